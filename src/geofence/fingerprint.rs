//! A fence set's identity: instances must run the same fences and settings
//! to give the same answers, and compare this fingerprint (partitioned
//! instances in their heartbeats) to see whether they do.

use super::{EvaluatorSettings, FenceIndex};
use xxhash_rust::xxh3::Xxh3;

/// 16 hex digits of XXH3 over the live fences' ids and GeoJSON, in id
/// order, and the settings that change the rules' answers. Two sets with
/// the same fences agree however they came to hold them (a file, the
/// API); a set changed in a different order of versions, but to the same
/// fences, agrees too.
pub fn fingerprint(set: &FenceIndex, settings: &EvaluatorSettings) -> String {
    let mut h = Xxh3::new();
    for fence in set.fences_by_id() {
        for part in [fence.id.as_bytes(), fence.source.feature.as_bytes()] {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part);
        }
    }
    h.update(
        format!(
            "|{}|{}|{}|{}",
            settings.hysteresis_m,
            settings.dwell_s,
            settings.max_memberships,
            settings.idle_expiry_ms
        )
        .as_bytes(),
    );
    format!("{:016x}", h.digest())
}
