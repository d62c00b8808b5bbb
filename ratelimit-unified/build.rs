//! Empty: cargo reads a package's build-dependencies only when it has a build script, and
//! the unified features of procedural macros and build scripts' dependencies are there.
fn main() {}
