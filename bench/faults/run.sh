#!/usr/bin/env bash
# The fault schedule's long form: every fault of tests/tests/faults.rs and
# faults_cluster.rs, one at a time, with its phases (before, during and after the fault)
# and its callers multiplied by FAULTS_SCALE (4 by default), and the intake's faults of
# tests/tests/faults_intake.rs (TANSU_BIN, KAFKA_PYTHON and KAFKA_JARS set, see
# docs/testing.md).
# Each fault adds one row to the report's table
# (FAULTS_REPORT, target/faults-report.md by default), which docs/faults.md quotes.
# Usage: bench/faults/run.sh [test name filter]
set -euo pipefail
cd "$(dirname "$0")/../.."

scale=${FAULTS_SCALE:-4}
report=${FAULTS_REPORT:-$PWD/target/faults-report.md}
mkdir -p "$(dirname "$report")"
: >"$report"
# The tests start the binaries found next to them (the xDS fault runs the example
# control plane), and Envoy from ENVOY_BIN.
cargo build -p ratelimit-sidecar -p operations-intake -p ratelimit-xds-example --bins
FAULTS_SCALE=$scale FAULTS_REPORT=$report \
    cargo test -p ratelimit-tests --test faults --test faults_cluster --test faults_intake -- --test-threads=1 --nocapture "$@"
echo
echo "scale $scale, $(nproc) CPUs, $(date -u +%Y-%m-%dT%H:%MZ):"
cat "$report"
