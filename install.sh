#!/usr/bin/env bash
# tunedeck's one set-up command for Ubuntu/Debian boxes with Python 3.10+.
#
#   ./install.sh            app + training stack in ./.venv, `tunedeck` put on the PATH
#   ./install.sh --dev      the same plus the test tools (pytest, import-linter, ruff)
#   ./install.sh --app-only only the app (GPU panels, model browser, dashboards); no torch
#
# Safe to run twice: an existing .venv is reused (made again where its Python is older than 3.10, or PYTHON
# names another version) and pinned versions already present are kept.
# Environment: PYTHON (interpreter to use), TUNEDECK_TORCH_INDEX (a PyTorch wheel index to force),
# TUNEDECK_FORCE_CPU=1 (CPU torch even where a GPU is found).
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"  # `sh install.sh`: dash stopped at `set -o pipefail`
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
venv="$here/.venv"
dev=0
app_only=0
torch_version=2.13.0

say()  { printf '\033[1m[tunedeck]\033[0m %s\n' "$*" >&2; }
die()  { printf '\033[1;31m[tunedeck] error:\033[0m %s\n' "$*" >&2; exit 1; }

for arg in "$@"; do
    case "$arg" in
        --dev) dev=1 ;;
        --app-only) app_only=1 ;;
        -h|--help) sed -n '2,/^[^#]/p' "$0" | sed -n 's/^# \{0,1\}//p'; exit 0 ;;  # the header comment
        *) die "unknown option '$arg' (try --help)" ;;
    esac
done

# --- Python -----------------------------------------------------------------------------------
python=${PYTHON:-}
if [ -z "$python" ]; then
    # The newest tested version found (3.12, 3.11, 3.10), then python3 where it is 3.10 or newer (a 3.13
    # python3 came before an installed 3.12). Each candidate must really run: pyenv shims exist for
    # versions that are not selected.
    for candidate in python3.12 python3.11 python3.10 python3; do
        if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 10))' >/dev/null 2>&1; then
            python=$candidate; break
        fi
    done
fi
[ -n "$python" ] || die "no Python 3.10 or newer found; install one (apt-get install -y python3 python3-venv) or set PYTHON"
# a PYTHON that does not run (a typo, a pyenv shim of a version not selected) is said so, not "too old"
py_err=$("$python" -c 'import sys' 2>&1 >/dev/null) \
    || die "PYTHON=$python does not run: $(printf '%s\n' "$py_err" | sed -n '1{s/^.*line [0-9]*: //;p;}')
  Set PYTHON to a Python 3.10-3.12 interpreter that runs (e.g. PYTHON=/usr/bin/python3.12), or leave it unset to let install.sh find one."
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
    || die "$($python -V 2>&1) is too old: tunedeck needs Python 3.10 or newer (set PYTHON=/path/to/python3.1x)"
say "using $($python -V 2>&1) at $(command -v "$python")"
if ! "$python" -c 'import sys; sys.exit(sys.version_info >= (3, 13))' >/dev/null 2>&1; then
    say "note: $($python -V 2>&1) is newer than the tested 3.10-3.12: accepted, untested (set PYTHON=/path/to/python3.12 to use a tested one)"
fi

# --- virtual environment ----------------------------------------------------------------------
# An existing .venv is kept, unless it does not run, runs a Python older than 3.10 (pip then failed on the
# first dependency, "requires a different Python", after "using Python 3.11"), or PYTHON names another version.
minor() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true; }
want_py=$(minor "$python")
have_py=""
remake=0
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import sys' >/dev/null 2>&1; then
    remake=1
else
    have_py=$(minor "$venv/bin/python")
    if ! "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' >/dev/null 2>&1; then
        say "$venv runs Python $have_py, older than 3.10: making it again with $($python -V 2>&1)"
        remake=1
    elif [ -n "${PYTHON:-}" ] && [ -n "$have_py" ] && [ -n "$want_py" ] && [ "$have_py" != "$want_py" ]; then
        say "$venv runs Python $have_py, PYTHON=$PYTHON is $want_py: making it again with $want_py"
        remake=1
    fi
