#!/usr/bin/env bash
# The full fault-injection sweep: 120 seeded runs (CI runs 40), every core step of both core ranks compared byte
# for byte with the reference built from the hybrid's witness; writes faults.json (the table of docs/elastic.md).
# Usage: bash scripts/elastic_faults.sh [report dir, default out/elastic] [runs, default 120, at least 15]
# (a relative report dir is taken from the folder you run it in; the default is the repository's out/elastic)
set -euo pipefail
report="${1:-}" runs="${2:-120}"
case "$runs" in
  '' | *[!0-9]*) echo "elastic_faults.sh: runs must be a whole number, got '$runs'" >&2; exit 2 ;;
esac
# the test asserts that every kill point was hit: seed 2026 reaches all of them from 15 runs on
if [ "$runs" -lt 15 ]; then
  echo "elastic_faults.sh: runs must be >= 15 (fewer miss a kill point of seed 2026 and the test fails), got $runs" >&2
  exit 2
fi
case "$report" in
  '') ;;
  /*) ;;
  *) report="$PWD/$report" ;;
esac
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] && . .venv/bin/activate
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false LIBRA_REQUIRE_ENGINES=1
export LIBRA_TEST_TIMEOUT_FACTOR="${LIBRA_TEST_TIMEOUT_FACTOR:-2}"   # as scripts/test.sh
export LIBRA_ELASTIC_REPORT="${report:-$PWD/out/elastic}" LIBRA_FAULT_RUNS="$runs"
python -m pytest -q -p no:cacheprovider tests/elastic/test_elastic_faults.py -k killing
echo "report: $LIBRA_ELASTIC_REPORT/faults.json" >&2
