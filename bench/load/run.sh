#!/usr/bin/env bash
# Load benchmark of the sidecar next to the transport floor, in one run.
#
# The floor is rls-floor: hyper's HTTP/2 on a single-threaded runtime, reading each body
# and answering one pre-encoded message and `grpc-status: 0`, with no gRPC or protobuf
# work, so every microsecond above it is the server's own. rls-tonic, tonic's generated
# server answering OK without deciding, is a second reference. The servers under test are
# the sidecar on the memory backend, on Redis (exact, and write-behind) and on memcached, each pinned to CPU 0 (so
# one worker), the same memory sidecar with every statistics output on (statsd over UDP
# flushed every second, Prometheus scraped every 2 s; the other has DISABLE_STATS=true),
# and the sidecar on memory with GRPC_WORKERS=2 unpinned, against the floor on two
# threads (scaling across cores; the generator shares those cores). The load generators
# run on CPU 1: h2load (Debian's nghttp2-client, when installed) for one hot key, then
# rls-load (this folder) for 1 and 10 000 keys with p50 and p99. Every server is started
# once; each load runs on every server in turn, round after round, so that a server and
# the floor it is compared with are measured seconds apart and drift of the machine hits
# all of them alike. Each measurement also records the server's CPU time (utime + stime
# from /proc), reported per request. Next to each median ratio the run prints the lowest
# and highest of that server's ratios over the rounds: a target inside that range is not
# decided by the run.
#   bench/load/run.sh [SECONDS] [ROUNDS]   (default 2 s, 9 rounds: short measurements in many
#   rounds keep the two halves of each ratio seconds apart on a machine whose speed drifts)
# BIN=DIR measures the binaries in DIR (the sidecar, rls-floor, rls-tonic and rls-load all
# built alike) instead of building target/release. PAIR_BIN=DIR adds the floor and the
# sidecar on each backend built in DIR (named NAME-… after PAIR_NAME, default `other`) to
# the same rounds, each divided by that floor, and by the same server of $BIN in `vs base`:
# a build with profile-guided optimisation (bench/load/pgo.sh: PGO_BIN=DIR is
# PAIR_BIN=DIR PAIR_NAME=pgo), or an earlier commit's build, measured seconds apart.
# ONLY="memory redis" measures only those servers and the floors they are divided by, so
# that more rounds fit in the same time.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
SECONDS_PER_RUN="${1:-2}"
ROUNDS="${2:-9}"
if [ -z "${BIN:-}" ]; then
	cargo build --quiet --release -p ratelimit-sidecar -p ratelimit-load-bench
	BIN=target/release
fi
WORK="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
TICK="$(getconf CLK_TCK)"

. bench/common.sh
bench_rules "$WORK/current/config"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

"$BIN/rls-load" --frame "$WORK/frame.bin"

declare -A PORT PID
start() { # name cpus command... (@PORT@ in the command is the gRPC port, @FREE@ another free port)
	local name="$1" cpus="$2" arg
	shift 2
	PORT[$name]=$(free_port)
	local command=()
	for arg in "$@"; do
		arg="${arg//@PORT@/${PORT[$name]}}"
		command+=("${arg//@FREE@/$(free_port)}")
	done
	[ -z "$cpus" ] || command=(taskset -c "$cpus" "${command[@]}")
	"${command[@]}" &
	PID[$name]=$!
	wait_port "${PORT[$name]}"
}

SIDECAR=(env RUNTIME_ROOT="$WORK/current" RUNTIME_SUBDIRECTORY= USE_STATSD=false LOG_LEVEL=error
	HOST=127.0.0.1 PORT=@FREE@ DEBUG_HOST=127.0.0.1 DEBUG_PORT=@FREE@ GRPC_HOST=127.0.0.1 GRPC_PORT=@PORT@)
