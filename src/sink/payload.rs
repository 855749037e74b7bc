//! Payloads as JSON can carry them, for captures and dead letters alike.

use base64::Engine;
use std::borrow::Cow;

/// A payload as JSON can carry it: `(Some(text), None)` when it is UTF-8,
/// else `(None, Some(base64))`. Captures and dead letters both store
/// payloads this way, so nothing is lost to an encoding. The text borrows
/// the payload, for a caller that serialises it at once.
pub fn text_or_base64(payload: &[u8]) -> (Option<Cow<'_, str>>, Option<String>) {
    match std::str::from_utf8(payload) {
        Ok(s) => (Some(Cow::Borrowed(s)), None),
        Err(_) => (
            None,
            Some(base64::engine::general_purpose::STANDARD.encode(payload)),
        ),
    }
}
