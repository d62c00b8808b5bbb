#!/usr/bin/env bash
# Builds the load benchmark's binaries with profile-guided optimisation, then measures
# them beside the plain release build: the sidecar, the floor (rls-floor), tonic's
# do-nothing server and the generator, every one instrumented, trained by the same short
# run of bench/load/run.sh (every server, every load, every backend), and rebuilt from the
# merged profile. The floor is optimised from its own profile exactly as the sidecar is
# from its, so the ratios stay honest.
#   bench/load/pgo.sh [SECONDS] [ROUNDS]   (the measured run's; default 2 s, 7 rounds)
# The training run lasts 1 round of 2 s per load. The measured run is run.sh with
# PGO_BIN: the optimised floor and sidecar (memory, Redis, memcached) alternate with the
# plain ones round after round. The optimised binaries stay in
# target/pgo/x86_64-unknown-linux-gnu/release (the profile in target/pgo/merged.profdata);
# `PGO_BIN=that/folder bench/load/run.sh` measures them again without rebuilding.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT="$PWD"
HOST="$(rustc -vV | sed -n 's/^host: //p')"
PACKAGES=(-p ratelimit-sidecar -p ratelimit-load-bench)
log() { printf '== %s\n' "$*" >&2; }

if ! rustup component list --installed | grep -q '^llvm-tools'; then
	log "installing rustup's llvm-tools (llvm-profdata of rustc's own LLVM)"
	rustup component add llvm-tools
fi
PROFDATA="$(rustc --print sysroot)/lib/rustlib/$HOST/bin/llvm-profdata"

# --target keeps the flags off build scripts and procedural macros: only what runs is
# instrumented, then optimised.
PROFILES="$ROOT/target/pgo/profiles"
rm -rf "$PROFILES"
log "building instrumented binaries"
RUSTFLAGS="-Cprofile-generate=$PROFILES" cargo build --quiet --release --target "$HOST" \
	--target-dir target/pgo-generate "${PACKAGES[@]}"

log "training: one short round of bench/load/run.sh on the instrumented binaries"
BIN="target/pgo-generate/$HOST/release" bench/load/run.sh 2 1 >/dev/null
# run.sh stops its servers with SIGTERM on its way out; each writes its profile as it exits.
for _ in $(seq 50); do
	pgrep -f "target/pgo-generate/$HOST/release/" >/dev/null || break
	sleep 0.2
done
if pgrep -f "target/pgo-generate/$HOST/release/" >/dev/null; then
	echo "instrumented servers still running after SIGTERM: their profiles would be missing" >&2
	exit 1
fi
"$PROFDATA" merge -o target/pgo/merged.profdata "$PROFILES"
log "profile: $(find "$PROFILES" -name '*.profraw' | wc -l) runs merged into target/pgo/merged.profdata"

log "building optimised binaries from the profile"
RUSTFLAGS="-Cprofile-use=$ROOT/target/pgo/merged.profdata" cargo build --quiet --release \
	--target "$HOST" --target-dir target/pgo "${PACKAGES[@]}"

log "measuring the optimised binaries beside the plain ones"
PGO_BIN="target/pgo/$HOST/release" bench/load/run.sh "${1:-2}" "${2:-7}"
