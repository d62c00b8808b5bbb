#!/usr/bin/env bash
# Store commands per decision at one hot key with three sidecar replicas on one Redis,
# exact and write-behind (WRITE_BEHIND=true, WRITE_BEHIND_FLUSH_INTERVAL=100ms): each
# replica gets rls-load (one key, 2 connections × 8 streams) for SECONDS, all at once,
# then Redis's INFO commandstats counts what the store ran.
#   bench/load/write_behind.sh [SECONDS=10]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
SECONDS_EACH="${1:-10}"
. bench/common.sh
bench_setup

run() { # mode: exact | write-behind
	local redis_port ports=() i
	redis_port=$(free_port)
	redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK" >/dev/null &
	local redis_job=$!
	wait_port "$redis_port"
	for i in 1 2 3; do
		ports+=("$(free_port)")
		env RUNTIME_ROOT="$WORK/current" RUNTIME_SUBDIRECTORY= USE_STATSD=false LOG_LEVEL=error \
			GRPC_WORKERS=1 HOST=127.0.0.1 PORT="$(free_port)" DEBUG_HOST=127.0.0.1 DEBUG_PORT="$(free_port)" \
			GRPC_HOST=127.0.0.1 GRPC_PORT="${ports[-1]}" BACKEND_TYPE=redis REDIS_SOCKET_TYPE=tcp \
			REDIS_URL="127.0.0.1:$redis_port" WRITE_BEHIND="$([ "$1" = write-behind ] && echo true || echo false)" \
			"$BIN/ratelimit" &
		wait_port "${ports[-1]}"
	done
	redis-cli -p "$redis_port" config resetstat >/dev/null
	for i in 0 1 2; do
		"$BIN/rls-load" "127.0.0.1:${ports[$i]}" 1 "$SECONDS_EACH" 2 8 >"$WORK/load.$i" &
	done
	wait $(jobs -p | tail -n 3)
	sleep 0.3 # the last flushes
	local requests
	requests=$(sed -n 's/.*requests=\([0-9]*\).*/\1/p' "$WORK"/load.* | awk '{ n += $1 } END { print n }')
	redis-cli -p "$redis_port" info commandstats | tr ',=:' '   ' |
		awk -v n="$requests" -v mode="$1" '/^cmdstat_/ && $1 !~ /info|ping|client|hello|select|command|config/ { calls += $3 }
			END { printf "%-13s %9d decisions %8d Redis commands %8.4f per decision\n", mode, n, calls, calls / n }'
	kill $(jobs -p) 2>/dev/null || true
	wait 2>/dev/null || true
}
run exact
run write-behind
