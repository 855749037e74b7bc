//! How a webhook request is signed, so that its receiver can refuse a
//! forgery (no shared secret) and a replay (an old timestamp).
//!
//! `X-Geogate-Timestamp` carries the Unix time in seconds when the request
//! was sent (each retry is signed anew), and `X-Geogate-Signature` carries
//! `sha256=` and the hex HMAC-SHA256, keyed with the shared secret, of the
//! timestamp, a `.`, and the body's bytes. A receiver recomputes it,
//! compares in constant time, and refuses a timestamp further than a few
//! minutes from its own clock. [`verify`] is that check.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

pub const TIMESTAMP_HEADER: &str = "X-Geogate-Timestamp";
pub const SIGNATURE_HEADER: &str = "X-Geogate-Signature";

/// Why a request's signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the signature is not `sha256=` and 64 hex digits")]
    Malformed,
    #[error("the signature does not match the body and timestamp")]
    Mismatch,
    #[error("the timestamp is {skew_s} s from now, more than the {tolerance_s} s allowed")]
    Stale { skew_s: i64, tolerance_s: i64 },
}

pub fn unix_seconds() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

fn mac(secret: &[u8], timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
    // HMAC takes a key of any length.
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret)
        .unwrap_or_else(|_| unreachable!("HMAC accepts every key length"));
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// The `X-Geogate-Signature` value for `body` sent at `timestamp`.
pub fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    let digest = mac(secret, timestamp, body).finalize().into_bytes();
    let mut text = String::with_capacity(7 + 64);
    text.push_str("sha256=");
    for b in digest {
        text.push_str(&format!("{b:02x}"));
    }
    text
}

/// A receiver's check of a request: the signature matches (compared in
/// constant time) and the timestamp is within `tolerance_s` of `now`.
pub fn verify(
    secret: &[u8],
    timestamp: i64,
    body: &[u8],
    signature: &str,
    now: i64,
    tolerance_s: i64,
) -> Result<(), SignatureError> {
    let hex = signature
        .strip_prefix("sha256=")
        .filter(|h| h.len() == 64)
        .ok_or(SignatureError::Malformed)?;
    let mut expected = [0u8; 32];
    for (i, byte) in expected.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2).unwrap_or("zz"), 16)
            .map_err(|_| SignatureError::Malformed)?;
    }
    mac(secret, timestamp, body)
        .verify_slice(&expected)
        .map_err(|_| SignatureError::Mismatch)?;
    let skew_s = now.saturating_sub(timestamp).saturating_abs();
    if skew_s > tolerance_s {
        return Err(SignatureError::Stale {
            skew_s,
            tolerance_s,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// RFC 4231 test case 2, as the signature's HMAC: the key "Jefe" over
    /// "what do ya want for nothing?", split where the format puts its dot.
    #[test]
    fn the_mac_is_hmac_sha256() {
        let body = b" ya want for nothing?";
        // "what do" is not a timestamp; the check runs the same bytes
        // through the same HMAC.
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do");
        mac.update(body);
        let hex: String = mac
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    proptest! {
        /// A signature checks out against its own body, secret and time,
        /// and not when any one of them changes or time has moved on.
        #[test]
        fn only_the_signed_request_verifies(
            secret in prop::collection::vec(any::<u8>(), 1..80),
            body in prop::collection::vec(any::<u8>(), 0..200),
            at in 1_600_000_000i64..1_900_000_000,
            flip in any::<prop::sample::Index>(),
        ) {
            let signed = sign(&secret, at, &body);
            prop_assert_eq!(verify(&secret, at, &body, &signed, at + 10, 300), Ok(()));
            prop_assert_eq!(verify(&secret, at + 1, &body, &signed, at, 300), Err(SignatureError::Mismatch));
            let mut other = secret.clone();
            let bit = flip.index(other.len());
            other[bit] ^= 1;
            prop_assert_eq!(verify(&other, at, &body, &signed, at, 300), Err(SignatureError::Mismatch));
            let mut forged = body.clone();
            forged.push(b' ');
            prop_assert_eq!(verify(&secret, at, &forged, &signed, at, 300), Err(SignatureError::Mismatch));
            prop_assert_eq!(
                verify(&secret, at, &body, &signed, at + 301, 300),
                Err(SignatureError::Stale { skew_s: 301, tolerance_s: 300 })
            );
            prop_assert_eq!(verify(&secret, at, &body, "sha256=zz", at, 300), Err(SignatureError::Malformed));
        }
    }
}
