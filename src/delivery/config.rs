//! `[events]`: where transitions go.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct EventsConfig {
    /// Append transitions as NDJSON here.
    pub path: Option<PathBuf>,
    /// Publish transitions (QoS 1) to `geogate/events/{vehicle}`.
    pub mqtt: bool,
}
