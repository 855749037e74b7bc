//! Several geogate processes on one MQTT shared subscription with their
//! per-vehicle state in Redis (`[state] backend = "redis"`), against real
//! mosquitto and redis-server: the union of their events files holds the
//! transitions of one uninterrupted single-instance run, each exactly once,
//! with a SIGKILL or without.

mod support;

use std::path::Path;
use std::time::Duration;
use support::fleet::{
    FENCES, FIXES, Multiset, VEHICLES, assert_seqs_gap_free, diff, fleet, multiset,
};
use support::geogate::{
    END_OF_TEST, GeogateProcess, collect_events_until_end, exclusive, publish_all, read_ndjson,
    read_ndjson_so_far, setup, wait_until,
};
use support::redis::Redis;

/// Between published fixes: a vehicle's consecutive fixes are then
/// 24 × 5 ms apart, far more than one instance takes to apply one, so
/// whichever instance gets the next fix finds the previous one applied.
const PACE: Duration = Duration::from_millis(5);

const SHARED_TOPICS: &str =
    r#"topics = ["$share/geogate/fleet/+/telemetry", "$share/geogate/owntracks/+/+"]"#;

fn total() -> f64 {
    (VEHICLES * FIXES) as f64
}

/// One uninterrupted run of one instance with the embedded store.
fn reference(broker: u16, runtime: &tokio::runtime::Runtime) -> Multiset {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("fences.geojson"), FENCES).unwrap();
    let mut geogate = GeogateProcess::start(dir.path(), &setup(broker, "reference", ""));
    runtime.block_on(publish_all(broker, &fleet(0..FIXES), None));
    geogate.wait_processed(total(), 60);
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{stdout}");
    let events = read_ndjson(&dir.path().join("events.ndjson"));
    assert_seqs_gap_free(&events, "reference");
    let want = multiset(&events);
    assert!(want.len() > 100 && want.values().all(|ids| ids.len() == 1));
    want
}

/// How an instance takes part.
#[derive(Clone, Copy)]
struct Role<'a> {
    /// The `topics = [...]` line it subscribes with.
    topics: &'a str,
    /// After how long it takes over a silent instance's outbox entries.
    claim_idle_s: f64,
    /// Where its first run stops.
    crash_point: Option<&'a str>,
    /// It also publishes transitions over MQTT.
    events_mqtt: bool,
    /// Its events file's write-back modelled by the sync shim.
    shim: Option<&'a Path>,
    /// It also posts transitions to this webhook URL.
    webhook: Option<&'a str>,
    /// Lines added to its `[events]` table.
    events_extra: &'a str,
}

const MEMBER: Role<'static> = Role {
    topics: SHARED_TOPICS,
    claim_idle_s: 60.0,
    crash_point: None,
    events_mqtt: false,
    shim: None,
    webhook: None,
    events_extra: "",
};

/// An instance with its state at `urls` (several: a Cluster's seeds).
fn instance_on(dir: &Path, broker: u16, urls: &[String], id: &str) -> GeogateProcess {
    launch(dir, broker, urls, id, MEMBER)
}

/// An instance in `role` with its state at `urls`.
fn launch(dir: &Path, broker: u16, urls: &[String], id: &str, role: Role) -> GeogateProcess {
    std::fs::write(dir.join("fences.geojson"), FENCES).unwrap();
    let mut geogate = GeogateProcess::launch_with(
        dir,
        &support::geogate::Setup {
            events_mqtt: role.events_mqtt,
            ..setup(broker, id, "")
        },
        |config| {
            let config = config.replace(
                r#"topics = ["fleet/+/telemetry", "owntracks/+/+"]"#,
                role.topics,
            );
            let config = config.replace(
                "mqtt = false\n",
                &format!("mqtt = false\n{}", role.events_extra),
            );
            let config = match role.webhook {
                Some(url) => config.replace(
                    "[state]\n",
                    &format!(
                        "[events.webhook]\nurl = \"{url}\"\nsecret = \"s\"\nbatch = 20\n[state]\n"
                    ),
                ),
                None => config,
            };
            support::redis::with_shared_state(&config, urls, role.claim_idle_s)
        },
        None,
    );
    match role.crash_point {
        Some(point) => {
            // Started anew with the point set (a kill clears it).
            geogate.kill();
            geogate.set_crash_point(Some(point));
            if let Some(shim) = role.shim {
                geogate.set_env("LD_PRELOAD", &shim.display().to_string());
                geogate.set_env(
                    "SYNC_SHIM_FILE",
                    &dir.join("events.ndjson").display().to_string(),
                );
            }
            geogate.restart();
        }
        None => geogate.wait_for_log("subscribed", 1),
    }
    geogate
}

