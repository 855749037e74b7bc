//! Outputs under the faults a disk brings: a power loss, a failed fsync, a
//! full device. Real geogate processes, a real mosquitto, and a write-back
//! modelled per file by an LD_PRELOAD shim (`support/sync_shim.c`): what
//! was not synced is what a power loss takes, and a failed sync drops it.
//!
//! Every run is compared with one uninterrupted run: the same multiset of
//! transitions, with the same ids, none twice and none missing, seqs
//! gap-free.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;
use support::fleet::{
    FENCES, FIXES, Multiset, VEHICLES, assert_seqs_gap_free, diff, fleet, multiset,
};
use support::geogate::{
    GeogateProcess, exclusive, publish_all, read_ndjson_so_far, setup, wait_until,
};

/// Between published fixes: the stream lasts several seconds, so faults
/// land while lines are being written.
const PACE: Duration = Duration::from_millis(10);

const EV_FAILURES: &str = r#"geogate_sink_write_failures_total{sink="events"}"#;
const STATE_FAILURES: &str = r#"geogate_sink_write_failures_total{sink="state"}"#;

fn total() -> f64 {
    (VEHICLES * FIXES) as f64
}

/// A geogate in `dir`, its config edited by `edit`, started with the sync
/// shim watching its events file (when `shim` is given).
fn start(
    dir: &Path,
    port: u16,
    id: &str,
    shim: Option<&Path>,
    edit: impl FnOnce(String) -> String,
    crash_point: Option<&str>,
) -> GeogateProcess {
    std::fs::write(dir.join("fences.geojson"), FENCES).unwrap();
    let mut geogate = GeogateProcess::prepare(dir, &setup(port, id, ""), edit);
    if let Some(shim) = shim {
        geogate.set_env("LD_PRELOAD", &shim.display().to_string());
        geogate.set_env(
            "SYNC_SHIM_FILE",
            &dir.join("events.ndjson").display().to_string(),
        );
    }
    geogate.set_crash_point(crash_point);
    geogate.restart();
    geogate
}

fn fsync(policy: &str) -> impl FnOnce(String) -> String + '_ {
    move |config| config.replace("[state]\n", &format!("[state]\nfsync = \"{policy}\"\n"))
}

fn events_of(dir: &Path) -> Vec<serde_json::Value> {
    read_ndjson_so_far(&dir.join("events.ndjson"))
}

/// The uninterrupted run.
fn reference(port: u16, runtime: &tokio::runtime::Runtime) -> Multiset {
    let dir = tempfile::tempdir().unwrap();
    let mut geogate = start(dir.path(), port, "ref", None, |c| c, None);
    runtime.block_on(publish_all(port, &fleet(0..FIXES), None));
    geogate.wait_processed(total(), 60);
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{stdout}");
    let events = events_of(dir.path());
    assert_seqs_gap_free(&events, "reference");
    let want = multiset(&events);
    assert!(want.len() > 100 && want.values().all(|ids| ids.len() == 1));
    want
}

/// Waits until the file holds `n` lines, stops geogate (which drains),
/// and compares the file with `want`.
fn finish_same_as(geogate: &mut GeogateProcess, want: &Multiset, what: &str) {
    wait_until(60, "every transition in the file", || {
        events_of(&geogate.dir).len() >= want.len()
    });
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{what}: {stdout}");
    let line = support::geogate::accounting_line(&stdout);
    assert!(line.ends_with("(balanced)"), "{what}: {line}");
    let got = events_of(&geogate.dir);
    assert_seqs_gap_free(&got, what);
    let got = multiset(&got);
    assert!(
        got == *want,
        "{what}: transitions differ from the uninterrupted run:\n{}",
        diff(&got, want)
    );
}

/// The bytes the shim cut from the file at each failed sync.
fn lost_bytes(events: &Path) -> Vec<u64> {
    std::fs::read_to_string(format!("{}.lost", events.display()))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Under `fsync = "always"` a power loss at any point loses nothing and
/// repeats nothing: geogate is SIGKILLed at each point where lines are in
/// flight, its events file cut back to what its last sync put on disk
/// (the shim's record), and restarted.
#[test]
fn under_always_a_power_loss_at_any_point_loses_and_repeats_nothing() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let Some(shim) = support::sync_shim() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let want = reference(broker.port, &runtime);
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.ndjson");
    let mut geogate = start(
        dir.path(),
        broker.port,
        "power-always",
        Some(&shim),
        fsync("always"),
        None,
    );
    let port = broker.port;
    let publishing =
        runtime.spawn(async move { publish_all(port, &fleet(0..FIXES), Some(PACE)).await });
    let mut cut_total = 0;
    for point in [
        "relay.mid_line:4",
        "relay.before_cursor:4",
        "commit.after:6",
    ] {
        geogate.kill();
        geogate.set_crash_point(Some(point));
        geogate.restart();
        geogate.wait_for_crash_point();
        geogate.kill();
        cut_total += support::cut_to_last_sync(&events);
        geogate.restart();
    }
    assert!(
        cut_total > 0,
        "the torn line of relay.mid_line was never synced, so the power loss took it"
    );
    runtime.block_on(publishing).unwrap();
    finish_same_as(&mut geogate, &want, "power losses under always");
}

