//! The embedded store: SQLite (bundled), one file, write-ahead log.
//!
//! Chosen over redb after measuring both on the pipeline's write pattern
//! (docs/decisions/0001-sqlite-embedded-state-store.md): SQLite's WAL with
//! `synchronous=NORMAL` makes a commit survive a process crash with a
//! `write()` and no fsync, which is what `fsync = "flush"` promises; redb's
//! only crash-safe commit fsyncs. `fsync = "always"` sets
//! `synchronous=FULL`: every commit is fsynced and survives power loss.
//!
//! `locking_mode=EXCLUSIVE` takes the file's lock at open and holds it, so
//! a second geogate pointed at the same file fails at start, by name.

mod config;
mod error;
pub mod held_log;
pub mod log_writeback;
pub mod outbox_rows;

pub use error::EmbeddedError;

use super::StateError;
use super::local::held_batch::{self, HeldBatch, HeldBytesError};
use super::local::record;
use super::local::store::{
    CommitBatch, FenceRows, NO_FILE_CURSOR, Opened, Recovered, Store, StoredFence, StoredFences,
    read_tail, with_held,
};
use crate::crash_point;
use crate::delivery::outbox::OutboxEntry;
use crate::geofence::{HeldChange, HeldFix};
use crate::model::{FenceId, VehicleId};
use crate::sink::config::FsyncPolicy;
use crate::state::StateConfig;
use held_log::{HeldLog, HeldPlan};
use log_writeback::LogWriteback;
use outbox_rows::OutboxRowError;
use rusqlite::types::ValueRef;
use rusqlite::{
    Connection, ErrorCode, OpenFlags, OptionalExtension, Transaction, TransactionBehavior, params,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Version 6 keeps the fence set (`fence`, a row per live fence with its
/// version, change time and GeoJSON; `fence_tombstone`, each deleted id's
/// last deletion; meta `fence_version`, `fence_changed_ms`); opening adds
/// the tables, empty, to an older file, which then holds no set.
/// Version 5 records each outbox row's commit time (`committed_ms`), from
/// which an output's maximum age counts; opening adds the column to an
/// older file, its rows at 0 (unknown). Version 4 keeps the log of held fixes a row per commit (`held_log`,
/// [`held_batch`], [`held_log`]); version 3 kept a row per fix, in a table `held` that
/// opening moves over. An older geogate would not read the log: it
/// refuses the file instead of dropping held fixes. Version 2 keeps the
/// outbox a row per commit ([`outbox_rows`]); version 1 kept a row per
/// entry, in a table `outbox` that opening moves over.
const SCHEMA_VERSION: i64 = 6;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS vehicle (id TEXT PRIMARY KEY, state BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS held_log (id INTEGER PRIMARY KEY, changes BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS outbox_commit (last_seq INTEGER PRIMARY KEY, first_seq INTEGER NOT NULL, entries BLOB NOT NULL, committed_ms INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fence (id TEXT PRIMARY KEY, version INTEGER NOT NULL, changed_ms INTEGER NOT NULL, feature TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fence_tombstone (id TEXT PRIMARY KEY, version INTEGER NOT NULL, at_ms INTEGER NOT NULL, feature TEXT NOT NULL) WITHOUT ROWID;
";

/// Takes version 1's table name, so that a geogate from before version 2
/// (which reads no version) fails at open on "no such column" instead of
/// creating an empty `outbox` beside this one and never delivering what
/// `outbox_commit` holds.
const OLD_READERS_REFUSED: &str = "CREATE VIEW outbox AS SELECT 2 AS schema_version";

/// Opens the store at `config.embedded.path`, checked against the events file so
/// that a lost or stale state file is an error rather than a silent reset.
pub fn open(config: &StateConfig, events: Option<&Path>) -> Result<Opened, StateError> {
    let tail = read_tail(events)?;
    let path = &config.embedded.path;
    if !config.reset
        && !path.exists()
        && tail.has_lines
        && let Some(events) = events
    {
        return Err(StateError::from(EmbeddedError::Missing {
            path: path.clone(),
            events: events.to_owned(),
            last_seq: tail.last_seq,
        }));
    }
    let (store, mut recovered) = EmbeddedStore::open(path, config)?;
    let store_seq = recovered.next_seq.saturating_sub(1);
    if tail.has_lines
        && tail.last_seq.is_none()
        && store_seq > 0
        && let Some(events) = events
    {
        // Transitions were written, yet no line says which: the relay
        // cannot tell where to go on without repeating.
        return Err(StateError::from(EmbeddedError::EventsWithoutSeq {
            path: events.to_owned(),
            store_seq,
        }));
    }
    let file_seq = tail.last_seq.unwrap_or(0);
    // Every transition up to the recorded cursor was synced to the events
    // file: one that is not there now was taken from outside (the file
    // moved, truncated or replaced). Only lines past it may be lost to a
    // power loss, and the outbox still holds those. Writing the missing
    // ones again from the outbox would copy what the moved file holds;
    // going on without them would leave a silent gap: refused either way.
    if let Some(events) = events
        && recovered.file_cursor != NO_FILE_CURSOR
        && !recovered.created
        && recovered.file_cursor > file_seq
    {
        let gap = EmbeddedError::EventsGap {
            path: events.to_owned(),
            file_seq,
            first: file_seq + 1,
            last: recovered.file_cursor,
        };
        if !config.accept_events_gap {
            return Err(StateError::from(gap));
        }
        tracing::warn!("{gap}; going on without them (--accept-events-gap)");
    }
    if file_seq > store_seq {
        if !recovered.created {
            return Err(StateError::from(EmbeddedError::Behind {
                path: path.clone(),
                store_seq,
                events: events.map(Path::to_owned).unwrap_or_default(),
                file_seq,
            }));
        }
        // A reset: keep numbering after the file's last line.
        recovered.next_seq = file_seq + 1;
    }
    tracing::info!(
        vehicles = recovered.vehicles.len(),
        outbox = recovered.outbox_len,
        "state {} opened{}",
        path.display(),
        if recovered.created { " (new)" } else { "" }
    );
    Ok(Opened {
        store: Box::new(store),
        recovered,
        tail,
    })
}

pub struct EmbeddedStore {
    path: PathBuf,
    conn: Connection,
    /// Under `fsync = "flush"`, on Linux: see [`LogWriteback`].
    log: Option<LogWriteback>,
    /// Which rows of `held_log` still hold a waiting fix.
    held: HeldLog,
}

impl EmbeddedStore {
    /// Opens (or, when missing or `config.reset`, creates) the file, takes
    /// its lock and reads everything committed.
    pub fn open(path: &Path, config: &StateConfig) -> Result<(Self, Recovered), EmbeddedError> {
        let mut created = !path.exists();
        let sql = |source| opening_error(path, source);
        let mut conn = Connection::open_with_flags(
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
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql)?;
        let version = upgrade(&tx, config.reset).map_err(sql)?;
        if version > SCHEMA_VERSION {
            return Err(EmbeddedError::Newer {
                path: path.to_owned(),
                version,
                readable: SCHEMA_VERSION,
            });
        }
        if config.reset {
            tx.execute_batch(
                "DELETE FROM vehicle; DELETE FROM held_log; DELETE FROM outbox_commit;
                 DELETE FROM fence; DELETE FROM fence_tombstone;
                 DELETE FROM meta WHERE key IN ('fence_version', 'fence_changed_ms');
                 UPDATE meta SET value = 1 WHERE key = 'next_seq';
                 UPDATE meta SET value = 0 WHERE key = 'mqtt_cursor';
                 UPDATE meta SET value = 0 WHERE key = 'webhook_cursor';
                 UPDATE meta SET value = 9223372036854775807 WHERE key = 'file_cursor';",
            )
            .map_err(sql)?;
            created = true;
        }
        tx.commit().map_err(sql)?;
        let mut store = Self {
            path: path.to_owned(),
            log: LogWriteback::open(&conn, config.fsync),
            conn,
            held: HeldLog::one_row(1, &[]),
        };
        let recovered = store.read_all(created)?;
        Ok((store, recovered))
    }

    fn read_all(&mut self, created: bool) -> Result<Recovered, EmbeddedError> {
        let path = self.path.clone();
        let sql = |source| EmbeddedError::Sqlite {
            path: path.clone(),
            source,
        };
        let meta = |key: &str| -> Result<u64, EmbeddedError> {
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
        let webhook_cursor = meta("webhook_cursor")?;
        let file_cursor = meta("file_cursor")?;
        let mut vehicles = Vec::new();
        let mut stmt = self
            .conn
            .prepare("SELECT id, state FROM vehicle")
            .map_err(sql)?;
        let mut rows = stmt.query([]).map_err(sql)?;
        while let Some(row) = rows.next().map_err(sql)? {
            let id: String = row.get(0).map_err(sql)?;
            let bytes: Vec<u8> = row.get(1).map_err(sql)?;
            let snapshot = record::decode(&bytes).map_err(|source| EmbeddedError::Corrupt {
                path: path.clone(),
                vehicle: id.clone(),
                source,
            })?;
            vehicles.push((VehicleId::from(id), snapshot));
        }
        drop(rows);
        drop(stmt);
        let held = self.read_held().map_err(|e| match e {
            ReadHeld::Sqlite(source) => sql(source),
            ReadHeld::Row { id, source } => EmbeddedError::CorruptHeld {
                path: path.clone(),
                id,
                source,
            },
        })?;
        let vehicles = with_held(vehicles, held);
        // Every row is read and checked (a damaged one fails the open by
        // name), one at a time: only the first seq and the count are kept.
        let (mut outbox_first, mut outbox_len) = (None, 0u64);
        scan_outbox(&self.conn, &path, 0, usize::MAX, |entries| {
            outbox_first = outbox_first.or(entries.first().map(|e| e.seq));
            outbox_len += entries.len() as u64;
        })?;
        let fences = self.read_fences().map_err(sql)?;
        Ok(Recovered {
            vehicles,
            outbox_first,
            outbox_len,
            next_seq,
            mqtt_cursor,
            webhook_cursor,
            file_cursor,
            created,
            fences,
        })
    }

    /// The fence set, if the store was ever given one.
    fn read_fences(&self) -> rusqlite::Result<Option<StoredFences>> {
        let meta = |key: &str| {
            self.conn
                .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| {
                    r.get::<_, i64>(0)
                })
                .optional()
        };
        let Some(version) = meta("fence_version")? else {
            return Ok(None);
        };
        let changed_ms = meta("fence_changed_ms")?.unwrap_or(0);
        let rows = |table: &str| -> rusqlite::Result<Vec<StoredFence>> {
            self.conn
                .prepare(&format!(
                    "SELECT id, version, {}, feature FROM {table} ORDER BY id",
                    if table == "fence" {
                        "changed_ms"
                    } else {
                        "at_ms"
                    }
                ))?
                .query_map([], |r| {
                    Ok((
                        FenceId::from(r.get::<_, String>(0)?),
                        r.get::<_, i64>(1)?.max(0) as u64,
                        r.get::<_, i64>(2)?,
                        r.get::<_, String>(3)?,
                    ))
                })?
                .collect()
        };
        Ok(Some(StoredFences {
            version: version.max(0) as u64,
            changed_ms,
            fences: rows("fence")?,
            tombstones: rows("fence_tombstone")?,
        }))
    }

    /// Replays the log of held fixes, and writes what waits back as one
    /// row (the log's rows since the oldest waiting fix become one).
    /// Returns the waiting fixes in key order.
    fn read_held(&mut self) -> Result<Vec<(VehicleId, HeldFix)>, ReadHeld> {
        let mut waiting = HashMap::new();
        let mut rows_read = false;
        {
            let mut stmt = self
                .conn
                .prepare("SELECT id, changes FROM held_log ORDER BY id")?;
            let mut rows = stmt.query([])?;
            while let Some(row) = rows.next()? {
                let id = row.get::<_, i64>(0)?;
                rows_read = true;
                let corrupt = |source| ReadHeld::Row { id, source };
                let ValueRef::Blob(bytes) = row.get_ref(1)? else {
                    return Err(corrupt(HeldBytesError::NotBytes));
                };
                held_batch::replay(bytes, &mut waiting).map_err(corrupt)?;
            }
        }
        let mut held: Vec<(u64, (VehicleId, HeldFix))> = waiting.into_iter().collect();
        held.sort_unstable_by_key(|(key, _)| *key);
        let keys: Vec<u64> = held.iter().map(|(key, _)| *key).collect();
        let held: Vec<(VehicleId, HeldFix)> = held.into_iter().map(|(_, h)| h).collect();
        // Written back as row 1, the log's ids starting over.
        if rows_read {
            let changes: Vec<HeldChange> = held
                .iter()
                .map(|(v, fix)| HeldChange::Held(v.clone(), *fix))
                .collect();
            let bytes = HeldBatch::from_changes(&changes).bytes;
            let tx = self.conn.transaction()?;
            tx.execute("DELETE FROM held_log", [])?;
            if !changes.is_empty() {
                tx.execute(
                    "INSERT INTO held_log (id, changes) VALUES (?1, ?2)",
                    params![1, bytes],
                )?;
            }
            tx.commit()?;
        }
        self.held = HeldLog::one_row(1, &keys);
        Ok(held)
    }

    fn write(&mut self, batch: &CommitBatch, held: &HeldPlan) -> rusqlite::Result<()> {
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
            if let Some(id) = held.insert {
                tx.prepare_cached("INSERT INTO held_log (id, changes) VALUES (?1, ?2)")?
                    .execute(params![id, batch.held.bytes])?;
            }
            if let Some(through) = held.delete_through {
                tx.prepare_cached("DELETE FROM held_log WHERE id <= ?1")?
                    .execute([through])?;
            }
            append_outbox(&tx, &batch.outbox)?;
            write_fences(&tx, &batch.fences)?;
            crash_point::reached("commit.inside");
            let mut set = tx.prepare_cached("UPDATE meta SET value = ?2 WHERE key = ?1")?;
            set.execute(params!["next_seq", batch.next_seq as i64])?;
            set.execute(params![
                "mqtt_cursor",
                batch.mqtt_cursor.min(i64::MAX as u64) as i64
            ])?;
            set.execute(params!["webhook_cursor", stored(batch.webhook_cursor)])?;
            set.execute(params!["file_cursor", stored(batch.file_cursor)])?;
            let confirmed = batch
                .file_cursor
                .min(batch.mqtt_cursor)
                .min(batch.webhook_cursor)
                .min(i64::MAX as u64);
            tx.prepare_cached("DELETE FROM outbox_commit WHERE last_seq <= ?1")?
                .execute([confirmed as i64])?;
        }
        tx.commit()
    }
}

/// Writes fence changes, in order: a put replaces its id's row, a
/// deletion moves the row to the tombstones.
fn write_fences(tx: &Transaction, changes: &[FenceRows]) -> rusqlite::Result<()> {
    for change in changes {
        let mut put = tx.prepare_cached(
            "INSERT OR REPLACE INTO fence (id, version, changed_ms, feature) VALUES (?1, ?2, ?3, ?4)",
        )?;
        let mut delete = tx.prepare_cached("DELETE FROM fence WHERE id = ?1")?;
        let mut tombstone = tx.prepare_cached(
            "INSERT OR REPLACE INTO fence_tombstone (id, version, at_ms, feature) VALUES (?1, ?2, ?3, ?4)",
        )?;
        let version = stored(change.version);
        for (id, feature) in &change.deleted {
            delete.execute([&**id])?;
            tombstone.execute(params![&**id, version, change.at_ms, feature])?;
        }
        for (id, feature) in &change.put {
            put.execute(params![&**id, version, change.at_ms, feature])?;
            crash_point::reached("fences.inside");
        }
        let mut meta =
            tx.prepare_cached("INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)")?;
        meta.execute(params!["fence_version", version])?;
        meta.execute(params!["fence_changed_ms", change.at_ms])?;
    }
    Ok(())
}

/// Reads the outbox's rows that hold seqs after `after`, in seq order,
/// checking each (a damaged row is an error naming it, never a panic), and
/// hands each row's entries to `each`, until rows holding `max` entries
/// have been read.
fn scan_outbox(
    conn: &Connection,
    path: &Path,
    after: u64,
    max: usize,
    mut each: impl FnMut(Vec<OutboxEntry>),
) -> Result<(), EmbeddedError> {
    let sql = |source| EmbeddedError::Sqlite {
        path: path.to_owned(),
        source,
    };
    let mut stmt = conn
        .prepare_cached(
            "SELECT first_seq, last_seq, entries, committed_ms FROM outbox_commit WHERE last_seq > ?1 ORDER BY last_seq",
        )
        .map_err(sql)?;
    let mut rows = stmt.query([stored(after)]).map_err(sql)?;
    let mut previous_last = None;
    let mut taken = 0usize;
    while taken < max
        && let Some(row) = rows.next().map_err(sql)?
    {
        let first = row.get::<_, i64>(0).map_err(sql)?.max(0) as u64;
        let last = row.get::<_, i64>(1).map_err(sql)?.max(0) as u64;
        let corrupt = |source| EmbeddedError::CorruptOutbox {
            path: path.to_owned(),
            last_seq: last,
            source,
        };
        if let Some(previous) = previous_last
            && first <= previous
        {
            return Err(corrupt(OutboxRowError::Overlap { first, previous }));
        }
        previous_last = Some(last);
        let bytes = match row.get_ref(2).map_err(sql)? {
            ValueRef::Blob(bytes) => bytes,
            _ => return Err(corrupt(OutboxRowError::NotBytes)),
        };
        let committed_ms = row.get::<_, i64>(3).map_err(sql)?;
        let mut entries = Vec::new();
        outbox_rows::unpack(first, last, committed_ms, bytes, &mut entries).map_err(corrupt)?;
        taken += entries.len();
        each(entries);
    }
    Ok(())
}

impl Store for EmbeddedStore {
    fn outbox_after(&mut self, after: u64, max: usize) -> Result<Vec<OutboxEntry>, StateError> {
        let mut out = Vec::new();
        scan_outbox(&self.conn, &self.path, after, max, |entries| {
            out.extend(entries.into_iter().filter(|e| e.seq > after));
        })?;
        Ok(out)
    }

    fn commit(&mut self, batch: &CommitBatch) -> Result<(), StateError> {
        let held = self.held.plan(&batch.held.runs);
        self.write(batch, &held)
            .map_err(|source| EmbeddedError::Sqlite {
                path: self.path.clone(),
                source,
            })?;
        self.held.committed(held);
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

/// Appends entries to the outbox, a row per run of consecutive seqs.
fn append_outbox(tx: &Transaction, entries: &[OutboxEntry]) -> rusqlite::Result<()> {
    let mut append = tx.prepare_cached(
        "INSERT INTO outbox_commit (last_seq, first_seq, entries, committed_ms) VALUES (?1, ?2, ?3, ?4)",
    )?;
    for row in outbox_rows::pack(entries) {
        append.execute(params![
            stored(row.last),
            stored(row.first),
            row.bytes,
            row.committed_ms
        ])?;
    }
    Ok(())
}

/// Why the log of held fixes could not be read.
enum ReadHeld {
    Sqlite(rusqlite::Error),
    Row { id: i64, source: HeldBytesError },
}

impl From<rusqlite::Error> for ReadHeld {
    fn from(e: rusqlite::Error) -> Self {
        Self::Sqlite(e)
    }
}

/// Brings the file to this version inside the opening transaction, and
/// returns the version it found if that is newer (then nothing is
/// written). With `reset`, a version 1 outbox is dropped unread, so that a
/// damaged one cannot stand in the way of the reset meant to get past it.
fn upgrade(tx: &Transaction, reset: bool) -> rusqlite::Result<i64> {
    if exists(tx, "table", "meta")? {
        let version: Option<i64> = tx
            .query_row("SELECT value FROM meta WHERE key = 'schema'", [], |r| {
                r.get(0)
            })
            .optional()?;
        if let Some(newer) = version.filter(|&v| v > SCHEMA_VERSION) {
            return Ok(newer);
        }
    }
    tx.execute_batch(SCHEMA)?;
    let has_commit_times: bool = tx.query_row(
        "SELECT EXISTS (SELECT 1 FROM pragma_table_info('outbox_commit') WHERE name = 'committed_ms')",
        [],
        |r| r.get(0),
    )?;
    if !has_commit_times {
        tx.execute_batch(
            "ALTER TABLE outbox_commit ADD COLUMN committed_ms INTEGER NOT NULL DEFAULT 0",
        )?;
    }
    tx.execute(
        "INSERT OR IGNORE INTO meta VALUES ('schema', ?1), ('next_seq', 1), ('mqtt_cursor', 0), ('file_cursor', ?2), ('webhook_cursor', ?2)",
        params![SCHEMA_VERSION, stored(NO_FILE_CURSOR)],
    )?;
    if exists(tx, "table", "outbox")? {
        if !reset {
            let entries = tx
                .prepare("SELECT seq, vehicle, line FROM outbox ORDER BY seq")?
                .query_map([], |r| {
                    Ok(OutboxEntry {
                        seq: r.get::<_, i64>(0)?.max(0) as u64,
                        vehicle: VehicleId::from(r.get::<_, String>(1)?),
                        line: r.get(2)?,
                        committed_ms: 0,
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            append_outbox(tx, &entries)?;
        }
        tx.execute_batch("DROP TABLE outbox")?;
    }
    if exists(tx, "table", "held")? {
        if !reset {
            // Version 3's row per fix becomes one row of the log, in key
            // order. A damaged fix (a key geogate never gives, bytes that
            // are not a fix) fails the open, naming what it is.
            let mut bytes = Vec::new();
            let mut rows = tx.prepare("SELECT key, vehicle, fix FROM held ORDER BY key")?;
            let mut rows = rows.query([])?;
            while let Some(row) = rows.next()? {
                let key = row.get::<_, i64>(0)?;
                let vehicle: String = row.get(1)?;
                let fix: Vec<u8> = row.get(2)?;
                let damaged = |source: Box<dyn std::error::Error + Send + Sync>| {
                    rusqlite::Error::FromSqlConversionFailure(
                        2,
                        rusqlite::types::Type::Blob,
                        source,
                    )
                };
                if key < 1 {
                    return Err(damaged(
                        format!("held fix of {vehicle:?} under key {key}").into(),
                    ));
                }
                record::decode_held(&fix, key as u64).map_err(|e| damaged(Box::new(e)))?;
                held_batch::put_entered(&mut bytes, key as u64, &vehicle, &fix);
            }
            if !bytes.is_empty() {
                tx.execute("INSERT INTO held_log (id, changes) VALUES (1, ?1)", [bytes])?;
            }
        }
        tx.execute_batch("DROP TABLE held")?;
    }
    if !exists(tx, "view", "outbox")? {
        tx.execute_batch(OLD_READERS_REFUSED)?;
    }
    tx.execute(
        "UPDATE meta SET value = ?1 WHERE key = 'schema'",
        [SCHEMA_VERSION],
    )?;
    Ok(SCHEMA_VERSION)
}

fn exists(tx: &Transaction, kind: &str, name: &str) -> rusqlite::Result<bool> {
    tx.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = ?1 AND name = ?2)",
        [kind, name],
        |r| r.get(0),
    )
}

/// Seqs and cursors as SQLite integers (i64); beyond i64::MAX is "all".
fn stored(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// At open, a busy or locked file is another process holding it.
fn opening_error(path: &Path, source: rusqlite::Error) -> EmbeddedError {
    match source.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => EmbeddedError::Held {
            path: path.to_owned(),
        },
        _ => EmbeddedError::Sqlite {
            path: path.to_owned(),
            source,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{EmbeddedConfig, StateBackend};

    fn config(dir: &Path) -> StateConfig {
        StateConfig {
            backend: StateBackend::Embedded,
            embedded: EmbeddedConfig {
                path: dir.join("state.sqlite"),
            },
            fsync: FsyncPolicy::Flush,
            ..StateConfig::default()
        }
    }

    /// The tables a version 1 file had.
    const VERSION_1_TABLES: &str = "
        CREATE TABLE vehicle (id TEXT PRIMARY KEY, state BLOB NOT NULL) WITHOUT ROWID;
        CREATE TABLE outbox (seq INTEGER PRIMARY KEY, vehicle TEXT NOT NULL, line BLOB NOT NULL);
        CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;";

    fn schema_version(conn: &Connection) -> i64 {
        conn.query_row("SELECT value FROM meta WHERE key = 'schema'", [], |r| {
            r.get(0)
        })
        .unwrap()
    }

    /// A store created in `dir` and closed, then changed behind its back.
    fn created_then_altered(dir: &Path, sql: &str) -> StateConfig {
        let config = config(dir);
        drop(EmbeddedStore::open(&config.embedded.path, &config).unwrap());
        Connection::open(&config.embedded.path)
            .unwrap()
            .execute_batch(sql)
            .unwrap();
        config
    }

    /// Everything the outbox holds.
    fn outbox(store: &mut EmbeddedStore) -> Vec<OutboxEntry> {
        store.outbox_after(0, usize::MAX).unwrap()
    }

    fn entry(seq: u64) -> OutboxEntry {
        OutboxEntry {
            seq,
            vehicle: "van7".into(),
            line: format!(r#"{{"seq":{seq}}}"#).into_bytes(),
            committed_ms: 0,
        }
    }

    /// A file written by a geogate before the outbox became a row per
    /// commit: its rows move over at open, nothing is lost, and later
    /// commits and reopenings see one outbox.
    #[test]
    fn a_version_1_file_opens_with_its_outbox_intact() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        let mut record = Vec::new();
        record::encode(
            &crate::geofence::VehicleSnapshot {
                last_fix_ms: 1_000,
                members: vec!["depot".into()],
                ..Default::default()
            },
            &mut record,
        );
        {
            let old = Connection::open(&config.embedded.path).unwrap();
            old.execute_batch(VERSION_1_TABLES).unwrap();
            old.execute_batch(
                "PRAGMA journal_mode = WAL;
                 INSERT INTO meta VALUES ('schema', 1), ('next_seq', 5), ('mqtt_cursor', 1);",
            )
            .unwrap();
            old.execute("INSERT INTO vehicle VALUES ('van7', ?1)", [&record])
                .unwrap();
            for seq in [2, 3, 4] {
                let e = entry(seq);
                old.execute(
                    "INSERT INTO outbox VALUES (?1, ?2, ?3)",
                    params![seq as i64, &*e.vehicle, &e.line],
                )
                .unwrap();
            }
        }
        let (mut store, recovered) = EmbeddedStore::open(&config.embedded.path, &config).unwrap();
        assert!(!recovered.created);
        assert_eq!(outbox(&mut store), vec![entry(2), entry(3), entry(4)]);
        assert_eq!((recovered.outbox_first, recovered.outbox_len), (Some(2), 3));
        assert_eq!((recovered.next_seq, recovered.mqtt_cursor), (5, 1));
        assert_eq!(recovered.vehicles.len(), 1);
        assert_eq!(&*recovered.vehicles[0].1.members[0], "depot");
        store
            .commit(&CommitBatch {
                outbox: vec![entry(5), entry(6)],
                next_seq: 7,
                file_cursor: 4,
                mqtt_cursor: 4,
                webhook_cursor: u64::MAX,
                ..CommitBatch::default()
            })
            .unwrap();
        drop(store);
        let (mut store, recovered) = EmbeddedStore::open(&config.embedded.path, &config).unwrap();
        // 2–4 were confirmed by both destinations and pruned.
        assert_eq!(outbox(&mut store), vec![entry(5), entry(6)]);
        assert_eq!(recovered.next_seq, 7);
        assert_eq!(schema_version(&store.conn), SCHEMA_VERSION);
        let tx = store.conn.transaction().unwrap();
        assert!(
            !exists(&tx, "table", "outbox").unwrap(),
            "version 1's table is gone"
        );
        // What a geogate from before version 2 runs at open: it creates
        // nothing beside the new table, and its read fails, loudly.
        tx.execute_batch("CREATE TABLE IF NOT EXISTS outbox (seq INTEGER PRIMARY KEY, vehicle TEXT NOT NULL, line BLOB NOT NULL)")
            .unwrap();
        assert!(!exists(&tx, "table", "outbox").unwrap());
        let old_read = tx.prepare("SELECT seq, vehicle, line FROM outbox ORDER BY seq");
        assert!(
            old_read.is_err(),
            "an older geogate must fail to read the outbox"
        );
    }

    /// Held fixes live in a log beside the records: what was put and not
    /// deleted comes back in its vehicle's window, in fix-time order, with
    /// its key; a vehicle known only from the log comes back with nothing
    /// applied; receive times take the log's newest into account.
    #[test]
    fn held_fixes_come_back_in_their_windows() {
        use crate::geofence::{HeldFix, VehicleSnapshot};
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        let held = |fix_ms, key| HeldFix {
            fix_ms,
            lat: 52.5,
            lon: 13.4,
            received_ms: 5_000 + key as i64,
            digest: key,
            key,
        };
        let put = |vehicle: &str, h: &HeldFix| HeldChange::Held(vehicle.into(), *h);
        let mut van7 = Vec::new();
        record::encode(
            &VehicleSnapshot {
                last_fix_ms: 1_000,
                last_heard_ms: 1_000,
                members: vec!["depot".into()],
                ..Default::default()
            },
            &mut van7,
        );
        let (mut store, _) = EmbeddedStore::open(&config.embedded.path, &config).unwrap();
        store
            .commit(&CommitBatch {
                vehicles: vec![("van7".into(), Some(van7))],
                held: HeldBatch::from_changes(&[
                    put("van7", &held(3_000, 1)),
                    put("van7", &held(2_000, 2)),
                    put("van7", &held(4_000, 3)),
                    put("van8", &held(2_500, 4)),
                    // Arrived after key 4 at the same fix time, though
                    // received earlier (another decode lane): after it.
                    put(
                        "van8",
                        &HeldFix {
                            received_ms: 4_000,
                            ..held(2_500, 5)
                        },
                    ),
                ]),
                next_seq: 1,
                ..CommitBatch::default()
            })
            .unwrap();
        store
            .commit(&CommitBatch {
                held: HeldBatch::from_changes(&[HeldChange::Left(3)]),
                next_seq: 1,
                ..CommitBatch::default()
            })
            .unwrap();
        drop(store);
        let (_, recovered) = EmbeddedStore::open(&config.embedded.path, &config).unwrap();
        let mut vehicles = recovered.vehicles;
        vehicles.sort_by(|a, b| a.0.cmp(&b.0));
        let (id, van7) = &vehicles[0];
        assert_eq!(&**id, "van7");
        assert_eq!(van7.window, vec![held(2_000, 2), held(3_000, 1)]);
        assert_eq!((van7.last_fix_ms, van7.last_heard_ms), (1_000, 5_002));
        assert_eq!(&*van7.members[0], "depot");
        let (id, van8) = &vehicles[1];
        assert_eq!(&**id, "van8");
        assert_eq!(
            van8.window,
            vec![
                held(2_500, 4),
                HeldFix {
                    received_ms: 4_000,
                    ..held(2_500, 5)
                }
            ]
        );
        assert_eq!((van8.last_fix_ms, van8.last_heard_ms), (i64::MIN, 5_004));
        assert!(van8.members.is_empty());
    }

    fn held_log_rows(store: &EmbeddedStore) -> i64 {
        store
            .conn
            .query_row("SELECT count(*) FROM held_log", [], |r| r.get(0))
            .unwrap()
    }

    fn held_at(key: u64) -> crate::geofence::HeldFix {
        crate::geofence::HeldFix {
            fix_ms: key as i64,
            lat: 0.0,
            lon: 0.0,
            received_ms: 0,
            digest: key,
            key,
        }
    }

    /// A row of the log goes once none of its fixes waits and every row
    /// before it has gone; what waits comes back, and opening leaves it
    /// in one row.
    #[test]
    fn the_log_keeps_only_rows_that_still_matter() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        let put = |key| HeldChange::Held("van7".into(), held_at(key));
        let left = HeldChange::Left;
        let commit = |store: &mut EmbeddedStore, held: Vec<HeldChange>| {
            store
                .commit(&CommitBatch {
                    held: HeldBatch::from_changes(&held),
                    next_seq: 1,
                    ..CommitBatch::default()
                })
                .unwrap();
        };
        let (mut store, _) = EmbeddedStore::open(&config.embedded.path, &config).unwrap();
        commit(&mut store, vec![put(1), put(2), put(3)]);
        commit(&mut store, vec![put(4), put(5)]);
        assert_eq!(held_log_rows(&store), 2);
        commit(&mut store, vec![left(1), left(2), left(3)]);
        assert_eq!(held_log_rows(&store), 2, "the first row has gone");
        // The second row still waits: the rows after it stay, or its
        // fixes' "left" would go before the row they entered in.
        commit(&mut store, vec![left(4)]);
        assert_eq!(held_log_rows(&store), 3);
        // Entered and left within one commit: nothing to keep.
        commit(&mut store, vec![put(6), left(6)]);
        drop(store);
        let (mut store, recovered) = EmbeddedStore::open(&config.embedded.path, &config).unwrap();
        let keys: Vec<u64> = recovered.vehicles[0]
            .1
            .window
            .iter()
            .map(|h| h.key)
            .collect();
        assert_eq!(keys, [5]);
        assert_eq!(held_log_rows(&store), 1, "compacted at open");
        commit(&mut store, vec![left(5)]);
        assert_eq!(held_log_rows(&store), 0);
        drop(store);
        let (_, recovered) = EmbeddedStore::open(&config.embedded.path, &config).unwrap();
        assert!(recovered.vehicles.is_empty());
    }

    /// A version 4 file's outbox rows have no commit time: the column is
    /// added at open, its rows read as unknown (0), and commits made after
    /// keep theirs.
    #[test]
    fn a_version_4_outbox_gains_commit_times() {
        let dir = tempfile::tempdir().unwrap();
        let config = created_then_altered(
            dir.path(),
            "DROP TABLE outbox_commit;
             CREATE TABLE outbox_commit (last_seq INTEGER PRIMARY KEY, first_seq INTEGER NOT NULL, entries BLOB NOT NULL);
             INSERT INTO outbox_commit VALUES (2, 2, x'0476616e37097b22736571223a327d');
             UPDATE meta SET value = 3 WHERE key = 'next_seq';
             UPDATE meta SET value = 4 WHERE key = 'schema';",
        );
        let (mut store, _) = EmbeddedStore::open(&config.embedded.path, &config).unwrap();
        assert_eq!(outbox(&mut store), vec![entry(2)]);
        assert_eq!(schema_version(&store.conn), SCHEMA_VERSION);
        store
            .commit(&CommitBatch {
                outbox: vec![entry(3).committed_at(1_700)],
                next_seq: 4,
                ..CommitBatch::default()
            })
            .unwrap();
        drop(store);
        let (mut store, _) = EmbeddedStore::open(&config.embedded.path, &config).unwrap();
        assert_eq!(
            outbox(&mut store),
            vec![entry(2), entry(3).committed_at(1_700)]
        );
    }

    /// A store created in `dir`, then made a version 3 file (a row per
    /// held fix, in `held`) holding what `rows` inserts.
    fn version_3_file(dir: &Path, rows: &str) -> StateConfig {
        created_then_altered(
            dir,
            &format!(
                "DROP TABLE held_log;
                 CREATE TABLE held (key INTEGER PRIMARY KEY, vehicle TEXT NOT NULL, fix BLOB NOT NULL);
                 {rows}
                 UPDATE meta SET value = 3 WHERE key = 'schema';"
            ),
        )
    }

    /// A version 3 file kept a row per held fix: they move to the log at
    /// open, in key order, and come back in their windows.
    #[test]
    fn a_version_3_file_opens_with_its_held_fixes() {
        let dir = tempfile::tempdir().unwrap();
        let config = version_3_file(dir.path(), "");
        let conn = Connection::open(&config.embedded.path).unwrap();
        for (key, vehicle) in [(7u64, "van7"), (3, "van7"), (5, "van8")] {
            conn.execute(
                "INSERT INTO held VALUES (?1, ?2, ?3)",
                params![key as i64, vehicle, &record::encode_held(&held_at(key))[..]],
            )
            .unwrap();
        }
        drop(conn);
        let (store, recovered) = EmbeddedStore::open(&config.embedded.path, &config).unwrap();
        let mut windows: Vec<(String, Vec<u64>)> = recovered
            .vehicles
            .iter()
            .map(|(id, s)| (id.to_string(), s.window.iter().map(|h| h.key).collect()))
            .collect();
        windows.sort();
        assert_eq!(
            windows,
            [
                ("van7".to_string(), vec![3, 7]),
                ("van8".to_string(), vec![5])
            ]
        );
        assert_eq!(schema_version(&store.conn), SCHEMA_VERSION);
        let held_table: bool = store
            .conn
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE name = 'held')",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert!(!held_table, "version 3's table is dropped");
    }

    /// A version 3 row that is not a fix fails the open, by name, and
    /// leaves the file as it was.
    #[test]
    fn a_damaged_version_3_fix_fails_the_open() {
        let dir = tempfile::tempdir().unwrap();
        let config = version_3_file(dir.path(), "INSERT INTO held VALUES (4, 'van7', x'0102');");
        let error = EmbeddedStore::open(&config.embedded.path, &config)
            .err()
            .expect("a damaged fix is refused");
        assert!(error.to_string().contains("record ends early"), "{error}");
        let conn = Connection::open(&config.embedded.path).unwrap();
        assert_eq!(schema_version(&conn), 3, "nothing was moved");
    }

    /// A commit's entries are one row; a confirmed run is pruned only as a
    /// whole, and what a row still holds below the cursors is skipped by
    /// the relay and the publisher, not lost or repeated.
    #[test]
    fn a_row_is_pruned_once_its_last_entry_is_confirmed() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        let (mut store, _) = EmbeddedStore::open(&config.embedded.path, &config).unwrap();
        let commit = |store: &mut EmbeddedStore, seqs: std::ops::Range<u64>, confirmed| {
            store
                .commit(&CommitBatch {
                    outbox: seqs.clone().map(entry).collect(),
                    next_seq: seqs.end,
                    file_cursor: confirmed,
                    mqtt_cursor: confirmed,
                    webhook_cursor: confirmed,
                    ..CommitBatch::default()
                })
                .unwrap();
        };
        commit(&mut store, 1..4, 0);
        commit(&mut store, 4..6, 2);
        let rows: i64 = store
            .conn
            .query_row("SELECT count(*) FROM outbox_commit", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 2);
        commit(&mut store, 6..7, 3);
        drop(store);
        let (mut store, _) = EmbeddedStore::open(&config.embedded.path, &config).unwrap();
        assert_eq!(outbox(&mut store), vec![entry(4), entry(5), entry(6)]);
        // A page is whole rows, and starts after the seq asked for.
        assert_eq!(store.outbox_after(4, 1).unwrap(), vec![entry(5)]);
        assert_eq!(store.outbox_after(6, 10).unwrap(), vec![]);
    }

    #[test]
    fn a_file_from_a_newer_geogate_is_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let config = created_then_altered(
            dir.path(),
            &format!(
                "UPDATE meta SET value = {} WHERE key = 'schema'; DROP TABLE vehicle;",
                SCHEMA_VERSION + 1
            ),
        );
        let refused = EmbeddedStore::open(&config.embedded.path, &config)
            .err()
            .unwrap();
        let newer = SCHEMA_VERSION + 1;
        assert!(
            matches!(refused, EmbeddedError::Newer { version, .. } if version == newer),
            "{refused}"
        );
        assert!(
            refused
                .to_string()
                .contains(&format!("schema version {newer}")),
            "{refused}"
        );
        let mut conn = Connection::open(&config.embedded.path).unwrap();
        let tx = conn.transaction().unwrap();
        assert!(
            !exists(&tx, "table", "vehicle").unwrap(),
            "nothing created in a newer file"
        );
    }

    /// A version 1 file with an outbox row it cannot read: the open fails
    /// and leaves the file as it was (the move is one transaction); with
    /// `--reset-state`, the same file opens empty.
    #[test]
    fn a_failed_move_leaves_the_file_as_it_was_and_a_reset_gets_past_it() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        let old = Connection::open(&config.embedded.path).unwrap();
        old.execute_batch(VERSION_1_TABLES).unwrap();
        old.execute_batch(
            "INSERT INTO meta VALUES ('schema', 1), ('next_seq', 3), ('mqtt_cursor', 0);
             INSERT INTO outbox VALUES (1, 'van1', x'7b7d'), (2, x'ff', x'7b7d');",
        )
        .unwrap();
        drop(old);
        assert!(EmbeddedStore::open(&config.embedded.path, &config).is_err());
        let mut conn = Connection::open(&config.embedded.path).unwrap();
        assert_eq!(schema_version(&conn), 1);
        let tx = conn.transaction().unwrap();
        assert!(exists(&tx, "table", "outbox").unwrap());
        assert!(!exists(&tx, "table", "outbox_commit").unwrap());
        drop(tx);
        drop(conn);
        let reset = StateConfig {
            reset: true,
            ..config.clone()
        };
        let (_, recovered) = EmbeddedStore::open(&reset.embedded.path, &reset).unwrap();
        assert!(recovered.created && recovered.outbox_len == 0);
        assert_eq!(recovered.next_seq, 1);
    }

    #[test]
    fn a_damaged_outbox_row_is_a_precise_error() {
        let dir = tempfile::tempdir().unwrap();
        let config = created_then_altered(
            dir.path(),
            "INSERT INTO outbox_commit VALUES (9, 8, x'0476616e', 0)",
        );
        let refused = EmbeddedStore::open(&config.embedded.path, &config)
            .err()
            .unwrap();
        assert!(
            matches!(
                refused,
                EmbeddedError::CorruptOutbox {
                    last_seq: 9,
                    source: OutboxRowError::Cut(_),
                    ..
                }
            ),
            "{refused}"
        );
    }
}
