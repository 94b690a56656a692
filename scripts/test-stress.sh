#!/usr/bin/env bash
# make test-stress: the e2e and web tests while every core is kept busy, as on a machine
# running at half speed. One spinning process per core (STRESS_BUSY, default: the number of
# cores), started here and stopped on any exit; the suite itself runs as in `make test`.
# Extra arguments go to pytest (e.g. a single file or -k).
set -euo pipefail
cd "$(dirname "$0")/.."

: "${BIN:=.venv/bin}"
: "${PYTEST_WORKERS:=2}"
busy=${STRESS_BUSY:-$(nproc)}

spinners=()
stop_spinners() {
  for pid in "${spinners[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop_spinners EXIT INT TERM

for _ in $(seq 1 "$busy"); do
  # A plain busy loop at the tests' own priority: it takes its fair share of a core.
  "$BIN/python" -c 'while True: pass' &
  spinners+=("$!")
done
echo "test-stress: $busy busy processes (pids ${spinners[*]}) on $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(tests/e2e tests/web)
started=$(date +%s)
status=0
"$BIN/pytest" --numprocesses="$PYTEST_WORKERS" --dist=loadfile --no-loadscope-reorder --durations=25 "${targets[@]}" \
  || status=$?
echo "test-stress: $busy busy processes throughout; pytest exited $status after $(( $(date +%s) - started )) s; load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"
exit "$status"