start floor 0 "$BIN/rls-floor" 127.0.0.1:@PORT@
start tonic 0 "$BIN/rls-tonic" 127.0.0.1:@PORT@
start floor-2w "" "$BIN/rls-floor" 127.0.0.1:@PORT@ 2
start memory 0 "${SIDECAR[@]}" BACKEND_TYPE=memory DISABLE_STATS=true "$BIN/ratelimit"
prometheus_port=$(free_port)
# Nothing listens on the statsd port: UDP datagrams are sent and dropped, as to a collector.
start sinks 0 "${SIDECAR[@]}" BACKEND_TYPE=memory USE_STATSD=true STATSD_PROTOCOL=udp \
	STATSD_HOST=127.0.0.1 STATSD_PORT=@FREE@ STATS_FLUSH_INTERVAL=1s USE_PROMETHEUS=true \
	PROMETHEUS_ADDR="127.0.0.1:$prometheus_port" "$BIN/ratelimit"
(while sleep 2; do curl -s "http://127.0.0.1:$prometheus_port/metrics" >/dev/null || true; done) &
start memory-2w "" "${SIDECAR[@]}" BACKEND_TYPE=memory GRPC_WORKERS=2 "$BIN/ratelimit"
SERVERS=(floor tonic memory sinks floor-2w memory-2w)
if command -v redis-server >/dev/null; then
	redis_port=$(free_port)
	# redis-server shares CPU 1 with the generators.
	taskset -c 1 redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
		--dir "$WORK" >/dev/null &
	wait_port "$redis_port"
	start redis 0 "${SIDECAR[@]}" BACKEND_TYPE=redis REDIS_SOCKET_TYPE=tcp \
		REDIS_URL="127.0.0.1:$redis_port" "$BIN/ratelimit"
	# The same with write-behind counters (WRITE_BEHIND=true, on the same Redis).
	start redis-behind 0 "${SIDECAR[@]}" BACKEND_TYPE=redis REDIS_SOCKET_TYPE=tcp \
		REDIS_URL="127.0.0.1:$redis_port" WRITE_BEHIND=true "$BIN/ratelimit"
	SERVERS+=(redis redis-behind)
fi
if command -v memcached >/dev/null; then
	memcached_port=$(free_port)
	# memcached shares CPU 1 with the generators, as Redis does.
	taskset -c 1 memcached -l 127.0.0.1 -p "$memcached_port" -U 0 -t 1 -u root >/dev/null &
	wait_port "$memcached_port"
	start memcache 0 "${SIDECAR[@]}" BACKEND_TYPE=memcache \
		MEMCACHE_HOST_PORT="127.0.0.1:$memcached_port" "$BIN/ratelimit"
	SERVERS+=(memcache)
fi
# UPSTREAM_RATELIMIT_BIN (bench/upstream/run.sh): envoyproxy/ratelimit on the same Redis
# and memcached, with GOMAXPROCS=1 on CPU 0 as the sidecar's one worker, and with
# GOMAXPROCS=2 unpinned beside the sidecar's two workers. It reads nothing when it watches
# the root with an empty RUNTIME_SUBDIRECTORY: it watches the config directory. Without a
# sink it logs every timer value of every request (gostats' logging sink): DISABLE_STATS
# keeps its counting and sends nothing, as the sidecar without a sink does.
if [ -n "${UPSTREAM_RATELIMIT_BIN:-}" ]; then
	UPSTREAM=(env RUNTIME_ROOT="$WORK/current" RUNTIME_SUBDIRECTORY= RUNTIME_WATCH_ROOT=false
		USE_STATSD=false DISABLE_STATS=true LOG_LEVEL=error HOST=127.0.0.1 PORT=@FREE@ DEBUG_HOST=127.0.0.1
		DEBUG_PORT=@FREE@ GRPC_HOST=127.0.0.1 GRPC_PORT=@PORT@)
	if [ -n "${redis_port:-}" ]; then
		start upstream-redis 0 "${UPSTREAM[@]}" GOMAXPROCS=1 BACKEND_TYPE=redis \
			REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$redis_port" "$UPSTREAM_RATELIMIT_BIN"
		start upstream-redis-2t "" "${UPSTREAM[@]}" GOMAXPROCS=2 BACKEND_TYPE=redis \
			REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$redis_port" "$UPSTREAM_RATELIMIT_BIN"
		start redis-2w "" "${SIDECAR[@]}" BACKEND_TYPE=redis GRPC_WORKERS=2 REDIS_SOCKET_TYPE=tcp \
			REDIS_URL="127.0.0.1:$redis_port" "$BIN/ratelimit"
		SERVERS+=(upstream-redis upstream-redis-2t redis-2w)
	fi
	if [ -n "${memcached_port:-}" ]; then
		start upstream-memcache 0 "${UPSTREAM[@]}" GOMAXPROCS=1 BACKEND_TYPE=memcache \
			MEMCACHE_HOST_PORT="127.0.0.1:$memcached_port" "$UPSTREAM_RATELIMIT_BIN"
		SERVERS+=(upstream-memcache)
	fi
