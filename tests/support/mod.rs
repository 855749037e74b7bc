//! Helpers shared by integration tests: locating real servers and tools,
//! and skipping loudly when they are absent.

#![allow(dead_code)]

pub mod browser;
pub mod example;
pub mod fleet;
pub mod geogate;
pub mod nats;
pub mod pki;
pub mod proxy;
pub mod redis;
pub mod webhook;

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

/// A mosquitto broker on a free loopback port, killed on drop.
pub struct Mosquitto {
    pub port: u16,
    child: std::process::Child,
    binary: PathBuf,
    conf: PathBuf,
    _dir: tempfile::TempDir,
}

impl Mosquitto {
    /// Starts mosquitto, or returns `None` (skipping loudly) when absent.
    pub fn start() -> Option<Self> {
        Self::start_with("persistence false\nmax_inflight_messages 1000\n")
    }

    /// Starts mosquitto with session persistence on disk.
    pub fn start_persistent() -> Option<Self> {
        Self::start_with("persistence true\nautosave_interval 1\nmax_inflight_messages 1000\n")
    }

    /// Starts mosquitto with no inflight limit towards subscribers, so that
    /// only the subscriber's own flow control (TCP, withheld acks) applies.
    pub fn start_unlimited_inflight() -> Option<Self> {
        Self::start_with("persistence false\nmax_inflight_messages 0\n")
    }

    /// Starts mosquitto with `extra` configuration lines.
    pub fn start_with(extra: &str) -> Option<Self> {
        let binary = require("mosquitto (apt-get install mosquitto)", binary("mosquitto"))?;
        let dir = tempfile::tempdir().expect("tempdir");
        // mosquitto started as root drops to its own user, which must be
        // able to write the persistence file here.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777));
        }
        let conf = dir.path().join("mosquitto.conf");
        let queued = if extra.contains("max_queued_messages") {
            ""
        } else {
            "max_queued_messages 200000\n"
        };
        // A free port can be taken by a parallel test before mosquitto binds
        // it: then mosquitto exits, and another port is tried.
        for _ in 0..5 {
            let port = free_port();
            std::fs::write(
                &conf,
                format!(
                    "listener {port} 127.0.0.1\nallow_anonymous true\n{extra}persistence_location {}/\n\
                     {queued}log_type error\n",
                    dir.path().display()
                ),
            )
            .expect("write mosquitto.conf");
            let mut child = Command::new(&binary)
                .arg("-c")
                .arg(&conf)
                .spawn()
                .expect("spawn mosquitto");
            if wait_for_child_port(&mut child, port) {
                return Some(Self {
                    port,
                    child,
                    binary,
                    conf,
                    _dir: dir,
                });
            }
        }
        panic!("mosquitto could not bind a free port in 5 tries");
    }

    /// Stops mosquitto cleanly (it saves its sessions) and starts it again
    /// on the same port.
    pub fn restart(&mut self) {
        self.stop();
        self.start_again();
    }

    /// Stops mosquitto cleanly (it saves its sessions).
    pub fn stop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }

    /// Starts a stopped mosquitto again on the same port.
    pub fn start_again(&mut self) {
        self.child = Command::new(&self.binary)
            .arg("-c")
            .arg(&self.conf)
            .spawn()
            .expect("respawn mosquitto");
        assert!(
            wait_for_child_port(&mut self.child, self.port),
            "mosquitto could not bind port {} again",
            self.port
        );
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// SIGKILLs a server or geogate started here, if it runs, and reaps it.
pub fn kill_and_reap(child: Option<std::process::Child>) {
    if let Some(mut child) = child {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Waits (at most 10 s) until `child` accepts connections on `port`:
/// false if it exits first (the port was taken), so the listener found is
/// never someone else's.
pub fn wait_for_child_port(child: &mut std::process::Child, port: u16) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if child.try_wait().ok().flatten().is_some() {
            return false;
        }
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            // Still ours: a child that lost the bind exits right away.
            std::thread::sleep(std::time::Duration::from_millis(50));
            return child.try_wait().ok().flatten().is_none();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "nothing listening on {port} after 10 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Waits (at most 10 s) until something accepts connections on the port.
pub fn wait_for_port(port: u16) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "nothing listening on {port} after 10 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The sync shim (`sync_shim.c`: a file's write-back modelled, for power
/// losses and failed fsyncs), built once with the system's C compiler.
pub fn sync_shim() -> Option<PathBuf> {
    static BUILT: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/support/sync_shim.c");
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sync_shim.so");
        let status = Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-Wall", "-o"])
            .arg(&out)
            .arg(&source)
            .args(["-ldl", "-lpthread"])
            .status();
        status.is_ok_and(|s| s.success()).then_some(out)
    });
    require("a C compiler (cc) for the sync shim", built.clone())
}

/// What a power loss leaves of `file` under the sync shim: cut back to its
/// length at its last sync. Returns the bytes cut.
pub fn cut_to_last_sync(file: &std::path::Path) -> u64 {
    let synced: u64 = std::fs::read_to_string(format!("{}.synced", file.display()))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let len = std::fs::metadata(file).map_or(0, |m| m.len());
    let handle = std::fs::OpenOptions::new()
        .write(true)
        .open(file)
        .expect("the file to cut");
    handle.set_len(synced.min(len)).expect("cut");
    len.saturating_sub(synced)
}

/// Collects every transition published to `geogate/events/#` on the
/// events broker at `port`, on a kept session (the broker's persistence
/// carries it across the broker's restart).
pub fn subscribe_events(
    runtime: &tokio::runtime::Runtime,
    port: u16,
) -> std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>> {
    use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let sink = got.clone();
    runtime.spawn(async move {
        let mut options = MqttOptions::new("outputs-subscriber", "127.0.0.1", port);
        options.set_clean_session(false);
        options.set_keep_alive(std::time::Duration::from_secs(5));
        let (client, mut events) = AsyncClient::new(options, 100);
        client
            .subscribe("geogate/events/#", QoS::AtLeastOnce)
            .await
            .unwrap();
        // Bounded: the test ends well within it.
        let until = tokio::time::Instant::now() + std::time::Duration::from_secs(300);
        while tokio::time::Instant::now() < until {
            match events.poll().await {
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    let _ = ready_tx.send(());
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    if let Ok(v) = serde_json::from_slice(&p.payload) {
                        sink.lock().unwrap().push(v);
                    }
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
            }
        }
        drop(client);
    });
    ready
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("subscribed to the events broker");
    got
}
