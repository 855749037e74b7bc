//! The TOML configuration (`config/geogate.toml` documents every field).
//!
//! Parsing uses `deny_unknown_fields`, so a misspelt key is an error naming
//! it. Semantic checks then run over the whole file and report every problem
//! at once, each with its field path, so an operator fixes a config in one
//! pass rather than one error per restart.

use crate::admission::{AdmissionPolicy, GateKind, GateSpec};
use crate::codec::CodecSettings;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub mqtt: MqttConfig,
    #[serde(default)]
    pub embedded_broker: EmbeddedBrokerConfig,
    #[serde(default)]
    pub pipeline: PipelineConfig,
    pub gate: GateConfig,
    #[serde(default)]
    pub codec: CodecSettings,
    pub fences: FencesConfig,
    pub dead_letter: DeadLetterConfig,
    #[serde(default)]
    pub events: EventsConfig,
    #[serde(default)]
    pub metrics: MetricsConfig,
    #[serde(default)]
    pub state: StateConfig,
    #[serde(default)]
    pub demo: DemoConfig,
}

/// Settings `geogate demo` applies on top of the rest of the file, so that
/// a laptop-sized capture visibly crosses the watermark.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DemoConfig {
    pub capture: PathBuf,
    /// Replay speed-up over the capture's own pacing.
    pub speed: f64,
    /// Worker cap during the demo, evaluations/s per shard (models a slower
    /// evaluator so the shift-change burst fills the queues).
    pub sustained_rate: f64,
    /// Queue capacity per shard during the demo. The embedded broker
    /// (rumqttd) keeps at most 100 QoS 1 messages unacked per subscriber, and
    /// geogate acks only after evaluation, so only a queue whose watermark
    /// sits below that window can ever reach it.
    pub queue_capacity: usize,
    /// The gate used during the demo.
    pub gate: GateSpec,
    pub report_dir: PathBuf,
}

impl Default for DemoConfig {
    fn default() -> Self {
        Self {
            capture: "replay/shift-change.ndjson.gz".into(),
            speed: 3.0,
            sustained_rate: 600.0,
            queue_capacity: 64,
            gate: GateSpec {
                kind: GateKind::Token,
                rate: 100.0,
                burst: 200,
            },
            report_dir: "geogate-report".into(),
        }
    }
}

/// Each shard's gate, and optionally the allowance all instances share.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateConfig {
    pub kind: GateKind,
    pub rate: f64,
    pub burst: u32,
    /// `[gate.global]`: one budget in Redis for every instance together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global: Option<GlobalAllowanceConfig>,
}

impl GateConfig {
    /// The shard gate alone.
    pub fn spec(&self) -> GateSpec {
        GateSpec {
            kind: self.kind,
            rate: self.rate,
            burst: self.burst,
        }
    }
}

impl From<GateSpec> for GateConfig {
    fn from(spec: GateSpec) -> Self {
        Self {
            kind: spec.kind,
            rate: spec.rate,
            burst: spec.burst,
            global: None,
        }
    }
}

/// The Redis token bucket behind `[gate.global]` (see `allowance`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlobalAllowanceConfig {
    /// `redis://host:port`: one for a single node, the seed nodes for a
    /// Cluster (then `cluster = true`).
    pub urls: Vec<String>,
    #[serde(default)]
    pub cluster: bool,
    /// The accounting key: instances with the same key share one budget.
    #[serde(default = "defaults::allowance_key")]
    pub key: String,
    /// Tokens per second for all instances together.
    pub rate: f64,
    /// The shared bucket's capacity b (it starts full).
    pub burst: u32,
    /// Tokens one low-priority event costs.
    #[serde(default = "defaults::allowance_cost")]
    pub cost: u32,
    /// Most tokens one instance holds locally, taken from Redis in chunks;
    /// loosens the shared bound by at most this much per instance.
    #[serde(default = "defaults::allowance_reserve")]
    pub reserve: u32,
    /// Once Redis is unreachable and the reserve is spent: `open` admits
    /// (counted), `closed` sheds. Required: the choice must be explicit.
    pub fail_mode: crate::allowance::FailMode,
    /// For each connect and each reply, in milliseconds.
    #[serde(default = "defaults::allowance_timeout_ms")]
    pub timeout_ms: u64,
}

