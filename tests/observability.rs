//! The shipped dashboard and alert rules against a real Prometheus scraping
//! a real geogate: every expression is valid, every panel query returns a
//! series, and Prometheus's shed total equals geogate's own count.

mod support;

use serde_json::Value;
use std::io::{Read, Write};
use std::process::{Child, Command};
use std::time::{Duration, Instant};
use support::geogate::{GeogateProcess, Setup, native, publish_all};

struct Prometheus {
    port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// GET over HTTP/1.0 on loopback; returns the body.
fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    raw.split_once("\r\n\r\n").map(|(_, body)| body.to_owned())
}

fn query(port: u16, expr: &str) -> Value {
    let body = http_get(
        port,
        &format!("/api/v1/query?query={}", percent_encode(expr)),
    )
    .expect("prometheus answers");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{expr}: not JSON ({e}): {body}"))
}

fn scalar(port: u16, expr: &str) -> Option<f64> {
    let v = query(port, expr);
    v["data"]["result"].get(0)?["value"][1]
        .as_str()?
        .parse()
        .ok()
}

fn start_prometheus(binary: &std::path::Path, target_ports: &[u16]) -> Prometheus {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = support::free_port();
    let rules =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards/prometheus/alerts.yml");
    let targets: Vec<String> = target_ports
        .iter()
        .map(|p| format!("\"127.0.0.1:{p}\""))
        .collect();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: geogate\n    static_configs:\n      - targets: [{}]\n",
        rules.display(),
        targets.join(", ")
    );
    std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
    let child = Command::new(binary)
        .arg(format!(
            "--config.file={}",
            dir.path().join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("prometheus.log")).unwrap())
        .spawn()
        .expect("spawn prometheus");
    let deadline = Instant::now() + Duration::from_secs(30);
    while http_get(port, "/-/ready").is_none_or(|b| !b.contains("Ready")) {
        assert!(
            Instant::now() < deadline,
            "prometheus not ready within 30 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    Prometheus {
        port,
        child,
        _dir: dir,
    }
}

