//! No code: every third-party dependency of the workspace named with the union of the
//! features its packages ask for (`cargo hakari generate` writes the list from
//! `.config/hakari.toml`). The binaries, the examples and the tests depend on it, so
//! `cargo run -p X` builds each dependency as `cargo test --workspace` built it, and a
//! documented command run after the tests compiles nothing again
//! (`scripts/unified-builds.py` checks it). The engine's library, the protocol crate and
//! the filter do not: what they link stays theirs alone.
