#!/usr/bin/env python3
"""Checks that the documented `cargo run` commands reuse what the test build compiled.

Usage: scripts/unified-builds.py

`cargo test --workspace` resolves each dependency's features over every package and its
dev-dependencies; `cargo run -p X` resolves them over X alone, so without
`ratelimit-unified` (the crate that names every dependency with the workspace's union of
features) a documented command after the tests compiled most of the tree again. This
compares cargo's unit graphs (`--unit-graph`, through RUSTC_BOOTSTRAP=1): a unit is the
same build when its package, target, mode, features, profile and, recursively, its
dependencies are. Every unit of each command's build must be in the test build's, but
for the command's own final binary or example. Exits 1 naming the units that would be
compiled again; `cargo hakari generate` (cargo install cargo-hakari) brings
ratelimit-unified up to date after dependencies change.
"""

import hashlib
import json
import os
import subprocess
import sys

TEST = ["test", "--workspace", "--exclude", "ratelimit-peer-bench", "--all-targets", "--no-run"]
# What the README and docs/ run with `cargo run` (scripts/readme.sh runs them).
COMMANDS = [
    ["build", "-p", "ratelimit-sidecar", "--bins"],
    ["build", "-p", "operations-intake"],
    ["build", "-p", "ratelimit-xds-example"],
    ["build", "-p", "ratelimit-core", "--examples"],
    ["build", "-p", "ratelimit-tower", "--example", "axum_api_key"],
]


def graph(args):
    env = dict(os.environ, RUSTC_BOOTSTRAP="1")
    out = subprocess.run(
        ["cargo", *args, "--unit-graph", "-Z", "unstable-options"],
        env=env, check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out)["units"]


def package(unit):
    """The package's name, from a unit's package id (`…#name@version` or `…/name#version`)."""
    tail = unit["pkg_id"].rsplit("/", 1)[-1]
    name, _, rest = tail.partition("#")
    return rest.split("@")[0] if "@" in rest else name


def identities(units):
    """Each unit's identity: its own settings and, recursively, its dependencies'."""
    memo = {}

    def identity(index):
        if index not in memo:
            unit = units[index]
            profile = {k: v for k, v in unit["profile"].items() if k != "name"}
            own = json.dumps([unit["pkg_id"].split("/")[-1], unit["target"]["name"],
                              unit["target"]["kind"], unit["mode"], sorted(unit["features"]),
                              profile, unit.get("platform")], sort_keys=True)
            deps = sorted(identity(d["index"]) for d in unit["dependencies"])
            memo[index] = hashlib.sha1("|".join([own, *deps]).encode()).hexdigest()
        return memo[index]

    return {identity(i): unit for i, unit in enumerate(units)}


def main():
    tested = identities(graph(TEST))
    failed = False
    for command in COMMANDS:
        units = graph(command)
        own = command[2]
        again = [u for key, u in identities(units).items()
                 if key not in tested and u["mode"] in ("build", "run-custom-build")
                 and not (package(u) == own and u["target"]["kind"] in (["bin"], ["example"]))]
        names = sorted({f'{package(u)} ({u["target"]["name"]})' for u in again})
        print(f"cargo {' '.join(command)}: {len(units)} units, {len(names)} built again")
        for name in names:
            print(f"  {name}")
        failed |= bool(names)
    if failed:
        print("the documented commands would compile again what the tests compiled: "
              "run `cargo hakari generate` (cargo install cargo-hakari)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