/// Every PromQL expression in the dashboard, with Grafana's variables
/// replaced by what they expand to when "All" is selected.
fn dashboard_exprs() -> Vec<(String, String)> {
    let dash: Value =
        serde_json::from_str(&std::fs::read_to_string("dashboards/grafana/geogate.json").unwrap())
            .unwrap();
    assert!(dash["schemaVersion"].as_u64().unwrap() >= 36);
    let vars: Vec<&str> = dash["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(vars, ["datasource", "shard"]);
    let mut out = Vec::new();
    for panel in dash["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().unwrap() {
            let expr = t["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "20s")
                .replace("$shard", ".*");
            out.push((panel["title"].as_str().unwrap().to_owned(), expr));
        }
    }
    out
}

/// Titles of the panels about partitions (`backend = "partitioned"`).
const PARTITIONS_ROW: &str = "Partitions:";

/// Every panel `chosen` by its title answers with a series: rate() needs
/// two scrapes, so each query is asked until it does (bounded), not after
/// a fixed sleep.
fn every_panel_answers(prometheus: &Prometheus, chosen: impl Fn(&str) -> bool) {
    let mut asked = 0;
    for (title, expr) in dashboard_exprs().into_iter().filter(|(t, _)| chosen(t)) {
        asked += 1;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let v = query(prometheus.port, &expr);
            assert_eq!(v["status"], "success", "panel {title:?}: {expr}: {v}");
            if v["data"]["result"].as_array().map_or(0, Vec::len) > 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "panel {title:?} returns no series: {expr}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
    assert!(asked > 0, "no panel chosen");
}

fn alert_exprs() -> Vec<String> {
    std::fs::read_to_string("dashboards/prometheus/alerts.yml")
        .unwrap()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr:"))
        .map(|e| e.trim().to_owned())
        .collect()
}

#[test]
fn dashboard_and_alerts_work_against_a_real_prometheus() {
    let Some(prometheus_bin) = support::require(
        "prometheus (apt-get install prometheus)",
        support::binary("prometheus"),
    ) else {
        return;
    };
    if let Some(promtool) = support::binary("promtool") {
        let ok = Command::new(promtool)
            .args(["check", "rules", "dashboards/prometheus/alerts.yml"])
            .status()
            .unwrap();
        assert!(ok.success(), "promtool check rules");
    }
    // The global allowance's panels need one: a small shared bucket, so
    // both it and the shard gate refuse some of the burst.
    let Some(redis) = support::redis::Redis::start() else {
        return;
    };
    let gate = format!(
        "kind = \"token\"\nrate = 0.001\nburst = 10\n[gate.global]\nurls = [\"{}\"]\n\
         rate = 1\nburst = 5\nreserve = 2\nfail_mode = \"closed\"",
        redis.url()
    );
    // The outputs' panel needs both outputs after the events file: MQTT
    // (to the embedded broker) and a webhook.
    let Some(receiver) = support::webhook::WebhookReceiver::start("prom-secret") else {
        return;
    };
    let broker_port = support::free_port();
    let dir = tempfile::tempdir().unwrap();
    let setup = Setup {
        broker_port,
        embedded: true,
        client_id: "geogate-prom",
        extra_pipeline: "queue_capacity = 40\nsustained_rate = 500",
        gate: &gate,
        events_mqtt: true,
        extra_mqtt: "",
    };
    let webhook = format!(
        "[events.webhook]\nurl = \"{}\"\nsecret = \"prom-secret\"\n[state]\n",
        receiver.url()
    );
    let geogate = GeogateProcess::launch_with(
        dir.path(),
        &setup,
        |config| config.replace("[state]\n", &webhook),
        None,
    );
    geogate.wait_for_log("subscribed", 1);
    let prometheus = start_prometheus(&prometheus_bin, &[geogate.metrics_port]);

    // A burst of pings that crosses the watermark, some High movement
    // through the fences, and a few bad payloads.
    let t0 = 1_750_000_000_000i64;
    let mut stream: Vec<_> = (0..300)
        .map(|i| native("idler", t0 + i, 50.5, 10.5, 0.0, "ping"))
        .collect();
    for (i, lon) in [10.015, 10.005, 10.025, 10.04].iter().enumerate() {
        stream.push(native(
            "mover",
            t0 + 1000 * i as i64,
            50.005,
            *lon,
            40.0,
            "move",
        ));
    }
    stream.push(("fleet/x/telemetry".into(), b"not json".to_vec()));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(publish_all(broker_port, &stream, None));
    geogate.wait_processed(stream.len() as f64, 60);

    // Wait until Prometheus has scraped the final state, then two more.
    let deadline = Instant::now() + Duration::from_secs(30);
    while scalar(prometheus.port, "sum(geogate_events_received_total)") != Some(stream.len() as f64)
    {
        assert!(
            Instant::now() < deadline,
            "prometheus never saw all {} messages",
            stream.len()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // The partitions' row is checked against partitioned instances below.
    every_panel_answers(&prometheus, |title| !title.starts_with(PARTITIONS_ROW));
    let alerts = alert_exprs();
    assert_eq!(alerts.len(), 14);
    for expr in alerts {
        let v = query(prometheus.port, &expr);
        assert_eq!(v["status"], "success", "alert {expr}: {v}");
    }

    let prom_shed = scalar(prometheus.port, "sum(geogate_events_shed_total)").expect("shed series");
    let (ok, stdout) = geogate.terminate();
    assert!(ok);
    let line = support::geogate::accounting_line(&stdout);
    let shed: f64 = line
        .split("shed ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("shed count");
    assert!(shed > 0.0, "the stream triggered shedding: {line}");
    assert_eq!(
        prom_shed, shed,
        "Prometheus's shed total equals geogate's own count"
    );
}

/// The partitions' row and `GeogatePartitionWithoutOwner` against a real
/// Prometheus scraping two partitioned instances on a real nats-server:
/// every panel answers; with both instances up every partition has an
/// owner, and once both have stopped the alert's expression counts every
/// partition as without one.
#[test]
fn the_partitions_row_and_its_alert_work_against_a_real_prometheus() {
    let Some(prometheus_bin) = support::require(
        "prometheus (apt-get install prometheus)",
        support::binary("prometheus"),
    ) else {
        return;
    };
    const PARTITIONS: u32 = 4;
    let Some(nats) = support::nats::Nats::start_partitioned(PARTITIONS) else {
        return;
    };
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut instances: Vec<GeogateProcess> = dirs
        .iter()
        .enumerate()
        .map(|(i, dir)| {
            std::fs::write(dir.path().join("fences.geojson"), support::fleet::FENCES).unwrap();
            let d = dir.path().display();
            let url = nats.url();
            let mqtt = nats.mqtt_port.unwrap();
            let setup = support::geogate::setup(mqtt, "p", "");
            let mut p = GeogateProcess::prepare(dir.path(), &setup, |default| {
                let metrics = default.lines().find(|l| l.starts_with("listen = ")).unwrap().to_owned();
                format!(
                    "[mqtt]\nhost = \"127.0.0.1\"\nport = {mqtt}\nclient_id = \"p{i}\"\ntopics = [\"fleet/+/telemetry\"]\n\
                     [gate]\nkind = \"token\"\nrate = 100\nburst = 100\n[fences]\npath = \"{d}/fences.geojson\"\n\
                     [dead_letter]\npath = \"{d}/dead-letter.ndjson\"\n[state]\nbackend = \"partitioned\"\n\
                     urls = [\"{url}\"]\npartitions = {PARTITIONS}\nlease_term_s = 1\nsnapshot_every = 2\n[metrics]\n{metrics}\n"
                )
            });
            p.restart_until("joined the fleet");
            p
        })
        .collect();
    let ports: Vec<u16> = instances.iter().map(|p| p.metrics_port).collect();
    let prometheus = start_prometheus(&prometheus_bin, &ports);
    let fixes: Vec<_> = (0..40)
        .map(|k| support::fleet::fix(2 * (k % 8), k / 8))
        .collect();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(publish_all(nats.mqtt_port.unwrap(), &fixes, None));
    // The alert's own expression, as shipped: no series while every
    // partition has an owner, the count without one once none has.
    let without_owner = std::fs::read_to_string("dashboards/prometheus/alerts.yml")
        .unwrap()
        .split("alert: GeogatePartitionWithoutOwner")
        .nth(1)
        .and_then(|rule| rule.lines().find_map(|l| l.trim().strip_prefix("expr:")))
        .expect("the rule's expression")
        .trim()
        .to_owned();
    let owned = "count(max by (partition) (geogate_partition_owned) == 1)";
    let deadline = Instant::now() + Duration::from_secs(30);
    while scalar(prometheus.port, owned) != Some(f64::from(PARTITIONS)) {
        assert!(
            Instant::now() < deadline,
            "every partition owned, as Prometheus sees it"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(scalar(prometheus.port, &without_owner), None, "not firing");
    every_panel_answers(&prometheus, |title| title.starts_with(PARTITIONS_ROW));
    for p in &mut instances {
        let (ok, _) = p.stop();
        assert!(ok);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while scalar(prometheus.port, &without_owner) != Some(f64::from(PARTITIONS)) {
        assert!(
            Instant::now() < deadline,
            "with every instance gone, every partition is without an owner: {:?}",
            scalar(prometheus.port, &without_owner)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}
