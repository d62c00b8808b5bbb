#!/usr/bin/env bash
# The Rate Limit Quota Service against ShouldRateLimit for the same traffic: two Envoys
# (two workers each) at RPS requests per second each for one user whose limit is LIMIT a
# minute, through the sidecar (release build, memory backend).
# - RLQS (envoy/rlqs.yaml): WINDOWS windows, each from a minute boundary for 59 s. In each,
#   the heavy user above, and light users at 20, 30, 40 and 60 % of LIMIT spread evenly
#   over both Envoys at a steady rate. Reports, per window, the heavy user's admitted /
#   LIMIT and the light users' denials (every one is false: they stay under the limit);
#   and the sidecar's CPU microseconds per Envoy request over the windows.
# - ShouldRateLimit (envoy/sidecar.yaml): the same traffic for SECONDS; reports the
#   sidecar's CPU microseconds per Envoy request.
# CPU is the sidecar process's whole user + system time over the run (from /proc), idle
# work included; the idle sidecar's CPU per second is printed for scale.
# Everything runs on loopback; h2load (nghttp2-client) sends the load.
# The figures are counts, not times: any quiet-enough machine gives the same ones.
#   bench/rlqs/run.sh [RPS=200] [LIMIT=6000] [SECONDS=20] [WINDOWS=2]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
RPS="${1:-200}" LIMIT="${2:-6000}" SECONDS_RLS="${3:-20}" WINDOWS="${4:-2}"
LIGHT_PERCENTS=(20 30 40 60)
ENVOY="${ENVOY_BIN:-$(compgen -G "$HOME/.cache/ratelimit-rs/envoy-*/lib/python3*/site-packages/envoy/_bin/envoy" | head -n 1)}"
cargo build --quiet --release -p ratelimit-sidecar
WORK="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT
mkdir -p "$WORK/current/config" "$WORK/www"
printf 'domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: %s}\n' "$LIMIT" >"$WORK/current/config/rules.yaml"

. bench/common.sh
fill() { python3 -c 'import os, re, sys; print(re.sub(r"\$\{(\w+)\}", lambda m: os.environ.get(m.group(1), m.group(0)), sys.stdin.read()), end="")'; }
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
ticks_per_second=$(getconf CLK_TCK)

UPSTREAM_PORT=$(free_port)
python3 -m http.server "$UPSTREAM_PORT" --bind 127.0.0.1 --directory "$WORK/www" >/dev/null 2>&1 &
wait_port "$UPSTREAM_PORT" 400
GRPC=$(free_port)
env RUNTIME_ROOT="$WORK/current" RUNTIME_SUBDIRECTORY= RUNTIME_APPDIRECTORY=config USE_STATSD=false \
	LOG_LEVEL=error HOST=127.0.0.1 PORT="$(free_port)" DEBUG_HOST=127.0.0.1 DEBUG_PORT="$(free_port)" \
	GRPC_HOST=127.0.0.1 GRPC_PORT="$GRPC" BACKEND_TYPE=memory target/release/ratelimit &
SIDECAR=$!
wait_port "$GRPC" 400

ENVOY_PIDS=()
envoys() { # file -> starts two Envoys on envoy/<file>; their ports in PORTS, pids in ENVOY_PIDS
	PORTS=()
	for i in 1 2; do
		local port admin
		port=$(free_port) admin=$(free_port)
		LISTEN_PORT=$port ADMIN_PORT=$admin UPSTREAM_PORT=$UPSTREAM_PORT RATELIMIT_PORT=$GRPC \
			FAILURE_MODE_DENY=false EXPIRED_RULE=DENY_ALL fill <"envoy/$1" >"$WORK/$i.$1"
		"$ENVOY" -c "$WORK/$i.$1" --concurrency 2 --log-level error --base-id $((RANDOM % 1000 + 2000)) \
			>"$WORK/envoy.$i.log" 2>&1 &
		ENVOY_PIDS+=($!)
		wait_port "$port" 400 || { cat "$WORK/envoy.$i.log" >&2; exit 1; }
		PORTS+=("$port")
	done
}

start_load() { # user seconds clients rps-per-client -> starts it on each Envoy; its outputs in OUTS
	OUTS=()
	for port in "${PORTS[@]}"; do
		local out="$WORK/h2load.$1.$port"
		h2load --h1 -c "$3" --rps "$4" -D "$2" -H "x-user: $1" "http://127.0.0.1:$port/" >"$out" 2>&1 &
		LOADS+=($!)
		OUTS+=("$out")
	done
}

