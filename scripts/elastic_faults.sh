#!/usr/bin/env bash
# The full fault-injection sweep: 120 seeded runs (CI runs 40), every core step of both core ranks compared byte
# for byte with the reference built from the hybrid's witness; writes faults.json (the table of docs/elastic.md).
# Usage: bash scripts/elastic_faults.sh [report dir, default out/elastic] [runs, default 120]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] && . .venv/bin/activate
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false LIBRA_REQUIRE_ENGINES=1
export LIBRA_TEST_TIMEOUT_FACTOR="${LIBRA_TEST_TIMEOUT_FACTOR:-2}"   # as scripts/test.sh
export LIBRA_ELASTIC_REPORT="${1:-out/elastic}" LIBRA_FAULT_RUNS="${2:-120}"
python -m pytest -q -p no:cacheprovider tests/elastic/test_elastic_faults.py -k killing
echo "report: $LIBRA_ELASTIC_REPORT/faults.json" >&2
