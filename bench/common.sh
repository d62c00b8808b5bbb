# What the benchmark scripts share; each sources it from the repository's root
# (`. bench/common.sh`).

# A free TCP port on 127.0.0.1 (free when asked; the caller binds it right after).
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Waits until something listens on 127.0.0.1:$1, trying every 50 ms, $2 times at most
# (200 by default: 10 s); fails after that.
wait_port() { for _ in $(seq "${2:-200}"); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; return 1; }

# Writes $1/bench.yaml: domain `bench`, one key (`client`) whose limit no load reaches.
bench_rules() {
	mkdir -p "$1"
	cat >"$1/bench.yaml" <<'YAML'
domain: bench
descriptors:
  - key: client
    rate_limit: {unit: hour, requests_per_unit: 4000000000}
YAML
}

# Builds the release sidecar and load tools, and sets BIN to them and WORK to a new
# directory holding the bench rules (`current/config`), removed on exit after every job
# (thawed first, should one be frozen) is stopped.
bench_setup() {
	cargo build --quiet --release -p ratelimit-sidecar -p ratelimit-load-bench
	BIN=target/release
	WORK="$(mktemp -d)"
	trap 'kill -CONT $(jobs -p) 2>/dev/null || true; kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"' EXIT
	bench_rules "$WORK/current/config"
}
