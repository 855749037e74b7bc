//! `geogate demo`: the whole product in one command, with nothing to
//! install and no files beside the binary. Starts the embedded broker, runs
//! the pipeline with the default config (plus its `[demo]` overrides),
//! replays the shift-change capture, shows live progress, then prints the
//! accounting line and writes an HTML report to `./geogate-report/`. The
//! config, the demo fences and the capture are compiled in ([`bundled`]);
//! `--config` points the demo at files of one's own instead.

use crate::config::Config;
use crate::pipeline::accounting::Balance;
use crate::replay::capture;
use crate::replay::{Pacing, replay_live};
use crate::report::map::{Marker, Track, map_svg};
use crate::report::{PALETTE, Series, html_page, html_table, line_chart};
use crate::service::{self, PipelineView};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("{0}")]
    Setup(String),
    #[error("pipeline: {0}")]
    Pipeline(#[from] service::ServiceError),
    #[error("replay: {0}")]
    Replay(#[from] crate::replay::ReplayError),
    #[error("report: {0}")]
    Report(#[from] std::io::Error),
}

/// `config/geogate.toml`, compiled in: the demo's settings, and what
/// `geogate config example` prints.
pub const BUNDLED_CONFIG: &str = include_str!("../../config/geogate.toml");
/// `config/fences.geojson`, compiled in: the demo's fences, and what
/// `geogate fences example` prints.
pub const BUNDLED_FENCES: &str = include_str!("../../config/fences.geojson");
const BUNDLED_CAPTURE: &[u8] = include_bytes!("../../replay/shift-change.ndjson.gz");

/// The compiled-in config, with the demo fences and capture written into
/// its report directory (relative to the working directory) and its paths
/// pointing there, so the demo runs from anywhere.
pub fn bundled() -> Result<Config, DemoError> {
    let mut config = Config::parse(BUNDLED_CONFIG).map_err(|e| DemoError::Setup(e.to_string()))?;
    let dir = config.demo.report_dir.clone();
    let write = |name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        std::fs::create_dir_all(&dir)
            .and_then(|_| std::fs::write(&path, bytes))
            .map(|_| path.clone())
            .map_err(|e| DemoError::Setup(format!("writing {}: {e}", path.display())))
    };
    config.fences.path = Some(write("fences.geojson", BUNDLED_FENCES.as_bytes())?);
    config.demo.capture = write("shift-change.ndjson.gz", BUNDLED_CAPTURE)?;
    Ok(config)
}

/// One per-second sample of the running pipeline.
#[derive(Debug, Clone, Default)]
struct Sample {
    second: f64,
    balance: Option<Balance>,
    fill: Vec<f64>,
    transitions: u64,
}

pub struct DemoOutcome {
    pub balance: Balance,
    pub report: PathBuf,
}

fn free_or(port: u16) -> u16 {
    if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
        return port;
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_or(port, |a| a.port())
}

/// Runs the demo with `config`; `print` receives each progress line.
pub async fn run(
    mut config: Config,
    print: impl Fn(&str) + Send + Sync + 'static,
) -> Result<DemoOutcome, DemoError> {
    let demo = config.demo.clone();
    let records = capture::read(&demo.capture).map_err(|e| DemoError::Setup(e.to_string()))?;
    let duration_s = records.last().map_or(0.0, |r| r.t_ns as f64 / 1e9) / demo.speed;
    std::fs::create_dir_all(&demo.report_dir)?;
    config.dead_letter.path = demo.report_dir.join("dead-letter.ndjson");
    let events_path = demo.report_dir.join("events.ndjson");
    let fences_path = config.fences.path.clone().unwrap_or_default();
    let codec = config.codec.clone();
    config.events.path = Some(events_path.clone());
    for stale in [
        &config.dead_letter.path,
        config
            .events
            .path
            .as_ref()
            .unwrap_or(&config.dead_letter.path),
    ] {
        let _ = std::fs::remove_file(stale);
    }
    // Each demo replays the same capture from the start, so it starts from
    // no state, explicitly, beside the events file it also starts anew.
    config.state.embedded.path = demo.report_dir.join("state.sqlite");
    config.state.reset = true;
    config.pipeline.sustained_rate = demo.sustained_rate;
    config.pipeline.queue_capacity = demo.queue_capacity;
    config.gate = demo.gate.clone().into();
    config.mqtt.client_id = format!("geogate-demo-{}", std::process::id());

    let port = free_or(config.embedded_broker.port);
    let broker = crate::broker::start(port).map_err(|e| DemoError::Setup(e.to_string()))?;
    config.mqtt.host = broker.addr.ip().to_string();
    config.mqtt.port = broker.addr.port();
    let url = format!("mqtt://{}", broker.addr);
    if config.metrics.enabled
        && let Ok(addr) = config.metrics.listen.parse::<std::net::SocketAddr>()
    {
        let addr = std::net::SocketAddr::new(addr.ip(), free_or(addr.port()));
        match crate::metrics::install(addr) {
            Ok(()) => print(&format!("metrics: http://{addr}/metrics")),
            Err(e) => print(&format!("metrics disabled: {e}")),
        }
    }
    print(&format!(
        "embedded broker on {}; replaying {} messages from {} at {}x (~{duration_s:.0} s); gate {}; worker cap {}/s and queue {} per shard",
        broker.addr,
        records.len(),
        demo.capture.display(),
        demo.speed,
        demo.gate,
        demo.sustained_rate,
        demo.queue_capacity
    ));

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (view_tx, view_rx) = tokio::sync::oneshot::channel::<PipelineView>();
    let pipeline = tokio::spawn(service::run(
        config,
        async {
            let _ = stop_rx.await;
        },
        move |_, view| {
            let _ = view_tx.send(view);
        },
    ));
    let view = view_rx
        .await
        .map_err(|_| DemoError::Setup("pipeline did not start".into()))?;
    let view = Arc::new(view);
    let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
    let started = Instant::now();
    let sampler = {
        let (view, samples) = (view.clone(), samples.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let b = view.accounting.balance();
                let fill = view.queue_fill();
                let sample = Sample {
                    second: started.elapsed().as_secs_f64(),
                    balance: Some(b),
                    fill: fill.clone(),
                    transitions: view.accounting.transitions_total(),
                };
                let fills: Vec<String> = fill
                    .iter()
                    .enumerate()
                    .map(|(i, f)| format!("s{i} {:>3.0}%", f * 100.0))
                    .collect();
                print(&format!(
                    "[{:>3.0}s] received {:>6} | shed {:>5.1}% | queues {} (watermark {:.0}%) | transitions {}",
                    sample.second,
                    b.received,
                    100.0 * b.shed as f64 / b.received.max(1) as f64,
                    fills.join(" "),
                    view.watermark * 100.0,
                    sample.transitions
                ));
                if let Ok(mut s) = samples.lock() {
                    s.push(sample);
                }
            }
        })
    };
    match tokio::time::timeout(Duration::from_secs(30), view.subscribed()).await {
        Ok(true) => {}
        Ok(false) => {
            return Err(DemoError::Setup(
                "the pipeline stopped before it subscribed".into(),
            ));
        }
        Err(_) => {
            return Err(DemoError::Setup(format!(
                "not subscribed to the embedded broker at {url} after 30 s"
            )));
        }
    }
    let (published, _) = replay_live(&records, &url, Pacing::Speed(demo.speed), false).await?;
    // Wait (≤ 30 s) until everything received has been handled.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let b = view.accounting.balance();
        if (b.received as usize >= published && b.in_queue == 0) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop_tx.send(());
    let balance = pipeline
        .await
        .map_err(|e| DemoError::Setup(e.to_string()))??;
    sampler.abort();
    let samples = samples.lock().map(|s| s.clone()).unwrap_or_default();
    let report = demo.report_dir.join("report.html");
    let map = draw_map(&records, &fences_path, &events_path, &codec);
    let (html, charts) = render(
        &samples,
        &balance,
        view.watermark,
        &demo.gate.to_string(),
        map,
    );
    std::fs::write(&report, html)?;
    for (name, svg) in charts {
        std::fs::write(demo.report_dir.join(name), svg)?;
    }
    Ok(DemoOutcome { balance, report })
}