fi
if [ "$remake" = 1 ]; then
    rm -rf "$venv"
    say "creating the virtual environment $venv"
    # venv's own message, kept in a variable: a fixed file in /tmp may belong to another user of a shared box
    # (its "Permission denied" then read as a missing python3-venv)
    if ! venv_err=$("$python" -m venv "$venv" 2>&1 >/dev/null); then
        case "$venv_err" in
            *ensurepip*|*"No module named venv"*) die "could not create $venv: $(printf '%s\n' "$venv_err" | tail -n 3)
  On Debian/Ubuntu: apt-get install -y python3-venv (or python3.X-venv for your version), then run ./install.sh again." ;;
            *) die "could not create $venv: $(printf '%s\n' "$venv_err" | tail -n 3)" ;;
        esac
    fi
else
    say "reusing the virtual environment $venv${have_py:+ (Python $have_py)}"
    if [ -n "$have_py" ] && [ -n "$want_py" ] && [ "$have_py" != "$want_py" ]; then
        say "note: it was made with Python $have_py, not the $want_py found now; set PYTHON=python$want_py to make it again with that one"
    fi
fi
vpy="$venv/bin/python"
pip() { "$vpy" -m pip --disable-pip-version-check "$@"; }
pip install -q --upgrade "setuptools>=64" wheel || die "pip could not install setuptools (is PyPI reachable?)"

# --- torch: the CUDA build only where an NVIDIA driver is present -----------------------------
gpu_count=0
cuda_driver=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    gpu_count=$(nvidia-smi -L | grep -c '^GPU' || true)
    cuda_driver=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | head -n 1)
fi
if [ "${TUNEDECK_FORCE_CPU:-0}" = 1 ]; then gpu_count=0; fi

