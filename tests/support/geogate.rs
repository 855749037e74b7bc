//! Runs the real `geogate` binary against a broker, as an operator would.

#![allow(dead_code)]

use super::free_port;
use rumqttc::{AsyncClient, Event, MqttOptions, Outgoing, Packet, QoS};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Two 0.01° squares side by side near (10°E, 50°N), plus room around them.
pub const FENCES_AB: &str = r#"{"type":"FeatureCollection","features":[
 {"type":"Feature","id":"A","properties":{},"geometry":{"type":"Polygon","coordinates":[[[10.00,50.00],[10.01,50.00],[10.01,50.01],[10.00,50.01],[10.00,50.00]]]}},
 {"type":"Feature","id":"B","properties":{},"geometry":{"type":"Polygon","coordinates":[[[10.02,50.00],[10.03,50.00],[10.03,50.01],[10.02,50.01],[10.02,50.00]]]}}]}"#;

pub struct GeogateProcess {
    pub dir: PathBuf,
    pub metrics_port: u16,
    child: Option<Child>,
    args: Vec<String>,
    /// Run as this user id (a root test runner dropping privileges).
    uid: Option<u32>,
    /// `GEOGATE_CRASH_POINT` for the next spawn (see `crash_point`).
    crash_point: Option<String>,
    /// Arguments added to the next spawns (see [`Self::set_args`]).
    extra_args: Vec<String>,
    /// Environment added to the next spawns (see [`Self::set_env`]).
    extra_env: Vec<(String, String)>,
}

/// Settings that vary between tests.
pub struct Setup<'a> {
    pub broker_port: u16,
    pub embedded: bool,
    pub client_id: &'a str,
    pub extra_pipeline: &'a str,
    pub gate: &'a str,
    /// Also publish transitions to `geogate/events/{vehicle}`.
    pub events_mqtt: bool,
    /// Extra lines at the end of `[mqtt]` (credentials, a `[mqtt.tls]` table).
    pub extra_mqtt: &'a str,
}

impl GeogateProcess {
    pub fn config(dir: &Path, setup: &Setup, metrics_port: u16) -> String {
        format!(
            r#"
[mqtt]
host = "127.0.0.1"
port = {port}
client_id = "{client_id}"
topics = ["fleet/+/telemetry", "owntracks/+/+"]
max_unacked = 1000
{extra_mqtt}
[embedded_broker]
port = {port}
[pipeline]
shards = 2
{extra}
[gate]
{gate}
[fences]
path = "{dir}/fences.geojson"
[dead_letter]
path = "{dir}/dead-letter.ndjson"
[events]
path = "{dir}/events.ndjson"
mqtt = {events_mqtt}
[state]
path = "{dir}/state.sqlite"
[metrics]
listen = "127.0.0.1:{metrics_port}"
"#,
            port = setup.broker_port,
            client_id = setup.client_id,
            extra = setup.extra_pipeline,
            gate = setup.gate,
            dir = dir.display(),
            events_mqtt = setup.events_mqtt,
            extra_mqtt = setup.extra_mqtt,
        )
    }

    /// Writes the config (and `fences` if none yet) into `dir`, starts, and
    /// waits until geogate has connected to its broker.
    pub fn start(dir: &Path, setup: &Setup) -> Self {
        let p = Self::launch(dir, setup);
        p.wait_for_log("subscribed", 1);
        p
    }

    /// Like [`Self::start`] without waiting for a connection (for tests of
    /// refused connections).
    pub fn launch(dir: &Path, setup: &Setup) -> Self {
        Self::launch_with(dir, setup, |config| config, None)
    }

    /// Like [`Self::launch`], with the config text edited by `edit` and the
    /// process run as user `uid`.
    pub fn launch_with(
        dir: &Path,
        setup: &Setup,
        edit: impl FnOnce(String) -> String,
        uid: Option<u32>,
    ) -> Self {
        let mut p = Self::prepare(dir, setup, edit);
        p.uid = uid;
        p.spawn();
        p
    }

