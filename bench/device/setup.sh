# Sourced by the device-call scripts, from the repository root (no network on the GPU machine): move into
# the clean tree when one was carried (devtree.tar: `git archive HEAD`, so that uncommitted work in the
# checkout never reaches the GPU), install .whl (bitsandbytes, liger-kernel, pytest:
# ../shared/device/wheels.sh) into /tmp/site, write box.txt. Leaves $out and $here set.
out=${OUT:-/tmp/out}; mkdir -p "$out"
here=$(pwd)
if [ -f devtree.tar ]; then rm -rf /tmp/tree && mkdir -p /tmp/tree && tar -xf devtree.tar -C /tmp/tree && cd /tmp/tree; fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$here"/.whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; df -h /tmp | tail -1; nproc; free -g | head -2
  python3 -c 'import torch, transformers, peft; print(torch.__version__, transformers.__version__, peft.__version__)'
  python3 -c 'import liger_kernel, bitsandbytes; print("liger-kernel and bitsandbytes importable")'; } \
  > "$out/box.txt" 2>&1
