#!/usr/bin/env bash
# The checks that need a CUDA GPU (CI has none): the CUDA snapshot path's tests, the GPU benchmarks of issue 16
# (targets 1 and 3 with the state on the GPU) and the Megatron-core adapter on a GPU. One log per part in OUT_DIR.
#
#   bash scripts/gpu_check.sh [OUT_DIR]      # default: $OUT, else /tmp/libra-gpu-check
#
# Needs: torch with CUDA, nvcc and ninja (the snapshot extension is JIT-built with its CUDA source), pytest,
# pytest-benchmark, pytest-timeout, hypothesis, attrs, numpy, xxhash; megatron-core for the last part. It runs from
# the source tree (PYTHONPATH), so no install is needed. Exit status 1 if any part fails; every part runs.
set -uo pipefail
out="${1:-${OUT:-/tmp/libra-gpu-check}}"
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac   # relative to the folder it is run from, not the repository
cd "$(dirname "$0")/.."
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export LIBRA_EXT_BUILD_DIR="${LIBRA_EXT_BUILD_DIR:-/tmp/libra-ext}"
status=0

part() {
  local name=$1
  shift
  echo "== [${SECONDS}s] $name: $*"
  "$@" 2>&1 | tee "$out/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "== [${SECONDS}s] $name: exit $rc"
  [ "$rc" -eq 0 ] || status=1
}

part machine bash -c 'nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc;
  nvcc --version | tail -1; python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"'
part build python3 -c "
from libra.elastic import native
mod = native.load()
print(mod, native.load_error() or 'built')
assert mod is not None and hasattr(mod, 'gather_cuda_into'), 'the CUDA path was not built'"
part tests-cuda python3 -m pytest -q -p no:cacheprovider -ra tests/elastic/test_elastic_cuda.py
part tests-pack python3 -m pytest -q -p no:cacheprovider -ra tests/elastic/test_elastic_pack.py \
  tests/elastic/test_elastic_snapshot.py
part bench python3 -m pytest -q -p no:cacheprovider benchmarks/bench_elastic_gpu.py --benchmark-only -s \
  --benchmark-json "$out/bench_elastic_gpu.json" --benchmark-columns=min,median,max
part megatron torchrun --nproc-per-node "$(python3 -c 'import torch; print(torch.cuda.device_count())')" \
  examples/gpu_check_megatron.py --tp 1
exit $status
