//! A vehicle's stored state as bytes: a version byte, the last applied fix
//! time, then length-prefixed fence ids. Binary rather than JSON because the
//! store must hold a million vehicles in ≤ 300 bytes each and every batch
//! encodes each vehicle it touched
//! (docs/decisions/0014-vehicle-record-binary-encoding.md has both figures).
//!
//! Layout (version 2): `2`, `last_fix_ms` (i64 LE), `last_heard_ms` (i64
//! LE), varint digest count, each digest as u64 LE, varint member count,
//! each member as varint length + UTF-8 id, varint pending count, each
//! pending dwell as varint length + UTF-8 id + first fix time (i64 LE),
//! varint window count, each held fix as [`encode_held`] writes it.
//! Version 3 adds, after the window, the fence set version the memberships
//! are settled against (varint), then `1` with the last applied fix's lat
//! and lon (f64 LE each), or `0` before any fix: what the state query
//! answers, and what a changed fence's geometry is checked against.
//!
//! The window is written empty: a durable store keeps held fixes in a log
//! of their own ([`crate::geofence::HeldChange`], [`super::held_batch`]), so
//! that a fix that only waits does not rewrite its vehicle's record. A
//! record written before that keeps its window; the backend moves it to
//! the log at start.
//!
//! Versions 1 and 2 are still read (no position, settled as of version
//! 0, so a restart asks about every fence changed or deleted since).
//! Version 1 (no receive time, digests or window) is still read: its
//! vehicle was last heard from when the store was last written, which
//! [`decode`] marks as [`HEARD_UNKNOWN`] for the backend to fill in.

use crate::geofence::{HeldFix, VehicleSnapshot};
use crate::model::FenceId;

const VERSION: u8 = 3;

/// `last_heard_ms` of a version 1 record.
pub const HEARD_UNKNOWN: i64 = i64::MIN;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("unknown record version {0} (this geogate reads versions 1 to {VERSION})")]
    Version(u8),
    #[error("record ends early at byte {0}")]
    Truncated(usize),
    #[error("fence id at byte {0} is not UTF-8")]
    NotUtf8(usize),
    #[error("{0} bytes left over after the record")]
    Trailing(usize),
}

pub fn encode(snapshot: &VehicleSnapshot, out: &mut Vec<u8>) {
    out.push(VERSION);
    out.extend_from_slice(&snapshot.last_fix_ms.to_le_bytes());
    out.extend_from_slice(&snapshot.last_heard_ms.to_le_bytes());
    put_varint(out, snapshot.last_digests.len() as u64);
    for d in &snapshot.last_digests {
        out.extend_from_slice(&d.to_le_bytes());
    }
    put_varint(out, snapshot.members.len() as u64);
    for id in &snapshot.members {
        put_str(out, id);
    }
    put_varint(out, snapshot.pending.len() as u64);
    for (id, since) in &snapshot.pending {
        put_str(out, id);
        out.extend_from_slice(&since.to_le_bytes());
    }
    put_varint(out, snapshot.window.len() as u64);
    for h in &snapshot.window {
        out.extend_from_slice(&encode_held(h));
    }
    put_varint(out, snapshot.fences_version);
    match snapshot.position {
        Some((lat, lon)) => {
            out.push(1);
            out.extend_from_slice(&lat.to_le_bytes());
            out.extend_from_slice(&lon.to_le_bytes());
        }
        None => out.push(0),
    }
}

/// A held fix as bytes: fix time, lat, lon, received time and digest, 8
/// bytes LE each. Its log key is not part of it.
pub fn encode_held(h: &HeldFix) -> [u8; 40] {
    let mut out = [0; 40];
    for (i, field) in [
        h.fix_ms.to_le_bytes(),
        h.lat.to_le_bytes(),
        h.lon.to_le_bytes(),
        h.received_ms.to_le_bytes(),
        h.digest.to_le_bytes(),
    ]
    .into_iter()
    .enumerate()
    {
        out[8 * i..8 * i + 8].copy_from_slice(&field);
    }
    out
}