    /// Writes the config (edited by `edit`) and fences, and starts nothing:
    /// environment and crash point are set before the first
    /// [`Self::restart`].
    pub fn prepare(dir: &Path, setup: &Setup, edit: impl FnOnce(String) -> String) -> Self {
        let metrics_port = free_port();
        if !dir.join("fences.geojson").exists() {
            std::fs::write(dir.join("fences.geojson"), FENCES_AB).expect("fences");
        }
        std::fs::write(
            dir.join("geogate.toml"),
            edit(Self::config(dir, setup, metrics_port)),
        )
        .expect("config");
        let mut args = vec![
            "run".to_owned(),
            "--config".to_owned(),
            dir.join("geogate.toml").display().to_string(),
        ];
        if setup.embedded {
            args.push("--embedded-broker".into());
        }
        Self {
            dir: dir.to_owned(),
            metrics_port,
            child: None,
            args,
            uid: None,
            crash_point: None,
            extra_args: Vec::new(),
            extra_env: Vec::new(),
        }
    }

    /// Like [`Self::start`], but the process stops at crash point `point`
    /// (`name` or `name:n`) for the test to kill it there.
    pub fn start_stopping_at(dir: &Path, setup: &Setup, point: &str) -> Self {
        let metrics_port = free_port();
        if !dir.join("fences.geojson").exists() {
            std::fs::write(dir.join("fences.geojson"), FENCES_AB).expect("fences");
        }
        std::fs::write(
            dir.join("geogate.toml"),
            Self::config(dir, setup, metrics_port),
        )
        .expect("config");
        let mut p = Self {
            dir: dir.to_owned(),
            metrics_port,
            child: None,
            args: vec![
                "run".to_owned(),
                "--config".to_owned(),
                dir.join("geogate.toml").display().to_string(),
            ],
            uid: None,
            crash_point: Some(point.to_owned()),
            extra_args: Vec::new(),
            extra_env: Vec::new(),
        };
        p.spawn();
        p.wait_for_log("subscribed", 1);
        p
    }