if [ "$app_only" = 0 ]; then
    index=${TUNEDECK_TORCH_INDEX:-}
    if [ -z "$index" ]; then
        if [ "$gpu_count" -gt 0 ]; then
            # Match the wheel's CUDA runtime to what the driver supports.
            major=${cuda_driver%%.*}; minor=${cuda_driver#*.}
            if [ -z "$cuda_driver" ]; then die "nvidia-smi works but reports no CUDA version; set TUNEDECK_TORCH_INDEX"
            elif [ "$major" -ge 13 ]; then index=https://download.pytorch.org/whl/cu130
            elif [ "$major" -eq 12 ] && [ "$minor" -ge 8 ]; then index=https://download.pytorch.org/whl/cu128
            elif [ "$major" -eq 12 ] && [ "$minor" -ge 6 ]; then index=https://download.pytorch.org/whl/cu126
            else die "the NVIDIA driver supports CUDA $cuda_driver; torch $torch_version needs 12.6 or newer. Update the driver or set TUNEDECK_TORCH_INDEX."
            fi
            say "found $gpu_count NVIDIA GPU(s), driver CUDA $cuda_driver: CUDA build of torch from $index"
        else
            index=https://download.pytorch.org/whl/cpu
            say "no NVIDIA driver found: CPU build of torch (no multi-GB CUDA download)"
        fi
    fi
    have_torch=$("$vpy" -c "import torch; print(torch.__version__)" 2>/dev/null || true)
    want_cpu=$([ "$gpu_count" -gt 0 ] && echo 0 || echo 1)
    # kept only where it is the build wanted: a CPU torch from an install before the driver (or with
    # TUNEDECK_FORCE_CPU=1) trained on the CPU of a GPU box for ever after
    if [ -n "$have_torch" ] && [ "${have_torch%%+*}" = "$torch_version" ] \
        && "$vpy" -c "import sys, torch; sys.exit((torch.version.cuda is None) != bool($want_cpu))"; then
        say "torch $have_torch already installed"
    else
        reinstall=()
        # pip takes torch==X as met by X+cpu or X+cu128 alike: another build present is replaced by force
        [ -n "$have_torch" ] && reinstall=(--force-reinstall)
        say "installing torch $torch_version${have_torch:+ (replacing $have_torch)}"
        # --no-deps: torch's own dependencies come from PyPI in the next step, so that a CPU index
        # that is unreachable can never make pip fall back to PyPI's multi-GB CUDA wheel of torch.
        pip install --no-deps ${reinstall[@]+"${reinstall[@]}"} --index-url "$index" "torch==$torch_version" \
            || die "could not install torch $torch_version from $index. Check the network, or point TUNEDECK_TORCH_INDEX at a reachable PyTorch wheel index."
    fi
fi

# --- tunedeck and its pinned dependencies -----------------------------------------------------
extras=()
[ "$app_only" = 0 ] && extras+=(ml)
[ "$app_only" = 0 ] && [ "$gpu_count" -gt 0 ] && extras+=(gpu)  # Liger's kernels need a GPU (Triton)
[ "$dev" = 1 ] && extras+=(dev)
spec="$here"
if [ ${#extras[@]} -gt 0 ]; then spec="$here[$(IFS=,; echo "${extras[*]}")]"; fi
say "installing tunedeck${extras:+ with extras: ${extras[*]}}"
# DeepSpeed is published as source only: build it against the torch above (no isolated build env,
# which would download another torch), with its CUDA ops compiled just in time on the GPU.
DS_BUILD_OPS=0 DS_SKIP_CUDA_CHECK=1 pip install -q --no-build-isolation -e "$spec" \
    || die "pip could not install tunedeck's dependencies (see the pip output above)"

# --- check, then put tunedeck on the PATH -----------------------------------------------------
"$venv/bin/tunedeck" --version >/dev/null || die "tunedeck was installed but does not start: run $venv/bin/tunedeck --version"
linked=""
on_path=0  # whether a folder it was linked into is on the PATH: /usr/local/bin is, but only root gets a link there
link() {
    # another checkout's link is replaced, and said so: on a shared box `tunedeck` changes meaning for everyone
    local before err
    before=$(readlink "$1/tunedeck" 2>/dev/null || true)
    # a home or folder that cannot be written (read-only, another user's) is said, not the end of the install:
    # everything is installed by now and $venv/bin/tunedeck starts it
    if ! err=$(ln -sf "$venv/bin/tunedeck" "$1/tunedeck" 2>&1); then
        say "could not link $1/tunedeck: ${err##*: }"
        return 0
    fi
    if [ -n "$before" ] && [ "$before" != "$venv/bin/tunedeck" ]; then
        say "$1/tunedeck started $before; it starts this checkout's now"
    fi
    linked="${linked:+$linked }$1/tunedeck"
    case ":$PATH:" in *":$1:"*) on_path=1 ;; esac
}
if err=$(mkdir -p "$HOME/.local/bin" 2>&1); then
    link "$HOME/.local/bin"
else
    say "could not create $HOME/.local/bin: ${err##*: }"
fi
if [ -w /usr/local/bin ] && [ "$(id -u)" = 0 ]; then
    link /usr/local/bin
fi
say "installed $("$venv/bin/tunedeck" --version) into $venv"
if [ -n "$linked" ]; then say "linked: $linked"; fi
start="tunedeck   (or $venv/bin/tunedeck)"
if [ -z "$linked" ]; then
    say "tunedeck was linked nowhere: start it as $venv/bin/tunedeck, or link it into a folder of your PATH (ln -s $venv/bin/tunedeck DIR/)"
    start="$venv/bin/tunedeck"
elif [ "$on_path" = 0 ]; then
    say "add ~/.local/bin to your PATH: echo 'export PATH=\$HOME/.local/bin:\$PATH' >> ~/.bashrc; then open a new shell"
    start="$venv/bin/tunedeck"
fi
if [ "$app_only" = 0 ]; then
    "$vpy" - <<'PY' >&2 || true
import torch
cuda = torch.version.cuda
print(f"[tunedeck] torch {torch.__version__}: " + (f"CUDA {cuda}, {torch.cuda.device_count()} GPU(s) visible" if cuda else "CPU build"))
PY
fi
say "done. Start the app with: $start"