/// `n` instances on the shared subscription with their state at `urls`,
/// each in a directory of its own, named `{prefix}-{i}`.
fn instances(
    n: usize,
    broker: u16,
    urls: &[String],
    prefix: &str,
) -> (Vec<GeogateProcess>, Vec<tempfile::TempDir>) {
    let dirs: Vec<_> = (0..n).map(|_| tempfile::tempdir().unwrap()).collect();
    let instances = dirs
        .iter()
        .enumerate()
        .map(|(i, d)| instance_on(d.path(), broker, urls, &format!("{prefix}-{i}")))
        .collect();
    (instances, dirs)
}

/// The sum of one metric over `instances`.
fn sum(instances: &[GeogateProcess], name: &str) -> f64 {
    instances.iter().map(|g| g.metric(name)).sum()
}

/// Waits until the instances together took and finished the whole fleet.
fn wait_all_processed(instances: &[GeogateProcess]) {
    wait_until(120, "every fix received and finished", || {
        let received = sum(instances, "geogate_events_received_total");
        received >= total()
            && sum(instances, "geogate_events_evaluated_total")
                + sum(instances, "geogate_events_invalid_total")
                + sum(instances, "geogate_fixes_late_total")
                >= received
    });
}

/// Stops every instance (each drains and delivers what its consumer has),
/// checks each account and file, and returns the union of their files.
fn stop_and_collect(
    instances: Vec<GeogateProcess>,
    dirs: &[tempfile::TempDir],
) -> Vec<serde_json::Value> {
    let mut union = Vec::new();
    for (mut geogate, dir) in instances.into_iter().zip(dirs) {
        let (ok, stdout) = geogate.stop();
        assert!(ok, "{stdout}");
        let line = support::geogate::accounting_line(&stdout);
        assert!(line.ends_with("(balanced)"), "{line}");
        assert!(
            line.contains("late 0 "),
            "a fix was applied after a later one: {line}"
        );
        let events = read_ndjson(&dir.path().join("events.ndjson"));
        assert_seqs_gap_free(&events, "an instance's file");
        union.extend(events);
    }
    union
}

/// Starts publishing the fleet, a fix every `pace`, and waits until the
/// instances have received `fraction` of it.
fn stream_under_way(
    runtime: &tokio::runtime::Runtime,
    broker: u16,
    pace: Duration,
    instances: &[GeogateProcess],
    fraction: f64,
) -> tokio::task::JoinHandle<()> {
    let publishing =
        runtime.spawn(async move { publish_all(broker, &fleet(0..FIXES), Some(pace)).await });
    wait_until(60, "the stream under way", || {
        sum(instances, "geogate_events_received_total") >= fraction * total()
    });
    publishing
}

/// Stops `victim` cleanly, then restarts it once per point in `points`,
/// each time SIGKILLing it where it stops, and finally restarts it to run
/// through.
fn kill_at(victim: &mut GeogateProcess, points: &[&str]) {
    let (ok, stdout) = victim.stop();
    assert!(ok, "{stdout}");
    for point in points {
        victim.set_crash_point(Some(point));
        victim.restart();
        victim.wait_for_crash_point();
        victim.kill();
    }
    victim.set_crash_point(None);
    victim.restart();
}

/// Waits until the files in `dirs` hold `n` lines between them.
fn wait_delivered(dirs: &[tempfile::TempDir], n: usize) {
    wait_until(120, "every transition delivered", || {
        dirs.iter()
            .map(|d| read_ndjson_so_far(&d.path().join("events.ndjson")).len())
            .sum::<usize>()
            >= n
    });
}

/// The end of a run: the stream published and every transition delivered;
/// then the instances stop (draining) and the union must be exactly `want`.
fn finish_exact(
    runtime: &tokio::runtime::Runtime,
    publishing: tokio::task::JoinHandle<()>,
    instances: Vec<GeogateProcess>,
    dirs: &[tempfile::TempDir],
    want: &Multiset,
    what: &str,
) {
    runtime.block_on(publishing).unwrap();
    wait_delivered(dirs, want.len());
    let union = stop_and_collect(instances, dirs);
    assert_exactly(&union, want, what);
}

