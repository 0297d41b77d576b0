#!/usr/bin/env bash
# `make run`: the mock upstream (or a real provider) behind Envoy with llm-filter,
# in the foreground until Ctrl-C, which stops everything this script started.
set -euo pipefail
cd "$(dirname "$0")/.."

ENVOY=${ENVOY_BIN:-.venv/bin/envoy}
MOCK=target/release/mock-upstream
RUN=.run
mkdir -p "$RUN"
pids=()
stop() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop EXIT INT TERM

if [[ -n "${PROVIDER_HOST:-}" ]]; then
  # The provider's certificate is checked against the system CA bundle (or
  # PROVIDER_CA) and PROVIDER_HOST.
  scripts/provider-config.sh "$PROVIDER_HOST" "${PROVIDER_PORT:-443}" > "$RUN/envoy.yaml"
  echo "upstream: https://${PROVIDER_HOST}:${PROVIDER_PORT:-443} (set your key in the Authorization header)"
else
  "$MOCK" --port 18080 --name mock --latency-ms 200 > "$RUN/mock.log" 2>&1 &
  pids+=($!)
  # Two backends of the routed model `gpt-4o`, one fast and one slow.
  "$MOCK" --port 18081 --name fast --latency-ms 100 > "$RUN/fast.log" 2>&1 &
  pids+=($!)
  "$MOCK" --port 18082 --name slow --latency-ms 800 > "$RUN/slow.log" 2>&1 &
  pids+=($!)
  cp envoy/envoy.yaml "$RUN/envoy.yaml"
  echo "upstream: mock on 127.0.0.1:18080; gpt-4o routed over fast (:18081, 100 ms) and slow (:18082, 800 ms)"
fi

"$ENVOY" -c "$RUN/envoy.yaml" --concurrency 2 --disable-hot-restart -l warning --component-log-level wasm:info \
  > "$RUN/envoy.log" 2>&1 &
pids+=($!)

for _ in $(seq 1 100); do
  if curl -fs http://127.0.0.1:9901/ready > /dev/null 2>&1; then break; fi
  if ! kill -0 "${pids[-1]}" 2>/dev/null; then
    echo "Envoy exited; last lines of $RUN/envoy.log:"; tail -20 "$RUN/envoy.log"; exit 1
  fi
  sleep 0.1
done

cat <<'TRY'

llm-filter is running in Envoy on http://127.0.0.1:10000 (admin: http://127.0.0.1:9901)
Try:

  # a plain call: see x-trace-id in the answer
  curl -si http://127.0.0.1:10000/v1/chat/completions -H 'content-type: application/json' \
    -d '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hello"}]}'

  # a streamed call: events arrive one by one
  curl -sN http://127.0.0.1:10000/v1/chat/completions -H 'content-type: application/json' \
    -d '{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello"}]}'

  # a priority: forwarded as x-request-priority and in baggage
  curl -si http://127.0.0.1:10000/v1/chat/completions -H 'content-type: application/json' \
    -H 'x-request-priority: p0' -H 'baggage: team=search' \
    -d '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"urgent"}]}'

  # the cache: a deterministic call (temperature 0) twice — x-cache MISS, then HIT with age
  for i in 1 2; do curl -s -o /dev/null -D - http://127.0.0.1:10000/v1/chat/completions \
    -H 'content-type: application/json' \
    -d '{"model":"gpt-4o-mini","temperature":0,"messages":[{"role":"user","content":"cache me"}]}' \
    | tr -d '\r' | grep -iE '^(x-cache|age):'; done

  # a timeout budget: the caller can wait 100 ms, the backend takes 200 ms — OpenAI-shaped 504
  curl -si http://127.0.0.1:10000/v1/chat/completions -H 'content-type: application/json' \
    -H 'x-request-timeout-ms: 100' \
    -d '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"too slow"}]}'

  # model routing: gpt-4o goes to `fast` or `slow` by health; see x-llm-cluster, and
  # the model name rewritten for `slow` in the answer
  curl -si http://127.0.0.1:10000/v1/chat/completions -H 'content-type: application/json' \
    -d '{"model":"gpt-4o","messages":[{"role":"user","content":"route me"}]}'

  # traffic shifts to the fast backend within seconds: send 50 calls, count who served them
  seq 50 | xargs -P 8 -I{} curl -s -o /dev/null -D - http://127.0.0.1:10000/v1/chat/completions \
    -H 'content-type: application/json' -d '{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}' \
    | tr -d '\r' | grep -i '^x-llm-cluster' | sort | uniq -c

  # routing metrics: calls by cluster and outcome, effective weights, probes, ejections
  curl -s http://127.0.0.1:9901/stats/prometheus | grep llm_filter_routing | grep -v _bucket

  # the metrics
  curl -s http://127.0.0.1:9901/stats/prometheus | grep -E '^(llm_filter|gen_ai)'

Logs: .run/envoy.log  — Ctrl-C stops everything.
TRY
wait "${pids[-1]}"
