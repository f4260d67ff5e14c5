#!/usr/bin/env bash
# Install everything the tests need into .venv (idempotent) and run lint, layer checks and the whole test suite.
# Usage: bash scripts/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_CONSTRAINT="$PWD/constraints.txt"   # keeps pip on the CPU torch wheel (no multi-GB CUDA build)
export PIP_DISABLE_PIP_VERSION_CHECK=1
export DS_BUILD_OPS=0                            # DeepSpeed: no ahead-of-time op builds (JIT on first use)
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
. .venv/bin/activate
if ! python -c "import libra, vllm, deepspeed, megatron.core, ray, pytest" >/dev/null 2>&1 \
   || [ pyproject.toml -nt .venv/.installed ]; then
  echo "== installing libra[all] into .venv (about 2 minutes on a fresh machine)" >&2
  pip install -q --upgrade pip
  pip install -q -e '.[all]'
  # PyPI's torchvision/torchaudio are CUDA builds that break vLLM's imports beside the CPU torch.
  pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  touch .venv/.installed
fi
export HF_HUB_OFFLINE=1 RAY_AUTH_MODE=disabled VLLM_CPU_KVCACHE_SPACE=1 TOKENIZERS_PARALLELISM=false
echo "== ruff" >&2
ruff check libra tests benchmarks examples ext
echo "== import-linter (layer rules of DESIGN.md)" >&2
lint-imports
echo "== C++ extension (JIT build, cached in ~/.cache/libra/ext; tests fall back to Python if it cannot build)" >&2
python -c "from libra.elastic import native; print('libra_ext built:', native.load() is not None, native.load_error() or '')" || true
# -- verl 0.9.1 (docs/verl.md): its own venv, since its transformers < 5.11 conflicts with vllm-cpu's >= 5.16.1.
# Built once (about 4 minutes on a fresh machine; rebuilt when pyproject.toml changes); a missing verl fails the run.
verl_env() {
  if [ ! -x .venv-verl/bin/python ]; then
    python3 -m venv .venv-verl
  fi
  # package metadata, not `import verl` (10-25 s): the tests import it anyway
  local check="import importlib.metadata as m, libra; [m.version(p) for p in ('verl', 'TransferQueue', 'pytest')]"
  if ! .venv-verl/bin/python -c "$check" >/dev/null 2>&1 \
     || [ pyproject.toml -nt .venv-verl/.installed ]; then
    echo "== installing libra[verl] into .venv-verl (about 4 minutes on a fresh machine)" >&2
    .venv-verl/bin/pip install -q --upgrade pip
    .venv-verl/bin/pip install -q -e '.[verl]' pytest hypothesis
    touch .venv-verl/.installed
  fi
}
echo "== verl tests (tests/adapters/verl_plugin, in .venv-verl)" >&2
verl_env
LIBRA_VERL_TESTS=1 LIBRA_MAIN_PYTHON="$PWD/.venv/bin/python" .venv-verl/bin/python -m pytest -q -p no:cacheprovider \
  tests/adapters/verl_plugin
echo "== pytest" >&2
python -m pytest -q --durations=15 "$@"