fn assert_exactly(got: &[serde_json::Value], want: &Multiset, what: &str) {
    let got = multiset(got);
    assert!(
        got == *want,
        "{what}: the union differs from one instance's run:\n{}",
        diff(&got, want)
    );
}

/// What each single-node test starts with: its turn on the machine, the
/// servers, a runtime, and the uninterrupted run to compare with.
struct Servers {
    _serial: std::sync::MutexGuard<'static, ()>,
    broker: support::Mosquitto,
    redis: Redis,
    runtime: tokio::runtime::Runtime,
    want: Multiset,
}

fn servers() -> Option<Servers> {
    let serial = exclusive();
    let (Some(broker), Some(redis)) = (support::Mosquitto::start(), Redis::start()) else {
        return None;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let want = reference(broker.port, &runtime);
    Some(Servers {
        _serial: serial,
        broker,
        redis,
        runtime,
        want,
    })
}

/// (a) Three instances, the fleet spread among them by the broker.
#[test]
fn three_instances_together_emit_what_one_does_exactly_once() {
    let Some(s) = servers() else {
        return;
    };
    let (instances, dirs) = instances(3, s.broker.port, &[s.redis.url()], "scale");
    s.runtime
        .block_on(publish_all(s.broker.port, &fleet(0..FIXES), Some(PACE)));
    wait_all_processed(&instances);
    let received: Vec<f64> = instances
        .iter()
        .map(|g| g.metric("geogate_events_received_total"))
        .collect();
    assert!(
        received.iter().all(|&n| n > 0.0),
        "the broker spread the fleet: {received:?}"
    );
    let files: Vec<usize> = dirs
        .iter()
        .map(|d| read_ndjson_so_far(&d.path().join("events.ndjson")).len())
        .collect();
    let union = stop_and_collect(instances, &dirs);
    assert_exactly(&union, &s.want, "three instances");
    eprintln!("received per instance {received:?}, lines per file (before stopping) {files:?}");
}

/// (b) One of three instances is SIGKILLed three times mid-stream and
/// restarted each time, stopped at each point where work is in flight: a
/// batch applied in Redis but not acked to the broker; transitions taken
/// from the outbox but not written; written but not acked to the outbox.
#[test]
fn a_sigkilled_instance_restarts_and_nothing_is_lost_or_repeated() {
    let Some(s) = servers() else {
        return;
    };
    let (mut instances, dirs) = instances(3, s.broker.port, &[s.redis.url()], "kill");
    // Slower than (a): the stream outlasts three restarts, and a fix the
    // victim held when it died comes back to it (on its restart) before
    // that vehicle's next fix is due.
    let publishing = stream_under_way(&s.runtime, s.broker.port, 4 * PACE, &instances, 0.1);
    kill_at(
        &mut instances[1],
        &["shared.applied:2", "outbox.read:2", "outbox.written:2"],
    );
    finish_exact(
        &s.runtime,
        publishing,
        instances,
        &dirs,
        &s.want,
        "with three SIGKILLs",
    );
}

/// A power loss under `fsync = "flush"`: an instance is SIGKILLed with
/// lines written and not yet synced, and its events file cut back to its
/// last sync (the sync shim's record), as a host reset leaves it. Entries
/// are acked in the outbox stream only once their lines are on disk, so
/// the cut ones are still pending for this instance and written again at
/// its restart: nothing is lost, nothing repeated.
#[test]
fn a_power_loss_takes_no_acked_transition_from_an_instances_file() {
    let Some(s) = servers() else {
        return;
    };
    let Some(shim) = support::sync_shim() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut geogate = launch(
        dir.path(),
        s.broker.port,
        &[s.redis.url()],
        "power",
        Role {
            crash_point: Some("outbox.written:6"),
            shim: Some(&shim),
            ..MEMBER
        },
    );
    let publishing = s.runtime.spawn({
        let port = s.broker.port;
        async move { publish_all(port, &fleet(0..FIXES), Some(PACE)).await }
    });
    geogate.wait_for_crash_point();
    geogate.kill();
    let events = dir.path().join("events.ndjson");
    let cut = support::cut_to_last_sync(&events);
    assert!(cut > 0, "lines written since the last sync were cut");
    geogate.restart();
    finish_exact(
        &s.runtime,
        publishing,
        vec![geogate],
        std::slice::from_ref(&dir),
        &s.want,
        "after a power loss",
    );
}

/// Redis stopped mid-stream for two seconds: the instances hold the fixes
/// they cannot apply unacked (the broker keeps them), the metrics show the
/// failing calls, and once Redis is back everything is applied and
/// delivered exactly once, without a restart.
#[test]
fn a_redis_outage_holds_work_unacked_and_the_pipeline_resumes_by_itself() {
    let Some(mut s) = servers() else {
        return;
    };
    let (instances, dirs) = instances(2, s.broker.port, &[s.redis.url()], "outage");
    let publishing = stream_under_way(&s.runtime, s.broker.port, 2 * PACE, &instances, 0.3);
    s.redis.stop();
    wait_until(30, "fixes held unacked while Redis is away", || {
        sum(&instances, "geogate_state_redis_errors_total") > 0.0
            && sum(&instances, "geogate_mqtt_unacked") > 0.0
            && sum(&instances, "geogate_state_redis_connected") == 0.0
    });
    let evaluated_before = sum(&instances, "geogate_events_evaluated_total");
    std::thread::sleep(Duration::from_secs(2));
    let evaluated_after = sum(&instances, "geogate_events_evaluated_total");
    assert_eq!(
        evaluated_after, evaluated_before,
        "nothing can be finished while Redis is away"
    );
    s.redis.start_again();
    wait_until(30, "the outage over and counted", || {
        sum(&instances, "geogate_state_redis_connected") == 2.0
            && instances
                .iter()
                .all(|g| g.metric("geogate_state_redis_unavailable_seconds") >= 2.0)
    });
    finish_exact(
        &s.runtime,
        publishing,
        instances,
        &dirs,
        &s.want,
        "across a Redis outage",
    );
}

/// (e) The state in a three-master Redis Cluster, one master SIGKILLed
/// mid-stream and started again: its slots fail while it is away (their
/// fixes stay unacked), the others keep working, and the union is exact.
#[test]
fn a_cluster_master_restarted_mid_stream_changes_nothing() {
    let _serial = exclusive();
    let (Some(broker), Some(mut cluster)) = (
        support::Mosquitto::start(),
        support::redis::RedisCluster::start(),
    ) else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let want = reference(broker.port, &runtime);
    let (instances, dirs) = instances(3, broker.port, &cluster.urls(), "cluster");
    let publishing = stream_under_way(&runtime, broker.port, 2 * PACE, &instances, 0.3);
    cluster.nodes[2].stop();
    wait_until(30, "calls to the stopped master failing", || {
        sum(&instances, "geogate_state_redis_errors_total") > 0.0
    });
    cluster.nodes[2].start_again();
    cluster.wait_ok();
    finish_exact(
        &runtime,
        publishing,
        instances,
        &dirs,
        &want,
        "with a master restarted",
    );
}

/// An instance that dies holding outbox entries and never comes back: after
/// `claim_idle_s` the others claim them and write them, once. The victim
/// subscribes to no telemetry, so it holds no fixes: only outbox entries,
/// read and not yet written when it is killed.
#[test]
fn a_dead_instances_transitions_are_claimed_by_the_others() {
    let Some(s) = servers() else {
        return;
    };
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let urls = [s.redis.url()];
    let mut victim = launch(
        dirs[0].path(),
        s.broker.port,
        &urls,
        "claim-victim",
        Role {
            topics: r#"topics = ["nothing/+"]"#,
            claim_idle_s: 2.0,
            crash_point: Some("outbox.read:3"),
            ..MEMBER
        },
    );
    let others: Vec<_> = dirs[1..]
        .iter()
        .enumerate()
        .map(|(i, d)| {
            launch(
                d.path(),
                s.broker.port,
                &urls,
                &format!("claim-{i}"),
                Role {
                    claim_idle_s: 2.0,
                    ..MEMBER
                },
            )
        })
        .collect();
    let port = s.broker.port;
    let publishing = s
        .runtime
        .spawn(async move { publish_all(port, &fleet(0..FIXES), Some(PACE)).await });
    victim.wait_for_crash_point();
    victim.kill();
    s.runtime.block_on(publishing).unwrap();
    wait_all_processed(&others);
    wait_until(
        60,
        "the dead instance's entries claimed and written",
        || {
            others
                .iter()
                .map(|g| g.metric("geogate_outbox_claimed_total"))
                .sum::<f64>()
                > 0.0
                && dirs
                    .iter()
                    .map(|d| read_ndjson_so_far(&d.path().join("events.ndjson")).len())
                    .sum::<usize>()
                    >= s.want.len()
        },
    );
    let victim_lines = read_ndjson(&dirs[0].path().join("events.ndjson"));
    let mut union = stop_and_collect(others, &dirs[1..]);
    union.extend(victim_lines);
    assert_exactly(&union, &s.want, "after a claim");
}

/// Transitions over MQTT from three instances, one SIGKILLed after writing
/// entries to its file and before publishing them, and restarted: every
/// transition arrives at least once, as the line in the file that holds it,
/// and nothing else arrives; the files stay exact.
#[test]
fn transitions_over_mqtt_arrive_at_least_once_from_the_instances() {
    let Some(s) = servers() else {
        return;
    };
    let (ready_tx, ready) = tokio::sync::oneshot::channel();
    let collector = s.runtime.spawn(collect_events_until_end(
        s.broker.port,
        "shared-event-collector",
        ready_tx,
    ));
    s.runtime.block_on(ready).expect("collector subscribed");
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let urls = [s.redis.url()];
    let mut instances: Vec<_> = dirs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let role = Role {
                events_mqtt: true,
                ..MEMBER
            };
            launch(d.path(), s.broker.port, &urls, &format!("mqtt-{i}"), role)
        })
        .collect();
    let publishing = stream_under_way(&s.runtime, s.broker.port, 4 * PACE, &instances, 0.1);
    kill_at(&mut instances[0], &["outbox.written:2"]);
    finish_exact(
        &s.runtime,
        publishing,
        instances,
        &dirs,
        &s.want,
        "with MQTT on and a SIGKILL",
    );
    s.runtime.block_on(publish_all(
        s.broker.port,
        &[(END_OF_TEST.to_owned(), b"{}".to_vec())],
        None,
    ));
    let copies = s.runtime.block_on(collector).unwrap();
    let lines: std::collections::HashMap<String, serde_json::Value> = dirs
        .iter()
        .flat_map(|d| read_ndjson(&d.path().join("events.ndjson")))
        .map(|v| (v["id"].as_str().unwrap_or_default().to_owned(), v))
        .collect();
    let mut missing: std::collections::BTreeSet<&String> = lines.keys().collect();
    for (_, copy) in &copies {
        let id = copy["id"].as_str().unwrap_or_default().to_owned();
        assert_eq!(lines.get(&id), Some(copy), "a copy not as in the files");
        missing.remove(&id);
    }
    assert!(missing.is_empty(), "never published: {missing:?}");
    eprintln!("{} copies of {} transitions", copies.len(), lines.len());
}

