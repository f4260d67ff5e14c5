#!/usr/bin/env bash
# The suite under load (issue 15): N consecutive runs of `bash scripts/test.sh` with LOOPS busy-loop processes
# beside them, each loop in its own session. On Linux with sched_autogroup_enabled=1 (most desktop and many server
# kernels) every session is scheduled as one group, so loops started in this script's session would only compete
# with the tests inside one group; in their own sessions they load the machine as programs started elsewhere do.
# Usage: bash scripts/load_runs.sh [N=3] [LOOPS=4]     (the results: build/load_runs/summary.md)
set -uo pipefail
cd "$(dirname "$0")/.."
runs="${1:-3}"
loops="${2:-4}"
case "$runs" in '' | *[!0-9]* | 0) echo "load_runs.sh: N must be a whole number >= 1, got '$runs'" >&2; exit 2 ;; esac
case "$loops" in '' | *[!0-9]*) echo "load_runs.sh: LOOPS must be a whole number >= 0, got '$loops'" >&2; exit 2 ;; esac
out=build/load_runs
mkdir -p "$out"
pids=()
stop_loops() { kill "${pids[@]}" 2>/dev/null || true; }
trap stop_loops EXIT
for _ in $(seq "$loops"); do
  setsid bash -c 'while :; do :; done' &
  pids+=("$!")
done
{
  echo "# $runs runs of bash scripts/test.sh beside $loops busy loops ($(git rev-parse --short HEAD), $(nproc) CPUs)"
  echo
  echo "| run | exit | wall (s) | load average at the end | pytest |"
  echo "|---|---|---|---|---|"
} > "$out/summary.md"
failed=0
for i in $(seq "$runs"); do
  start=$(date +%s)
  bash scripts/test.sh > "$out/run-$i.log" 2>&1
  rc=$?
  wall=$(( $(date +%s) - start ))
  result=$(grep -E "^(=+ )?[0-9]+ (passed|failed)" "$out/run-$i.log" | tail -1 | tr -d '=' | xargs)
  echo "| $i | $rc | $wall | $(cut -d' ' -f1-3 /proc/loadavg) | ${result:-no summary (see run-$i.log)} |" >> "$out/summary.md"
  echo "run $i: exit $rc in $wall s: ${result:-no summary}" >&2
  [ "$rc" -eq 0 ] || failed=1
done
cat "$out/summary.md"
exit "$failed"
