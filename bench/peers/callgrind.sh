#!/usr/bin/env bash
# Instructions per call of the prepared keyed check, the full decision and governor's
# keyed check, on each workload of `src/lib.rs`, under valgrind's callgrind: each engine
# runs N and 2N calls and the difference over N is its cost per call. Only instructions
# inside the calls are collected, so that setup (governor calibrates its clock, which
# takes a different number of instructions each run) does not leak into the difference.
# Deterministic, so it can run while the machine is busy (the timed comparison is
# `cargo bench -p ratelimit-peer-bench --bench peers`). The last line is
# `prepared_over_governor_instructions <the worst ratio>`.
#   bench/peers/callgrind.sh [N]   (default 100000)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
N="${1:-100000}"
cargo build --quiet --profile bench -p ratelimit-peer-bench --bin per-call
BIN=target/release/per-call
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

instructions() { # workload engine calls
	valgrind --tool=callgrind --callgrind-out-file="$WORK/out" --collect-atstart=no \
		'--toggle-collect=ratelimit_peer_bench::Workload::*::{{closure}}' \
		"$BIN" "$1" "$2" "$3" 2>"$WORK/log" ||
		{ cat "$WORK/log" >&2; return 1; }
	sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$WORK/log"
}

per_call() { # workload engine
	local one two
	one="$(instructions "$1" "$2" "$N")"
	two="$(instructions "$1" "$2" "$((2 * N))")"
	echo $(((two - one) / N))
}

worst=0
printf '%-26s %10s %10s %10s %8s\n' workload prepared full governor ratio
for workload in token_bucket_hot_key token_bucket_10000_keys fixed_window_hot_key fixed_window_10000_keys; do
	prepared="$(per_call "$workload" prepared)"
	full="$(per_call "$workload" full)"
	governor="$(per_call "$workload" governor)"
	ratio="$(awk -v p="$prepared" -v g="$governor" 'BEGIN { printf "%.2f", p / g }')"
	worst="$(awk -v r="$ratio" -v w="$worst" 'BEGIN { print (r > w ? r : w) }')"
	printf '%-26s %10s %10s %10s %8s\n' "$workload" "$prepared" "$full" "$governor" "$ratio"
done
echo "prepared_over_governor_instructions $worst"