/// Two instances, one reloading a different fence file (SIGHUP) and then
/// the same one again: each instance's `geogate_fence_sets_live` goes
/// from 1 to 2 and back, so a rollout's window of disagreement is seen.
#[test]
fn instances_with_different_fence_sets_are_counted_until_they_agree() {
    let _serial = exclusive();
    let (Some(broker), Some(redis)) = (support::Mosquitto::start(), Redis::start()) else {
        return;
    };
    let (instances, dirs) = instances(2, broker.port, &[redis.url()], "fence-sets");
    let all_see = |n: f64| {
        let instances = &instances;
        move || {
            instances
                .iter()
                .all(|g| g.metric("geogate_fence_sets_live") == n)
        }
    };
    wait_until(30, "both instances registered, agreeing", all_see(1.0));
    let fence_file = dirs[1].path().join("fences.geojson");
    std::fs::write(&fence_file, FENCES.replacen("\"A\"", "\"A2\"", 1)).unwrap();
    instances[1].sighup();
    wait_until(30, "two fence sets seen by both", all_see(2.0));
    std::fs::write(&fence_file, FENCES).unwrap();
    instances[1].sighup();
    wait_until(30, "one fence set again", all_see(1.0));
    // Differing again, the odd one stops cleanly: it leaves the register
    // at once (not after claim_idle_s, 60 s here).
    std::fs::write(&fence_file, FENCES.replacen("\"A\"", "\"A2\"", 1)).unwrap();
    instances[1].sighup();
    wait_until(30, "two fence sets again", all_see(2.0));
    let mut instances = instances;
    let (ok, stdout) = instances[1].stop();
    assert!(ok, "{stdout}");
    wait_until(10, "the stopped one gone from the register", || {
        instances[0].metric("geogate_fence_sets_live") == 1.0
    });
}

