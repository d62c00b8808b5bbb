#!/usr/bin/env bash
# The sidecar side by side with envoyproxy/ratelimit's own binary, given by path:
#
#   UPSTREAM_RATELIMIT_BIN=/path/to/ratelimit bench/upstream/run.sh [STEP...]
#
# STEP (default: fleet outputs conformance):
#   fleet         upstream and the sidecar as one fleet on one Redis (single, per-second
#                 split, local over-limit cache, STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT)
#                 and one memcached, against each alone (tests/examples/upstream_fleet.rs)
#   outputs       the same calls to each: statsd, DogStatsD and Prometheus statistics,
#                 /json, /healthcheck, /rlconfig, a bad rule file's error, the exit codes
#                 of bad settings (tests/examples/upstream_outputs.rs)
#   conformance   the public conformance suite (../shared/conformance) against upstream,
#                 on Redis and on memcached
#   suites        the sidecar's own end-to-end suites named in SUITES (default: parity
#                 statistics), their Redis and memcached cases, against upstream
#                 (RATELIMIT_SERVER_BIN); a failure there is a case to explain, not a
#                 verdict, so this step reports and goes on
#   load          bench/load/run.sh with upstream beside the sidecar: requests/s, CPU per
#                 request, p99 and RSS in one alternating run (SECONDS_EACH, ROUNDS)
#   instructions  instructions per request under callgrind, the sidecar with one worker
#                 against upstream with GOMAXPROCS=1, on Redis and on memcached
#                 (bench/load/instructions.sh; COUNT and WARM as there)
#
# This repository neither holds nor builds upstream. Without UPSTREAM_RATELIMIT_BIN this
# says so and exits 0; it is not part of CI. Loopback only; it starts and stops its own
# Redis and memcached servers.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
if [ -z "${UPSTREAM_RATELIMIT_BIN:-}" ]; then
	echo "bench/upstream/run.sh compares the sidecar with envoyproxy/ratelimit: set"
	echo "UPSTREAM_RATELIMIT_BIN to the path of an envoyproxy/ratelimit binary built from"
	echo "its source (outside this repository), then run this again. Nothing was run."
	exit 0
fi
UPSTREAM="$(realpath "$UPSTREAM_RATELIMIT_BIN")"
export UPSTREAM_RATELIMIT_BIN="$UPSTREAM"
STEPS=("$@")
[ ${#STEPS[@]} -gt 0 ] || STEPS=(fleet outputs conformance)
log() { printf '== upstream: %s\n' "$*" >&2; }
CONFORMANCE="$PWD/../shared/conformance"

for step in "${STEPS[@]}"; do
	case "$step" in
	fleet)
		log "one fleet of upstream and the sidecar, against each alone"
		cargo build --quiet -p ratelimit-sidecar --bins
		cargo build --quiet -p ratelimit-tests --example upstream_fleet
		target/debug/examples/upstream_fleet
		;;
	outputs)
		log "the same calls to each, their outputs compared"
		cargo build --quiet -p ratelimit-sidecar --bins
		cargo build --quiet -p ratelimit-tests --example upstream_outputs
		target/debug/examples/upstream_outputs
		;;
	conformance)
		if [ ! -x "$CONFORMANCE/run.sh" ]; then
			log "no conformance suite at $CONFORMANCE: skipped"
			continue
		fi
		for backend in redis memcache; do
			log "the public conformance suite against upstream ($backend)"
			RL_SERVER_CMD="$UPSTREAM" ACCEPT_BACKEND="$backend" "$CONFORMANCE/run.sh" -q || true
		done
		;;
	suites)
		for suite in ${SUITES:-parity statistics}; do
			log "the sidecar's suite '$suite' against upstream (Redis and memcached cases)"
			RATELIMIT_SERVER_BIN="$UPSTREAM" cargo test --quiet -p ratelimit-sidecar --test "$suite" \
				-- redis memcache 2>&1 | grep -E '^test result|panicked at|^    [a-z_:]+$' || true
		done
		;;
	load)
		bench/load/run.sh "${SECONDS_EACH:-2}" "${ROUNDS:-5}"
		;;
	instructions)
		bench/load/instructions.sh "${COUNT:-40000}" "${WARM:-4000}" redis upstream-redis memcache upstream-memcache
		;;
	*)
		echo "unknown step $step (fleet, outputs, conformance, suites, load, instructions)" >&2
		exit 2
		;;
	esac
done
