//! The webhook receiver (`webhook_receiver.py`): a real HTTP server on
//! loopback that verifies signatures on its own and answers as told.

#![allow(dead_code)]

use super::{free_port, require, wait_for_child_port};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

pub struct WebhookReceiver {
    pub port: u16,
    secret: String,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl WebhookReceiver {
    /// Starts the receiver checking signatures with `secret`, or returns
    /// `None` (skipping loudly) without python3.
    pub fn start(secret: &str) -> Option<Self> {
        require("python3", super::binary("python3"))?;
        let mut receiver = Self {
            port: free_port(),
            secret: secret.to_owned(),
            child: None,
            dir: tempfile::tempdir().expect("tempdir"),
        };
        receiver.answer(r#"{"status": 200}"#);
        receiver.start_again();
        Some(receiver)
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hooks/geogate", self.port)
    }

    /// How it answers from the next request on (see the script).
    pub fn answer(&self, control: &str) {
        std::fs::write(self.dir.path().join("control.json"), control).expect("control");
    }

    pub fn stop(&mut self) {
        super::kill_and_reap(self.child.take());
    }

    /// Starts it (again) on its port.
    pub fn start_again(&mut self) {
        let script =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/support/webhook_receiver.py");
        for _ in 0..50 {
            let mut child = Command::new("python3")
                .arg(&script)
                .arg(self.port.to_string())
                .arg(&self.secret)
                .arg(self.log())
                .arg(self.dir.path().join("control.json"))
                .spawn()
                .expect("spawn the webhook receiver");
            if wait_for_child_port(&mut child, self.port) {
                self.child = Some(child);
                return;
            }
            // The port is still held by the last one's closing sockets.
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("the webhook receiver could not bind port {}", self.port);
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("requests.ndjson")
    }

    /// Every request so far, as the receiver logged it.
    pub fn requests(&self) -> Vec<serde_json::Value> {
        read_lines(&self.log())
    }

    /// The ids of transitions in requests it accepted (2xx), in arrival
    /// order, with their vehicles and seqs.
    pub fn accepted(&self) -> Vec<(String, String, u64)> {
        let mut out = Vec::new();
        for r in self.requests() {
            if !(200..300).contains(&r["status"].as_u64().unwrap_or(0)) {
                continue;
            }
            let ids = r["ids"].as_array().cloned().unwrap_or_default();
            let vehicles = r["vehicles"].as_array().cloned().unwrap_or_default();
            let seqs = r["seqs"].as_array().cloned().unwrap_or_default();
            for ((id, vehicle), seq) in ids.iter().zip(&vehicles).zip(&seqs) {
                out.push((
                    id.as_str().unwrap_or("").to_owned(),
                    vehicle.as_str().unwrap_or("").to_owned(),
                    seq.as_u64().unwrap_or(0),
                ));
            }
        }
        out
    }
}

fn read_lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

impl Drop for WebhookReceiver {
    fn drop(&mut self) {
        self.stop();
    }
}
