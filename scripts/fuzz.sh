#!/usr/bin/env bash
# Fuzzes the parsers and the decision code (the cargo-fuzz targets in fuzz/).
#
#   scripts/fuzz.sh [seconds] [target...]
#
# Installs cargo-fuzz when it is missing, builds every target (in fuzz/target; nothing is
# rebuilt when nothing changed), then runs each target (all of them unless some are
# named) for `seconds` (default 30), as many at once as there are cores (FUZZ_JOBS
# overrides). Each target's working corpus, fuzz/corpus/<target>/, is topped up from the
# seeds kept in fuzz/seeds/<target>/ first.
#
# Prints, per target, how many inputs were run and whether a crash was found; exits
# non-zero when one was, with the input saved under fuzz/artifacts/<target>/. To look at
# one: `RUSTC_BOOTSTRAP=1 cargo fuzz run <target> <artifact>` (from the repository root)
# reruns it, `cargo fuzz tmin <target> <artifact>` minimizes it; keep minimized crashes
# in fuzz/regressions/<target>/.
#
# cargo-fuzz needs nightly features: on a stable toolchain RUSTC_BOOTSTRAP=1 enables them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
FUZZ="$ROOT/fuzz"

SECONDS_PER_TARGET="${1:-30}"
if ! [[ "$SECONDS_PER_TARGET" =~ ^[0-9]+$ ]] || [ "$SECONDS_PER_TARGET" -eq 0 ]; then
	echo "usage: $0 [seconds per target, default 30] [target...]" >&2
	exit 2
fi
shift $(($# > 0 ? 1 : 0))

log() { printf '== %s\n' "$*" >&2; }

export RUSTC_BOOTSTRAP=1
if ! cargo fuzz --version >/dev/null 2>&1; then
	log "installing cargo-fuzz"
	cargo install --locked cargo-fuzz
fi

if [ $# -gt 0 ]; then
	TARGETS=("$@")
else
	mapfile -t TARGETS < <(cargo fuzz list --fuzz-dir "$FUZZ")
	if [ ${#TARGETS[@]} -eq 0 ]; then
		echo "cargo fuzz list found no targets in $FUZZ" >&2
		exit 1
	fi
fi

# No AddressSanitizer: the code under test is safe Rust, whose memory errors the compiler
# already rules out; what libFuzzer finds here are panics (debug assertions and overflow
# checks are on), hangs and broken invariants. Without the sanitizer the build of the
# dependency tree takes minutes less, and each second fuzzes more inputs.
SANITIZER=(--sanitizer none)
log "building the fuzz targets"
build_start=$(date +%s)
cargo fuzz build --fuzz-dir "$FUZZ" "${SANITIZER[@]}"
log "built in $(($(date +%s) - build_start)) s"

LOGS="$FUZZ/target/fuzz-logs"
BIN="$FUZZ/target/$(rustc -vV | sed -n 's/^host: //p')/release"
JOBS="${FUZZ_JOBS:-$(nproc)}"
mkdir -p "$LOGS"

# Fuzzes one target (the built binary itself: no cargo, so jobs don't wait on its lock);
# its summary line goes to $LOGS/<target>.result.
fuzz_one() { # target
	local target="$1" corpus="$FUZZ/corpus/$1" output="$LOGS/$1.log" status=0
	mkdir -p "$corpus" "$FUZZ/artifacts/$target"
	if [ -d "$FUZZ/seeds/$target" ]; then
		cp -n "$FUZZ/seeds/$target"/* "$corpus"/ 2>/dev/null || true
	fi
	# -timeout: an input running longer than 10 s is reported as a hang, like a crash.
	"$BIN/$target" "$corpus" -artifact_prefix="$FUZZ/artifacts/$target/" \
		-max_total_time="$SECONDS_PER_TARGET" -timeout=10 -print_final_stats=1 \
		>"$output" 2>&1 || status=$?
	local execs corpus_size artifact line
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$output" | tail -n 1)
	if [ -z "$execs" ]; then
		# No final statistics (the process died hard): the last progress line's count.
		execs=$(sed -n 's/^#\([0-9][0-9]*\).*/\1/p' "$output" | tail -n 1)
	fi
	corpus_size=$(find "$corpus" -type f | wc -l)
	if [ "$status" -eq 0 ]; then
		line="$target: ${execs:-?} executions, corpus $corpus_size, no crash"
	else
		artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$output" | tail -n 1)
		if [ -z "$artifact" ]; then
			artifact="(no input saved: see ${output#"$ROOT"/})"
		fi
		line="CRASH in $target: ${execs:-?} executions (exit $status): $artifact"
		# What failed, for the record: the panic or sanitizer report.
		grep -m 3 -E "panicked at|ERROR: (libFuzzer|AddressSanitizer)|^SUMMARY" "$output" >&2 || true
	fi
	log "$line"
	echo "$line" >"$LOGS/$target.result"
}

log "fuzzing ${#TARGETS[@]} targets for $SECONDS_PER_TARGET s each, $JOBS at a time (logs: ${LOGS#"$ROOT"/})"
running=0
for target in "${TARGETS[@]}"; do
	rm -f "$LOGS/$target.result"
	fuzz_one "$target" &
	running=$((running + 1))
	if [ "$running" -ge "$JOBS" ]; then
		wait -n || true
		running=$((running - 1))
	fi
done
wait

echo
crashed=()
for target in "${TARGETS[@]}"; do
	if [ ! -e "$LOGS/$target.result" ]; then
		echo "CRASH in $target: the fuzzing job ended without a result" >"$LOGS/$target.result"
	fi
	cat "$LOGS/$target.result"
	if grep -q '^CRASH' "$LOGS/$target.result"; then
		crashed+=("$target")
	fi
done
if [ ${#crashed[@]} -gt 0 ]; then
	echo "crashes found in: ${crashed[*]}" >&2
	exit 1
fi