/// How many vehicles' tracks the map shows: the busiest ones.
const MAP_VEHICLES: usize = 8;

/// The map of the demo's fences with the tracks of its busiest vehicles and
/// where they entered and left fences (from the events file).
fn draw_map(
    records: &[capture::CaptureRecord],
    fences: &std::path::Path,
    events: &std::path::Path,
    codec: &crate::codec::CodecSettings,
) -> Option<String> {
    let fences = crate::geofence::load_fences(fences).ok()?;
    let transitions: Vec<serde_json::Value> = std::fs::read_to_string(events)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let mut busiest: std::collections::HashMap<&str, usize> = Default::default();
    for t in &transitions {
        if let Some(v) = t["vehicle"].as_str() {
            *busiest.entry(v).or_default() += 1;
        }
    }
    let mut chosen: Vec<(&str, usize)> = busiest.into_iter().collect();
    chosen.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    chosen.truncate(MAP_VEHICLES);
    let mut tracks: Vec<Track> = chosen
        .iter()
        .map(|(v, _)| Track {
            vehicle: (*v).to_owned(),
            points: Vec::new(),
        })
        .collect();
    let mut at = std::collections::HashMap::new();
    let mut fixes: Vec<Vec<(i64, f64, f64)>> = vec![Vec::new(); tracks.len()];
    for r in records {
        let Ok(fix) = crate::codec::decode(&r.topic, &r.payload_bytes(), codec) else {
            continue;
        };
        if let Some(i) = tracks.iter().position(|t| *t.vehicle == *fix.vehicle) {
            fixes[i].push((fix.fix_time_ms, fix.lon, fix.lat));
            at.insert(
                (tracks[i].vehicle.clone(), fix.fix_time_ms),
                (fix.lon, fix.lat),
            );
        }
    }
    // Drawn in fix-time order: buffered pings arrive late.
    for (track, mut fixes) in tracks.iter_mut().zip(fixes) {
        fixes.sort_by_key(|&(t, _, _)| t);
        track.points = fixes.into_iter().map(|(_, lon, lat)| (lon, lat)).collect();
    }
    let markers: Vec<Marker> = transitions
        .iter()
        .filter_map(|t| {
            let key = (t["vehicle"].as_str()?.to_owned(), t["ts"].as_i64()?);
            let &(lon, lat) = at.get(&key)?;
            Some(Marker {
                lon,
                lat,
                enter: t["event"] == "enter",
            })
        })
        .collect();
    Some(map_svg(
        &format!(
            "Fences, the {} busiest vehicles' tracks, their enters and exits",
            tracks.len()
        ),
        &fences,
        &tracks,
        &markers,
    ))
}

