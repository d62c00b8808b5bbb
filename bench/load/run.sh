#!/usr/bin/env bash
# Load benchmark of the sidecar on the memory and Redis backends, next to the transport ceiling
# (a tonic server that answers OK without deciding), measured in the same run.
#
# The server under test is pinned to CPU 0 and the load generators to CPU 1: h2load
# (Debian's nghttp2-client, when installed) for one hot key, then rls-load (this folder)
# for one and 10 000 keys with p50/p99.
#   bench/load/run.sh [SECONDS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
SECONDS_PER_RUN="${1:-10}"
cargo build --quiet --release -p ratelimit-sidecar -p ratelimit-load-bench
BIN=target/release
WORK="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

mkdir -p "$WORK/current/config"
cat > "$WORK/current/config/bench.yaml" <<'YAML'
domain: bench
descriptors:
  - key: client
    rate_limit: {unit: hour, requests_per_unit: 4000000000}
YAML

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_port() { for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; return 1; }

"$BIN/rls-load" --frame "$WORK/frame.bin"

measure() { # name port
	if command -v h2load >/dev/null; then
		printf '%-10s h2load keys=1 ' "$1"
		taskset -c 1 h2load -D "$SECONDS_PER_RUN" -c 4 -m 16 -t 1 -d "$WORK/frame.bin" \
			-H 'content-type: application/grpc' -H 'te: trailers' \
			"http://127.0.0.1:$2/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" |
			grep -E '^finished in|^requests:' | tr '\n' ' '
		echo
	fi
	for keys in 1 10000; do
		printf '%-10s rls-load ' "$1"
		taskset -c 1 "$BIN/rls-load" "127.0.0.1:$2" "$keys" "$SECONDS_PER_RUN" 4 16
	done
}

port=$(free_port)
taskset -c 0 "$BIN/rls-ceiling" "127.0.0.1:$port" &
pid=$!
wait_port "$port"
measure ceiling "$port"
kill "$pid"; wait "$pid" 2>/dev/null || true

port=$(free_port)
RUNTIME_ROOT="$WORK/current" RUNTIME_SUBDIRECTORY= BACKEND_TYPE=memory USE_STATSD=false \
	HOST=127.0.0.1 PORT="$(free_port)" DEBUG_HOST=127.0.0.1 DEBUG_PORT="$(free_port)" \
	GRPC_HOST=127.0.0.1 GRPC_PORT="$port" LOG_LEVEL=error taskset -c 0 "$BIN/ratelimit" &
pid=$!
wait_port "$port"
measure sidecar "$port"
kill "$pid"; wait "$pid" 2>/dev/null || true

# The same with the Redis backend; redis-server shares CPU 1 with the generators.
if command -v redis-server >/dev/null; then
	redis_port=$(free_port)
	taskset -c 1 redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK" >/dev/null &
	wait_port "$redis_port"
	port=$(free_port)
	RUNTIME_ROOT="$WORK/current" RUNTIME_SUBDIRECTORY= BACKEND_TYPE=redis REDIS_SOCKET_TYPE=tcp \
		REDIS_URL="127.0.0.1:$redis_port" USE_STATSD=false \
		HOST=127.0.0.1 PORT="$(free_port)" DEBUG_HOST=127.0.0.1 DEBUG_PORT="$(free_port)" \
		GRPC_HOST=127.0.0.1 GRPC_PORT="$port" LOG_LEVEL=error taskset -c 0 "$BIN/ratelimit" &
	wait_port "$port"
	measure redis "$port"
fi
