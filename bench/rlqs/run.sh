#!/usr/bin/env bash
# The Rate Limit Quota Service against ShouldRateLimit for the same traffic: two Envoys
# (two workers each) at RPS requests per second each for one user whose limit is LIMIT a
# minute, through the sidecar (release build, memory backend).
# - RLQS (envoy/rlqs.yaml): starts at a minute boundary and runs for one window; reports
#   admitted / LIMIT and the sidecar's CPU microseconds per Envoy request.
# - ShouldRateLimit (envoy/sidecar.yaml): the same traffic for SECONDS; reports the
#   sidecar's CPU microseconds per Envoy request.
# CPU is the sidecar process's whole user + system time over the run (from /proc), idle
# work included; the idle sidecar's CPU per second is printed for scale.
# Everything runs on loopback; h2load (nghttp2-client) sends the load.
#   bench/rlqs/run.sh [RPS=200] [LIMIT=6000] [SECONDS=20]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
RPS="${1:-200}" LIMIT="${2:-6000}" SECONDS_RLS="${3:-20}"
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

envoys() { # file -> starts two Envoys on envoy/<file>; their ports in PORTS
	PORTS=()
	for i in 1 2; do
		local port admin
		port=$(free_port) admin=$(free_port)
		LISTEN_PORT=$port ADMIN_PORT=$admin UPSTREAM_PORT=$UPSTREAM_PORT RATELIMIT_PORT=$GRPC \
			FAILURE_MODE_DENY=false EXPIRED_RULE=DENY_ALL fill <"envoy/$1" >"$WORK/$i.$1"
		"$ENVOY" -c "$WORK/$i.$1" --concurrency 2 --log-level error --base-id $((RANDOM % 1000 + 2000)) \
			>"$WORK/envoy.$i.log" 2>&1 &
		wait_port "$port" 400 || { cat "$WORK/envoy.$i.log" >&2; exit 1; }
		PORTS+=("$port")
	done
}

load() { # user seconds -> runs RPS a second on each Envoy; prints "admitted requests"
	local outs=()
	for port in "${PORTS[@]}"; do
		h2load --h1 -c 4 --rps "$((RPS / 4))" -D "$2" -H "x-user: $1" "http://127.0.0.1:$port/" >"$WORK/h2load.$port" 2>&1 &
		outs+=("$WORK/h2load.$port")
	done
	wait $(jobs -p | tail -n 2)
	cat "${outs[@]}" | awk '/^status codes:/ { ok += $3; done4 += $7 } END { print ok, ok + done4 }'
}

# What the sidecar spends with no traffic at all, for scale.
before=$(cpu_ticks "$SIDECAR")
sleep 10
idle_cpu=$(( $(cpu_ticks "$SIDECAR") - before ))

envoys rlqs.yaml
curl -s -o /dev/null -H 'x-user: warmup' "http://127.0.0.1:${PORTS[0]}/"
# One full window: start just after a minute boundary, stop before the next.
sleep $(( (60 - $(date +%s) % 60) % 60 )).3
before=$(cpu_ticks "$SIDECAR")
read -r rlqs_ok rlqs_total < <(load rlqs-user 59)
rlqs_cpu=$(( $(cpu_ticks "$SIDECAR") - before ))
kill $(jobs -p | grep -v "^$SIDECAR$" | tail -n 2) 2>/dev/null || true

envoys sidecar.yaml
load warmup 2 >/dev/null
before=$(cpu_ticks "$SIDECAR")
read -r rls_ok rls_total < <(load rls-user "$SECONDS_RLS")
rls_cpu=$(( $(cpu_ticks "$SIDECAR") - before ))

python3 - "$rlqs_ok" "$rlqs_total" "$rlqs_cpu" "$rls_ok" "$rls_total" "$rls_cpu" "$LIMIT" "$ticks_per_second" "$idle_cpu" <<'PY'
import sys
rlqs_ok, rlqs_total, rlqs_cpu, rls_ok, rls_total, rls_cpu, limit, hz, idle = map(int, sys.argv[1:])
print(f"idle sidecar: {idle * 1000 / hz / 10:.1f} ms CPU per second")
us = lambda ticks, n: ticks * 1e6 / hz / max(n, 1)
print(f"RLQS: {rlqs_ok} of {rlqs_total} admitted in one window, limit {limit}: accuracy {rlqs_ok / limit:.3f}; "
      f"sidecar CPU {us(rlqs_cpu, rlqs_total):.2f} us per Envoy request")
print(f"ShouldRateLimit: {rls_total} requests ({rls_ok} admitted); sidecar CPU {us(rls_cpu, rls_total):.2f} us per Envoy request")
print(f"RLQS CPU per request / ShouldRateLimit CPU per request: {us(rlqs_cpu, rlqs_total) / max(us(rls_cpu, rls_total), 1e-9):.4f}")
PY
