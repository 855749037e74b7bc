//! What the commands do beyond parsing their arguments: the demo (embedded
//! broker, pipeline, bundled capture, report) and the offline `eval` loop.
//! The binary (`src/bin/geogate/`) holds the argument parsing and the
//! command bodies' text or JSON output and exit codes.

pub mod demo;
pub mod eval;
pub mod fences_export;