/// Two instances pointed at one events file: the second is refused at
/// start, naming the lock, since the shared state has no lock of its own
/// on a file each instance writes.
#[test]
fn a_second_instance_on_one_events_file_is_refused() {
    let Some(s) = servers() else {
        return;
    };
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let urls = [s.redis.url()];
    let first = instance_on(dirs[0].path(), s.broker.port, &urls, "lock-first");
    std::fs::write(dirs[1].path().join("fences.geojson"), FENCES).unwrap();
    let events = dirs[0].path().join("events.ndjson").display().to_string();
    let mut second = GeogateProcess::launch_with(
        dirs[1].path(),
        &setup(s.broker.port, "lock-second", ""),
        |config| {
            let config = config.replace(
                &format!("{}/events.ndjson", dirs[1].path().display()),
                &events,
            );
            support::redis::with_shared_state(&config, &urls, 60.0)
        },
        None,
    );
    second.refused_saying("another geogate writes this events file");
    drop(first);
}

/// Transitions posted to a webhook from three instances, one SIGKILLed
/// after the receiver accepted a batch and before its cursor moved, and
/// restarted: every transition in the files arrives, at least once, as
/// the line that holds it; the files stay exact.
#[test]
fn a_webhook_gets_every_transition_from_the_instances() {
    let Some(s) = servers() else {
        return;
    };
    let Some(receiver) = support::webhook::WebhookReceiver::start("s") else {
        return;
    };
    let url = receiver.url();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let urls = [s.redis.url()];
    let mut instances: Vec<_> = dirs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let role = Role {
                webhook: Some(&url),
                ..MEMBER
            };
            launch(d.path(), s.broker.port, &urls, &format!("hook-{i}"), role)
        })
        .collect();
    let publishing = stream_under_way(&s.runtime, s.broker.port, 4 * PACE, &instances, 0.1);
    kill_at(&mut instances[0], &["webhook.before_cursor:2"]);
    s.runtime.block_on(publishing).unwrap();
    wait_delivered(&dirs, s.want.len());
    wait_until(60, "every transition posted", || {
        let posted: std::collections::BTreeSet<String> =
            receiver.accepted().into_iter().map(|(id, ..)| id).collect();
        s.want.values().flatten().all(|id| posted.contains(id))
    });
    let union = stop_and_collect(instances, &dirs);
    assert_exactly(&union, &s.want, "with a webhook and a SIGKILL");
    assert!(
        receiver
            .requests()
            .iter()
            .all(|r| r["signature_ok"] == true)
    );
}