#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MqttConfig {
    pub host: String,
    pub port: u16,
    /// Required and stable: the broker keeps the session (and the unacked
    /// messages) under this id across restarts.
    pub client_id: String,
    pub topics: Vec<String>,
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password: Option<String>,
    #[serde(default = "defaults::max_packet_bytes")]
    pub max_packet_bytes: usize,
    #[serde(default = "defaults::keep_alive_s")]
    pub keep_alive_s: u64,
    /// Budget for one whole connect (TCP, TLS, CONNECT/CONNACK). A connect
    /// is never cut short by anything else; past this it is logged and
    /// retried with backoff.
    #[serde(default = "defaults::connect_timeout_s")]
    pub connect_timeout_s: u64,
    /// Most QoS 1 messages held unacked before intake stops reading.
    #[serde(default = "defaults::max_unacked")]
    pub max_unacked: usize,
    /// Subscription QoS: 1 (default) acks each message only after it is
    /// evaluated or dead-lettered, so a crash loses nothing; 0 has no acks
    /// and no redelivery, for fleets that resend often and want raw speed.
    #[serde(default = "defaults::subscribe_qos")]
    pub subscribe_qos: u8,
    /// MQTT over TLS (rustls): verify the broker against `ca_file`, and
    /// optionally present a client certificate.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM file of the CA(s) that signed the broker's certificate.
    pub ca_file: PathBuf,
    #[serde(default)]
    pub client_cert_file: Option<PathBuf>,
    #[serde(default)]
    pub client_key_file: Option<PathBuf>,
}

impl fmt::Debug for MqttConfig {
    /// Redacts the password: configs get logged.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MqttConfig")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("client_id", &self.client_id)
            .field("topics", &self.topics)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("max_packet_bytes", &self.max_packet_bytes)
            .field("keep_alive_s", &self.keep_alive_s)
            .field("connect_timeout_s", &self.connect_timeout_s)
            .field("max_unacked", &self.max_unacked)
            .field("subscribe_qos", &self.subscribe_qos)
            .field("tls", &self.tls)
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmbeddedBrokerConfig {
    /// Port for `--embedded-broker`, always on 127.0.0.1.
    pub port: u16,
}

impl Default for EmbeddedBrokerConfig {
    fn default() -> Self {
        Self { port: 1883 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PipelineConfig {
    /// Worker shards; 0 means one per available core.
    pub shards: usize,
    pub queue_capacity: usize,
    pub watermark: f64,
    /// Optional cap on each worker's evaluations per second; 0 = off.
    pub sustained_rate: f64,
    /// How long shutdown may spend draining queues.
    pub drain_deadline_s: f64,
    /// Decode lanes (tasks decoding payloads beside the router), split by
    /// topic; 0 means one per available core but the router's: one on a
    /// single core, at least two on two cores or more.
    pub decode_lanes: usize,
    /// The runtime's threads ask Linux for `SCHED_BATCH`: no preemption on
    /// wake-up (see [`crate::runtime`]).
    pub sched_batch: bool,
}

/// Most decode lanes: more only adds tasks that wait.
pub const MAX_DECODE_LANES: usize = 64;

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            decode_lanes: 0,
            sched_batch: true,
            shards: 0,
            queue_capacity: 4096,
            watermark: crate::admission::watermark::DEFAULT_WATERMARK,
            sustained_rate: 0.0,
            drain_deadline_s: 10.0,
        }
    }
}

impl PipelineConfig {
    pub fn shard_count(&self) -> usize {
        if self.shards == 0 {
            cores()
        } else {
            self.shards
        }
    }

