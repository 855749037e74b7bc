//! Real redis-servers on free loopback ports: a single node, or a
//! three-master Cluster. Data is kept in an append-only file synced on
//! every write, so a node restarted on its port finds its keys (the
//! allowance's bucket, vehicle records, outbox streams) where they were.

use super::{binary, free_port, require, wait_for_child_port};
use std::path::PathBuf;
use std::process::{Child, Command};

pub struct Redis {
    pub port: u16,
    child: Option<Child>,
    binary: PathBuf,
    dir: tempfile::TempDir,
    /// Further server arguments (cluster mode).
    extra: Vec<String>,
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
                extra: Vec::new(),
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
            .args(&self.extra)
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

/// A Redis Cluster of three masters (no replicas) on loopback, each with a
/// synced append-only file, so a restarted master comes back with its
/// slots and its data. Other masters keep serving their slots while one is
/// down (`cluster-require-full-coverage no`).
pub struct RedisCluster {
    pub nodes: Vec<Redis>,
}

impl RedisCluster {
    pub fn start() -> Option<Self> {
        let server = require(
            "redis-server (apt-get install redis-server)",
            binary("redis-server"),
        )?;
        let cli = require(
            "redis-cli (apt-get install redis-tools)",
            binary("redis-cli"),
        )?;
        let mut nodes = Vec::new();
        while nodes.len() < 3 {
            // The cluster bus listens on port + 10000: both must be free.
            let port = free_port();
            if port > 55_000 || std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_err() {
                continue;
            }
            let mut node = Redis {
                port,
                child: None,
                binary: server.clone(),
                dir: tempfile::tempdir().expect("tempdir"),
                extra: vec![
                    "--cluster-enabled".into(),
                    "yes".into(),
                    "--cluster-node-timeout".into(),
                    "2000".into(),
                    "--cluster-require-full-coverage".into(),
                    "no".into(),
                ],
            };
            if node.spawn() {
                nodes.push(node);
            }
        }
        let mut create = Command::new(&cli);
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        let out = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Self { nodes };
        cluster.wait_ok();
        Some(cluster)
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Redis::url).collect()
    }

    /// Waits (≤ 30 s) until every node reports `cluster_state:ok`.
    pub fn wait_ok(&self) {
        let cli = binary("redis-cli").expect("redis-cli");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        for node in &self.nodes {
            loop {
                let out = Command::new(&cli)
                    .args(["-p", &node.port.to_string(), "cluster", "info"])
                    .output()
                    .expect("redis-cli cluster info");
                if String::from_utf8_lossy(&out.stdout).contains("cluster_state:ok") {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "node {} never reported cluster_state:ok",
                    node.port
                );
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
    }
}

/// A test config (as `GeogateProcess` writes it) with its `[state]` section
/// switched to the redis backend at `urls` (several: a Cluster's seeds),
/// 8 partitions, claiming a silent instance's entries after `claim_idle_s`.
pub fn with_shared_state(config: &str, urls: &[String], claim_idle_s: f64) -> String {
    let quoted: Vec<String> = urls.iter().map(|u| format!("\"{u}\"")).collect();
    let state = format!(
        "[state]\nbackend = \"redis\"\nurls = [{}]\ncluster = {}\npartitions = 8\nclaim_idle_s = {claim_idle_s}\n",
        quoted.join(", "),
        urls.len() > 1,
    );
    let start = config.find("[state]").expect("a [state] section");
    let end = config[start..]
        .find("\n[")
        .map_or(config.len(), |n| start + n + 1);
    format!("{}{state}{}", &config[..start], &config[end..])
}