/// Every line in an instance's events file and the files rotated away
/// from it.
fn lines_in_all_files(dir: &Path) -> Vec<serde_json::Value> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("events.ndjson.0"))
        })
        .collect();
    files.sort();
    files.push(dir.join("events.ndjson"));
    files.iter().flat_map(|f| read_ndjson_so_far(f)).collect()
}

/// With the redis backend, an output reads its backlog back from the
/// events files at a restart, so rotation keeps a rotated file holding
/// anything it has not confirmed, past `rotate_keep`: a webhook receiver
/// down through many rotations and a SIGKILL gets every transition once
/// it is up, read back across the rotated files.
#[test]
fn rotated_files_an_output_still_needs_are_kept() {
    let Some(s) = servers() else {
        return;
    };
    let Some(mut receiver) = support::webhook::WebhookReceiver::start("s") else {
        return;
    };
    receiver.stop();
    let url = receiver.url();
    let dir = tempfile::tempdir().unwrap();
    let mut geogate = launch(
        dir.path(),
        s.broker.port,
        &[s.redis.url()],
        "keep-for-hook",
        Role {
            webhook: Some(&url),
            events_extra: "rotate_bytes = 4096\nrotate_keep = 1\n",
            ..MEMBER
        },
    );
    s.runtime
        .block_on(publish_all(s.broker.port, &fleet(0..FIXES), Some(PACE)));
    wait_until(60, "every transition in the files", || {
        lines_in_all_files(dir.path()).len() >= s.want.len()
    });
    let rotated = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            e.as_ref().is_ok_and(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("events.ndjson.0")
            })
        })
        .count();
    assert!(
        rotated > 1,
        "rotated files kept past rotate_keep: {rotated}"
    );
    geogate.kill();
    geogate.restart();
    receiver.start_again();
    wait_until(60, "every transition posted", || {
        let posted: std::collections::BTreeSet<String> =
            receiver.accepted().into_iter().map(|(id, ..)| id).collect();
        s.want.values().flatten().all(|id| posted.contains(id))
    });
    let (ok, stdout) = geogate.stop();
    assert!(ok, "{stdout}");
    let lines = lines_in_all_files(dir.path());
    assert_exactly(&lines, &s.want, "across rotated files");
}
