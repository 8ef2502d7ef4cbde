#!/usr/bin/env bash
# A GPU host with Docker, the NVIDIA Container Toolkit and imgbuild installed, and the image in
# reach (built here, or in REGISTRY): `imgbuild run` serves the smoke model for real, on the
# target it chooses for this host's GPUs, answers a completion, and Ctrl-C leaves nothing.
#   REGISTRY=host/repo bash tests/gpu/run_serving.sh      # writes $OUT/run-serving.json
set -euo pipefail
OUT=${OUT:-/tmp}
PORT=${PORT:-30000}
args=(run tiny-nvfp4 --port "$PORT" --progress plain)
[ -n "${REGISTRY:-}" ] && args+=(--registry "$REGISTRY")
imgbuild "${args[@]}" --dry-run | tee "$OUT/run-serving.dry-run.txt"
imgbuild "${args[@]}" > "$OUT/run-serving.out" 2> "$OUT/run-serving.err" &
pid=$!
trap 'kill -INT $pid 2>/dev/null; wait $pid' EXIT
for _ in $(seq 1 900); do
  grep -q "is serving" "$OUT/run-serving.out" 2>/dev/null && break
  kill -0 $pid 2>/dev/null || { cat "$OUT/run-serving.err"; exit 1; }
  sleep 2
done
model=$(curl -sf "http://127.0.0.1:$PORT/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
curl -sf "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
  -d "{\"model\": \"$model\", \"prompt\": \"The capital of France is\", \"max_tokens\": 8}" \
  | tee "$OUT/run-serving.json"
kill -INT $pid; wait $pid || true
trap - EXIT
left=$(docker ps -a --filter label=imgbuild.run --format '{{.Names}}')
[ -z "$left" ] || { echo "containers left: $left"; exit 1; }
echo "run-serving: ok"
