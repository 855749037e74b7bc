//! A real redis-server on a free loopback port, for the global allowance's
//! shared bucket. Data is kept in an append-only file synced on every
//! write, so a server restarted on its port finds its keys (the bucket)
//! where they were.

use super::{binary, free_port, require, wait_for_child_port};
use std::path::PathBuf;
use std::process::{Child, Command};

pub struct Redis {
    pub port: u16,
    child: Option<Child>,
    binary: PathBuf,
    dir: tempfile::TempDir,
}

impl Redis {
    /// Starts redis-server, or returns `None` (skipping loudly) when absent.
    pub fn start() -> Option<Self> {
        let binary = require(
            "redis-server (apt-get install redis-server)",
            binary("redis-server"),
        )?;
        // A free port can be taken by a parallel test before redis binds
        // it: then redis exits, and another port is tried.
        for _ in 0..5 {
            let mut redis = Self {
                port: free_port(),
                child: None,
                binary: binary.clone(),
                dir: tempfile::tempdir().expect("tempdir"),
            };
            if redis.spawn() {
                return Some(redis);
            }
        }
        panic!("redis-server could not bind a free port in 5 tries");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) -> bool {
        let mut child = Command::new(&self.binary)
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--loglevel", "warning"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        let up = wait_for_child_port(&mut child, self.port);
        self.child = Some(child);
        up
    }

    /// Stops the server (SIGKILL: what it acknowledged is in its synced
    /// append-only file); connections to the port are refused until
    /// [`Self::start_again`].
    pub fn stop(&mut self) {
        super::kill_and_reap(self.child.take());
    }

    /// Starts the server again on the same port, with the same data.
    pub fn start_again(&mut self) {
        assert!(
            self.spawn(),
            "redis-server could not bind port {} again",
            self.port
        );
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}
