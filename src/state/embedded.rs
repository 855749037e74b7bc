//! The embedded store: SQLite (bundled), one file, write-ahead log.
//!
//! Chosen over redb after measuring both on the pipeline's write pattern
//! (BENCHMARKS.md, "State store"): SQLite's WAL with `synchronous=NORMAL`
//! makes a commit survive a process crash with a `write()` and no fsync,
//! which is what `fsync = "flush"` promises; redb's only crash-safe commit
//! fsyncs. `fsync = "always"` sets `synchronous=FULL`: every commit is
//! fsynced and survives power loss.
//!
//! `locking_mode=EXCLUSIVE` takes the file's lock at open and holds it, so
//! a second geogate pointed at the same file fails at start, by name.

use super::crash_point;
use super::log_writeback::LogWriteback;
use super::outbox::OutboxEntry;
use super::record;
use super::{CommitBatch, Recovered, StateError, Store};
use crate::config::{FsyncPolicy, StateConfig};
use crate::model::VehicleId;
use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, params};
use std::path::{Path, PathBuf};
use std::time::Instant;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS vehicle (id TEXT PRIMARY KEY, state BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS outbox (seq INTEGER PRIMARY KEY, vehicle TEXT NOT NULL, line BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
INSERT OR IGNORE INTO meta VALUES ('schema', 1), ('next_seq', 1), ('mqtt_cursor', 0);
";

pub struct EmbeddedStore {
    path: PathBuf,
    conn: Connection,
    /// Under `fsync = "flush"`, on Linux: see [`LogWriteback`].
    log: Option<LogWriteback>,
}

impl EmbeddedStore {
    /// Opens (or, when missing or `config.reset`, creates) the file, takes
    /// its lock and reads everything committed.
    pub fn open(path: &Path, config: &StateConfig) -> Result<(Self, Recovered), StateError> {
        let mut created = !path.exists();
        let sql = |source| opening_error(path, source);
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(sql)?;
        // No waiting on a lock another process holds: say so at once.
        conn.busy_timeout(std::time::Duration::ZERO).map_err(sql)?;
        conn.pragma_update(None, "locking_mode", "EXCLUSIVE")
            .map_err(sql)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(sql)?;
        let synchronous = match config.fsync {
            FsyncPolicy::Flush => "NORMAL",
            FsyncPolicy::Always => "FULL",
        };
        conn.pragma_update(None, "synchronous", synchronous)
            .map_err(sql)?;
        // The first write takes the exclusive lock, held until close. A
        // reset empties the file only once it is ours: another geogate's
        // file is refused above, never wiped.
        conn.execute_batch(&format!("BEGIN IMMEDIATE; {SCHEMA} COMMIT;"))
            .map_err(sql)?;
        if config.reset {
            conn.execute_batch(
                "BEGIN; DELETE FROM vehicle; DELETE FROM outbox;
                 UPDATE meta SET value = 1 WHERE key = 'next_seq';
                 UPDATE meta SET value = 0 WHERE key = 'mqtt_cursor'; COMMIT;",
            )
            .map_err(|source| StateError::Sqlite {
                path: path.to_owned(),
                source,
            })?;
            created = true;
        }
        let mut store = Self {
            path: path.to_owned(),
            log: LogWriteback::open(&conn, config.fsync),
            conn,
        };
        let recovered = store.read_all(created)?;
        Ok((store, recovered))
    }

    fn read_all(&mut self, created: bool) -> Result<Recovered, StateError> {
        let path = self.path.clone();
        let sql = |source| StateError::Sqlite {
            path: path.clone(),
            source,
        };
        let meta = |key: &str| -> Result<u64, StateError> {
            self.conn
                .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| {
                    r.get::<_, i64>(0)
                })
                .optional()
                .map(|v| v.unwrap_or(0).max(0) as u64)
                .map_err(sql)
        };
        let next_seq = meta("next_seq")?.max(1);
        let mqtt_cursor = meta("mqtt_cursor")?;
        let mut vehicles = Vec::new();
        let mut stmt = self
            .conn
            .prepare("SELECT id, state FROM vehicle")
            .map_err(sql)?;
        let mut rows = stmt.query([]).map_err(sql)?;
        while let Some(row) = rows.next().map_err(sql)? {
            let id: String = row.get(0).map_err(sql)?;
            let bytes: Vec<u8> = row.get(1).map_err(sql)?;
            let snapshot = record::decode(&bytes).map_err(|source| StateError::Corrupt {
                path: path.clone(),
                vehicle: id.clone(),
                source,
            })?;
            vehicles.push((VehicleId::from(id), snapshot));
        }
        drop(rows);
        drop(stmt);
        let mut stmt = self
            .conn
            .prepare("SELECT seq, vehicle, line FROM outbox ORDER BY seq")
            .map_err(sql)?;
        let outbox = stmt
            .query_map([], |r| {
                Ok(OutboxEntry {
                    seq: r.get::<_, i64>(0)?.max(0) as u64,
                    vehicle: VehicleId::from(r.get::<_, String>(1)?),
                    line: r.get(2)?,
                })
            })
            .map_err(sql)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(sql)?;
        Ok(Recovered {
            vehicles,
            outbox,
            next_seq,
            mqtt_cursor,
            created,
        })
    }

    fn write(&mut self, batch: &CommitBatch) -> rusqlite::Result<()> {
        let tx = self.conn.transaction()?;
        {
            let mut upsert = tx.prepare_cached(
                "INSERT INTO vehicle (id, state) VALUES (?1, ?2) ON CONFLICT (id) DO UPDATE SET state = excluded.state",
            )?;
            let mut delete = tx.prepare_cached("DELETE FROM vehicle WHERE id = ?1")?;
            for (id, state) in &batch.vehicles {
                match state {
                    Some(bytes) => upsert.execute(params![&**id, bytes])?,
                    None => delete.execute([&**id])?,
                };
            }
            let mut append =
                tx.prepare_cached("INSERT INTO outbox (seq, vehicle, line) VALUES (?1, ?2, ?3)")?;
            for e in &batch.outbox {
                append.execute(params![stored(e.seq), &*e.vehicle, &e.line])?;
            }
            crash_point::reached("commit.inside");
            let mut set = tx.prepare_cached("UPDATE meta SET value = ?2 WHERE key = ?1")?;
            set.execute(params!["next_seq", batch.next_seq as i64])?;
            set.execute(params![
                "mqtt_cursor",
                batch.mqtt_cursor.min(i64::MAX as u64) as i64
            ])?;
            let confirmed = batch
                .file_cursor
                .min(batch.mqtt_cursor)
                .min(i64::MAX as u64);
            tx.prepare_cached("DELETE FROM outbox WHERE seq <= ?1")?
                .execute([confirmed as i64])?;
        }
        tx.commit()
    }
}

impl Store for EmbeddedStore {
    fn commit(&mut self, batch: &CommitBatch) -> Result<(), StateError> {
        self.write(batch).map_err(|source| StateError::Sqlite {
            path: self.path.clone(),
            source,
        })?;
        if let Some(log) = &mut self.log
            && !log.after_commit(Instant::now())
        {
            self.log = None;
        }
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        ["", "-wal"]
            .iter()
            .filter_map(|suffix| {
                let mut file = self.path.as_os_str().to_owned();
                file.push(suffix);
                std::fs::metadata(file).ok()
            })
            .map(|m| m.len())
            .sum()
    }

    fn durable(&self) -> bool {
        true
    }
}

/// Seqs and cursors as SQLite integers (i64); beyond i64::MAX is "all".
fn stored(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// At open, a busy or locked file is another process holding it.
fn opening_error(path: &Path, source: rusqlite::Error) -> StateError {
    match source.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StateError::Held {
            path: path.to_owned(),
        },
        _ => StateError::Sqlite {
            path: path.to_owned(),
            source,
        },
    }
}
