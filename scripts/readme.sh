#!/usr/bin/env bash
# Runs the README's command blocks marked `<!-- test: NAME -->`, as written, so that they
# cannot rot: the sidecar and its client, the sidecar following the example xDS control
# plane, the intake with the mock broker and its curl examples, and the Envoy and wasm
# walkthroughs (their `--demo` lines) up to the 429.
#
# They use the README's default ports (8080, 8081, 6070, 3000, 10000, 9901, 18000), which
# must be free. scripts/test.sh runs this after the tests, with ENVOY_BIN set.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
WORK="$(mktemp -d)"
SERVERS=()
stop() {
	for server in "${SERVERS[@]}"; do
		kill -- "-$server" 2>/dev/null || true
		wait "$server" 2>/dev/null || true
	done
	SERVERS=()
}
trap 'stop; rm -rf "$WORK"' EXIT

log() { printf '== readme: %s\n' "$*" >&2; }

# The body of the sh block that follows `<!-- test: NAME -->`.
block() {
	python3 - "$1" <<'PY'
import re, sys
text = open("README.md").read()
match = re.search(r"<!-- test: %s -->\n```sh\n(.*?)```" % re.escape(sys.argv[1]), text, re.S)
if not match:
    sys.exit("README.md has no block marked 'test: %s'" % sys.argv[1])
print(match.group(1), end="")
PY
}

for port in 8080 8081 6070 3000 10000 9901 18000; do
	if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
		echo "port $port is in use: the README's commands need it free" >&2
		exit 1
	fi
done

wait_port() { # port what
	for _ in $(seq 600); do
		(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
		sleep 0.1
	done
	echo "$2 did not open port $1; its output:" >&2
	cat "$WORK/$2.log" >&2
	exit 1
}

# Starts a block in its own process group (cargo run and what it runs stop together).
serve() { # name port
	setsid bash -c "$(block "$1")" >"$WORK/$1.log" 2>&1 &
	SERVERS+=("$!")
	wait_port "$2" "$1"
}

expect() { # what output pattern
	if ! grep -q -- "$3" <<<"$2"; then
		printf '%s: expected %s in:\n%s\n' "$1" "$3" "$2" >&2
		exit 1
	fi
}

# `cargo run -p X` builds X with only X's features, which differ from the workspace's test
# build: on a fresh clone the first run compiles for minutes. Build first, untimed, so the
# port waits below time the servers, not the compiler.
log "building what the README's commands run"
cargo build -p ratelimit-sidecar --bins
cargo build -p operations-intake
cargo build -p ratelimit-xds-example

log "the sidecar on the example rules, then its client commands"
serve sidecar 8081
out=$(bash -euo pipefail -c "$(block sidecar-client)")
expect "sidecar-client" "$out" '"overallCode":"OK"'
expect "sidecar-client" "$out" 'response: {"overallCode":"OK"'
expect "sidecar-client" "$out" 'edge'
stop

log "the sidecar following the example xDS control plane"
serve xds-server 18000
serve xds-sidecar 8081
out=$(bash -euo pipefail -c "$(block xds-client)")
expect "xds-client" "$out" '"overallCode":"OVER_LIMIT"'
expect "xds-client" "$out" 'edge'
stop

log "the intake with the mock broker, then its curl examples"
serve intake 3000
out=$(bash -euo pipefail -c "$(block intake-client)")
expect "intake-client" "$out" '"message":"Operations received and processing initiated.","id":"2026-11-22-acme-1","count":2'
expect "intake-client" "$out" '"field":"unit_cost","message":"unknown field'
expect "intake-client" "$out" '"app":"operations-service","status":"up"'
expect "intake-client" "$out" '"message":"authentication required'
expect "intake-client" "$out" 'intake_requests_total{status="202"} 1'
stop

log "the Envoy walkthroughs up to the 429"
out=$(bash -euo pipefail -c "$(block envoy)")
expect "envoy" "$out" 'request 4 as alice: 429'
log "every README block ran as written"
