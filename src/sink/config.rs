//! `[dead_letter]`, and the fsync policy every appended file follows.

use crate::problems::Problems;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

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
    #[serde(default = "default_rotate_bytes")]
    pub rotate_bytes: u64,
    /// Rotated files kept (`<path>.1` newest … `<path>.N` oldest); records
    /// in a file rotated past N are deleted and counted.
    #[serde(default = "default_rotate_keep")]
    pub rotate_keep: u32,
    #[serde(default = "default_fsync")]
    pub fsync: FsyncPolicy,
    /// Optionally also publish each record (QoS 1) to this topic.
    #[serde(default)]
    pub mqtt_topic: Option<String>,
}

fn default_rotate_bytes() -> u64 {
    64 * 1024 * 1024
}

fn default_rotate_keep() -> u32 {
    5
}

fn default_fsync() -> FsyncPolicy {
    FsyncPolicy::Flush
}

impl DeadLetterConfig {
    pub fn check(&self, problems: &mut Problems) {
        if self.rotate_keep == 0 {
            problems.add(
                "dead_letter.rotate_keep",
                "must be ≥ 1: rotation moves the full file to <path>.1",
            );
        }
        if self.rotate_bytes < 4096 {
            problems.add("dead_letter.rotate_bytes", "must be ≥ 4096");
        }
    }
}
