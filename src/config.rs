//! The TOML configuration (`config/geogate.toml` documents every field),
//! composed of the sections each component owns: its struct, its
//! defaults and its checks live with the component; this module puts them
//! together.
//!
//! Parsing uses `deny_unknown_fields`, so a misspelt key is an error naming
//! it. Semantic checks then run over the whole file and report every problem
//! at once, each with its field path, so an operator fixes a config in one
//! pass rather than one error per restart.

use crate::admission::{GateKind, GateSpec};
use crate::api::ApiConfig;
use crate::geofence::config::FencesSource;
use crate::problems::Problems;
use serde::Deserialize;
use std::path::{Path, PathBuf};

pub use crate::admission::config::GateConfig;
pub use crate::allowance::GlobalAllowanceConfig;
pub use crate::broker::EmbeddedBrokerConfig;
pub use crate::codec::CodecSettings;
pub use crate::delivery::config::EventsConfig;
pub use crate::geofence::config::FencesConfig;
pub use crate::metrics::MetricsConfig;
pub use crate::pipeline::config::{MAX_DECODE_LANES, PipelineConfig};
pub use crate::problems::ConfigProblem;
pub use crate::sink::config::{DeadLetterConfig, FsyncPolicy};
pub use crate::source::mqtt::config::{MqttConfig, TlsConfig};
pub use crate::state::config::{StateBackend, StateConfig};

#[derive(Debug, Clone, PartialEq, Deserialize)]
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
    /// The HTTP API (fences, vehicle state); off unless the section is
    /// there.
    pub api: Option<ApiConfig>,
}

/// Settings `geogate demo` applies on top of the rest of the file, so that
/// a laptop-sized capture visibly crosses the watermark.
#[derive(Debug, Clone, PartialEq, Deserialize)]
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

impl DemoConfig {
    fn check(&self, problems: &mut Problems) {
        if !(self.speed.is_finite() && self.speed > 0.0) {
            problems.add(
                "demo.speed",
                format!("must be a number > 0, got {}", self.speed),
            );
        }
        if !(self.sustained_rate.is_finite() && self.sustained_rate >= 0.0) {
            problems.add("demo.sustained_rate", "must be a finite number ≥ 0");
        }
        if self.queue_capacity == 0 {
            problems.add("demo.queue_capacity", "must be ≥ 1");
        }
        if let Err(e) = self.gate.build() {
            problems.add("demo.gate", e.to_string());
        }
    }
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

    /// Every semantic problem in the file, each section checked by the
    /// component that owns it.
    pub fn problems(&self) -> Vec<ConfigProblem> {
        let mut problems = Problems::default();
        self.mqtt.check(&mut problems);
        self.pipeline.check(&mut problems);
        self.gate.check(&mut problems);
        self.fences.check(&mut problems);
        self.codec.check(&mut problems);
        self.dead_letter.check(&mut problems);
        self.events.check(&mut problems);
        self.demo.check(&mut problems);
        self.state.check(
            self.events.path.as_deref(),
            &self.dead_letter.path,
            &mut problems,
        );
        self.metrics.check(&mut problems);
        if let Some(api) = &self.api {
            api.check(&mut problems);
        }
        if self.state.backend == StateBackend::Partitioned {
            self.check_partitioned(&mut problems);
        }
        problems.into_vec()
    }

    /// What a partitioned instance needs of the other sections: a name the
    /// engine's subjects can carry, and outputs that give up on a
    /// transition before the engine forgets it.
    fn check_partitioned(&self, problems: &mut Problems) {
        let id = &self.mqtt.client_id;
        if id.is_empty()
            || !id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            problems.add(
                "mqtt.client_id",
                format!(
                    "{id:?}: with backend = \"partitioned\" it names this instance among the fleet's owners, in the engine's subjects: use letters, digits, - and _ only, and a name no other instance has"
                ),
            );
        }
        // Each output reads the events stream: what it has not delivered
        // within its maximum age goes to the dead letter, which must come
        // before the stream lets the transition go. Half the stream's age
        // at most leaves room for an output's queue to be worked through
        // (and for retry pauses) before the stream's age is reached.
        let kept = self.state.partitioned.events_max_age_s as f64;
        let outputs = [
            self.events
                .mqtt
                .then_some(("events.mqtt_max_age_s", self.events.mqtt_max_age_s)),
            self.events
                .webhook
                .as_ref()
                .map(|w| ("events.webhook.max_age_s", w.max_age_s)),
        ];
        for (key, max_age) in outputs.into_iter().flatten() {
            if kept > 0.0 && max_age > kept / 2.0 {
                problems.add(
                    key,
                    format!(
                        "{max_age} s is more than half [state] events_max_age_s ({kept} s): the events stream could let transitions go before this output got to them or gave up on them; lower it, or raise events_max_age_s"
                    ),
                );
            }
        }
        if self.fences.source == FencesSource::Store {
            problems.add(
                "fences.source",
                "\"store\" is not served with backend = \"partitioned\" yet: the fence file is each instance's set",
            );
        }
        if self.api.is_some() {
            problems.add(
                "api",
                "the HTTP API is not served with backend = \"partitioned\" yet: remove [api]",
            );
        }
        if self.gate.global.is_some() {
            problems.add(
                "gate.global",
                "with backend = \"partitioned\" nothing is shed: a backlog waits in the engine's partitions and each owner reads at its own pace, so no gate and no shared allowance apply; remove [gate.global]",
            );
        }
    }

    /// The membership rules' settings: the fences' own, and the reorder
    /// window the pipeline asks for.
    pub fn evaluator_settings(&self) -> crate::geofence::EvaluatorSettings {
        let window = self
            .pipeline
            .reorder_window_ms
            .unwrap_or(crate::pipeline::config::DEFAULT_REORDER_WINDOW_MS);
        crate::geofence::EvaluatorSettings {
            reorder_window_ms: i64::try_from(window).unwrap_or(i64::MAX),
            ..self.fences.settings()
        }
    }
}
