//! The `rdmx` command.
fn main() {}