    pub fn decode_lane_count(&self) -> usize {
        if self.decode_lanes == 0 {
            default_decode_lanes(cores())
        } else {
            self.decode_lanes
        }
    }
}

/// A lane per core but the router's, one on a single core, and at least
/// two on two cores: one lane leaves decoding serial, and on 2 cores two
/// lanes ran the in-process pipeline faster in 12 of 16 alternating
/// rounds over two sessions, with the live drain level by the median
/// (BENCHMARKS.md, "Two decode lanes on two cores").
fn default_decode_lanes(cores: usize) -> usize {
    cores
        .saturating_sub(1)
        .max(cores.min(2))
        .clamp(1, MAX_DECODE_LANES)
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FencesConfig {
    pub path: PathBuf,
    #[serde(default)]
    pub hysteresis_m: f64,
    #[serde(default)]
    pub dwell_s: f64,
    #[serde(default = "defaults::max_memberships")]
    pub max_memberships: usize,
    #[serde(default = "defaults::idle_expiry_s")]
    pub idle_expiry_s: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FsyncPolicy {
    /// fsync after every record: a record survives power loss before its ack.
    Always,
    /// Flush to the OS after every record (survives a process crash), fsync
    /// on rotation and shutdown.
    Flush,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterConfig {
    pub path: PathBuf,
    #[serde(default = "defaults::rotate_bytes")]
    pub rotate_bytes: u64,
    /// Rotated files kept (`<path>.1` newest … `<path>.N` oldest); records
    /// in a file rotated past N are deleted and counted.
    #[serde(default = "defaults::rotate_keep")]
    pub rotate_keep: u32,
    #[serde(default = "defaults::fsync")]
    pub fsync: FsyncPolicy,
    /// Optionally also publish each record (QoS 1) to this topic.
    #[serde(default)]
    pub mqtt_topic: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct EventsConfig {
    /// Append transitions as NDJSON here.
    pub path: Option<PathBuf>,
    /// Publish transitions (QoS 1) to `geogate/events/{vehicle}`.
    pub mqtt: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateBackend {
    /// Nothing survives the process: benchmarks, throwaway runs.
    Memory,
    /// A SQLite file at `path` (see `state::embedded`).
    Embedded,
    /// Redis (a node or a Cluster) at `urls`, shared by every instance
    /// (see `state::shared`).
    Redis,
}

/// Where per-vehicle state and the outbox live (see `state`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StateConfig {
    pub backend: StateBackend,
    pub path: PathBuf,
    /// `flush`: a commit survives a process crash; `always`: it is fsynced
    /// and survives power loss too. Applies to the events file as well.
    pub fsync: FsyncPolicy,
    /// Start from no state even if the file holds some (`--reset-state`);
    /// never read from the file, so a reset is always explicit.
    #[serde(skip)]
    pub reset: bool,
    /// `redis`: one node, or a Cluster's seed nodes (then `cluster = true`).
    pub urls: Vec<String>,
    pub cluster: bool,
    /// `redis`: instances with the same prefix share the vehicles' state.
    pub prefix: String,
    /// `redis`: vehicles are spread over this many outbox streams; every
    /// instance must use the same number (checked at start).
    pub partitions: u32,
    /// `redis`: another instance's undelivered transitions are taken over
    /// after it has been silent this long.
    pub claim_idle_s: f64,
    /// `redis`: for each connect and each reply, in milliseconds.
    pub timeout_ms: u64,
}

impl Default for StateConfig {
    fn default() -> Self {
        Self {
            backend: StateBackend::Embedded,
            path: "geogate-state.sqlite".into(),
            fsync: FsyncPolicy::Flush,
            reset: false,
            urls: Vec::new(),
            cluster: false,
            prefix: "geogate".into(),
            partitions: 16,
            claim_idle_s: 30.0,
            timeout_ms: 1000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Prometheus exporter address; loopback unless you mean otherwise.
    pub listen: String,
    pub enabled: bool,
    /// Opt-in: label transitions by fence id. One series per fence, so
    /// only for fence sets small enough for Prometheus to hold.
    pub per_fence_labels: bool,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:9464".into(),
            enabled: true,
            per_fence_labels: false,
        }
    }
}

mod defaults {
    use super::FsyncPolicy;
    pub fn allowance_key() -> String {
        "geogate:allowance".into()
    }
    pub fn allowance_cost() -> u32 {
        1
    }
    pub fn allowance_reserve() -> u32 {
        32
    }
    pub fn allowance_timeout_ms() -> u64 {
        250
    }
    pub fn max_packet_bytes() -> usize {
        8 * 1024 * 1024
    }
    pub fn keep_alive_s() -> u64 {
        30
    }
    pub fn connect_timeout_s() -> u64 {
        10
    }
    pub fn max_unacked() -> usize {
        4096
    }
    pub fn subscribe_qos() -> u8 {
        1
    }
    pub fn max_memberships() -> usize {
        256
    }
    pub fn idle_expiry_s() -> f64 {
        86_400.0
    }
    pub fn rotate_bytes() -> u64 {
        64 * 1024 * 1024
    }
    pub fn rotate_keep() -> u32 {
        5
    }
    pub fn fsync() -> FsyncPolicy {
        FsyncPolicy::Flush
    }
}

/// One problem, with the dotted path of the field it concerns.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConfigProblem {
    pub field: String,
    pub message: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Syntax(String),
    #[error("{} config error(s):\n{}", .0.len(), .0.iter().map(|p| format!("  {}: {}", p.field, p.message)).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<ConfigProblem>),
}

/// `urls` and `cluster` of a Redis section, reported under `section`.
fn check_redis_urls(
    section: &str,
    urls: &[String],
    cluster: bool,
    problem: &mut impl FnMut(&str, String),
) {
    let field = format!("{section}.urls");
    if urls.is_empty() {
        problem(&field, "name at least one redis://host:port".into());
    }
    for url in urls {
        if redis::parse_redis_url(url).is_none() {
            problem(&field, format!("{url:?} is not a redis://host:port URL"));
        }
    }
    if urls.len() > 1 && !cluster {
        problem(
            &format!("{section}.cluster"),
            format!(
                "{} urls given: several seed nodes mean a Cluster, so set cluster = true (a single node takes one url)",
                urls.len()
            ),
        );
    }
}

impl GlobalAllowanceConfig {
    /// Reports each problem under `gate.global.<field>`.
    fn check(&self, problem: &mut impl FnMut(&str, String)) {
        check_redis_urls("gate.global", &self.urls, self.cluster, problem);
        if self.key.is_empty() {
            problem("gate.global.key", "must not be empty".into());
        }
        if !(self.rate.is_finite() && self.rate > 0.0) {
            problem(
                "gate.global.rate",
                format!("must be a number > 0 (tokens/s), got {}", self.rate),
            );
        }
        if self.burst == 0 {
            problem("gate.global.burst", "must be ≥ 1".into());
        }
        if self.cost == 0 || self.cost > self.burst {
            problem(
                "gate.global.cost",
                format!(
                    "must be between 1 and burst ({}), got {}",
                    self.burst, self.cost
                ),
            );
        }
        if self.reserve < self.cost || self.reserve > self.burst {
            problem(
                "gate.global.reserve",
                format!(
                    "must be between cost ({}) and burst ({}), got {}",
                    self.cost, self.burst, self.reserve
                ),
            );
        }
        if self.timeout_ms == 0 {
            problem("gate.global.timeout_ms", "must be ≥ 1".into());
        }
    }
}

impl Config {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text)
    }

    /// Parses and validates; relative paths stay relative to the cwd.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let config: Config =
            toml::from_str(text).map_err(|e| ConfigError::Syntax(e.to_string()))?;
        let problems = config.problems();
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError::Invalid(problems))
        }
    }

    /// Every semantic problem in the file.
    pub fn problems(&self) -> Vec<ConfigProblem> {
        let mut out = Vec::new();
        let mut problem = |field: &str, message: String| {
            out.push(ConfigProblem {
                field: field.into(),
                message,
            })
        };
        if self.mqtt.client_id.trim().is_empty() {
            problem(
                "mqtt.client_id",
                "must be a stable, non-empty id (the broker keeps the session under it)".into(),
            );
        }
        if self.mqtt.topics.is_empty() {
            problem("mqtt.topics", "needs at least one topic filter".into());
        }
        if self.mqtt.host.is_empty() {
            problem("mqtt.host", "must not be empty".into());
        }
        if let Some(tls) = &self.mqtt.tls {
            if tls.client_cert_file.is_some() != tls.client_key_file.is_some() {
                problem(
                    "mqtt.tls",
                    "client_cert_file and client_key_file go together".into(),
                );
            }
            for (field, path) in [
                ("mqtt.tls.ca_file", Some(&tls.ca_file)),
                ("mqtt.tls.client_cert_file", tls.client_cert_file.as_ref()),
                ("mqtt.tls.client_key_file", tls.client_key_file.as_ref()),
            ] {
                if let Some(path) = path
                    && let Err(e) = std::fs::metadata(path)
                {
                    problem(field, format!("cannot read {}: {e}", path.display()));
                }
            }
        }
        if self.mqtt.connect_timeout_s == 0 {
            problem("mqtt.connect_timeout_s", "must be ≥ 1 (seconds)".into());
        }
        if self.mqtt.max_unacked == 0 {
            problem("mqtt.max_unacked", "must be ≥ 1".into());
        }
        if self.mqtt.subscribe_qos > 1 {
            problem(
                "mqtt.subscribe_qos",
                format!(
                    "{} is not supported: use 1 (at least once, acked after evaluation) or 0 (at most once, no redelivery)",
                    self.mqtt.subscribe_qos
                ),
            );
        }
        if self.pipeline.queue_capacity == 0 {
            problem("pipeline.queue_capacity", "must be ≥ 1".into());
        }
        if let Err(e) =
            AdmissionPolicy::new(self.pipeline.watermark, self.pipeline.queue_capacity.max(1))
        {
            problem("pipeline.watermark", e.to_string());
        }
        if self.pipeline.decode_lanes > MAX_DECODE_LANES {
            problem(
                "pipeline.decode_lanes",
                format!(
                    "must be 0 (cores − 1, at least 1, and at least 2 on 2 cores or more) to {MAX_DECODE_LANES}, got {}",
                    self.pipeline.decode_lanes
                ),
            );
        }
        if !(self.pipeline.sustained_rate.is_finite() && self.pipeline.sustained_rate >= 0.0) {
            problem(
                "pipeline.sustained_rate",
                format!(
                    "must be a finite number ≥ 0 (0 = off), got {}",
                    self.pipeline.sustained_rate
                ),
            );
        }
        if !(self.pipeline.drain_deadline_s.is_finite() && self.pipeline.drain_deadline_s >= 0.0) {
            problem(
                "pipeline.drain_deadline_s",
                "must be a finite number ≥ 0".into(),
            );
        }
        if self.gate.kind == GateKind::FixedWindow {
            problem(
                "gate.kind",
                "fixed_window is lab-only; use token, leaky_meter or leaky_shaper".into(),
            );
        }
        if let Err(e) = self.gate.spec().build() {
            let field = match e {
                crate::admission::GateSpecError::Rate(_) => "gate.rate",
                crate::admission::GateSpecError::Burst(_) => "gate.burst",
                crate::admission::GateSpecError::Syntax(_) => "gate",
            };
            problem(field, e.to_string());
        }
        if let Some(global) = &self.gate.global {
            global.check(&mut problem);
        }
        for (field, v) in [
            ("fences.hysteresis_m", self.fences.hysteresis_m),
            ("fences.dwell_s", self.fences.dwell_s),
            ("fences.idle_expiry_s", self.fences.idle_expiry_s),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                problem(field, format!("must be a finite number ≥ 0, got {v}"));
            }
        }
        if self.codec.max_payload_bytes == 0 {
            problem("codec.max_payload_bytes", "must be ≥ 1".into());
        }
        if !(self.codec.idle_speed_kmh.is_finite() && self.codec.idle_speed_kmh >= 0.0) {
            problem("codec.idle_speed_kmh", "must be a finite number ≥ 0".into());
        }
        if self.dead_letter.rotate_keep == 0 {
            problem(
                "dead_letter.rotate_keep",
                "must be ≥ 1: rotation moves the full file to <path>.1".into(),
            );
        }
        if self.dead_letter.rotate_bytes < 4096 {
            problem("dead_letter.rotate_bytes", "must be ≥ 4096".into());
        }
        if !(self.demo.speed.is_finite() && self.demo.speed > 0.0) {
            problem(
                "demo.speed",
                format!("must be a number > 0, got {}", self.demo.speed),
            );
        }
        if !(self.demo.sustained_rate.is_finite() && self.demo.sustained_rate >= 0.0) {
            problem("demo.sustained_rate", "must be a finite number ≥ 0".into());
        }
        if self.demo.queue_capacity == 0 {
            problem("demo.queue_capacity", "must be ≥ 1".into());
        }
        if let Err(e) = self.demo.gate.build() {
            problem("demo.gate", e.to_string());
        }
        if self.state.backend == StateBackend::Redis {
            check_redis_urls("state", &self.state.urls, self.state.cluster, &mut problem);
            if self.state.prefix.is_empty() || self.state.prefix.contains(['{', '}']) {
                problem(
                    "state.prefix",
                    "must be non-empty, without { or } (they mark Redis hash tags)".into(),
                );
            }
            if self.state.partitions == 0 {
                problem("state.partitions", "must be ≥ 1".into());
            }
            if !(self.state.claim_idle_s.is_finite() && self.state.claim_idle_s > 0.0) {
                problem(
                    "state.claim_idle_s",
                    "must be a number > 0 (seconds)".into(),
                );
            }
            if self.state.timeout_ms == 0 {
                problem("state.timeout_ms", "must be ≥ 1".into());
            }
            if self.events.path.is_none() {
                problem(
                    "events.path",
                    "the redis backend delivers transitions to this instance's events file; name one".into(),
                );
            }
        }
        if self.state.backend == StateBackend::Embedded {
            let path = &self.state.path;
            let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
            if path.as_os_str().is_empty() {
                problem(
                    "state.path",
                    "must name a file for the embedded store".into(),
                );
            } else if path.is_dir() {
                problem(
                    "state.path",
                    format!("{} is a directory; name a file in it", path.display()),
                );
            } else if let Some(dir) = parent
                && !dir.is_dir()
            {
                problem(
                    "state.path",
                    format!("directory {} does not exist", dir.display()),
                );
            } else if Some(path) == self.events.path.as_ref() || *path == self.dead_letter.path {
                problem(
                    "state.path",
                    format!(
                        "{} is also the events or dead-letter file; the state needs a file of its own",
                        path.display()
                    ),
                );
            }
        }
        if self.metrics.enabled && self.metrics.listen.parse::<std::net::SocketAddr>().is_err() {
            problem(
                "metrics.listen",
                format!(
                    "{:?} is not an address like 127.0.0.1:9464",
                    self.metrics.listen
                ),
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One lane on one core, two on two and three, then a lane per core
    /// but the router's, never more than the cap.
    #[test]
    fn default_decode_lanes_by_core_count() {
        let lanes: Vec<_> = [1, 2, 3, 4, 8, 64, 65, 200]
            .into_iter()
            .map(default_decode_lanes)
            .collect();
        assert_eq!(lanes, [1, 2, 2, 3, 7, 63, 64, MAX_DECODE_LANES]);
    }
}
