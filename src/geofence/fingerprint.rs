//! A fence set's identity: partitioned instances must run the same fences
//! and settings for a partition to give the same answers whichever of them
//! owns it, and compare this fingerprint (in their heartbeats) to see
//! whether they do.

use super::EvaluatorSettings;
use sha2::{Digest, Sha256};

/// 16 hex digits of SHA-256 over the fence file's text and the settings
/// that change the rules' answers.
pub fn fingerprint(fence_text: &str, settings: &EvaluatorSettings) -> String {
    let mut h = Sha256::new();
    h.update(fence_text.as_bytes());
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
    h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
