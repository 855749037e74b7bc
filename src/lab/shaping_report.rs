//! Files of `geogate lab shaping --out DIR`: the two CSVs, two SVG charts,
//! `report.html` and `manifest.json` (inputs and the sha256 of every
//! output). Everything is deterministic, so reruns give identical bytes.

use super::shaping::{self, CONVENTIONS, DIMENSIONS, Row, WINDOW_DIMENSION};
use crate::report::{PALETTE, Series, html_page, html_table, line_chart, sha256_file};
use serde_json::json;
use std::path::Path;

pub const FILES: [&str; 5] = [
    "shaping.csv",
    "shaping_windows.csv",
    "offered_vs_released.svg",
    "goodput_vs_burst.svg",
    "report.html",
];

pub fn write(dir: &Path, rows: &[Row]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let csv = shaping::rows_csv(rows);
    let windows_csv = shaping::windows_csv();
    let windows = shaping::windows();
    let series = |name: &str, pick: fn(&(u64, u64, u64, u64)) -> u64, color| Series {
        name: name.into(),
        points: windows
            .iter()
            .map(|w| (w.0 as f64 / 1000.0, pick(w) as f64))
            .collect(),
        color,
    };
    let over_time = line_chart(
        &format!("Offered vs released per 100 ms window (dimension {WINDOW_DIMENSION})"),
        "time (s)",
        "requests/s",
        &[
            series("offered", |w| w.1, PALETTE[0]),
            series("token bucket", |w| w.2, PALETTE[1]),
            series("leaky bucket", |w| w.3, PALETTE[2]),
        ],
        Some((100.0, "server capacity")),
    );
    let by_dim = |limiter: &str, pick: fn(&Row) -> f64, name: &str, color| Series {
        name: name.into(),
        points: rows
            .iter()
            .filter(|r| r.limiter == limiter)
            .map(|r| (f64::from(r.burst), pick(r)))
            .collect(),
        color,
    };
    let goodput = line_chart(
        "Goodput and downstream peak against burst dimension",
        "burst dimension",
        "requests/s",
        &[
            by_dim(
                "token-bucket",
                |r| r.goodput_rps,
                "token goodput",
                PALETTE[1],
            ),
            by_dim(
                "leaky-bucket",
                |r| r.goodput_rps,
                "leaky goodput",
                PALETTE[2],
            ),
            by_dim(
                "token-bucket",
                |r| r.downstream_peak as f64,
                "token peak",
                PALETTE[3],
            ),
            by_dim(
                "leaky-bucket",
                |r| r.downstream_peak as f64,
                "leaky peak",
                PALETTE[4],
            ),
        ],
        Some((100.0, "server capacity")),
    );
    let header = [
        "limiter",
        "burst",
        "goodput_rps",
        "reject_pct",
        "served_late_pct",
        "gate_delay_p99",
        "server_wait_p99",
        "downstream_peak",
    ];
    let table_rows: Vec<Vec<String>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').map(str::to_owned).collect())
        .collect();
    let conventions: String = CONVENTIONS
        .iter()
        .map(|c| format!("<li>{c}</li>"))
        .collect();
    let html = html_page(
        "geogate lab shaping",
        &[
            ("Model".into(), "<p>A gate (sustained 100 rps) in front of one FIFO server taking 10 ms per request; client deadline 200 ms from arrival to completion; demand alternates a 20 rps valley (1000 ms) and a 600 rps spike (200 ms) over 5 s.</p>".into()),
            ("Conventions".into(), format!("<ul>{conventions}</ul>")),
            ("Offered vs released".into(), over_time.clone()),
            ("Goodput and downstream peak".into(), goodput.clone()),
            ("Sweep".into(), html_table(&header, &table_rows)),
        ],
    );
    std::fs::write(dir.join("shaping.csv"), &csv)?;
    std::fs::write(dir.join("shaping_windows.csv"), &windows_csv)?;
    std::fs::write(dir.join("offered_vs_released.svg"), over_time)?;
    std::fs::write(dir.join("goodput_vs_burst.svg"), goodput)?;
    std::fs::write(dir.join("report.html"), html)?;
    let mut outputs = serde_json::Map::new();
    for f in FILES {
        outputs.insert(f.into(), json!(sha256_file(&dir.join(f))?));
    }
    let manifest = json!({
        "command": "geogate lab shaping",
        "inputs": {
            "service_time_ms": 10, "deadline_ms": 200, "gate_rate_rps": 100,
            "valley": {"rps": 20, "ms": 1000}, "spike": {"rps": 600, "ms": 200},
            "arrival_window_s": 5, "dimensions": DIMENSIONS, "window_csv_dimension": WINDOW_DIMENSION,
        },
        "conventions": CONVENTIONS,
        "outputs_sha256": outputs,
    });
    std::fs::write(
        dir.join("manifest.json"),
        serde_json::to_string_pretty(&manifest)? + "\n",
    )
}