/// A failed fsync is not trusted on retry: while the shim fails every
/// sync of the events file (dropping what was not synced, as the kernel
/// may), geogate holds the file's cursor and the acks behind it; once
/// syncs work again it writes the dropped lines again, and the file ends
/// as in the uninterrupted run, under both fsync policies.
#[test]
fn lines_a_failed_fsync_dropped_are_written_again() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let Some(shim) = support::sync_shim() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let want = reference(broker.port, &runtime);
    for policy in ["always", "flush"] {
        let dir = tempfile::tempdir().unwrap();
        let events = dir.path().join("events.ndjson");
        let switch = PathBuf::from(format!("{}.fail-sync", events.display()));
        let mut geogate = start(
            dir.path(),
            broker.port,
            &format!("fail-sync-{policy}"),
            Some(&shim),
            fsync(policy),
            None,
        );
        let port = broker.port;
        let publishing =
            runtime.spawn(async move { publish_all(port, &fleet(0..FIXES), Some(PACE)).await });
        wait_until(30, "lines in the file", || {
            events_of(dir.path()).len() >= 20
        });
        std::fs::write(&switch, b"").unwrap();
        wait_until(30, "syncs that failed and dropped lines", || {
            lost_bytes(&events).iter().filter(|&&n| n > 0).count() >= 2
                && geogate.series(EV_FAILURES) >= 2.0
        });
        std::fs::remove_file(&switch).unwrap();
        runtime.block_on(publishing).unwrap();
        finish_same_as(&mut geogate, &want, &format!("failed syncs under {policy}"));
    }
}

/// A small tmpfs, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        support::require("mounting a tmpfs (root)", mounted.then_some(Self { dir }))
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Fills the device to the last byte; returns the filler's path.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let filler = self.path().join("filler");
        let mut file = std::fs::File::create(&filler).unwrap();
        let block = vec![0u8; 4096];
        while file.write_all(&block).is_ok() {}
        while file.write_all(&block[..1]).is_ok() {}
        filler
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.dir.path())
            .status();
    }
}

/// The events file and the state on devices that fill up, one after the
/// other, while the fleet streams in: each time, intake stops (fixes are
/// left unacked at the broker), nothing is lost, and once space is freed
/// geogate goes on by itself, without a restart.
#[test]
fn a_full_disk_pushes_back_loses_nothing_and_resumes_by_itself() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let (Some(events_fs), Some(state_fs)) = (Tmpfs::mount("1m"), Tmpfs::mount("16m")) else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let want = reference(broker.port, &runtime);
    let dir = tempfile::tempdir().unwrap();
    let events = events_fs.path().join("events.ndjson");
    let state = state_fs.path().join("state.sqlite");
    let relocate = |config: String| {
        config
            .replace(
                &format!("{}/events.ndjson", dir.path().display()),
                &events.display().to_string(),
            )
            .replace(
                &format!("{}/state.sqlite", dir.path().display()),
                &state.display().to_string(),
            )
    };
    let mut geogate = start(dir.path(), broker.port, "full-disk", None, relocate, None);
    let thirds = [0..FIXES / 3, FIXES / 3..2 * FIXES / 3, 2 * FIXES / 3..FIXES];
    runtime.block_on(publish_all(broker.port, &fleet(thirds[0].clone()), None));
    geogate.wait_processed(total() / 3.0, 60);
    for (k, (device, failures, rounds)) in [
        (&events_fs, EV_FAILURES, thirds[1].clone()),
        (&state_fs, STATE_FAILURES, thirds[2].clone()),
    ]
    .into_iter()
    .enumerate()
    {
        let filler = device.fill();
        let half = (rounds.start + rounds.end) / 2;
        runtime.block_on(publish_all(broker.port, &fleet(rounds.start..half), None));
        wait_until(30, &format!("{failures} to count the full device"), || {
            geogate.series(failures) >= 2.0
        });
        // What comes in meanwhile waits unacked behind the batch the
        // device refused.
        runtime.block_on(publish_all(broker.port, &fleet(half..rounds.end), None));
        wait_until(30, "intake held", || {
            geogate.metric("geogate_mqtt_unacked") >= 1.0
        });
        std::fs::remove_file(filler).unwrap();
        geogate.wait_processed(total() * (k + 2) as f64 / 3.0, 60);
    }
    wait_until(60, "every transition in the file", || {
        read_ndjson_so_far(&events).len() >= want.len()
    });
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{stdout}");
    let line = support::geogate::accounting_line(&stdout);
    assert!(line.ends_with("(balanced)"), "{line}");
    let got = read_ndjson_so_far(&events);
    assert_seqs_gap_free(&got, "full disks");
    let got = multiset(&got);
    assert!(
        got == want,
        "full disks: transitions differ from the uninterrupted run:\n{}",
        diff(&got, &want)
    );
}
