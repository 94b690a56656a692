#!/usr/bin/env bash
# How long a newcomer's `make run` takes on this machine, from a fresh clone (no .venv) to a
# master that lists its agent, and how big the venv it builds is. Prints one JSON line.
#
#   benchmarks/cold_make_run.sh [REV] [VAR=VALUE...]
#
# REV (default HEAD) is cloned from this repository into a temporary directory. Extra
# VAR=VALUE pairs go to make's environment: `UV_CACHE_DIR=$(mktemp -d) PIP_NO_CACHE_DIR=1`
# measures with nothing cached (every package downloaded). Ports 18080/18090 must be free.
set -euo pipefail
rev=${1:-HEAD}
shift || true
repo=$(git rev-parse --show-toplevel)
dir=$(mktemp -d /tmp/cold-make-run.XXXXXX)
git clone -q "$repo" "$dir/clone"
cd "$dir/clone"
git checkout -q "$rev"
port=18080
started=$(date +%s.%N)
env "$@" PORT=$port AGENT_PORT=18090 setsid make run >"$dir/run.log" 2>&1 &
runner=$!
stop() {
    kill -- -"$runner" 2>/dev/null || true
    wait "$runner" 2>/dev/null || true
    rm -rf "$dir"
}
trap stop EXIT
agent_listed() {
    local token
    token=$(curl -sf -X POST "http://127.0.0.1:$port/api/v1/auth/login" \
        -d '{"username": "determined", "password": ""}' |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["token"])' 2>/dev/null) || return 1
    curl -sf -H "Authorization: Bearer $token" "http://127.0.0.1:$port/api/v1/agents" |
        python3 -c 'import json, sys; sys.exit(0 if json.load(sys.stdin)["agents"] else 1)' 2>/dev/null
}
until agent_listed; do
    if ! kill -0 "$runner" 2>/dev/null; then
        echo "make run exited:" >&2
        tail -20 "$dir/run.log" >&2
        exit 1
    fi
    sleep 0.25
done
ended=$(date +%s.%N)
python3 - "$rev" "$started" "$ended" "$dir/clone/.venv" "$*" <<'PY'
import json, os, platform, subprocess, sys
rev, started, ended, venv, extra = sys.argv[1:]
size = int(subprocess.run(["du", "-sb", venv], capture_output=True, text=True).stdout.split()[0])
print(json.dumps({
    "rev": rev,
    "environment": extra,
    "seconds_to_agent_listed": round(float(ended) - float(started), 1),
    "venv_mb": round(size / 2**20),
    "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                "load_average_1m": os.getloadavg()[0]},
}))
PY
