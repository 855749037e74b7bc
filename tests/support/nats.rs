//! A real nats-server with JetStream on a free loopback port, its store in
//! a directory of its own, so a server started again on the port finds its
//! streams where they were. Optionally with its MQTT listener and the
//! partition mapping README gives (decision 0025).

use super::{binary, free_port, require, wait_for_child_port};
use std::path::PathBuf;
use std::process::{Child, Command};

pub struct Nats {
    pub port: u16,
    /// The MQTT listener's port, when started with partitions.
    pub mqtt_port: Option<u16>,
    /// The partition count the mapping spreads device topics over.
    partitions: Option<u32>,
    /// More of the server's config (TLS, users).
    extra: String,
    child: Option<Child>,
    binary: PathBuf,
    dir: tempfile::TempDir,
}

impl Nats {
    /// Starts nats-server, or returns `None` (skipping loudly) when absent.
    pub fn start() -> Option<Self> {
        Self::start_with(None, "")
    }

    /// Starts nats-server with `extra` added to its config (a `tls`
    /// block, an `authorization` block).
    pub fn start_configured(extra: &str) -> Option<Self> {
        Self::start_with(None, extra)
    }

    /// Starts nats-server with its MQTT listener, device topics mapped to
    /// `partitions` partitions.
    pub fn start_partitioned(partitions: u32) -> Option<Self> {
        Self::start_with(Some(partitions), "")
    }

    /// Starts nats-server with its MQTT listener and mapping, and `extra`
    /// added to its config (users and their permissions).
    pub fn start_partitioned_with(partitions: u32, extra: &str) -> Option<Self> {
        Self::start_with(Some(partitions), extra)
    }

    fn start_with(partitions: Option<u32>, extra: &str) -> Option<Self> {
        let binary = require(
            "nats-server (apt-get install nats-server)",
            binary("nats-server"),
        )?;
        for _ in 0..5 {
            let mut nats = Self {
                port: free_port(),
                mqtt_port: partitions.map(|_| free_port()),
                partitions,
                extra: extra.to_owned(),
                child: None,
                binary: binary.clone(),
                dir: tempfile::tempdir().expect("tempdir"),
            };
            if nats.spawn() {
                return Some(nats);
            }
        }
        panic!("nats-server could not bind a free port in 5 tries");
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) -> bool {
        let config = self.dir.path().join("nats.conf");
        let mut text = format!(
            "listen: 127.0.0.1:{}\nserver_name: geogate-test\njetstream {{ store_dir: \"{}\" }}\n",
            self.port,
            self.dir.path().join("js").display()
        );
        if let (Some(mqtt), Some(n)) = (self.mqtt_port, self.partitions) {
            text.push_str(&format!(
                "mqtt {{ listen: 127.0.0.1:{mqtt} }}\nmappings = {{\n  \"fleet.*.telemetry\": \"in.{{{{partition({n},1)}}}}.fleet.{{{{wildcard(1)}}}}.telemetry\"\n  \"owntracks.*.*\": \"in.{{{{partition({n},1,2)}}}}.owntracks.{{{{wildcard(1)}}}}.{{{{wildcard(2)}}}}\"\n}}\n"
            ));
        }
        text.push_str(&self.extra);
        std::fs::write(&config, text).expect("write nats.conf");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("nats.log"))
            .expect("nats.log");
        let mut child = Command::new(&self.binary)
            .arg("-c")
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn nats-server");
        let up = wait_for_child_port(&mut child, self.port)
            && self
                .mqtt_port
                .is_none_or(|mqtt| wait_for_child_port(&mut child, mqtt));
        self.child = Some(child);
        up
    }

    /// The last lines the server logged (warnings and errors), for a
    /// failure's message.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("nats.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        // A server that panicked: from its panic on, or the last lines.
        let from = lines
            .iter()
            .position(|l| l.starts_with("panic:"))
            .unwrap_or(lines.len().saturating_sub(30));
        lines[from..lines.len().min(from + 12)].join("\n")
    }

    /// SIGKILLs the server.
    pub fn stop(&mut self) {
        super::kill_and_reap(self.child.take());
    }

    /// Starts the server again on the same port, with the same store.
    pub fn start_again(&mut self) {
        assert!(self.spawn(), "nats-server did not come back on its port");
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.stop();
    }
}