    /// Waits (≤ 60 s) until the process has stopped at its crash point.
    pub fn wait_for_crash_point(&self) {
        let point = self
            .crash_point
            .clone()
            .expect("started with a crash point");
        let name = point.split(':').next().unwrap_or(&point).to_owned();
        let deadline = Instant::now() + Duration::from_secs(60);
        let needle = format!("crash point {name} reached");
        loop {
            let log = std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default();
            if log.contains(&needle) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "never reached {point}:\n{}",
                log.lines().rev().take(30).collect::<Vec<_>>().join("\n")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `GEOGATE_CRASH_POINT` for the next [`Self::restart`] (`None`: run
    /// through).
    pub fn set_crash_point(&mut self, point: Option<&str>) {
        self.crash_point = point.map(str::to_owned);
    }

    /// Extra arguments for the next spawns (e.g. `--reset-state`).
    pub fn set_args(&mut self, extra: &[&str]) {
        self.extra_args = extra.iter().map(|a| a.to_string()).collect();
    }

    /// An environment variable for the next spawns.
    pub fn set_env(&mut self, name: &str, value: &str) {
        self.extra_env.push((name.to_owned(), value.to_owned()));
    }

    /// Starts the process. The metrics port was picked by binding and
    /// releasing it, so a parallel test can take it first: geogate then
    /// exits naming the address, and it is started again on a fresh port
    /// (the failed attempt's lines are taken back out of the log).
    fn spawn(&mut self) {
        let log_path = self.dir.join("stderr.log");
        for _ in 0..5 {
            let before = std::fs::read_to_string(&log_path).unwrap_or_default();
            self.spawn_once();
            if !self.lost_metrics_port(before.len()) {
                return;
            }
            std::fs::write(&log_path, before).expect("log");
            let config = PathBuf::from(&self.args[2]);
            let text = std::fs::read_to_string(&config).expect("config");
            let old = format!("listen = \"127.0.0.1:{}\"", self.metrics_port);
            self.metrics_port = free_port();
            let new = format!("listen = \"127.0.0.1:{}\"", self.metrics_port);
            std::fs::write(&config, text.replace(&old, &new)).expect("config");
        }
        panic!("no free port for geogate's metrics in 5 attempts");
    }

    /// Waits (≤ 20 s) until the process has bound its metrics port (true
    /// if it exited because the port was taken).
    fn lost_metrics_port(&mut self, log_offset: usize) -> bool {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let log = std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default();
            let new = log.get(log_offset..).unwrap_or("");
            if new.contains("metrics on http://") {
                return false;
            }
            let exited = self
                .child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
            if exited {
                // Read again: the last lines may have landed after the look.
                let log = std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default();
                let new = log.get(log_offset..).unwrap_or("");
                return new.contains("metrics exporter") && new.contains("Address already in use");
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn spawn_once(&mut self) {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("stderr.log"))
            .expect("log");
        let mut command = Command::new(env!("CARGO_BIN_EXE_geogate"));
        command
            .args(&self.args)
            .args(&self.extra_args)
            // As shipped: huge pages off (`huge_pages::keep_off_unless_asked`),
            // unless a test sets the switch.
            .env_remove("MIMALLOC_ALLOW_THP")
            .envs(self.extra_env.iter().map(|(n, v)| (n, v)))
            .stdout(Stdio::piped())
            .stderr(stderr);
        // A crash point applies to one run: the restart runs through.
        match self.crash_point.take() {
            Some(point) => {
                command.env("GEOGATE_CRASH_POINT", &point);
                self.crash_point = Some(point);
            }
            None => {
                command.env_remove("GEOGATE_CRASH_POINT");
            }
        }
        if let Some(uid) = self.uid {
            use std::os::unix::process::CommandExt;
            command.uid(uid).gid(uid);
        }
        let child = command.spawn().expect("spawn geogate");
        self.child = Some(child);
    }

    /// Waits (≤ 20 s) until stderr.log holds `needle` at least `times` times.
    pub fn wait_for_log(&self, needle: &str, times: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let log = std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default();
            if log.matches(needle).count() >= times {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no {needle:?} in geogate's log:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill {sig} failed");
    }

    /// SIGKILL, and wait for the process to be gone. A crash point it was
    /// started with does not apply to the restart.
    pub fn kill(&mut self) {
        self.signal("-KILL");
        let _ = self.child.take().expect("running").wait();
        self.crash_point = None;
    }

    /// Starts the process again with the same config (after [`Self::kill`]
    /// or [`Self::terminate`]), and waits for its subscription.
    pub fn restart(&mut self) {
        self.restart_until("subscribed");
    }

    /// Starts the process again and waits until its log says `needle`
    /// once more.
    pub fn restart_until(&mut self, needle: &str) {
        let before = std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default();
        self.spawn();
        self.wait_for_log(needle, before.matches(needle).count() + 1);
    }

    /// Starts the process again without waiting for a connection (for a
    /// start that is meant to be refused).
    pub fn restart_refused(&mut self) {
        self.spawn();
    }

    pub fn sighup(&self) {
        self.signal("-HUP");
    }

    /// SIGKILL, then start again with the same config.
    pub fn kill_and_restart(&mut self) {
        self.kill();
        self.restart();
    }

    /// Waits (≤ 20 s) for a process that is meant to refuse to start;
    /// returns its exit status and stderr.
    /// Waits for a refused start, and checks that it failed saying
    /// `said`; its log.
    pub fn refused_saying(&mut self, said: &str) -> String {
        let (status, log) = self.wait_refused();
        assert!(!status.success(), "{log}");
        assert!(log.contains(said), "no {said:?} in the log:\n{log}");
        log
    }

    pub fn wait_refused(&mut self) -> (std::process::ExitStatus, String) {
        let mut child = self.child.take().expect("running");
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break status;
            }
            assert!(Instant::now() < deadline, "geogate kept running");
            std::thread::sleep(Duration::from_millis(50));
        };
        let log = std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default();
        (status, log)
    }

    /// SIGTERM; returns (exit success, stdout).
    pub fn terminate(mut self) -> (bool, String) {
        self.stop()
    }

    /// SIGTERM and wait, keeping the handle for [`Self::restart`].
    pub fn stop(&mut self) -> (bool, String) {
        self.signal("-TERM");
        let mut child = self.child.take().expect("running");
        let deadline = Instant::now() + Duration::from_secs(30);
        while child.try_wait().expect("wait").is_none() {
            assert!(
                Instant::now() < deadline,
                "geogate did not exit within 30 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let status = child.wait().expect("status");
        let mut out = String::new();
        child
            .stdout
            .take()
            .expect("stdout")
            .read_to_string(&mut out)
            .expect("read stdout");
        if !status.success() {
            // Shown with a failing test's output; the log goes with the
            // test's temporary directory.
            let log = std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default();
            eprintln!("geogate exited with {status} after SIGTERM; stdout:\n{out}\nstderr:\n{log}");
        }
        (status.success(), out)
    }

    /// Sums each `geogate_*` metric over its labels, from `/metrics`.
    pub fn metrics(&self) -> HashMap<String, f64> {
        scrape(self.metrics_port)
    }

    /// One metric summed over its labels (0 when absent).
    pub fn metric(&self, name: &str) -> f64 {
        self.metrics().get(name).copied().unwrap_or(0.0)
    }

    /// One series by its exact text, e.g. `geogate_sink_healthy{sink="events"}`
    /// (0 when absent).
    pub fn series(&self, series: &str) -> f64 {
        scrape_series(self.metrics_port)
            .get(series)
            .copied()
            .unwrap_or(0.0)
    }

    /// Waits (≤ `secs`) until `received` reaches `n` and all of it is done.
    pub fn wait_processed(&self, n: f64, secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let m = self.metrics();
            let received = m
                .get("geogate_events_received_total")
                .copied()
                .unwrap_or(0.0);
            if received >= n && finished(&m) >= received {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not processed within {secs} s: {m:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for GeogateProcess {
    fn drop(&mut self) {
        super::kill_and_reap(self.child.take());
    }
}

/// Sums each `geogate_*` metric over its labels, from `/metrics` on `port`.
/// Messages finished, by the accounting line's terms, from one instance's
/// metrics: a fix that left its reorder window is in the evaluated metric
/// and the released one, and finished once, as held.
pub fn finished(m: &HashMap<String, f64>) -> f64 {
    let get = |k: &str| m.get(k).copied().unwrap_or(0.0);
    get("geogate_events_invalid_total")
        + get("geogate_messages_ignored_total")
        + get("geogate_events_shed_total")
        + get("geogate_events_evaluated_total")
        - get("geogate_fixes_released_total")
        + get("geogate_fixes_held_total")
        + get("geogate_fixes_late_total")
}

pub fn scrape(port: u16) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    for (series, value) in scrape_series(port) {
        let name = series.split('{').next().unwrap_or(&series).to_owned();
        *out.entry(name).or_default() += value;
    }
    out
}

/// Every `geogate_*` series with its labels as Prometheus prints them
/// (`name{label="value"}`), from `/metrics` on `port`.
pub fn scrape_series(port: u16) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return out;
    };
    let _ = s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    for line in body.lines().filter(|l| l.starts_with("geogate_")) {
        if let Some((series, value)) = line.rsplit_once(' ') {
            out.insert(series.to_owned(), value.parse::<f64>().unwrap_or(0.0));
        }
    }
    out
}

/// One MQTT message: topic and payload.
pub type Message = (String, Vec<u8>);

/// Publishes every message at QoS 1 and waits for all PubAcks (≤ 60 s).
pub async fn publish_all(port: u16, messages: &[Message], pace: Option<Duration>) {
    let mut options = MqttOptions::new(format!("publisher-{}", free_port()), "127.0.0.1", port);
    options
        .set_keep_alive(Duration::from_secs(10))
        .set_max_packet_size(4 << 20, 4 << 20);
    let (client, mut events) = AsyncClient::new(options, 1000);
    let expected = messages.len();
    let driver = tokio::spawn(async move {
        let mut acked = 0;
        while acked < expected {
            match events.poll().await {
                Ok(Event::Incoming(Packet::PubAck(_))) => acked += 1,
                Ok(Event::Outgoing(Outgoing::Disconnect)) => break,
                Ok(_) => {}
                Err(e) => panic!("publisher connection failed: {e}"),
            }
        }
        acked
    });
    for (topic, payload) in messages {
        client
            .publish(topic.clone(), QoS::AtLeastOnce, false, payload.clone())
            .await
            .expect("publish");
        if let Some(p) = pace {
            tokio::time::sleep(p).await;
        }
    }
    let acked = tokio::time::timeout(Duration::from_secs(60), driver)
        .await
        .expect("all PubAcks within 60 s")
        .expect("driver");
    assert_eq!(acked, expected);
}

pub fn native(
    vehicle: &str,
    ts: i64,
    lat: f64,
    lon: f64,
    speed: f64,
    kind: &str,
) -> (String, Vec<u8>) {
    (
        format!("fleet/{vehicle}/telemetry"),
        format!(r#"{{"vehicle":"{vehicle}","ts":{ts},"lat":{lat},"lon":{lon},"speed_kmh":{speed},"kind":"{kind}"}}"#).into_bytes(),
    )
}

/// Reads an NDJSON file into JSON values (missing file: empty).
pub fn read_ndjson(path: &Path) -> Vec<serde_json::Value> {
    parse_ndjson(&std::fs::read_to_string(path).unwrap_or_default())
}

/// The complete lines of a file a running process is appending to: a last
/// line without its newline is still being written, and is left for the
/// next read rather than failing the parse.
pub fn read_ndjson_so_far(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |end| &text[..=end]);
    parse_ndjson(complete)
}

fn parse_ndjson(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).expect("every line parses"))
        .collect()
}

/// Subscribes to `filter` and collects payloads until `n` arrive (≤ 20 s).
pub async fn collect(
    port: u16,
    filter: &str,
    n: usize,
    ready: tokio::sync::oneshot::Sender<()>,
) -> Vec<serde_json::Value> {
    let mut options = MqttOptions::new(format!("collector-{}", free_port()), "127.0.0.1", port);
    options.set_keep_alive(Duration::from_secs(10));
    let (client, mut events) = AsyncClient::new(options, 100);
    client
        .subscribe(filter, QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    let mut ready = Some(ready);
    let mut got = Vec::new();
    let run = async {
        while got.len() < n {
            match events.poll().await.expect("collector connection") {
                Event::Incoming(Packet::SubAck(_)) => {
                    if let Some(r) = ready.take() {
                        let _ = r.send(());
                    }
                }
                Event::Incoming(Packet::Publish(p)) => {
                    got.push(serde_json::from_slice(&p.payload).expect("JSON payload"))
                }
                _ => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("messages within 20 s");
    got
}

/// A topic geogate never publishes to: a test publishes it after the events
/// it waits for, so a collector knows everything before it has arrived.
pub const END_OF_TEST: &str = "geogate/events/~end-of-test";

/// A client subscribing to every topic geogate publishes events on (the
/// SUBACK comes through the event loop). Keep the client while polling.
pub async fn subscribe_to_events(port: u16, client_id: &str) -> (AsyncClient, rumqttc::EventLoop) {
    let mut options = MqttOptions::new(client_id, "127.0.0.1", port);
    options.set_keep_alive(Duration::from_secs(10));
    let (client, events) = AsyncClient::new(options, 100);
    client
        .subscribe("geogate/events/#", QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    (client, events)
}

/// Subscribes to geogate's events and keeps every copy with the moment it
/// arrived, until [`END_OF_TEST`] comes, or 60 s pass with no event (a
/// test may take a while before its events start), or 10 minutes in all.
pub async fn collect_events_until_end(
    port: u16,
    client_id: &str,
    ready: tokio::sync::oneshot::Sender<()>,
) -> Vec<(std::time::Instant, serde_json::Value)> {
    let (_client, mut events) = subscribe_to_events(port, client_id).await;
    let mut ready = Some(ready);
    let mut got = Vec::new();
    const QUIET: Duration = Duration::from_secs(60);
    let run = async {
        let mut quiet_until = tokio::time::Instant::now() + QUIET;
        loop {
            let polled = tokio::time::timeout_at(quiet_until, events.poll()).await;
            match polled {
                Err(_) => break,
                Ok(Ok(Event::Incoming(Packet::SubAck(_)))) => {
                    if let Some(r) = ready.take() {
                        let _ = r.send(());
                    }
                }
                Ok(Ok(Event::Incoming(Packet::Publish(p)))) if p.topic == END_OF_TEST => break,
                Ok(Ok(Event::Incoming(Packet::Publish(p)))) => {
                    quiet_until = tokio::time::Instant::now() + QUIET;
                    got.push((
                        std::time::Instant::now(),
                        serde_json::from_slice(&p.payload).expect("events are JSON"),
                    ));
                }
                Ok(_) => {}
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(600), run).await;
    got
}

/// The (vehicle, fix time) of every `enter` in an events file a running
/// geogate is writing: with fixes that alternate between fences A and B,
/// one per evaluated fix.
pub fn entered_fixes(events: &Path) -> std::collections::BTreeSet<(String, i64)> {
    enters(&read_ndjson_so_far(events))
}

/// The (vehicle, fix time) of every `enter` among `events`, as a set.
pub fn enters(events: &[serde_json::Value]) -> std::collections::BTreeSet<(String, i64)> {
    enters_in_order(events).into_iter().collect()
}

/// The (vehicle, fix time) of every `enter` among `events`, repeats kept.
pub fn enters_in_order(events: &[serde_json::Value]) -> Vec<(String, i64)> {
    events
        .iter()
        .filter(|e| e["event"] == "enter")
        .map(|e| {
            (
                e["vehicle"].as_str().unwrap_or("").to_owned(),
                e["ts"].as_i64().unwrap_or(0),
            )
        })
        .collect()
}

/// Tests that load the machine take turns, so each gets the rates it asks
/// for (one lock per test binary).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The usual setup against a broker on `port`: token gate, no MQTT events.
pub fn setup<'a>(port: u16, id: &'a str, pipeline: &'a str) -> Setup<'a> {
    Setup {
        broker_port: port,
        embedded: false,
        client_id: id,
        extra_pipeline: pipeline,
        gate: "kind = \"token\"\nrate = 1000\nburst = 100",
        events_mqtt: false,
        extra_mqtt: "",
    }
}

/// Waits (≤ `secs`) until `cond` holds, polling every 50 ms.
pub fn wait_until(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The fix time (unix ms) of each vehicle's first [`crossing_fix`]; its
/// fix k comes k seconds later.
pub const CROSSING_T0: i64 = 1_750_000_000_000;

/// Fix `i` of a stream of High fixes for `vehicles` vehicles named
/// `{prefix}{n}`, alternating between fences A and B, so every fix of a
/// vehicle after its first is one exit and one enter (its first, one
/// enter).
pub fn crossing_fix(prefix: &str, vehicles: i64, i: i64) -> Message {
    let (v, k) = (i % vehicles, i / vehicles);
    native(
        &format!("{prefix}{v}"),
        CROSSING_T0 + 1000 * k,
        50.005,
        if k % 2 == 0 { 10.005 } else { 10.025 },
        40.0,
        "move",
    )
}

/// Fixes `first..first + n` of [`crossing_fix`].
pub fn crossing_fixes(prefix: &str, vehicles: i64, first: i64, n: i64) -> Vec<Message> {
    (first..first + n)
        .map(|i| crossing_fix(prefix, vehicles, i))
        .collect()
}

/// The `accounting:` line geogate prints at shutdown.
pub fn accounting_line(stdout: &str) -> &str {
    stdout
        .lines()
        .find(|l| l.starts_with("accounting:"))
        .unwrap_or_else(|| panic!("no accounting line in {stdout}"))
}

/// One term's count in an [`accounting_line`], found by its name (a
/// whole word: `duplicate` is written `(duplicate 0)`).
pub fn accounting_term(line: &str, term: &str) -> u64 {
    let words: Vec<&str> = line.split_whitespace().collect();
    words
        .windows(2)
        .find(|w| w[0].trim_start_matches('(') == term)
        .and_then(|w| w[1].trim_end_matches(')').parse().ok())
        .unwrap_or_else(|| panic!("no {term} in {line}"))
}
