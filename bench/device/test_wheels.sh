#!/usr/bin/env bash
# shellcheck disable=SC2012  # ls of wheel names we made
# Gather into ./.whl-test everything the test suite needs on the offline H200 machine that its image lacks
# (or holds at another version than pyproject.toml pins), for Python 3.12 on x86-64, plus the tree to test
# (.whl-test/devtree.tar.gz: `git archive HEAD`, so that uncommitted work in the checkout never reaches the
# GPU). Then bench/device/pytest_call.sh is the one device call; its header says how to make it.
#
#   bash bench/device/test_wheels.sh        from the project root, after the last commit (it re-archives HEAD)
#
# Quick once the wheels are there (kept; a changed pin is fetched again). Adds /.whl-test/ to
# .git/info/exclude. Run it inside the project's environment (.venv): deepspeed is built against its torch.
#
# What the image already has (KINDS.md: torch 2.11 CUDA, accelerate 1.15.0, safetensors
# 0.8.0, numpy, pyarrow, pandas, pyyaml, psutil, requests, tqdm, filelock, packaging, regex, typer, jinja2,
# httpx, anyio, h11, httpcore, xxhash, hf-xet, tensorboard, protobuf, grpcio, py-cpuinfo, msgpack, einops,
# ninja, ...) is used as it is; what is carried and why:
# - the app: textual 8.2.8 and its stack at the pinned/locked versions (rich, pygments, markdown-it-py,
#   mdurl, mdit-py-plugins, linkify-it-py, platformdirs): the SVG snapshots are byte-exact renderings;
# - transformers 5.23.0 + huggingface_hub 2.4.0 (+ httpx2, httpcore2, truststore, click>=8.4.2):
#   core/hub/hf_source.py needs the 2.x hub (httpx2), and the image's transformers 5.17 refuses hub >= 2 at
#   import (huggingface-hub<2.0); peft 0.21.2 and tokenizers 0.23.3 (0.23.2 asks hub < 2) with them, as pinned;
# - modelscope-hub (+ cryptography, cffi, pycparser), modelscope, datasets (+ dill, multiprocess, fsspec
#   <= 2026.9.0), liger-kernel, deepspeed (a pure wheel built here, DS_BUILD_OPS=0, + hjson), openai
#   (+ distro, jiter, sniffio, pydantic, pydantic-core, annotated-types, typing-inspection), import-linter
#   (+ grimp), pytest 9.0.3 (+ pluggy, iniconfig), nvidia-ml-py and psutil as pinned, typing-extensions;
# - bitsandbytes 0.50.2 with only its CPU and CUDA 13.x libraries: the image's torch is cu130, and the
#   wheel's builds for CUDA 11.8-12.8, ROCm and XPU are 120 of its 129 MB (43 MB zipped, 2/3 of a carry).
#   BNB_KEEP names the libraries kept (default "cpu cuda130 cuda132").
# Not carried: tensorboard (the image has one, built against its protobuf), ruff (no test runs it), torch.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
out=.whl-test
py=${PYTHON:-.venv/bin/python}
[ -x "$py" ] || py=python3
mkdir -p "$out"
grep -qx '/.whl-test/' .git/info/exclude 2>/dev/null || echo '/.whl-test/' >> .git/info/exclude

want="textual==8.2.8 rich==15.0.0 pygments==2.21.0 markdown-it-py==4.3.0 mdurl==0.1.2 mdit-py-plugins==0.7.0
 linkify-it-py==2.2.0 platformdirs==4.14.9
 transformers==5.23.0 huggingface-hub==2.4.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 click==8.5.1
 peft==0.21.2 tokenizers==0.23.3
 modelscope-hub==0.5.1 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12 modelscope==1.40.2
 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 fsspec==2026.9.0
 liger-kernel==0.8.5 hjson==3.1.0
 openai==2.8.1 distro==1.9.0 jiter==0.19.0 sniffio==1.3.1 pydantic==2.14.4 pydantic-core==2.50.5
 annotated-types==0.8.0 typing-inspection==0.4.5
 import-linter==2.17 grimp==3.20 pytest==9.0.3 pluggy==1.7.0 iniconfig==2.3.1
 nvidia-ml-py==13.615.71 psutil==7.2.2 typing-extensions==4.16.0"
