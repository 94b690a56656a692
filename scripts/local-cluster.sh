#!/usr/bin/env bash
# `make run`: a master on embedded SQLite plus one local agent with this machine's GPUs,
# or CPU slots (one per core) when NVML finds none. Ctrl-C stops both.
set -euo pipefail
BIN=${BIN:-.venv/bin}
PORT=${PORT:-8080}
AGENT_PORT=${AGENT_PORT:-8090}
DATA_DIR=${DATA_DIR:-data}

"$BIN/det-master" --port "$PORT" --agent-port "$AGENT_PORT" --data-dir "$DATA_DIR" &
master=$!
agent=""
stop() {
    [[ -n "$agent" ]] && kill "$agent" 2>/dev/null || true
    kill "$master" 2>/dev/null || true
    wait || true
}
trap stop EXIT INT TERM

for _ in $(seq 1 100); do
    if [[ -s "$DATA_DIR/agent_join_token" ]] && curl -sf "http://127.0.0.1:$PORT/info" >/dev/null; then
        break
    fi
    kill -0 "$master" 2>/dev/null || { echo "det-master exited" >&2; exit 1; }
    sleep 0.2
done

slots=()
if ! "$BIN/python" -c 'import sys; from agent.gpu import open_nvml; sys.exit(open_nvml() is None)'; then
    slots=(--artificial-slots "$(nproc)")
fi
# As root the agent runs each trial as a uid of its own (README.md, "The ranks' user"). Such
# a uid must reach the agent's interpreter and the data directory: a checkout or a Python
# under root's 0700 home is out of its reach. Then this local cluster keeps its ranks as
# root, explicitly and saying so; set DET_AGENT_RANK_USER or DET_AGENT_RANK_UID_RANGE to decide.
ranks=()
if [[ "$(id -u)" == 0 && -z "${DET_AGENT_RANK_USER:-}${DET_AGENT_RANK_UID_RANGE:-}" ]]; then
    uid=$("$BIN/python" -c 'from agent.rank_user import DEFAULT_UID_SPACE as r; print(r.split("-")[0])')
    python=$(cd "$(dirname "$BIN/python")" && pwd)/python
    if ! setpriv --reuid="$uid" --regid="$uid" --clear-groups -- /bin/sh -c \
        'cd -- "$1" && cd / && exec "$2" -c "import resolute"' sh "$DATA_DIR" "$python" \
        >/dev/null 2>&1; then
        echo "resolute: the ranks' uids cannot reach $python or $DATA_DIR (a directory above" \
            "them is closed to other users): this local agent runs ranks as root" \
            "(--rank-user root), and they can read its secrets" >&2
        ranks=(--rank-user root)
    fi
fi
"$BIN/det-agent" --master "127.0.0.1:$AGENT_PORT" --id "$(hostname)" \
    --work-dir "$DATA_DIR/agent-work" --join-token-file "$DATA_DIR/agent_join_token" \
    "${slots[@]}" "${ranks[@]}" &
agent=$!
echo "resolute: master http://127.0.0.1:$PORT, agent $(hostname) (Ctrl-C stops both)" >&2
wait -n "$master" "$agent"