/// Reads what [`encode_held`] wrote, under log key `key`.
pub fn decode_held(bytes: &[u8], key: u64) -> Result<HeldFix, RecordError> {
    let mut r = Reader { bytes, at: 0 };
    let held = read_held(&mut r, key)?;
    if r.at != bytes.len() {
        return Err(RecordError::Trailing(bytes.len() - r.at));
    }
    Ok(held)
}

fn read_held(r: &mut Reader<'_>, key: u64) -> Result<HeldFix, RecordError> {
    Ok(HeldFix {
        fix_ms: r.i64()?,
        lat: f64::from_bits(r.u64()?),
        lon: f64::from_bits(r.u64()?),
        received_ms: r.i64()?,
        digest: r.u64()?,
        key,
    })
}

pub fn decode(bytes: &[u8]) -> Result<VehicleSnapshot, RecordError> {
    let mut r = Reader { bytes, at: 0 };
    let version = r.byte()?;
    if !(1..=VERSION).contains(&version) {
        return Err(RecordError::Version(version));
    }
    let last_fix_ms = r.i64()?;
    let mut snapshot = VehicleSnapshot {
        last_fix_ms,
        last_heard_ms: HEARD_UNKNOWN,
        ..VehicleSnapshot::default()
    };
    if version >= 2 {
        snapshot.last_heard_ms = r.i64()?;
        snapshot.last_digests = (0..r.count()?).map(|_| r.u64()).collect::<Result<_, _>>()?;
    }
    snapshot.members = (0..r.count()?).map(|_| r.str()).collect::<Result<_, _>>()?;
    snapshot.pending = (0..r.count()?)
        .map(|_| Ok((r.str()?, r.i64()?)))
        .collect::<Result<_, _>>()?;
    if version >= 2 {
        // In no log yet: key 0.
        snapshot.window = (0..r.count()?)
            .map(|_| read_held(&mut r, 0))
            .collect::<Result<_, _>>()?;
    }
    if version >= 3 {
        snapshot.fences_version = r.varint()?;
        if r.byte()? == 1 {
            snapshot.position = Some((f64::from_bits(r.u64()?), f64::from_bits(r.u64()?)));
        }
    }
    if r.at != bytes.len() {
        return Err(RecordError::Trailing(bytes.len() - r.at));
    }
    Ok(snapshot)
}

pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn put_str(out: &mut Vec<u8>, s: &str) {
    put_varint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// Reads what the `put_` functions wrote, every length checked.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, at: 0 }
    }

    /// Bytes read so far.
    pub(crate) fn at(&self) -> usize {
        self.at
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], RecordError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or(RecordError::Truncated(self.bytes.len()))?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn byte(&mut self) -> Result<u8, RecordError> {
        Ok(self.take(1)?[0])
    }

    fn i64(&mut self) -> Result<i64, RecordError> {
        Ok(self.u64()? as i64)
    }

    fn u64(&mut self) -> Result<u64, RecordError> {
        let mut raw = [0u8; 8];
        raw.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(raw))
    }

    pub(crate) fn varint(&mut self) -> Result<u64, RecordError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(RecordError::Truncated(self.at))
    }

    /// A count, bounded by the bytes left so that a corrupt length cannot
    /// ask for a huge allocation.
    pub(crate) fn count(&mut self) -> Result<usize, RecordError> {
        let n = self.varint()?;
        if n > (self.bytes.len() - self.at) as u64 {
            return Err(RecordError::Truncated(self.bytes.len()));
        }
        Ok(n as usize)
    }

    fn str(&mut self) -> Result<FenceId, RecordError> {
        let at = self.at;
        let len = self.count()?;
        std::str::from_utf8(self.take(len)?)
            .map(FenceId::from)
            .map_err(|_| RecordError::NotUtf8(at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn snapshot() -> impl Strategy<Value = VehicleSnapshot> {
        (
            (any::<i64>(), any::<i64>()),
            proptest::collection::vec(any::<u64>(), 0..4),
            proptest::collection::vec("\\PC{0,40}", 0..5),
            proptest::collection::vec(("\\PC{0,300}", any::<i64>()), 0..3),
            proptest::collection::vec(
                (
                    any::<i64>(),
                    -90.0..90.0f64,
                    -180.0..180.0f64,
                    any::<i64>(),
                    any::<u64>(),
                ),
                0..4,
            ),
            (
                any::<u64>(),
                proptest::option::of((-90.0..90.0f64, -180.0..180.0f64)),
            ),
        )
            .prop_map(
                |(
                    (last_fix_ms, last_heard_ms),
                    last_digests,
                    members,
                    pending,
                    window,
                    (fences_version, position),
                )| {
                    VehicleSnapshot {
                        last_fix_ms,
                        last_digests,
                        last_heard_ms,
                        members: members.into_iter().map(FenceId::from).collect(),
                        pending: pending
                            .into_iter()
                            .map(|(id, t)| (FenceId::from(id), t))
                            .collect(),
                        window: window
                            .into_iter()
                            .map(|(fix_ms, lat, lon, received_ms, digest)| HeldFix {
                                fix_ms,
                                lat,
                                lon,
                                received_ms,
                                digest,
                                key: 0,
                            })
                            .collect(),
                        position,
                        fences_version,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn round_trips(s in snapshot()) {
            let mut bytes = Vec::new();
            encode(&s, &mut bytes);
            prop_assert_eq!(decode(&bytes), Ok(s));
        }

        #[test]
        fn a_held_fix_round_trips_under_its_key(s in snapshot(), key in 1..u64::MAX) {
            for h in &s.window {
                let bytes = encode_held(h);
                prop_assert_eq!(decode_held(&bytes, key), Ok(HeldFix { key, ..*h }));
                prop_assert!(decode_held(&bytes[..bytes.len() - 1], key).is_err());
            }
        }

        #[test]
        fn every_cut_is_an_error_not_a_panic(s in snapshot()) {
            let mut bytes = Vec::new();
            encode(&s, &mut bytes);
            for cut in 0..bytes.len() {
                prop_assert!(decode(&bytes[..cut]).is_err());
            }
        }
    }

    #[test]
    fn a_vehicle_in_one_fence_costs_few_bytes() {
        let s = VehicleSnapshot {
            last_fix_ms: 1_772_427_600_000,
            last_digests: vec![7],
            last_heard_ms: 1_772_427_601_000,
            members: vec!["depot-17".into()],
            pending: vec![],
            window: vec![],
            position: Some((52.52, 13.4)),
            fences_version: 12,
        };
        let mut bytes = Vec::new();
        encode(&s, &mut bytes);
        assert_eq!(
            bytes.len(),
            1 + 8 + 8 + 1 + 8 + 1 + 1 + 8 + 1 + 1 + 1 + 1 + 16
        );
        assert_eq!(decode(&[4]), Err(RecordError::Version(4)));
        bytes.push(0);
        assert_eq!(decode(&bytes), Err(RecordError::Trailing(1)));
    }

    /// A version 1 record (before receive times, digests and windows) is
    /// still read, its receive time marked unknown.
    #[test]
    fn reads_version_1() {
        let mut v1 = vec![1];
        v1.extend_from_slice(&1_772_427_600_000i64.to_le_bytes());
        v1.push(1);
        put_str(&mut v1, "depot-17");
        v1.push(0);
        let s = decode(&v1).unwrap();
        assert_eq!(s.last_fix_ms, 1_772_427_600_000);
        assert_eq!(s.last_heard_ms, HEARD_UNKNOWN);
        assert_eq!(s.members, vec![FenceId::from("depot-17")]);
        assert!(s.window.is_empty() && s.last_digests.is_empty());
    }

    /// A version 2 record (before positions and settled versions) is still
    /// read: no position, settled as of version 0.
    #[test]
    fn reads_version_2() {
        let s = VehicleSnapshot {
            last_fix_ms: 1_772_427_600_000,
            last_heard_ms: 1_772_427_601_000,
            members: vec!["depot-17".into()],
            ..VehicleSnapshot::default()
        };
        let mut bytes = Vec::new();
        encode(&s, &mut bytes);
        // Version 3's tail for no position at version 0: varint 0, then 0.
        assert_eq!(bytes[bytes.len() - 2..], [0, 0]);
        bytes.truncate(bytes.len() - 2);
        bytes[0] = 2;
        assert_eq!(decode(&bytes), Ok(s));
    }
}