/// The report page, and its charts as (file name, SVG).
fn render(
    samples: &[Sample],
    balance: &Balance,
    watermark: f64,
    gate: &str,
    map: Option<String>,
) -> (String, Vec<(&'static str, String)>) {
    let rate = |pick: fn(&Balance) -> u64| -> Vec<(f64, f64)> {
        let mut prev = 0;
        samples
            .iter()
            .filter_map(|s| s.balance.as_ref().map(|b| (s.second, b)))
            .map(|(t, b)| {
                let v = pick(b);
                let d = v.saturating_sub(prev);
                prev = v;
                (t, d as f64)
            })
            .collect()
    };
    let flow = line_chart(
        "Offered, admitted and shed per second",
        "seconds",
        "events/s",
        &[
            Series {
                name: "offered".into(),
                points: rate(|b| b.received),
                color: PALETTE[0],
            },
            Series {
                name: "admitted".into(),
                points: rate(|b| b.evaluated + b.held + b.late + b.in_queue),
                color: PALETTE[2],
            },
            Series {
                name: "shed".into(),
                points: rate(|b| b.shed),
                color: PALETTE[1],
            },
        ],
        None,
    );
    let shards = samples.iter().map(|s| s.fill.len()).max().unwrap_or(0);
    let fill_series: Vec<Series> = (0..shards)
        .map(|i| Series {
            name: format!("shard {i}"),
            points: samples
                .iter()
                .map(|s| (s.second, 100.0 * s.fill.get(i).copied().unwrap_or(0.0)))
                .collect(),
            color: PALETTE[(i + 3) % PALETTE.len()],
        })
        .collect();
    let fill = line_chart(
        "Queue fill against the watermark",
        "seconds",
        "% of capacity",
        &fill_series,
        Some((watermark * 100.0, "watermark")),
    );
    let mut prev = 0;
    let transitions: Vec<(f64, f64)> = samples
        .iter()
        .map(|s| {
            let d = s.transitions.saturating_sub(prev);
            prev = s.transitions;
            (s.second, d as f64)
        })
        .collect();
    let transitions = line_chart(
        "Fence transitions per second",
        "seconds",
        "transitions/s",
        &[Series {
            name: "enter + exit".into(),
            points: transitions,
            color: PALETTE[4],
        }],
        None,
    );
    let summary = html_table(
        &[
            "received",
            "invalid",
            "ignored",
            "shed",
            "evaluated",
            "held",
            "late",
            "in_queue",
            "balanced",
        ],
        &[vec![
            balance.received.to_string(),
            balance.invalid.to_string(),
            balance.ignored.to_string(),
            balance.shed.to_string(),
            balance.evaluated.to_string(),
            balance.held.to_string(),
            balance.late.to_string(),
            balance.in_queue.to_string(),
            balance.balances().to_string(),
        ]],
    );
    let mut sections = vec![(
        "Accounting".into(),
        format!(
            "<p><code>{}</code></p><p>Gate: <code>{gate}</code></p>{summary}",
            balance.line()
        ),
    )];
    let mut charts = Vec::new();
    if let Some(map) = map {
        sections.push(("Map".into(), map.clone()));
        charts.push(("map.svg", map));
    }
    sections.extend([
        ("Flow".into(), flow.clone()),
        ("Queues".into(), fill.clone()),
        ("Transitions".into(), transitions.clone()),
    ]);
    charts.extend([
        ("flow.svg", flow),
        ("queues.svg", fill),
        ("transitions.svg", transitions),
    ]);
    (html_page("geogate demo", &sections), charts)
}
