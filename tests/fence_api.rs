//! The HTTP API against the real geogate binary, with a real HTTP client
//! and a real broker: every endpoint's answers and refusals, the lifecycle
//! of a fence changed under vehicles, and what survives a SIGKILL.

mod support;

use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};
use support::geogate::{GeogateProcess, Setup, publish_all, read_ndjson_so_far, setup, wait_until};
use support::{Mosquitto, free_port};

const TOKEN: &str = "test-token-0123456789abcdef";

/// A geogate with the API on a free port, fences kept in its store (or
/// from the file), events carrying each fence's `site`.
fn start(dir: &Path, broker: u16, source: &str) -> (GeogateProcess, Api) {
    let port = free_port();
    let p = GeogateProcess::launch_with(
        dir,
        &Setup {
            extra_pipeline: "reorder_window_ms = 0",
            ..setup(broker, "api-test", "")
        },
        |config| {
            let config = config
                .replace("[fences]\n", &format!("[fences]\nsource = \"{source}\"\n"))
                .replace("[events]\n", "[events]\nfence_properties = [\"site\"]\n");
            format!(
                "{config}\n[api]\nlisten = \"127.0.0.1:{port}\"\ntoken = \"{TOKEN}\"\npage_size = 50\n"
            )
        },
        None,
    );
    p.wait_for_log("subscribed", 1);
    (p, Api::new(port))
}

#[derive(Clone)]
struct Api {
    base: String,
    client: reqwest::Client,
}

impl Api {
    fn new(port: u16) -> Self {
        // reqwest is built without a TLS provider of its own.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        Self {
            base: format!("http://127.0.0.1:{port}"),
            client: reqwest::Client::new(),
        }
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.call_as(Some(TOKEN), method, path, body.map(|b| b.to_string()))
            .await
    }

    async fn call_as(
        &self,
        token: Option<&str>,
        method: &str,
        path: &str,
        body: Option<String>,
    ) -> (u16, Value) {
        let mut request = self.client.request(
            method.parse().expect("a method"),
            format!("{}{path}", self.base),
        );
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        let response = request.send().await.expect("the API answers");
        let status = response.status().as_u16();
        let text = response.text().await.expect("a body");
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }
}

fn square(id: &str, lon: f64, lat: f64, side: f64, props: Value) -> Value {
    json!({"type": "Feature", "id": id, "properties": props, "geometry": {"type": "Polygon",
        "coordinates": [[[lon, lat], [lon + side, lat], [lon + side, lat + side], [lon, lat + side], [lon, lat]]]}})
}

