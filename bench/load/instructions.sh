#!/usr/bin/env bash
# Instructions per request of each server, under valgrind's callgrind: repeatable where
# time is not (the count does not move with the machine's speed or with other load).
# Each server runs alone under callgrind; h2load (`-c 4 -m 16`, one hot key) sends WARM
# requests, the counters are reset, then it sends COUNT more, and the instructions of
# those COUNT requests, divided by COUNT, are the figure (start-up and warm-up left out).
#   bench/load/instructions.sh [COUNT=40000] [WARM=4000] [SERVERS...]
# KEEP=DIR keeps the callgrind files (for callgrind_annotate).
# SERVERS: floor tonic memory redis memcache (default: all that can run here),
# redis-behind and memcache-behind (WRITE_BEHIND=true on the same stores), and with
# UPSTREAM_RATELIMIT_BIN set (bench/upstream/run.sh), upstream-redis and upstream-memcache:
# envoyproxy/ratelimit with GOMAXPROCS=1 on the same stores (its Go runtime counts too).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
COUNT="${1:-40000}"
WARM="${2:-4000}"
shift $(($# < 2 ? $# : 2))
SERVERS=("$@")
[ ${#SERVERS[@]} -gt 0 ] || SERVERS=(floor tonic memory redis memcache)
cargo build --quiet --release -p ratelimit-sidecar -p ratelimit-load-bench
BIN=target/release
WORK="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; [ -n "${KEEP:-}" ] && cp "$WORK"/callgrind.* "$KEEP"/ 2>/dev/null; rm -rf "$WORK"' EXIT
. bench/common.sh
bench_rules "$WORK/current/config"
"$BIN/rls-load" --frame "$WORK/frame.bin"

# valgrind names the pipes callgrind_control talks through after $HOST, which the sidecar
# reads as its HTTP address: the same value everywhere keeps the two in step.
export HOST=127.0.0.1
SIDECAR=(env RUNTIME_ROOT="$WORK/current" RUNTIME_SUBDIRECTORY= USE_STATSD=false LOG_LEVEL=error
	DISABLE_STATS=true GRPC_WORKERS=1 DEBUG_HOST=127.0.0.1 GRPC_HOST=127.0.0.1)

load() { # port count
	h2load -n "$2" -c 4 -m 16 -t 1 -d "$WORK/frame.bin" \
		-H 'content-type: application/grpc' -H 'te: trailers' \
		"http://127.0.0.1:$1/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" |
		awk '/^requests:/ && $8 != '"$2"' { print "h2load: " $0 > "/dev/stderr"; exit 1 }'
}

measure() { # name command... (@PORT@ is the gRPC port)
	local name="$1" port arg command=()
	shift
	port=$(free_port)
	for arg in "$@"; do command+=("${arg//@PORT@/$port}"); done
	local out="$WORK/callgrind.$name" i=0
	# valgrind goes after `env` and its assignments, straight before the server.
	while [ "${command[$i]}" = env ] || [[ "${command[$i]}" == *=* ]]; do i=$((i + 1)); done
	command=("${command[@]:0:$i}" valgrind --tool=callgrind --callgrind-out-file="$out.%p" "${command[@]:$i}")
	"${command[@]}" 2>"$WORK/valgrind.$name" &
	local job=$! pid
	wait_port "$port" 3000 || {
		echo "$name did not listen within 150 s under valgrind; its output:" >&2
		cat "$WORK/valgrind.$name" >&2
		exit 1
	}
	# The process valgrind runs the server in (its launcher may be another process).
	pid=$(pgrep -n -f "valgrind.*--callgrind-out-file=$out")
	load "$port" "$WARM"
	callgrind_control -z "$pid" >/dev/null
	load "$port" "$COUNT"
	callgrind_control -d "$pid" >/dev/null
	kill "$pid"
	wait "$job" 2>/dev/null || true
	# The dump taken after the counted requests: the highest-numbered part file.
	local part
	part=$(ls "$out".*.* 2>/dev/null | sort -t. -k3 -n | tail -n 1)
	awk -v n="$COUNT" -v name="$name" '/^summary:/ { printf "%-10s %8.0f instructions per request\n", name, $2 / n }' "$part"
}

start_redis() { # sets redis_port
	redis_port=$(free_port)
	redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK" >/dev/null &
	wait_port "$redis_port"
}
start_memcached() { # sets memcached_port
	memcached_port=$(free_port)
	memcached -l 127.0.0.1 -p "$memcached_port" -U 0 -t 1 -u root >/dev/null &
	wait_port "$memcached_port"
}
# Upstream reads nothing when it watches the root with an empty RUNTIME_SUBDIRECTORY.
# A server that loaded no rules answers without counting: each run must leave counters.
counted() { # name redis|memcache port
	local items
	case "$2" in
	redis) items=$(redis-cli -p "$3" dbsize) ;;
	memcache) items=$(exec 3<>"/dev/tcp/127.0.0.1/$3" && printf 'stats\r\nquit\r\n' >&3 &&
		awk '/curr_items/ { print $3 + 0 }' <&3) ;;
	esac
	[ "${items:-0}" -gt 0 ] || { echo "$1 left no counter in $2: did its rules load?" >&2; exit 1; }
}
# The commands a Redis ran per request sent (WARM + COUNT), from INFO commandstats.
commands() { # name port
	redis-cli -p "$2" info commandstats | tr ',=:' '   ' |
		awk -v n="$((WARM + COUNT))" -v name="$1" '/^cmdstat_/ && $1 !~ /info|ping|client|hello|select|command/ { calls += $3 }
			END { printf "%-10s %8.4f Redis commands per request\n", name, calls / n }'
}
# Go preempts goroutines with signals, which callgrind can trip over (an assertion in
# its signal handling): asyncpreemptoff keeps to cooperative preemption.
UPSTREAM=(env GOMAXPROCS=1 GODEBUG=asyncpreemptoff=1 RUNTIME_ROOT="$WORK/current" RUNTIME_SUBDIRECTORY= RUNTIME_APPDIRECTORY=config RUNTIME_WATCH_ROOT=false
	USE_STATSD=false DISABLE_STATS=true LOG_LEVEL=error DEBUG_HOST=127.0.0.1 GRPC_HOST=127.0.0.1)

for server in "${SERVERS[@]}"; do
	case "$server" in
	floor) measure floor "$BIN/rls-floor" 127.0.0.1:@PORT@ ;;
	tonic) measure tonic "$BIN/rls-tonic" 127.0.0.1:@PORT@ ;;
	memory) measure memory "${SIDECAR[@]}" PORT=$(free_port) DEBUG_PORT=$(free_port) GRPC_PORT=@PORT@ \
		BACKEND_TYPE=memory "$BIN/ratelimit" ;;
	redis)
		start_redis
		measure redis "${SIDECAR[@]}" PORT=$(free_port) DEBUG_PORT=$(free_port) GRPC_PORT=@PORT@ \
			BACKEND_TYPE=redis REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$redis_port" "$BIN/ratelimit"
		counted redis redis "$redis_port"
		commands redis "$redis_port" ;;
	redis-behind)
		start_redis
		measure redis-behind "${SIDECAR[@]}" PORT=$(free_port) DEBUG_PORT=$(free_port) GRPC_PORT=@PORT@ \
			BACKEND_TYPE=redis REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$redis_port" WRITE_BEHIND=true "$BIN/ratelimit"
		counted redis-behind redis "$redis_port"
		commands redis-behind "$redis_port" ;;
	memcache-behind)
		start_memcached
		measure memcache-behind "${SIDECAR[@]}" PORT=$(free_port) DEBUG_PORT=$(free_port) GRPC_PORT=@PORT@ \
			BACKEND_TYPE=memcache MEMCACHE_HOST_PORT="127.0.0.1:$memcached_port" WRITE_BEHIND=true "$BIN/ratelimit"
		counted memcache-behind memcache "$memcached_port" ;;
	memcache)
		start_memcached
		measure memcache "${SIDECAR[@]}" PORT=$(free_port) DEBUG_PORT=$(free_port) GRPC_PORT=@PORT@ \
			BACKEND_TYPE=memcache MEMCACHE_HOST_PORT="127.0.0.1:$memcached_port" "$BIN/ratelimit"
		counted memcache memcache "$memcached_port" ;;
	upstream-redis)
		start_redis
		measure upstream-redis "${UPSTREAM[@]}" PORT=$(free_port) DEBUG_PORT=$(free_port) GRPC_PORT=@PORT@ \
			BACKEND_TYPE=redis REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$redis_port" "$UPSTREAM_RATELIMIT_BIN"
		counted upstream-redis redis "$redis_port" ;;
	upstream-memcache)
		start_memcached
		measure upstream-memcache "${UPSTREAM[@]}" PORT=$(free_port) DEBUG_PORT=$(free_port) GRPC_PORT=@PORT@ \
			BACKEND_TYPE=memcache MEMCACHE_HOST_PORT="127.0.0.1:$memcached_port" "$UPSTREAM_RATELIMIT_BIN"
		counted upstream-memcache memcache "$memcached_port" ;;
	*) echo "unknown server $server" >&2; exit 2 ;;
	esac
done
