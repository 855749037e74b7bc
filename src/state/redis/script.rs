//! The rules script (`apply.lua`) and its call from Rust.

use super::{FixFacts, SharedKeys, partition_of};
use crate::geofence::{FixOutcome, VehicleSnapshot};
use redis::Script;
use serde::Deserialize;

/// What one script call did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// One per fix, in the order given.
    pub outcomes: Vec<FixOutcome>,
    /// Enters refused by `max_memberships`.
    pub overflows: u64,
    /// Transitions appended to the outbox.
    pub enters: u64,
    pub exits: u64,
}

/// The membership rules as a Redis script, with the settings it needs.
#[derive(Debug, Clone)]
pub struct SharedRules {
    script: Script,
    pub keys: SharedKeys,
    pub partitions: u32,
    pub max_memberships: usize,
    pub idle_expiry_ms: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum SharedStateError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("the rules script answered {0:?}")]
    Reply(String),
    #[error(
        "{key} says {recorded:?} partitions, this instance is configured with {ours}: every instance sharing a prefix must use the same [state] partitions"
    )]
    Partitions {
        key: String,
        recorded: Option<u32>,
        ours: u32,
    },
    #[error("vehicle state {key}: {message}")]
    Record { key: String, message: String },
}

/// A vehicle's state as the script stores it. Lua's cjson writes an empty
/// list as `{}`, so lists accept either form.
#[derive(Debug, Deserialize)]
struct StoredState {
    t: Option<i64>,
    #[serde(default, deserialize_with = "list_or_empty_object")]
    m: Vec<String>,
    #[serde(default, deserialize_with = "list_or_empty_object")]
    p: Vec<(String, i64)>,
}

fn list_or_empty_object<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum ListOrObject<T> {
        List(Vec<T>),
        Object(serde_json::Map<String, serde_json::Value>),
    }
    match ListOrObject::deserialize(d)? {
        ListOrObject::List(v) => Ok(v),
        ListOrObject::Object(m) if m.is_empty() => Ok(Vec::new()),
        ListOrObject::Object(_) => Err(serde::de::Error::custom("expected a list")),
    }
}

impl SharedRules {
    pub fn new(prefix: &str, partitions: u32, max_memberships: usize, idle_expiry_ms: i64) -> Self {
        Self {
            script: Script::new(include_str!("apply.lua")),
            keys: SharedKeys::new(prefix),
            partitions,
            max_memberships,
            idle_expiry_ms,
        }
    }

    pub fn partition_of(&self, vehicle: &str) -> u32 {
        partition_of(vehicle, self.partitions)
    }

    /// Applies `fixes`, all of `partition`, in one atomic call.
    pub async fn apply(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
        partition: u32,
        fixes: &[FixFacts],
    ) -> Result<Applied, SharedStateError> {
        let mut call = self.script.key(self.keys.outbox(partition));
        for fix in fixes {
            call.key(self.keys.vehicle(partition, &fix.vehicle));
        }
        let facts =
            serde_json::to_string(fixes).map_err(|e| SharedStateError::Reply(e.to_string()))?;
        let (letters, overflows, enters, exits, lateness): (String, u64, u64, u64, Vec<i64>) = call
            .arg(self.max_memberships)
            .arg(self.idle_expiry_ms.max(1))
            .arg(facts)
            .invoke_async(conn)
            .await?;
        let mut late = lateness.into_iter();
        let outcomes = letters
            .chars()
            .map(|c| match c {
                'a' => Ok(FixOutcome::Applied),
                'l' => late
                    .next()
                    .map(|by_ms| FixOutcome::Late { by_ms })
                    .ok_or_else(|| SharedStateError::Reply(letters.clone())),
                'd' => Ok(FixOutcome::Duplicate),
                _ => Err(SharedStateError::Reply(letters.clone())),
            })
            .collect::<Result<Vec<_>, _>>()?;
        if outcomes.len() != fixes.len() {
            return Err(SharedStateError::Reply(letters));
        }
        Ok(Applied {
            outcomes,
            overflows,
            enters,
            exits,
        })
    }

    /// Records this instance's partition count, or checks it against the
    /// one already recorded: instances that disagree would look for a
    /// vehicle's state in different places.
    pub async fn agree_on_partitions(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
    ) -> Result<(), SharedStateError> {
        let key = self.keys.meta("partitions");
        let _: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(self.partitions)
            .arg("NX")
            .query_async(conn)
            .await?;
        let recorded: Option<u32> = redis::cmd("GET").arg(&key).query_async(conn).await?;
        match recorded {
            Some(n) if n == self.partitions => Ok(()),
            other => Err(SharedStateError::Partitions {
                key,
                recorded: other,
                ours: self.partitions,
            }),
        }
    }

    /// A vehicle's stored state (`None`: never seen, or expired).
    pub async fn snapshot(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
        vehicle: &str,
    ) -> Result<Option<VehicleSnapshot>, SharedStateError> {
        let key = self.keys.vehicle(self.partition_of(vehicle), vehicle);
        let raw: Option<String> = redis::cmd("GET").arg(&key).query_async(conn).await?;
        let Some(raw) = raw else {
            return Ok(None);
        };
        let stored: StoredState =
            serde_json::from_str(&raw).map_err(|e| SharedStateError::Record {
                key: key.clone(),
                message: e.to_string(),
            })?;
        Ok(Some(VehicleSnapshot {
            last_fix_ms: stored.t.unwrap_or(i64::MIN),
            members: stored.m.into_iter().map(Into::into).collect(),
            pending: stored.p.into_iter().map(|(f, s)| (f.into(), s)).collect(),
            ..VehicleSnapshot::default()
        }))
    }
}
