#!/usr/bin/env bash
# Measures the sidecar through a Redis outage, per failure mode: the time from freezing
# Redis (SIGSTOP) under load to the breaker opening, the p50/p99 of answers while it is
# open, and the time from thawing Redis (SIGCONT) to the breaker closing (REDIS_TIMEOUT
# is 200ms here, BACKEND_BREAKER_* the defaults). How two sidecars in `local` mode share
# a limit is pinned by ratelimit-sidecar/tests/outage.rs. Everything runs on loopback;
# the sidecar is pinned to CPU 0, Redis and the load generator to CPU 1.
#   bench/outage/run.sh [SECONDS_OPEN]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OPEN_SECONDS="${1:-5}"
. bench/common.sh
bench_setup
now_ms() { date +%s%3N; }
stat() { curl -s "http://127.0.0.1:$1/stats" | awk -v n="$2:" '$1 == n { print $2 }'; }
until_stat() { # debug_port name -> waits until the statistic is at least 1
	while [ "$(stat "$1" "$2")" = "" ] || [ "$(stat "$1" "$2")" -lt 1 ]; do sleep 0.005; done
}

redis_port=$(free_port)
taskset -c 1 redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK" >/dev/null &
REDIS=$!
wait_port "$redis_port"

sidecar() { # mode grpc_port debug_port [extra env...]
	local mode="$1" grpc="$2" debug="$3"
	shift 3
	env RUNTIME_ROOT="$WORK/current" RUNTIME_SUBDIRECTORY= USE_STATSD=false LOG_LEVEL=error \
		HOST=127.0.0.1 PORT="$(free_port)" DEBUG_HOST=127.0.0.1 DEBUG_PORT="$debug" \
		GRPC_HOST=127.0.0.1 GRPC_PORT="$grpc" BACKEND_TYPE=redis REDIS_SOCKET_TYPE=tcp \
		REDIS_URL="127.0.0.1:$redis_port" REDIS_TIMEOUT=200ms BACKEND_FAILURE_MODE="$mode" "$@" \
		taskset -c 0 "$BIN/ratelimit" &
	wait_port "$grpc"
}

printf '%-6s %14s %12s %12s %14s %8s\n' mode "to open (ms)" "p50 open" "p99 open" "to close (ms)" errors
for mode in error allow local; do
	grpc=$(free_port) debug=$(free_port)
	sidecar "$mode" "$grpc" "$debug"
	pid=$!
	taskset -c 1 "$BIN/rls-load" "127.0.0.1:$grpc" 100 2 4 16 >/dev/null
	# Freeze Redis under load; the breaker opens once REDIS_TIMEOUT has passed.
	(taskset -c 1 "$BIN/rls-load" "127.0.0.1:$grpc" 100 2 4 16 >/dev/null &)
	sleep 0.5
	frozen=$(now_ms)
	kill -STOP "$REDIS"
	until_stat "$debug" ratelimit.redis.breaker_opened
	opened=$(now_ms)
	sleep 1.5
	out=$(taskset -c 1 "$BIN/rls-load" "127.0.0.1:$grpc" 100 "$OPEN_SECONDS" 4 16)
	# Steady load again, so that a probe goes through once the open period has passed.
	(taskset -c 1 "$BIN/rls-load" "127.0.0.1:$grpc" 100 3 1 4 >/dev/null &)
	thawed=$(now_ms)
	kill -CONT "$REDIS"
	until_stat "$debug" ratelimit.redis.breaker_closed
	closed=$(now_ms)
	eval "$(tr ' ' '\n' <<<"$out" | grep -E '^(p50_us|p99_us|errors)=')"
	printf '%-6s %14d %10dus %10dus %14d %8d\n' "$mode" $((opened - frozen)) "$p50_us" "$p99_us" $((closed - thawed)) "$errors"
	sleep 3
	kill "$pid"
	wait "$pid" 2>/dev/null || true
done