fn ids(page: &Value) -> Vec<String> {
    page["fences"]
        .as_array()
        .map(|f| {
            f.iter()
                .map(|f| f["id"].as_str().unwrap_or("").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// What `geogate fences check --format json` says of `feature` in a file.
fn fences_check(dir: &Path, feature: &Value) -> Value {
    let path = dir.join("check.geojson");
    let doc = json!({"type": "FeatureCollection", "features": [feature]});
    std::fs::write(&path, doc.to_string()).expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_geogate"))
        .args(["fences", "check", "--format", "json"])
        .arg(&path)
        .output()
        .expect("geogate runs");
    serde_json::from_slice(&out.stdout).expect("JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_answers_and_refuses_as_documented() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let (geogate, api) = start(dir.path(), broker.port, "store");

    // Without the token, or with another, nothing is served.
    for token in [None, Some("not-the-token-at-all")] {
        for (method, path) in [
            ("GET", "/fences"),
            ("GET", "/vehicles/v1"),
            ("DELETE", "/fences/A"),
        ] {
            let (status, body) = api.call_as(token, method, path, None).await;
            assert_eq!(status, 401, "{method} {path} with {token:?}");
            assert_eq!(body["error"], "missing or wrong bearer token");
        }
    }

    // The file seeded the store: A and B, version 1.
    let (status, page) = api.call("GET", "/fences", None).await;
    assert_eq!(status, 200);
    assert_eq!(ids(&page), ["A", "B"]);
    assert_eq!(page["version"], 1);
    let (_, first) = api.call("GET", "/fences?limit=1", None).await;
    assert_eq!(
        (ids(&first), first["next"].clone()),
        (vec!["A".to_owned()], json!("A"))
    );
    let (_, second) = api.call("GET", "/fences?limit=1&after=A", None).await;
    assert_eq!(ids(&second), ["B"]);
    assert!(second.get("next").is_none(), "the last page: {second}");
    let (status, _) = api.call("GET", "/fences?limit=51", None).await;
    assert_eq!(status, 400, "past the page size");

    let (status, a) = api.call("GET", "/fences/A", None).await;
    assert_eq!((status, a["version"].clone()), (200, json!(1)));
    assert_eq!(a["feature"]["geometry"]["type"], "Polygon");
    let (status, body) = api.call("GET", "/fences/nope", None).await;
    assert_eq!(status, 404, "{body}");

    // A put, then its read.
    let c = square("C", 10.04, 50.0, 0.01, json!({"site": "north"}));
    let (status, put) = api.call("PUT", "/fences/C", Some(c.clone())).await;
    assert_eq!(
        (status, put["version"].clone(), put["fences"].clone()),
        (200, json!(2), json!(3))
    );
    let (_, read) = api.call("GET", "/fences/C", None).await;
    assert_eq!(read["version"], 2);
    assert_eq!(read["feature"]["properties"]["site"], "north");
    // The path names the fence when the Feature does not.
    let mut unnamed = square("x", 10.06, 50.0, 0.01, json!({}));
    unnamed.as_object_mut().map(|o| o.remove("id"));
    let (status, put) = api.call("PUT", "/fences/F", Some(unnamed)).await;
    assert_eq!((status, put["version"].clone()), (200, json!(3)));

    // Refusals: not JSON, a bad ring (with fences check's very words), an
    // id that is not the path's.
    let (status, body) = api
        .call_as(Some(TOKEN), "PUT", "/fences/D", Some("{not json".into()))
        .await;
    assert_eq!(status, 400);
    assert!(
        body["errors"][0]["defect"]
            .as_str()
            .unwrap_or("")
            .starts_with("not JSON"),
        "{body}"
    );
    let mut open_ring = square("D", 10.0, 50.0, 0.01, json!({}));
    open_ring["geometry"]["coordinates"][0][4] = json!([10.5, 50.5]);
    let (status, body) = api.call("PUT", "/fences/D", Some(open_ring.clone())).await;
    assert_eq!(status, 400);
    let checked = fences_check(dir.path(), &open_ring);
    assert_eq!(checked["valid"], false);
    assert_eq!(
        body["errors"], checked["errors"],
        "the API's defects are fences check's"
    );
    let (status, body) = api
        .call(
            "PUT",
            "/fences/D",
            Some(square("E", 10.0, 50.0, 0.01, json!({}))),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let (status, _) = api.call("DELETE", "/fences/nope", None).await;
    assert_eq!(status, 404);

    // A batch with one bad fence changes nothing.
    let bad_batch = json!({"type": "FeatureCollection", "features": [
        square("G", 10.08, 50.0, 0.01, json!({})), open_ring]});
    let (status, body) = api.call("POST", "/fences:batch", Some(bad_batch)).await;
    assert_eq!(status, 400);
    assert_eq!(
        body["errors"][0]["index"], 1,
        "the bad one is named: {body}"
    );
    let (_, page) = api.call("GET", "/fences", None).await;
    assert_eq!(
        (ids(&page), page["version"].clone()),
        (
            vec!["A".into(), "B".into(), "C".into(), "F".into()],
            json!(3)
        )
    );
    // A good one, with a deletion, is one version.
    let good_batch = json!({"type": "FeatureCollection", "delete": ["B"], "features": [
        square("G", 10.08, 50.0, 0.01, json!({})), square("H", 10.1, 50.0, 0.01, json!({}))]});
    let (status, put) = api.call("POST", "/fences:batch", Some(good_batch)).await;
    assert_eq!((status, put["version"].clone()), (200, json!(4)));
    let (_, page) = api.call("GET", "/fences", None).await;
    assert_eq!(ids(&page), ["A", "C", "F", "G", "H"]);
    let (status, del) = api.call("DELETE", "/fences/C", None).await;
    assert_eq!((status, del["version"].clone()), (200, json!(5)));

    let (status, body) = api.call("GET", "/vehicles/never-seen", None).await;
    assert_eq!(status, 404, "{body}");
    let (ok, _) = geogate.terminate();
    assert!(ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_fences_from_the_file_the_api_only_reads() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let (geogate, api) = start(dir.path(), broker.port, "file");
    let (status, page) = api.call("GET", "/fences", None).await;
    assert_eq!((status, ids(&page)), (200, vec!["A".into(), "B".into()]));
    let (status, body) = api
        .call(
            "PUT",
            "/fences/C",
            Some(square("C", 10.04, 50.0, 0.01, json!({}))),
        )
        .await;
    assert_eq!(status, 409);
    assert!(
        body["error"].as_str().unwrap_or("").contains("SIGHUP"),
        "{body}"
    );
    let (status, _) = api.call("DELETE", "/fences/A", None).await;
    assert_eq!(status, 409);
    let (ok, _) = geogate.terminate();
    assert!(ok);
}

fn fix(vehicle: &str, ts: i64, lat: f64, lon: f64) -> support::geogate::Message {
    support::geogate::native(vehicle, ts, lat, lon, 40.0, "move")
}

/// The events file's lines for `vehicle`, as (fence, event, cause).
fn lines_of(events: &[Value], vehicle: &str) -> Vec<(String, String, Option<String>)> {
    events
        .iter()
        .filter(|e| e["vehicle"] == vehicle)
        .map(|e| {
            (
                e["fence"].as_str().unwrap_or("").to_owned(),
                e["event"].as_str().unwrap_or("").to_owned(),
                e["cause"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Deleting a fence exits its members at once, dated at the change; a
/// fence created under a silent vehicle waits for its next fix; a changed
/// geometry exits only those it lets go; events carry the chosen property;
/// the state query agrees with the events file, after a SIGKILL too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_changes_exit_their_members_at_once_and_invent_no_enter() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let events_path = dir.path().join("events.ndjson");
    let (mut geogate, api) = start(dir.path(), broker.port, "store");
    let t0 = now_ms() - 60_000;
    // v1 and v2 in A; v3 in B.
    publish_all(
        broker.port,
        &[
            fix("v1", t0, 50.005, 10.005),
            fix("v2", t0, 50.009, 10.009),
            fix("v3", t0, 50.005, 10.025),
        ],
        None,
    )
    .await;
    wait_until(20, "three enters", || {
        read_ndjson_so_far(&events_path).len() >= 3
    });
    let (status, v1) = api.call("GET", "/vehicles/v1", None).await;
    assert_eq!(status, 200, "{v1}");
    assert_eq!(v1["fences"], json!([{"id": "A", "version": 1}]));
    assert_eq!(
        v1["last_fix"],
        json!({"ts": t0, "lat": 50.005, "lon": 10.005})
    );

    // A shrinks so that v2 (at its corner) is let go and v1 is not; B is
    // deleted under v3. No fix is needed for either exit.
    let before = now_ms();
    let (status, changed) = api
        .call(
            "POST",
            "/fences:batch",
            Some(json!({"type": "FeatureCollection", "delete": ["B"],
                "features": [square("A", 10.0, 50.0, 0.007, json!({"site": "yard"}))]})),
        )
        .await;
    let after = now_ms();
    assert_eq!((status, changed["version"].clone()), (200, json!(2)));
    wait_until(20, "two exits", || {
        read_ndjson_so_far(&events_path).len() >= 5
    });
    let events = read_ndjson_so_far(&events_path);
    let exits: Vec<&Value> = events.iter().filter(|e| e["cause"].is_string()).collect();
    assert_eq!(exits.len(), 2, "{events:?}");
    for exit in &exits {
        let ts = exit["ts"].as_i64().unwrap_or(0);
        // The receive clock is the wall clock read once and carried on the
        // monotonic clock: within a second of this process's wall clock.
        assert!(
            (before - 1_000..=after + 1_000).contains(&ts),
            "dated at the change: {exit}"
        );
        assert_eq!(exit["fence_version"], 2);
    }
    assert_eq!(
        lines_of(&events, "v2")[1],
        ("A".into(), "exit".into(), Some("fence_changed".into()))
    );
    assert_eq!(lines_of(&events, "v2")[1..].len(), 1);
    assert_eq!(
        lines_of(&events, "v3")[1],
        ("B".into(), "exit".into(), Some("fence_deleted".into()))
    );
    assert_eq!(
        lines_of(&events, "v1").len(),
        1,
        "v1 stays in the smaller A"
    );
    let v2_exit = exits
        .iter()
        .find(|e| e["vehicle"] == "v2")
        .expect("v2's exit");
    assert_eq!(
        v2_exit["properties"],
        json!({"site": "yard"}),
        "the new definition's property"
    );

    // A fence created over silent v3: nothing until its next fix.
    let (status, _) = api
        .call(
            "PUT",
            "/fences/Z",
            Some(square("Z", 10.02, 50.0, 0.01, json!({"site": "zed"}))),
        )
        .await;
    assert_eq!(status, 200);
    let (_, v3) = api.call("GET", "/vehicles/v3", None).await;
    assert_eq!(v3["fences"], json!([]), "{v3}");
    assert_eq!(
        read_ndjson_so_far(&events_path).len(),
        5,
        "no enter is invented"
    );
    publish_all(broker.port, &[fix("v3", t0 + 1_000, 50.005, 10.025)], None).await;
    wait_until(20, "v3 enters Z", || {
        read_ndjson_so_far(&events_path).len() >= 6
    });
    let events = read_ndjson_so_far(&events_path);
    let last = events.last().expect("a line");
    assert_eq!(
        (
            last["vehicle"].clone(),
            last["fence"].clone(),
            last["event"].clone()
        ),
        (json!("v3"), json!("Z"), json!("enter"))
    );
    assert_eq!(last["ts"], t0 + 1_000);
    assert_eq!(last["fence_version"], 3);
    assert_eq!(last["properties"], json!({"site": "zed"}));

    // After a SIGKILL: the same fences and version, and each vehicle's
    // fences are what its events add up to.
    geogate.kill_and_restart();
    let (_, page) = api.call("GET", "/fences", None).await;
    assert_eq!(
        (ids(&page), page["version"].clone()),
        (vec!["A".into(), "Z".into()], json!(3))
    );
    let events = read_ndjson_so_far(&events_path);
    for v in ["v1", "v2", "v3"] {
        let mut inside = std::collections::BTreeSet::new();
        for (fence, event, _) in lines_of(&events, v) {
            if event == "enter" {
                inside.insert(fence);
            } else {
                inside.remove(&fence);
            }
        }
        let (status, view) = api.call("GET", &format!("/vehicles/{v}"), None).await;
        assert_eq!(status, 200, "{view}");
        let listed: std::collections::BTreeSet<String> = view["fences"]
            .as_array()
            .map(|f| {
                f.iter()
                    .map(|f| f["id"].as_str().unwrap_or("").to_owned())
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(listed, inside, "{v}: {view}");
    }
    let (ok, _) = geogate.terminate();
    assert!(ok);
}

/// A SIGKILL inside a batch's transaction leaves none of it; one after it
/// is durable but before it went live leaves all of it, and the exits it
/// owes come after the restart, once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_during_a_change_leaves_all_of_it_or_none() {
    let Some(broker) = Mosquitto::start() else {
        return;
    };
    for (point, applied) in [("fences.inside:2", false), ("fences.committed:1", true)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let events_path = dir.path().join("events.ndjson");
        let (mut geogate, api) = start(dir.path(), broker.port, "store");
        let t0 = now_ms() - 60_000;
        let vehicles: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
        let fixes: Vec<_> = vehicles
            .iter()
            .enumerate()
            .map(|(i, v)| fix(v, t0, 50.001 + i as f64 * 1e-4, 10.005))
            .collect();
        publish_all(broker.port, &fixes, None).await;
        wait_until(20, "forty enters", || {
            read_ndjson_so_far(&events_path).len() >= 40
        });
        // Stop at the point during the next change: a batch deleting A and
        // putting two fences.
        geogate.kill();
        geogate.set_crash_point(Some(point));
        geogate.restart();
        let batch = json!({"type": "FeatureCollection", "delete": ["A"], "features": [
            square("P", 11.0, 50.0, 0.01, json!({})), square("Q", 11.1, 50.0, 0.01, json!({}))]});
        let api_call = tokio::spawn({
            let api = api.clone();
            async move { api.call("POST", "/fences:batch", Some(batch)).await }
        });
        geogate.wait_for_crash_point();
        geogate.kill_and_restart();
        // The change was in flight: its request got no answer.
        assert!(api_call.await.is_err(), "{point}: the request was answered");
        let (_, page) = api.call("GET", "/fences", None).await;
        if applied {
            assert_eq!(
                (ids(&page), page["version"].clone()),
                (vec!["B".into(), "P".into(), "Q".into()], json!(2)),
                "{point}"
            );
            wait_until(20, "forty exits", || {
                read_ndjson_so_far(&events_path).len() >= 80
            });
        } else {
            assert_eq!(
                (ids(&page), page["version"].clone()),
                (vec!["A".into(), "B".into()], json!(1)),
                "{point}"
            );
        }
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(500) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let events = read_ndjson_so_far(&events_path);
        let mut ids_seen = std::collections::HashSet::new();
        for e in &events {
            assert!(
                ids_seen.insert(e["id"].as_str().unwrap_or("").to_owned()),
                "once each: {e}"
            );
        }
        let deleted = events
            .iter()
            .filter(|e| e["cause"] == "fence_deleted")
            .count();
        assert_eq!(deleted, if applied { 40 } else { 0 }, "{point}");
        let (ok, _) = geogate.terminate();
        assert!(ok);
    }
}
