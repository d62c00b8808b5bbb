#!/usr/bin/env bash
# Runs the command blocks marked `<!-- test: NAME -->` in README.md and in docs/*.md, as
# written, so that they cannot rot: the sidecar, its client and its 429 (README.md), the
# rule format's examples (docs/rules.md: every `rules-file-*` block, the `rules-sidecar`
# server, then every `rules-ask-*` block), the sidecar following the example xDS control
# plane (docs/xds.md), the intake with the mock broker and its curl examples
# (docs/intake.md), and the Envoy and wasm walkthroughs (their `--demo` lines,
# docs/envoy.md) up to the 429. A marked block this script does not name below is run
# once, after those, and must succeed; every name marks one block. A block followed by a
# text block marked `<!-- output: NAME -->` must print that text (check_output).
#
# They use the documented default ports (8080, 8081, 6070, 3000, 10000, 9901, 10080, 18000),
# which must be free. scripts/test.sh runs this after the tests, with ENVOY_BIN set.
set -euo pipefail
shopt -s inherit_errexit
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

shopt -s nullglob
MARKED=(README.md docs/*.md)
shopt -u nullglob

# The body of the sh block that follows `<!-- test: NAME -->`, in whichever page has it.
block() {
	python3 - "$1" "${MARKED[@]}" <<'PY'
import re, sys
name, pages = sys.argv[1], sys.argv[2:]
found = [(page, match.group(1)) for page in pages for match in re.finditer(
    r"<!-- test: %s -->\n```sh\n(.*?)```" % re.escape(name), open(page).read(), re.S)]
if len(found) != 1:
    sys.exit("%d sh blocks marked 'test: %s' in %s: there must be one"
             % (len(found), name, " ".join(pages)))
print(found[0][1], end="")
PY
}

# Checks what the block marked `test: NAME` printed (in the file OUT) against the text
# block marked `<!-- output: NAME -->`, when a page has one: line by line, the same number
# of lines, `…` in an expected line standing for any text. Exits 1 showing both.
check_output() { # name out
	python3 - "$1" "$2" "${MARKED[@]}" <<'PY'
import re, sys
name, out, pages = sys.argv[1], sys.argv[2], sys.argv[3:]
found = [match.group(1) for page in pages for match in re.finditer(
    r"<!-- output: %s -->\n```text\n(.*?)```" % re.escape(name), open(page).read(), re.S)]
if not found:
    sys.exit(0)
if len(found) > 1:
    sys.exit("%d text blocks marked 'output: %s': there must be one" % (len(found), name))
expected, actual = found[0].splitlines(), open(out).read().splitlines()
def same(want, got):
    return re.fullmatch(".*?".join(map(re.escape, want.split("\u2026"))), got) is not None
if len(expected) != len(actual) or not all(map(same, expected, actual)):
    sys.exit("'%s' printed:\n%s\nwhere its page shows:\n%s"
             % (name, "\n".join(actual), "\n".join(expected)))
PY
}

# Runs the block marked NAME to its end, checks what it printed (check_output) and prints
# it; its standard error goes to the work directory.
run_block() { # name
	if ! bash -euo pipefail -c "$(block "$1")" >"$WORK/$1.out" 2>"$WORK/$1.log"; then
		echo "the block marked '$1' failed; its output:" >&2
		cat "$WORK/$1.out" "$WORK/$1.log" >&2
		exit 1
	fi
	# Explicitly: callers run this in a command substitution, where bash drops `set -e`.
	check_output "$1" "$WORK/$1.out" || exit 1
	cat "$WORK/$1.out"
}

# Every name marked in the pages (a line of its own), in page order; a name marked twice
# is an error.
marked() {
	python3 - "${MARKED[@]}" <<'PY'
import re, sys
seen = {}
for page in sys.argv[1:]:
    for name in re.findall(r"^<!-- test: (\S+) -->$", open(page).read(), re.M):
        if name in seen:
            sys.exit("'test: %s' marks a block in %s and in %s" % (name, seen[name], page))
        seen[name] = page
        print(name)
for page in sys.argv[1:]:
    for name in re.findall(r"^<!-- output: (\S+) -->$", open(page).read(), re.M):
        if name not in seen:
            sys.exit("'output: %s' in %s follows no block marked 'test: %s'" % (name, page, name))
PY
}
NAMES="$(marked)"

for port in 8080 8081 6070 3000 10000 9901 10080 18000; do
	if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
		echo "port $port is in use: the documented commands need it free" >&2
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

# After the tests these builds reuse theirs (ratelimit-unified gives every package the
# workspace's features; scripts/test.sh checks it); run alone on a fresh clone, the first
# compiles for minutes. Build first, untimed, so the port waits below time the servers,
# not the compiler.
log "building what the documented commands run"
cargo build -p ratelimit-sidecar --bins
cargo build -p operations-intake
cargo build -p ratelimit-xds-example

log "the sidecar on the example rules, its client commands, then its 429"
serve sidecar 8081
out=$(run_block sidecar-client)
expect "sidecar-client" "$out" 'response: {"overallCode":"OK"'
# The loop counts in a one-minute window: it starts with ten seconds of it left at least.
while [ "$(date +%-S)" -ge 50 ]; do sleep 1; done
out=$(run_block sidecar-429)
expect "sidecar-429" "$out" '"overallCode":"OVER_LIMIT"'
stop

log "the sidecar following the example xDS control plane"
serve xds-server 18000
serve xds-sidecar 8081
out=$(run_block xds-client)
expect "xds-client" "$out" '"overallCode":"OVER_LIMIT"'
expect "xds-client" "$out" 'edge'
stop

log "the intake with the mock broker, then its curl examples"
serve intake 3000
out=$(run_block intake-client)
expect "intake-client" "$out" 'HTTP/1.1 202 Accepted'
expect "intake-client" "$out" 'HTTP/1.1 401 Unauthorized'
expect "intake-client" "$out" '"message":"Operations received and processing initiated.","id":"2026-11-22-acme-1","count":2'
expect "intake-client" "$out" '"field":"unit_cost","message":"unknown field'
expect "intake-client" "$out" '"app":"operations-service","status":"up"'
expect "intake-client" "$out" '"message":"authentication required'
expect "intake-client" "$out" 'intake_requests_total{status="202"} 1'
stop

log "the rule format's examples (docs/rules.md) on one sidecar"
rm -rf /tmp/ratelimit-rules
for name in $NAMES; do
	case "$name" in rules-file-*) run_block "$name" >/dev/null ;; esac
done
serve rules-sidecar 8081
# The examples count in one-minute windows: they start with 15 seconds of one left.
while [ "$(date +%-S)" -ge 45 ]; do sleep 1; done
asked=0
for name in $NAMES; do
	case "$name" in rules-ask-*) run_block "$name" >/dev/null && asked=$((asked + 1)) ;; esac
done
[ "$asked" -gt 0 ] || { echo "docs/rules.md: no block marked rules-ask-*" >&2; exit 1; }
stop

log "the Envoy walkthroughs up to the 429"
out=$(run_block envoy)
expect "envoy" "$out" 'request 4 as alice: 429'

# The blocks above, by name; any other marked block is run once and must succeed.
RAN=" sidecar sidecar-client sidecar-429 xds-server xds-sidecar xds-client intake intake-client envoy "
count=9
for name in $NAMES; do
	case "$RAN" in *" $name "*) continue ;; esac
	case "$name" in rules-*) continue ;; esac
	log "the block marked '$name'"
	timeout 600 bash -euo pipefail -c "$(block "$name")" >"$WORK/$name.out" 2>"$WORK/$name.log" || {
		echo "the block marked '$name' failed; its output:" >&2
		cat "$WORK/$name.out" "$WORK/$name.log" >&2
		exit 1
	}
	check_output "$name" "$WORK/$name.out"
	count=$((count + 1))
done
log "every marked block of README.md and docs/ ran as written ($count)"