counted() { # outputs... -> prints "admitted requests upstream-failures": admitted are what
	# the filter passed, 2xx and 5xx (a request whose upstream, python's http.server, failed).
	cat "$@" | awk '/^status codes:/ { ok += $3; done4 += $7; done5 += $9 }
		END { print ok + done5, ok + done4 + done5, done5 + 0 }'
}

load() { # user seconds -> runs RPS a second on each Envoy; prints "admitted requests"
	LOADS=()
	start_load "$1" "$2" 4 "$((RPS / 4))"
	wait "${LOADS[@]}"
	counted "${OUTS[@]}"
}

window() { # n -> one window of the heavy user and the light users; prints its line
	LOADS=()
	# The same users every window: the first window starts their buckets, the next ones
	# roll them over.
	start_load heavy 59 4 "$((RPS / 4))"
	local heavy=("${OUTS[@]}") lights=()
	for percent in "${LIGHT_PERCENTS[@]}"; do
		# Their share of LIMIT over the window, half on each Envoy, one request at a time.
		local per_envoy=$((LIMIT * percent / 100 / 2 / 60))
		start_load "light-$percent" 59 1 "$((per_envoy > 0 ? per_envoy : 1))"
		lights+=("${OUTS[@]}")
	done
	wait "${LOADS[@]}"
	read -r heavy_ok heavy_total heavy_5xx < <(counted "${heavy[@]}")
	read -r light_ok light_total light_5xx < <(counted "${lights[@]}")
	echo "window $1: heavy user $heavy_ok of $heavy_total admitted ($heavy_5xx of them failed upstream), limit $LIMIT: $(python3 -c "print(f'{$heavy_ok / $LIMIT:.3f}')") of the limit; light users (${LIGHT_PERCENTS[*]} % of the limit): $((light_total - light_ok)) false denials of $light_total requests ($light_5xx admitted ones failed upstream)"
	TOTAL_REQUESTS=$((TOTAL_REQUESTS + heavy_total + light_total))
}

# What the sidecar spends with no traffic at all, for scale.
before=$(cpu_ticks "$SIDECAR")
sleep 10
idle_cpu=$(( $(cpu_ticks "$SIDECAR") - before ))

envoys rlqs.yaml
curl -s -o /dev/null -H 'x-user: warmup' "http://127.0.0.1:${PORTS[0]}/"
# Whole windows: each starts just after a minute boundary and stops before the next.
TOTAL_REQUESTS=0
rlqs_cpu=0
for n in $(seq 1 "$WINDOWS"); do
	sleep $(( (60 - $(date +%s) % 60) % 60 )).3
	before=$(cpu_ticks "$SIDECAR")
	window "$n"
	rlqs_cpu=$(( rlqs_cpu + $(cpu_ticks "$SIDECAR") - before ))
done
rlqs_total=$TOTAL_REQUESTS
kill "${ENVOY_PIDS[@]}" 2>/dev/null || true
wait "${ENVOY_PIDS[@]}" 2>/dev/null || true
ENVOY_PIDS=()

envoys sidecar.yaml
load warmup 2 >/dev/null
before=$(cpu_ticks "$SIDECAR")
read -r rls_ok rls_total _ < <(load rls-user "$SECONDS_RLS")
rls_cpu=$(( $(cpu_ticks "$SIDECAR") - before ))

python3 - "$rlqs_total" "$rlqs_cpu" "$rls_ok" "$rls_total" "$rls_cpu" "$ticks_per_second" "$idle_cpu" <<'PY'
import sys
rlqs_total, rlqs_cpu, rls_ok, rls_total, rls_cpu, hz, idle = map(int, sys.argv[1:])
print(f"idle sidecar: {idle * 1000 / hz / 10:.1f} ms CPU per second")
us = lambda ticks, n: ticks * 1e6 / hz / max(n, 1)
print(f"RLQS: {rlqs_total} Envoy requests; sidecar CPU {us(rlqs_cpu, rlqs_total):.2f} us per Envoy request")
print(f"ShouldRateLimit: {rls_total} requests ({rls_ok} admitted); sidecar CPU {us(rls_cpu, rls_total):.2f} us per Envoy request")
print(f"RLQS CPU per request / ShouldRateLimit CPU per request: {us(rlqs_cpu, rlqs_total) / max(us(rls_cpu, rls_total), 1e-9):.4f}")
PY