want="$want ${TEST_WHEELS_EXTRA:-}"   # e.g. TEST_WHEELS_EXTRA="tensorboard==2.21.0 tensorboard-data-server==0.7.2"
plat=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64
      --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 --platform any)

# Wheels of names no longer wanted, or of other versions than wanted, go: two versions of one name would
# break the install there.
# shellcheck disable=SC2086  # one argument per requirement
"$py" - "$out" $want <<'EOF'
import re, sys
from pathlib import Path
out, reqs = Path(sys.argv[1]), sys.argv[2:]
norm = lambda s: re.sub(r"[-_.]+", "_", s).lower()
pins = {norm(r.split("==")[0]): r.split("==")[1] for r in reqs}
pins.update({"deepspeed": "0.19.8", "bitsandbytes": "0.50.2"})
for whl in out.glob("*.whl"):
    name, version = whl.name.split("-")[:2]
    if pins.get(norm(name)) != version:
        print(f"removing {whl.name} (not wanted at this version)")
        whl.unlink()
EOF

missing=()
for req in $want; do
    name=${req%%==*}; version=${req#*==}
    stem=$(echo "$name" | tr 'A-Z-.' 'a-z__')
    ls "$out" | tr 'A-Z-.' 'a-z__' | grep -q "^${stem}-${version//./_}-" || missing+=("$req")
done
if [ ${#missing[@]} -gt 0 ]; then
    "$py" -m pip download -q --no-deps --disable-pip-version-check "${plat[@]}" -d "$out" "${missing[@]}" 2>&1 \
        | grep -v "^WARNING: Location 'file:" || true
fi

# bitsandbytes: download once into a cache beside, carry the slimmed copy (same name, RECORD rewritten).
if ! ls "$out"/bitsandbytes-0.50.2-*.whl >/dev/null 2>&1; then
    cache=${XDG_CACHE_HOME:-$HOME/.cache}/tunedeck-test-wheels; mkdir -p "$cache"
    ls "$cache"/bitsandbytes-0.50.2-*.whl >/dev/null 2>&1 || cp .whl/bitsandbytes-0.50.2-*.whl "$cache"/ 2>/dev/null \
        || "$py" -m pip download -q --no-deps --disable-pip-version-check "${plat[@]}" -d "$cache" bitsandbytes==0.50.2
    "$py" - "$cache"/bitsandbytes-0.50.2-*.whl "$out" "${BNB_KEEP:-cpu cuda130 cuda132}" <<'EOF'
import re, sys, zipfile
from pathlib import Path
src, out, keep = Path(sys.argv[1]), Path(sys.argv[2]), set(sys.argv[3].split())
lib = re.compile(r"bitsandbytes/libbitsandbytes_(\w+)\.so$")
drop = lambda n: (m := lib.search(n)) is not None and m.group(1) not in keep
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out / src.name, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
    for info in zin.infolist():
        if drop(info.filename):
            continue
        data = zin.read(info)
        if info.filename.endswith(".dist-info/RECORD"):
            lines = data.decode().splitlines(keepends=True)
            data = "".join(l for l in lines if not drop(l.split(",")[0])).encode()
        zout.writestr(info, data)
kept = sorted(m.group(1) for n in zipfile.ZipFile(out / src.name).namelist() if (m := lib.search(n)))
print(f"bitsandbytes slimmed: {src.stat().st_size / 1e6:.1f} MB -> {(out / src.name).stat().st_size / 1e6:.1f} MB, "
      f"libraries kept: {' '.join(kept)}")
EOF
fi

# deepspeed ships only as source: a pure-Python wheel built here (its ops compile just in time there).
if ! ls "$out"/deepspeed-0.19.8-*.whl >/dev/null 2>&1; then
    DS_BUILD_OPS=0 "$py" -m pip wheel -q --no-deps --no-build-isolation --disable-pip-version-check -w "$out" \
        deepspeed==0.19.8 2>&1 | grep -v "^WARNING: Location 'file:" || true
fi

# The tree to test: HEAD, compressed (tar -x reads it as it is).
git archive --format=tar.gz -o "$out/devtree.tar.gz" HEAD
git rev-parse HEAD > "$out/devtree.sha"
if ! git diff --quiet HEAD -- 2>/dev/null; then
    echo "note: the checkout has uncommitted changes; the device tests HEAD $(git rev-parse --short HEAD) without them"
fi

# Nothing missing: every requirement of a carried wheel (markers taken for CPython 3.12 on x86-64 Linux,
# extras left out) is carried at a version that meets it, or is a package of the image (its version is
# not known here: `pip check` there, in box.txt, says whether it meets it).
"$py" - "$out" <<'EOF'
import re, sys, zipfile
from pathlib import Path
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as canon
from packaging.version import Version

image = set(map(canon, """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
 build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
 cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
 flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
 huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jaxlib jaxtyping jinja2 joblib
 kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py
 markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions
 nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-ml-py onnx onnx-ir onnxruntime
 onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas
 pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11
 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
 pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu
 safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
 setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
 tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio
 torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions
 typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp""".split()))
env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "platform_system": "Linux",
       "platform_machine": "x86_64", "implementation_name": "cpython", "platform_python_implementation": "CPython",
       "os_name": "posix", "extra": ""}
out = Path(sys.argv[1])
carried = {}
for whl in sorted(out.glob("*.whl")):
    name, version = whl.name.split("-")[:2]
    carried[canon(name)] = (Version(version), whl)
if len(carried) != len(list(out.glob("*.whl"))):
    sys.exit("two wheels of one name in .whl-test: the install there would stop")
bad, from_image = [], {}
for name, (version, whl) in carried.items():
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode("utf-8", "replace").splitlines()
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        dep = canon(req.name)
        if dep in carried:
            if not req.specifier.contains(carried[dep][0], prereleases=True):
                bad.append(f"{name} needs {req}, carried {dep} {carried[dep][0]}")
        elif dep in image:
            from_image.setdefault(dep, set()).add(f"{name}: {req.specifier or 'any'}")
        else:
            bad.append(f"{name} needs {req}: neither carried nor in the image")
print(f"{len(carried)} wheels; requirements met by carried wheels, or left to the image's:")
for dep in sorted(from_image):
    print(f"  {dep:22} {'; '.join(sorted(from_image[dep]))}")
if bad:
    print("MISSING or mismatched:\n  " + "\n  ".join(bad))
    sys.exit(1)
EOF

# The carry limit: 64 MiB for the tree that travels (tracked files, untracked files git does not ignore)
# and the carried folder together.
tracked=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
untracked=$(git ls-files -z --others --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
carry=$(du -cb "$out" | tail -1 | cut -f1)
limit=$((64 * 1024 * 1024))
total=$((tracked + untracked + carry))
ls -lS "$out" | awk 'NR > 1 {printf "  %10d  %s\n", $5, $9}'
awk -v t="$tracked" -v u="$untracked" -v c="$carry" 'BEGIN { m = 1048576
    printf "tree %.1f MiB (tracked) + %.1f MiB (untracked, not ignored) + .whl-test %.1f MiB = %.1f MiB of 64 MiB\n",
           t / m, u / m, c / m, (t + u + c) / m }'
[ "$total" -le "$limit" ] || { echo "over the 64 MiB a call carries: move untracked files away or carry less"; exit 1; }
