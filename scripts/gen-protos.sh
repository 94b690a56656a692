#!/usr/bin/env bash
# Regenerate the committed gRPC stubs from proto/**/*.proto.
# `--check` regenerates into a scratch copy and fails if the committed files differ.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
root=proto
out=proto
if [[ "${1:-}" == "--check" ]]; then
    out=$(mktemp -d)
    trap 'rm -rf "$out"' EXIT
fi
# -I proto: the tree under the include root is the Python package tree, so the generated
# modules import each other as resolute_proto.agent.v1.… (grpc issues #19730, #29390).
mapfile -t sources < <(cd "$root" && find resolute_proto -name '*.proto' | sort)
"$PYTHON" -m grpc_tools.protoc -I "$root" \
    --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" "${sources[@]}"
if [[ "${1:-}" == "--check" ]]; then
    status=0
    for src in "${sources[@]}"; do
        base=${src%.proto}
        for suffix in _pb2.py _pb2.pyi _pb2_grpc.py; do
            if ! cmp -s "$out/$base$suffix" "$root/$base$suffix"; then
                echo "stale generated file: $root/$base$suffix (run scripts/gen-protos.sh)" >&2
                status=1
            fi
        done
    done
    exit $status
fi
echo "generated stubs for ${#sources[@]} proto file(s)"
