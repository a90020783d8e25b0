//! Present only so that the build-dependencies in `Cargo.toml` take part in feature
//! resolution (they unify the build scripts' features across the workspace's builds).
fn main() {}