fi
# PAIR_BIN=DIR: the floor and the sidecar on each backend built in DIR run beside those
# of $BIN and are measured in the same rounds.
if [ -n "${PGO_BIN:-}" ]; then
	PAIR_BIN="$PGO_BIN" PAIR_NAME=pgo
fi
PAIR="${PAIR_NAME:-other}"
if [ -n "${PAIR_BIN:-}" ]; then
	start "floor-$PAIR" 0 "$PAIR_BIN/rls-floor" 127.0.0.1:@PORT@
	start "memory-$PAIR" 0 "${SIDECAR[@]}" BACKEND_TYPE=memory DISABLE_STATS=true "$PAIR_BIN/ratelimit"
	SERVERS+=("floor-$PAIR" "memory-$PAIR")
	if [ -n "${redis_port:-}" ]; then
		start "redis-$PAIR" 0 "${SIDECAR[@]}" BACKEND_TYPE=redis REDIS_SOCKET_TYPE=tcp \
			REDIS_URL="127.0.0.1:$redis_port" "$PAIR_BIN/ratelimit"
		SERVERS+=("redis-$PAIR")
	fi
	if [ -n "${memcached_port:-}" ]; then
		start "memcache-$PAIR" 0 "${SIDECAR[@]}" BACKEND_TYPE=memcache \
			MEMCACHE_HOST_PORT="127.0.0.1:$memcached_port" "$PAIR_BIN/ratelimit"
		SERVERS+=("memcache-$PAIR")
	fi
fi
if [ -n "${ONLY:-}" ]; then
	# A paired build's server goes with the same server of this build.
	wanted=" floor $ONLY "
	[[ "$wanted" != *"-2w "* && "$wanted" != *"-2t "* ]] || wanted+="floor-2w "
	chosen=()
	for name in "${SERVERS[@]}"; do
		[[ "$wanted" != *" ${name%-"$PAIR"} "* ]] || chosen+=("$name")
	done
	SERVERS=("${chosen[@]}")
fi

