//! Helpers shared by integration tests: locating real servers and tools,
//! and skipping loudly when they are absent.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// True when CI demands every real server: a missing one fails the test.
pub fn servers_required() -> bool {
    std::env::var("GEOGATE_REQUIRE_SERVERS").is_ok_and(|v| v == "1")
}

/// Skips (returns `None`) with a loud message, or panics under
/// `GEOGATE_REQUIRE_SERVERS=1`.
pub fn require<T>(what: &str, found: Option<T>) -> Option<T> {
    if found.is_none() {
        if servers_required() {
            panic!("{what} is required (GEOGATE_REQUIRE_SERVERS=1) but was not found");
        }
        eprintln!(
            "\n*** SKIPPED: {what} not found; set it up as .ci/run does to run this test ***\n"
        );
    }
    found
}

/// A Python interpreter that has Shapely 2: `$GEOGATE_PYTHON`, `.venv`, or
/// `python3`.
pub fn shapely_python() -> Option<PathBuf> {
    let candidates = [
        std::env::var("GEOGATE_PYTHON").ok().map(PathBuf::from),
        Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python")),
        Some(PathBuf::from("python3")),
    ];
    candidates.into_iter().flatten().find(|py| {
        Command::new(py)
            .args([
                "-c",
                "import shapely, sys; sys.exit(0 if shapely.__version__ >= '2' else 1)",
            ])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// An executable on PATH (or in /usr/sbin, where Debian puts mosquitto).
pub fn binary(name: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/sbin", "/usr/local/sbin"])
        .map(|dir| PathBuf::from(dir).join(name))
        .find(|p| p.is_file())
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}
