//! What the commands do beyond parsing their arguments: the demo (embedded
//! broker, pipeline, bundled capture, report) and the offline `eval` loop.
//! The binary's command bodies (text or JSON output, exit codes) are in
//! `cli/commands.rs`, compiled into the binary only.

pub mod demo;
pub mod eval;
