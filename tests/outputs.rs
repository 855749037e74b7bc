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
    GeogateProcess, crossing_fixes, exclusive, publish_all, read_ndjson_so_far, setup, wait_until,
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

/// What most tests here start with: their turn on the machine, a broker,
/// a runtime, and the uninterrupted run to compare with.
struct Run {
    _serial: std::sync::MutexGuard<'static, ()>,
    broker: support::Mosquitto,
    runtime: tokio::runtime::Runtime,
    want: Multiset,
}

impl Run {
    fn start() -> Option<Self> {
        let serial = exclusive();
        let broker = support::Mosquitto::start()?;
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let want = reference(broker.port, &runtime);
        Some(Self {
            _serial: serial,
            broker,
            runtime,
            want,
        })
    }
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
/// (the shim's record), and restarted. MQTT and the webhook, on as well,
/// each get every transition of the file.
#[test]
fn under_always_a_power_loss_at_any_point_loses_and_repeats_nothing() {
    let Some(shim) = support::sync_shim() else {
        return;
    };
    let Some(Run {
        _serial,
        broker,
        runtime,
        want,
    }) = Run::start()
    else {
        return;
    };
    let Some(receiver) = support::webhook::WebhookReceiver::start(SECRET) else {
        return;
    };
    let published = support::subscribe_events(&runtime, broker.port);
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.ndjson");
    // Every output on: the file, MQTT and a webhook.
    let url = receiver.url();
    let mut geogate = start(
        dir.path(),
        broker.port,
        "power-always",
        Some(&shim),
        move |config| {
            fsync("always")(config).replace("mqtt = false\n", "mqtt = true\n").replace(
                "[state]\n",
                &format!("[events.webhook]\nurl = \"{url}\"\nsecret = \"{SECRET}\"\nbatch = 20\n[state]\n"),
            )
        },
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
    wait_until(60, "every transition posted and published", || {
        let file = ids(&events_of(dir.path()));
        file.len() >= want.len()
            && ids(&published.lock().unwrap()).is_superset(&file)
            && receiver
                .accepted()
                .into_iter()
                .map(|(id, ..)| id)
                .collect::<std::collections::BTreeSet<_>>()
                .is_superset(&file)
    });
    finish_same_as(&mut geogate, &want, "power losses under always");
    // Each output got every transition in the file, at least once by id;
    // the webhook in order per vehicle.
    let file = events_of(dir.path());
    assert_eq!(ids(&published.lock().unwrap()), ids(&file), "over MQTT");
    assert_all_arrived_in_order(&receiver.accepted(), &file);
}

/// A failed fsync is not trusted on retry: while the shim fails every
/// sync of the events file (dropping what was not synced, as the kernel
/// may), geogate holds the file's cursor and the acks behind it; once
/// syncs work again it writes the dropped lines again, and the file ends
/// as in the uninterrupted run, under both fsync policies.
#[test]
fn lines_a_failed_fsync_dropped_are_written_again() {
    let Some(shim) = support::sync_shim() else {
        return;
    };
    let Some(Run {
        _serial,
        broker,
        runtime,
        want,
    }) = Run::start()
    else {
        return;
    };
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

fn ids(events: &[serde_json::Value]) -> std::collections::BTreeSet<String> {
    events
        .iter()
        .filter_map(|e| e["id"].as_str().map(str::to_owned))
        .collect()
}

/// Resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

const MQTT_PENDING: &str = r#"geogate_output_pending_entries{output="mqtt"}"#;
const MQTT_HEALTHY: &str = r#"geogate_sink_healthy{sink="mqtt"}"#;
const MQTT_EXPIRED: &str = r#"geogate_output_expired_total{output="mqtt"}"#;

/// geogate with its transitions published to a broker of their own, and
/// its intake on a broker with mosquitto's default queue bound (what
/// README says the intake broker needs).
struct TwoBrokers {
    intake: support::Mosquitto,
    events: support::Mosquitto,
}

impl TwoBrokers {
    fn start() -> Option<Self> {
        Some(Self {
            intake: support::Mosquitto::start_with(
                "persistence false\nmax_inflight_messages 1000\nmax_queued_messages 1000\n",
            )?,
            events: support::Mosquitto::start_persistent()?,
        })
    }

    /// No reorder window: a fix's ack waits for its own transitions
    /// (with one, fixes are acked once held, and intake is held from the
    /// first one that arrives after the queue filled).
    fn geogate(&self, dir: &Path, id: &str, max_pending: usize, max_age_s: f64) -> GeogateProcess {
        let events_port = self.events.port;
        let mut geogate = GeogateProcess::prepare(
            dir,
            &support::geogate::Setup {
                events_mqtt: true,
                ..setup(self.intake.port, id, "reorder_window_ms = 0")
            },
            |config| {
                config.replace(
                    "mqtt = true\n",
                    &format!(
                        "mqtt = true\nmqtt_port = {events_port}\nmax_pending = {max_pending}\nmqtt_max_age_s = {max_age_s}\n"
                    ),
                )
            },
        );
        geogate.restart();
        geogate
    }
}

/// The events broker stopped while transitions keep coming: geogate's
/// queue for it fills to `events.max_pending`, and then intake is held
/// (fixes wait unacked at the intake broker, within its queue bound)
/// instead of memory growing; resident memory after an outage ten times
/// longer is what it was once the bound was reached. Once the broker is
/// back, every transition in the events file arrives over MQTT, with the
/// same id.
#[test]
fn a_dead_events_broker_holds_intake_within_bounds_and_loses_nothing() {
    let _serial = exclusive();
    let Some(mut brokers) = TwoBrokers::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let published = support::subscribe_events(&runtime, brokers.events.port);
    let dir = tempfile::tempdir().unwrap();
    let geogate = brokers.geogate(dir.path(), "dead-events", 100, 600.0);
    let port = brokers.intake.port;
    runtime.block_on(publish_all(port, &crossing_fixes("d", 10, 0, 100), None));
    geogate.wait_processed(100.0, 30);
    wait_until(30, "the first transitions published", || {
        published.lock().unwrap().len() >= events_of(dir.path()).len()
    });

    let outage = std::time::Instant::now();
    brokers.events.stop();
    // More than geogate takes unacked (mqtt.max_unacked, 1000): the rest
    // wait in the intake broker's queue, within its bound.
    runtime.block_on(publish_all(port, &crossing_fixes("d", 10, 100, 1500), None));
    // Held: the queue is filling, acks have stopped moving for a second
    // with fixes unacked, and the output is unhealthy. (The queue need not
    // reach the bound exactly: a group of transitions waits whole for room,
    // and under load a group is larger than what is left.)
    let mut seen = String::new();
    let mut last_acked = None;
    let mut still_since = std::time::Instant::now();
    let held = (0..600).any(|_| {
        let m = geogate.metrics();
        let (pending, healthy) = (geogate.series(MQTT_PENDING), geogate.series(MQTT_HEALTHY));
        let unacked = m.get("geogate_mqtt_unacked").copied().unwrap_or(0.0);
        let received = m.get("geogate_events_received_total").copied();
        let acked = m.get("geogate_mqtt_acks_total").copied();
        if acked != last_acked {
            (last_acked, still_since) = (acked, std::time::Instant::now());
        }
        seen = format!(
            "queued {pending}, unacked {unacked}, healthy {healthy}, received {received:?} and acked {acked:?} of 1600 fixes"
        );
        let held = (50.0..=100.0).contains(&pending)
            && unacked >= 1.0
            && healthy == 0.0
            && still_since.elapsed() >= Duration::from_secs(1);
        if !held {
            std::thread::sleep(Duration::from_millis(100));
        }
        held
    });
    assert!(held, "the MQTT queue never filled with intake held: {seen}");
    let to_bound = outage.elapsed() + Duration::from_secs(1);
    std::thread::sleep(Duration::from_secs(1));
    let rss_at_bound = rss_kib(geogate.pid());
    let acked_at_bound = geogate.metric("geogate_mqtt_acks_total");
    let pending_at_bound = geogate.series(MQTT_PENDING);
    std::thread::sleep(9 * to_bound);
    let rss_later = rss_kib(geogate.pid());
    assert_eq!(
        geogate.series(MQTT_PENDING),
        pending_at_bound,
        "the queue stays where intake was held, within max_pending (100)"
    );
    assert_eq!(
        geogate.metric("geogate_mqtt_acks_total"),
        acked_at_bound,
        "intake held: no fix acked while the queue stays full"
    );
    assert!(geogate.metric("geogate_events_received_total") < 1600.0);
    assert!(
        rss_later <= rss_at_bound + 2048,
        "resident memory grew from {rss_at_bound} KiB to {rss_later} KiB over an outage {:?} long",
        outage.elapsed()
    );

    brokers.events.start_again();
    geogate.wait_processed(1600.0, 60);
    wait_until(60, "every transition published", || {
        ids(&published.lock().unwrap()) == ids(&events_of(dir.path()))
    });
    assert_eq!(geogate.series(MQTT_HEALTHY), 1.0);
    assert_eq!(geogate.series(MQTT_EXPIRED), 0.0);
    let mut geogate = geogate;
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{stdout}");
    let events = events_of(dir.path());
    assert_seqs_gap_free(&events, "the events file");
    assert_eq!(events.len(), ids(&events).len());
    assert_eq!(ids(&published.lock().unwrap()), ids(&events));
}

/// The events broker down past `events.mqtt_max_age_s`: what it has not
/// confirmed goes to the dead letter as `mqtt_expired`, and geofencing
/// goes on for every fix while the broker is still down. Once it is back,
/// every transition in the events file has either arrived over MQTT or is
/// in the dead letter: none is lost silently.
#[test]
fn past_its_maximum_age_an_unpublished_transition_goes_to_the_dead_letter() {
    let _serial = exclusive();
    let Some(mut brokers) = TwoBrokers::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let published = support::subscribe_events(&runtime, brokers.events.port);
    let dir = tempfile::tempdir().unwrap();
    let mut geogate = brokers.geogate(dir.path(), "expire-events", 100, 1.0);
    let port = brokers.intake.port;
    runtime.block_on(publish_all(port, &crossing_fixes("x", 10, 0, 100), None));
    geogate.wait_processed(100.0, 30);
    wait_until(30, "the first transitions published", || {
        published.lock().unwrap().len() >= events_of(dir.path()).len()
    });
    brokers.events.stop();
    runtime.block_on(publish_all(port, &crossing_fixes("x", 10, 100, 400), None));
    // Every fix is evaluated with the broker still down.
    geogate.wait_processed(500.0, 60);
    wait_until(30, "the queue emptied into the dead letter", || {
        geogate.series(MQTT_PENDING) == 0.0
    });
    let expired = geogate.series(MQTT_EXPIRED);
    assert!(
        expired > 100.0,
        "more than the queue holds expired: {expired}"
    );
    brokers.events.start_again();
    let dead: Vec<serde_json::Value> =
        support::geogate::read_ndjson(&dir.path().join("dead-letter.ndjson"))
            .into_iter()
            .filter(|r| r["reason"] == "mqtt_expired")
            .filter_map(|r| serde_json::from_str(r["payload"].as_str()?).ok())
            .collect();
    assert_eq!(
        dead.len() as f64,
        expired,
        "one record per expired transition"
    );
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{stdout}");
    let events = events_of(dir.path());
    assert_seqs_gap_free(&events, "the events file");
    let mut reached = ids(&published.lock().unwrap());
    reached.extend(ids(&dead));
    assert_eq!(
        reached,
        ids(&events),
        "every transition published or dead-lettered"
    );
}

const WEBHOOK_HEALTHY: &str = r#"geogate_sink_healthy{sink="webhook"}"#;
const WEBHOOK_RETRIES: &str = r#"geogate_output_retries_total{output="webhook"}"#;
const WEBHOOK_EXPIRED: &str = r#"geogate_output_expired_total{output="webhook"}"#;
const WEBHOOK_DELIVERED: &str = r#"geogate_output_delivered_total{output="webhook"}"#;
const SECRET: &str = "s3cret-shared-with-the-receiver";

/// geogate posting its transitions to `receiver`, signed with `secret`,
/// stopping first at `crash_point` if one is given.
fn with_webhook(
    dir: &Path,
    port: u16,
    id: &str,
    url: &str,
    secret: &str,
    extra: &str,
    crash_point: Option<&str>,
) -> GeogateProcess {
    std::fs::write(dir.join("fences.geojson"), FENCES).unwrap();
    let secret_file = dir.join("webhook.secret");
    std::fs::write(&secret_file, format!("{secret}\n")).unwrap();
    let table = format!(
        "[events.webhook]\nurl = \"{url}\"\nsecret_file = \"{}\"\nbatch = 20\ntimeout_ms = 1000\n{extra}\n",
        secret_file.display()
    );
    let mut geogate = GeogateProcess::prepare(dir, &setup(port, id, ""), |config| {
        config.replace("[state]\n", &format!("{table}[state]\n"))
    });
    geogate.set_crash_point(crash_point);
    geogate.restart();
    geogate
}

/// Each vehicle's transitions, in the order of their first arrival, are in
/// seq order, and every transition in the file arrived.
fn assert_all_arrived_in_order(accepted: &[(String, String, u64)], events: &[serde_json::Value]) {
    let mut first = std::collections::BTreeMap::<String, Vec<u64>>::new();
    let mut seen = std::collections::BTreeSet::new();
    for (id, vehicle, seq) in accepted {
        if seen.insert(id.clone()) {
            first.entry(vehicle.clone()).or_default().push(*seq);
        }
    }
    for (vehicle, seqs) in &first {
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "{vehicle}'s transitions out of order: {seqs:?}"
        );
    }
    assert_eq!(seen, ids(events), "every transition in the file arrived");
}

/// The receiver down for longer than many retries, then up: every
/// transition arrives, in order per vehicle, each request signed.
#[test]
fn a_webhook_receiver_down_then_up_gets_every_transition_in_order() {
    let _serial = exclusive();
    let (Some(broker), Some(mut receiver)) = (
        support::Mosquitto::start(),
        support::webhook::WebhookReceiver::start(SECRET),
    ) else {
        return;
    };
    receiver.stop();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = receiver.url();
    let mut geogate = with_webhook(dir.path(), broker.port, "hook-down", &url, SECRET, "", None);
    runtime.block_on(publish_all(
        broker.port,
        &fleet(0..FIXES),
        Some(Duration::from_millis(2)),
    ));
    geogate.wait_processed(total(), 60);
    wait_until(30, "several failed attempts", || {
        geogate.series(WEBHOOK_RETRIES) >= 5.0 * 20.0
    });
    assert_eq!(geogate.series(WEBHOOK_HEALTHY), 0.0);
    assert_eq!(geogate.series(WEBHOOK_DELIVERED), 0.0);
    receiver.start_again();
    wait_until(60, "every transition posted", || {
        ids(&events_of(dir.path()))
            .iter()
            .all(|id| receiver.accepted().iter().any(|(got, ..)| got == id))
    });
    assert_eq!(geogate.series(WEBHOOK_HEALTHY), 1.0);
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{stdout}");
    let events = events_of(dir.path());
    assert!(events.len() > 100);
    assert_all_arrived_in_order(&receiver.accepted(), &events);
    assert!(
        receiver
            .requests()
            .iter()
            .all(|r| r["signature_ok"] == true)
    );
}

/// geogate SIGKILLed after the receiver accepted a batch and before its
/// cursor moved: after the restart that batch is posted again, with the
/// same ids (at least once), and every transition arrives.
#[test]
fn a_webhook_batch_in_flight_at_a_sigkill_is_posted_again_with_the_same_ids() {
    let _serial = exclusive();
    let (Some(broker), Some(receiver)) = (
        support::Mosquitto::start(),
        support::webhook::WebhookReceiver::start(SECRET),
    ) else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let want = reference(broker.port, &runtime);
    let dir = tempfile::tempdir().unwrap();
    let mut geogate = with_webhook(
        dir.path(),
        broker.port,
        "hook-kill",
        &receiver.url(),
        SECRET,
        "",
        Some("webhook.before_cursor:3"),
    );
    let port = broker.port;
    let publishing =
        runtime.spawn(async move { publish_all(port, &fleet(0..FIXES), Some(PACE)).await });
    geogate.wait_for_crash_point();
    geogate.kill();
    let before_kill = receiver.accepted();
    assert!(!before_kill.is_empty());
    geogate.restart();
    runtime.block_on(publishing).unwrap();
    wait_until(60, "every transition in the file", || {
        events_of(dir.path()).len() >= want.len()
    });
    wait_until(60, "every transition posted", || {
        let got: std::collections::BTreeSet<String> =
            receiver.accepted().into_iter().map(|(id, ..)| id).collect();
        ids(&events_of(dir.path())).is_subset(&got)
    });
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{stdout}");
    let events = events_of(dir.path());
    assert_seqs_gap_free(&events, "the events file");
    assert!(
        multiset(&events) == want,
        "the file is as in the uninterrupted run"
    );
    let accepted = receiver.accepted();
    // The batch the kill caught is in again: the fault hit in-flight work.
    let last_before = &before_kill[before_kill.len() - 1].0;
    assert!(
        accepted.iter().filter(|(id, ..)| id == last_before).count() >= 2,
        "the batch accepted before the kill was posted again"
    );
    assert_all_arrived_in_order(&accepted, &events_of(dir.path()));
}

/// A receiver that answers 500 three times, then 200; then one slower than
/// the request timeout, then fast again: the failed attempts are retried,
/// counted and shown, and every transition arrives.
#[test]
fn a_failing_then_slow_webhook_receiver_gets_everything_by_retries() {
    let _serial = exclusive();
    let (Some(broker), Some(receiver)) = (
        support::Mosquitto::start(),
        support::webhook::WebhookReceiver::start(SECRET),
    ) else {
        return;
    };
    receiver.answer(r#"{"status": 200, "fail_first": 3, "fail_status": 500}"#);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut geogate = with_webhook(
        dir.path(),
        broker.port,
        "hook-500",
        &receiver.url(),
        SECRET,
        "",
        None,
    );
    runtime.block_on(publish_all(
        broker.port,
        &crossing_fixes("f", 5, 0, 50),
        None,
    ));
    geogate.wait_processed(50.0, 30);
    wait_until(30, "the first transitions posted", || {
        let statuses: Vec<u64> = receiver
            .requests()
            .iter()
            .filter_map(|r| r["status"].as_u64())
            .collect();
        statuses.starts_with(&[500, 500, 500]) && statuses.contains(&200)
    });
    assert!(geogate.series(WEBHOOK_RETRIES) >= 3.0);
    // Slower than timeout_ms (1 s): each attempt times out.
    receiver.answer(r#"{"status": 200, "delay_ms": 1500}"#);
    let retried = geogate.series(WEBHOOK_RETRIES);
    runtime.block_on(publish_all(
        broker.port,
        &crossing_fixes("f", 5, 50, 50),
        None,
    ));
    wait_until(30, "attempts timed out", || {
        geogate.series(WEBHOOK_RETRIES) > retried && geogate.series(WEBHOOK_HEALTHY) == 0.0
    });
    // Batches of more than 3 are too large for it: halved until they pass.
    receiver.answer(r#"{"status": 200, "delay_ms": 200, "max_batch": 3}"#);
    geogate.wait_processed(100.0, 30);
    wait_until(60, "every transition posted", || {
        let got: std::collections::BTreeSet<String> =
            receiver.accepted().into_iter().map(|(id, ..)| id).collect();
        ids(&events_of(dir.path())).is_subset(&got)
    });
    assert_eq!(geogate.series(WEBHOOK_HEALTHY), 1.0);
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{stdout}");
    assert_all_arrived_in_order(&receiver.accepted(), &events_of(dir.path()));
    let requests = receiver.requests();
    assert!(requests.iter().any(|r| r["status"] == 413));
    assert!(
        requests
            .iter()
            .filter(|r| r["status"] == 200)
            .skip_while(|r| r["ids"].as_array().is_some_and(|ids| ids.len() > 3))
            .all(|r| r["ids"].as_array().is_some_and(|ids| ids.len() <= 3)),
        "after a 413 the batches fit"
    );
}

/// Signed with the wrong secret, every request is refused by the receiver
/// (its own check finds the signature wrong); past the maximum age the
/// transitions go to the dead letter as `webhook_expired`, each with its
/// line, and geofencing never stopped. A receiver that answers 410 (422)
/// has its batches dead-lettered at once as `webhook_gone`
/// (`webhook_rejected`).
#[test]
fn refused_webhooks_end_in_the_dead_letter_never_dropped() {
    let _serial = exclusive();
    let (Some(broker), Some(receiver)) = (
        support::Mosquitto::start(),
        support::webhook::WebhookReceiver::start(SECRET),
    ) else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dead_letter = |dir: &Path, reason: &str| -> Vec<serde_json::Value> {
        support::geogate::read_ndjson(&dir.join("dead-letter.ndjson"))
            .into_iter()
            .filter(|r| r["reason"] == reason)
            .filter_map(|r| serde_json::from_str(r["payload"].as_str()?).ok())
            .collect()
    };
    let dir = tempfile::tempdir().unwrap();
    let mut geogate = with_webhook(
        dir.path(),
        broker.port,
        "hook-forged",
        &receiver.url(),
        "not-the-secret",
        "max_age_s = 2",
        None,
    );
    runtime.block_on(publish_all(
        broker.port,
        &crossing_fixes("w", 5, 0, 50),
        None,
    ));
    geogate.wait_processed(50.0, 30);
    wait_until(30, "every transition expired", || {
        let written = events_of(dir.path()).len();
        written > 0 && geogate.series(WEBHOOK_EXPIRED) as usize == written
    });
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{stdout}");
    let requests = receiver.requests();
    assert!(!requests.is_empty());
    assert!(
        requests
            .iter()
            .all(|r| r["signature_ok"] == false && r["status"] == 401)
    );
    assert_eq!(
        ids(&dead_letter(dir.path(), "webhook_expired")),
        ids(&events_of(dir.path()))
    );

    for (status, reason, prefix) in [(410, "webhook_gone", "g"), (422, "webhook_rejected", "u")] {
        receiver.answer(&format!(r#"{{"status": {status}}}"#));
        let dir = tempfile::tempdir().unwrap();
        let mut geogate = with_webhook(
            dir.path(),
            broker.port,
            &format!("hook-{status}"),
            &receiver.url(),
            SECRET,
            "",
            None,
        );
        runtime.block_on(publish_all(
            broker.port,
            &crossing_fixes(prefix, 5, 0, 50),
            None,
        ));
        geogate.wait_processed(50.0, 30);
        wait_until(
            30,
            &format!("every transition dead-lettered as {reason}"),
            || {
                let written = events_of(dir.path()).len();
                written > 0 && dead_letter(dir.path(), reason).len() == written
            },
        );
        let (ok, stdout) = geogate.stop();
        assert!(ok, "{stdout}");
        assert_eq!(
            ids(&dead_letter(dir.path(), reason)),
            ids(&events_of(dir.path()))
        );
    }
}

/// A restart that finds a large outbox (200,000 transitions the events
/// broker never confirmed, about 40 MB of lines) streams it a page at a
/// time instead of loading it whole: with the broker still down, resident
/// memory stays far below the outbox's size while the queue sits full;
/// once the broker is back, every one of them is published.
const BIG_BACKLOG: u64 = 200_000;

/// A backlog line as the relay writes it, padded to a typical length.
fn backlog_line(seq: u64) -> String {
    format!(
        r#"{{"id":"{seq:032x}","seq":{seq},"vehicle":"v{}","fence":"A","event":"enter","ts":{},"pad":"{}"}}"#,
        seq % 100,
        1_750_000_000_000u64 + seq,
        "x".repeat(60)
    )
}

/// geogate started with its events broker stopped and stopped again; then
/// `backlog` (given the directory, its events file written) leaves
/// [`BIG_BACKLOG`] transitions committed and unconfirmed by the broker, and
/// at the restart resident memory stays far below the backlog's size while
/// the MQTT queue is full. Once the broker is back every one arrives.
fn a_big_backlog_is_streamed(backlog: impl FnOnce(&Path)) {
    let Some(mut brokers) = TwoBrokers::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let published = support::subscribe_events(&runtime, brokers.events.port);
    brokers.events.stop();
    let dir = tempfile::tempdir().unwrap();
    let mut geogate = brokers.geogate(dir.path(), "big-outbox", 1000, 3600.0);
    std::thread::sleep(Duration::from_secs(1));
    let baseline = rss_kib(geogate.pid());
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{stdout}");
    let mut file = String::new();
    for seq in 1..=BIG_BACKLOG {
        file.push_str(&backlog_line(seq));
        file.push('\n');
    }
    std::fs::write(dir.path().join("events.ndjson"), &file).unwrap();
    backlog(dir.path());

    geogate.restart();
    let backlog_kib = file.len() as u64 / 1024;
    let assert_bounded = |when: &str| {
        let rss = rss_kib(geogate.pid());
        eprintln!(
            "{when}: resident {rss} KiB with a backlog of {backlog_kib} KiB, {baseline} KiB with none"
        );
        assert!(
            rss < baseline + backlog_kib / 4,
            "{when}: resident memory {rss} KiB ({baseline} KiB with no backlog) holds much of the backlog ({backlog_kib} KiB of lines)"
        );
    };
    std::thread::sleep(Duration::from_secs(2));
    assert_bounded("started");
    wait_until(60, "the MQTT queue full from the backlog", || {
        geogate.series(MQTT_PENDING) >= 1000.0
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_bounded("the queue full");
    brokers.events.start_again();
    wait_until(120, "every transition published", || {
        published.lock().unwrap().len() as u64 >= BIG_BACKLOG
    });
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{stdout}");
    let got = ids(&published.lock().unwrap());
    assert_eq!(got.len() as u64, BIG_BACKLOG, "each id arrived");
    assert_eq!(got, ids(&events_of(dir.path())));
}

#[test]
fn a_large_outbox_is_streamed_at_a_restart_not_loaded_whole() {
    let _serial = exclusive();
    a_big_backlog_is_streamed(|dir| {
        // Committed, in the events file, and none confirmed by the broker.
        let mut conn = rusqlite::Connection::open(dir.join("state.sqlite")).unwrap();
        let tx = conn.transaction().unwrap();
        let varint = |out: &mut Vec<u8>, mut v: u64| {
            while v >= 0x80 {
                out.push((v as u8) | 0x80);
                v >>= 7;
            }
            out.push(v as u8);
        };
        for first in (1..=BIG_BACKLOG).step_by(4096) {
            let last = (first + 4095).min(BIG_BACKLOG);
            let mut row = Vec::new();
            for seq in first..=last {
                let vehicle = format!("v{}", seq % 100);
                varint(&mut row, vehicle.len() as u64);
                row.extend_from_slice(vehicle.as_bytes());
                let text = backlog_line(seq);
                varint(&mut row, text.len() as u64);
                row.extend_from_slice(text.as_bytes());
            }
            tx.execute(
                "INSERT INTO outbox_commit (last_seq, first_seq, entries, committed_ms) VALUES (?1, ?2, ?3, 0)",
                rusqlite::params![last as i64, first as i64, row],
            )
            .unwrap();
        }
        tx.execute_batch(&format!(
            "UPDATE meta SET value = {} WHERE key = 'next_seq';
             UPDATE meta SET value = 0 WHERE key = 'mqtt_cursor';
             UPDATE meta SET value = {BIG_BACKLOG} WHERE key = 'file_cursor';",
            BIG_BACKLOG + 1
        ))
        .unwrap();
        tx.commit().unwrap();
    });
}

/// Every line of the events file and the files rotated away from it, in
/// file order (oldest rotated first, the current file last), with the
/// files that held them.
fn all_files(dir: &Path) -> (Vec<serde_json::Value>, Vec<PathBuf>) {
    let mut rotated: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with("events.ndjson.") && n.len() == "events.ndjson.".len() + 25
            })
        })
        .collect();
    rotated.sort();
    let mut lines = Vec::new();
    for file in rotated.iter().chain([&dir.join("events.ndjson")]) {
        lines.extend(read_ndjson_so_far(file));
    }
    (lines, rotated)
}

fn rotating(bytes: u64, keep: usize) -> impl FnOnce(String) -> String {
    move |config| {
        config.replace(
            "mqtt = false\n",
            &format!("mqtt = false\nrotate_bytes = {bytes}\nrotate_keep = {keep}\n"),
        )
    }
}

/// The events file rotated every 4 KiB while the fleet streams in, and
/// geogate SIGKILLed at each step of a rotation (before the rename, after
/// it and before the new file) and where lines are in flight: across the
/// rotated files and the current one, seqs run on gap-free and the
/// transitions are exactly those of the uninterrupted run.
#[test]
fn a_rotation_cut_short_at_any_step_loses_and_repeats_nothing() {
    let Some(Run {
        _serial,
        broker,
        runtime,
        want,
    }) = Run::start()
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut geogate = start(
        dir.path(),
        broker.port,
        "rotate-kill",
        None,
        rotating(4096, 1000),
        None,
    );
    let port = broker.port;
    let publishing =
        runtime.spawn(async move { publish_all(port, &fleet(0..FIXES), Some(PACE)).await });
    for point in [
        "events.before_rotate:1",
        "events.rotated:1",
        "relay.mid_line:3",
        "events.rotated:2",
    ] {
        geogate.kill();
        geogate.set_crash_point(Some(point));
        geogate.restart();
        geogate.wait_for_crash_point();
        geogate.kill();
        geogate.restart();
    }
    runtime.block_on(publishing).unwrap();
    wait_until(60, "every transition in the files", || {
        all_files(dir.path()).0.len() >= want.len()
    });
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{stdout}");
    let (lines, rotated) = all_files(dir.path());
    assert!(rotated.len() >= 4, "rotated: {rotated:?}");
    assert_seqs_gap_free(&lines, "across rotations");
    let got = multiset(&lines);
    assert!(
        got == want,
        "across rotations: transitions differ from the uninterrupted run:\n{}",
        diff(&got, &want)
    );
    // Each rotated file's name says which seqs it holds.
    for file in &rotated {
        let held = read_ndjson_so_far(file);
        let name = file.file_name().unwrap().to_str().unwrap();
        let range = format!(
            "{:012}-{:012}",
            held[0]["seq"].as_u64().unwrap(),
            held[held.len() - 1]["seq"].as_u64().unwrap()
        );
        assert!(name.ends_with(&range), "{name} holds {range}");
    }
}

/// Rotation keeps `rotate_keep` rotated files, deleting the oldest; the
/// ones kept and the current file run on to the last seq with no gap.
#[test]
fn rotation_keeps_only_the_newest_files() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut geogate = start(
        dir.path(),
        broker.port,
        "rotate-keep",
        None,
        rotating(4096, 2),
        None,
    );
    // Paced: a rotation follows a write, so lines released together
    // share a file.
    runtime.block_on(publish_all(
        broker.port,
        &crossing_fixes("k", 10, 0, 400),
        Some(PACE),
    ));
    geogate.wait_processed(400.0, 60);
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{stdout}");
    let (lines, rotated) = all_files(dir.path());
    assert_eq!(rotated.len(), 2, "{rotated:?}");
    assert_seqs_gap_free_from(&lines);
    let log = std::fs::read_to_string(dir.path().join("stderr.log")).unwrap();
    assert!(
        log.contains("past events.rotate_keep"),
        "deletions are logged: {log}"
    );
}

/// Seqs run on by one from the first line.
fn assert_seqs_gap_free_from(lines: &[serde_json::Value]) {
    let seqs: Vec<u64> = lines.iter().filter_map(|l| l["seq"].as_u64()).collect();
    assert!(!seqs.is_empty());
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "seqs run on: {:?}…",
        &seqs[..seqs.len().min(20)]
    );
}

/// The events file renamed away by another process while geogate writes
/// (a log rotator's `create` mode): geogate notices, leaves what it wrote
/// in the renamed file, and starts a new one at the path; between them
/// the two hold the uninterrupted run's transitions, each once.
#[test]
fn an_events_file_renamed_from_outside_is_followed() {
    let Some(Run {
        _serial,
        broker,
        runtime,
        want,
    }) = Run::start()
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut geogate = start(dir.path(), broker.port, "renamed", None, |c| c, None);
    let port = broker.port;
    let publishing =
        runtime.spawn(async move { publish_all(port, &fleet(0..FIXES), Some(PACE)).await });
    wait_until(30, "lines in the file", || {
        events_of(dir.path()).len() >= 20
    });
    let moved = dir.path().join("events.ndjson.moved");
    std::fs::rename(dir.path().join("events.ndjson"), &moved).unwrap();
    runtime.block_on(publishing).unwrap();
    wait_until(60, "every transition in the two files", || {
        read_ndjson_so_far(&moved).len() + events_of(dir.path()).len() >= want.len()
    });
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{stdout}");
    let mut lines = read_ndjson_so_far(&moved);
    assert!(!events_of(dir.path()).is_empty(), "a new file was started");
    lines.extend(events_of(dir.path()));
    assert_seqs_gap_free(&lines, "the renamed file and the new one");
    let got = multiset(&lines);
    assert!(got == want, "{}", diff(&got, &want));
}

/// The events file moved away from outside while geogate is down, its
/// lines still in the outbox for an MQTT broker that is down too: the
/// restart is refused, naming the file and the seqs synced to it, rather
/// than writing a second copy of them beside the moved file.
#[test]
fn an_events_file_moved_away_while_geogate_is_down_is_refused_not_copied() {
    let _serial = exclusive();
    let Some(mut brokers) = TwoBrokers::start() else {
        return;
    };
    brokers.events.stop();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut geogate = brokers.geogate(dir.path(), "moved-while-down", 1000, 3600.0);
    let port = brokers.intake.port;
    runtime.block_on(publish_all(port, &crossing_fixes("m", 5, 0, 30), None));
    geogate.wait_processed(30.0, 30);
    // Synced (about once a second), and the sync recorded by a commit.
    std::thread::sleep(Duration::from_secs(2));
    runtime.block_on(publish_all(port, &crossing_fixes("m", 5, 30, 10), None));
    geogate.wait_processed(40.0, 30);
    geogate.kill();
    let path = dir.path().join("events.ndjson");
    let written = events_of(dir.path());
    assert!(!written.is_empty());
    std::fs::rename(&path, dir.path().join("events.ndjson.moved")).unwrap();
    geogate.restart_refused();
    geogate.refused_saying(&format!(
        "events file {} ends at seq 0, but transitions 1..=",
        path.display()
    ));
    assert!(events_of(dir.path()).is_empty(), "nothing copied again");
}

/// The events file cut short by another process (`copytruncate`): lines
/// written since the copy would be lost, so geogate writes nothing more
/// and says so (the sink unhealthy, acks held, the log naming it) instead
/// of going on past a gap.
#[test]
fn an_events_file_truncated_from_outside_is_refused_loudly() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let geogate = start(
        dir.path(),
        broker.port,
        "truncated",
        None,
        // Every line synced as written: the cut takes synced lines.
        |c| fsync("always")(c).replace("[pipeline]\n", "[pipeline]\nreorder_window_ms = 0\n"),
        None,
    );
    runtime.block_on(publish_all(
        broker.port,
        &crossing_fixes("t", 5, 0, 50),
        None,
    ));
    geogate.wait_processed(50.0, 30);
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("events.ndjson"))
        .unwrap()
        .set_len(0)
        .unwrap();
    runtime.block_on(publish_all(
        broker.port,
        &crossing_fixes("t", 5, 50, 20),
        None,
    ));
    wait_until(30, "the file refused", || {
        geogate.series(r#"geogate_sink_healthy{sink="events"}"#) == 0.0
            && geogate.metric("geogate_mqtt_unacked") >= 1.0
    });
    let log = std::fs::read_to_string(dir.path().join("stderr.log")).unwrap();
    assert!(log.contains("by another process (copytruncate?)"), "{log}");
}

/// A second geogate pointed at an events file another one writes is
/// refused at start, naming the lock, whatever its state: here with a
/// state file of its own.
#[test]
fn a_second_geogate_on_one_events_file_is_refused() {
    let _serial = exclusive();
    let Some(broker) = support::Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let first = start(dir.path(), broker.port, "first", None, |c| c, None);
    let other = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.ndjson").display().to_string();
    std::fs::write(other.path().join("fences.geojson"), FENCES).unwrap();
    let mut second =
        GeogateProcess::prepare(other.path(), &setup(broker.port, "second", ""), |c| {
            c.replace(
                &format!("{}/events.ndjson", other.path().display()),
                &events,
            )
        });
    second.restart_refused();
    second.refused_saying("another geogate writes this events file");
    drop(first);
}