# One line per measurement: round server tool keys requests errors seconds p50 p99 cpu_ticks
RESULTS="$WORK/results.tsv"
measure() { # round server load (h2load, or rls-load's key count)
	local round="$1" name="$2" load="$3" port="${PORT[$2]}" pid="${PID[$2]}" before out
	before=$(cpu_ticks "$pid")
	if [ "$load" = h2load ]; then
		out=$(taskset -c 1 h2load -D "$SECONDS_PER_RUN" -c 4 -m 16 -t 1 -d "$WORK/frame.bin" \
			-H 'content-type: application/grpc' -H 'te: trailers' \
			"http://127.0.0.1:$port/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
		awk -v r="$round" -v n="$name" -v s="$SECONDS_PER_RUN" -v t=$(($(cpu_ticks "$pid") - before)) '
			/^requests:/ { done = $8; failed = $10 + $12 }
			END { print r, n, "h2load", 1, done, failed, s, "-", "-", t }' <<<"$out" >>"$RESULTS"
	else
		out=$(taskset -c 1 "$BIN/rls-load" "127.0.0.1:$port" "$load" "$SECONDS_PER_RUN" 4 16)
		awk -v r="$round" -v n="$name" -v s="$SECONDS_PER_RUN" -v t=$(($(cpu_ticks "$pid") - before)) '
			{ for (i = 1; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
			  print r, n, "rls-load", f["keys"], f["requests"], f["errors"], s, f["p50_us"], f["p99_us"], t }' \
			<<<"$out" >>"$RESULTS"
	fi
}

LOADS=(1 10000)
! command -v h2load >/dev/null || LOADS=(h2load "${LOADS[@]}")
# Each load runs on every server back to back, so that a server and the floor it is
# compared with are measured seconds apart.
for round in $(seq "$ROUNDS"); do
	for load in "${LOADS[@]}"; do
		for name in "${SERVERS[@]}"; do
			echo "round $round/$ROUNDS: $load on $name" >&2
			measure "$round" "$name" "$load"
		done
	done
done

python3 - "$RESULTS" "$TICK" "$PAIR" <<'PY'
import collections, statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
tick = int(sys.argv[2])
pair = "-" + sys.argv[3]
by = collections.defaultdict(list)
for r, server, tool, keys, requests, errors, secs, p50, p99, ticks in rows:
    by[(tool, keys, server)].append((int(r), int(requests), int(errors), float(secs), p50, p99, int(ticks)))
print(f"{'load':<16} {'server':<12} {'req/s':>8} {'vs floor':>8} {'rounds':>9} {'CPU us/req':>10} {'x floor':>7} {'p50 us':>7} {'p99 us':>7} {'errors':>6} {'vs base':>17}")
BASE = ["floor", "tonic", "memory", "sinks", "redis", "redis-behind", "memcache", "upstream-redis",
        "upstream-memcache", "floor-2w", "memory-2w", "redis-2w", "upstream-redis-2t"]
ORDER = BASE + [s + pair for s in ("floor", "memory", "redis", "memcache")]
def rates(tool, keys, server):
    return {r: (n / s, t / tick * 1e6 / max(n, 1)) for r, n, _, s, _, _, t in by[(tool, keys, server)]}
for tool, keys in sorted({(t, k) for t, k, _ in by}, key=lambda x: (x[0], int(x[1]))):
    for server in ORDER:
        runs = by.get((tool, keys, server))
        if not runs:
            continue
        # Two workers are compared with the floor on two threads, the paired build with
        # its own floor, the rest with the floor.
        two = server.endswith("-2w") or server.endswith("-2t")
        floor = "floor-2w" if two else "floor" + pair if server.endswith(pair) else "floor"
        base = rates(tool, keys, floor)
        # The paired build against the same server of the base build, within each round.
        plain = "-"
        if server.endswith(pair):
            same = rates(tool, keys, server[: -len(pair)])
            against = [n / s / same[r][0] for r, n, _, s, _, _, _ in runs]
            plain = f"{statistics.median(against):.2f} ({min(against):.2f}-{max(against):.2f})"
        rps = statistics.median(n / s for _, n, _, s, _, _, _ in runs)
        ratios = [n / s / base[r][0] for r, n, _, s, _, _, _ in runs]
        ratio, spread = statistics.median(ratios), f"{min(ratios):.2f}-{max(ratios):.2f}"
        cpu = statistics.median(t / tick * 1e6 / max(n, 1) for _, n, _, _, _, _, t in runs)
        cpu_ratio = statistics.median(t / tick * 1e6 / max(n, 1) / base[r][1] for r, n, _, _, _, _, t in runs)
        p50 = "-" if runs[0][4] == "-" else int(statistics.median(int(x[4]) for x in runs))
        p99 = "-" if runs[0][5] == "-" else int(statistics.median(int(x[5]) for x in runs))
        errors = sum(x[2] for x in runs)
        print(f"{tool + ' keys=' + keys:<16} {server:<12} {rps:>8.0f} {ratio:>8.2f} {spread:>9} {cpu:>10.1f} {cpu_ratio:>7.2f} {p50:>7} {p99:>7} {errors:>6} {plain:>17}")
    floors = [n / s for _, n, _, s, _, _, _ in by[(tool, keys, "floor")]]
    print(f"{'':<16} the floor's req/s over the rounds: {min(floors):.0f}-{max(floors):.0f}, {max(floors) / min(floors):.2f} x apart")
print(f"median of {len(set(r[0] for r in rows))} alternating rounds; ratios are taken within a round, to the floor (memory-2w: to floor-2w; X" + pair + ": to floor" + pair + ", and to X in 'vs base'); 'rounds' is the lowest and highest of a server's ratios over the rounds")
PY
# Resident memory of each server after the rounds.
for name in "${SERVERS[@]}"; do
	awk -v name="$name" '/^VmRSS/ { printf "%-18s RSS %6.1f MB after the rounds\n", name, $2 / 1024 }' "/proc/${PID[$name]}/status"
done
