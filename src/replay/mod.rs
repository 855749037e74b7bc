//! Recording captures from a broker, and replaying them: live (publishing
//! with the original pacing, scaled) or virtually (through [`sim`]).
//!
//! * [`capture`]: the NDJSON(.gz) capture format;
//! * [`synth`]: deterministic shift-change captures;
//! * [`sim`]: the virtual-time model behind `replay --virtual` and the labs.

pub mod capture;
pub mod sim;
pub mod synth;

use crate::replay::capture::{CaptureRecord, CaptureWriter};
use crate::replay::sim::GateReport;
use crate::report::{PALETTE, Series, html_page, html_table, line_chart};
use indicatif::{ProgressBar, ProgressStyle};
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use std::path::Path;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("broker URL {0:?}: expected mqtt://HOST:PORT")]
    Url(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("mqtt: {0}")]
    Mqtt(String),
}

/// `mqtt://host:port` (port defaults to 1883).
pub fn parse_url(url: &str) -> Result<(String, u16), ReplayError> {
    let rest = url
        .strip_prefix("mqtt://")
        .ok_or_else(|| ReplayError::Url(url.into()))?;
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) => (h, p.parse().map_err(|_| ReplayError::Url(url.into()))?),
        None => (rest, 1883),
    };
    if host.is_empty() {
        return Err(ReplayError::Url(url.into()));
    }
    Ok((host.to_owned(), port))
}

fn client_id(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{prefix}-{}-{nanos}", std::process::id())
}

/// When [`record`] stops, besides its `stop` future.
#[derive(Debug, Clone, Copy, Default)]
pub struct RecordLimits {
    /// After this long.
    pub duration: Option<Duration>,
    /// After this many messages.
    pub count: Option<usize>,
}

/// Records every message on `topics` until a limit is reached or `stop`
/// resolves; returns how many were written. `subscribed` is called once
/// the broker has confirmed every filter: from then on nothing published
/// is missed.
pub async fn record(
    url: &str,
    topics: &[String],
    out: &Path,
    limits: RecordLimits,
    subscribed: impl FnOnce(),
    stop: impl std::future::Future<Output = ()>,
) -> Result<usize, ReplayError> {
    let (host, port) = parse_url(url)?;
    let mut options = MqttOptions::new(client_id("geogate-record"), host, port);
    options
        .set_keep_alive(Duration::from_secs(15))
        .set_max_packet_size(4 << 20, 4 << 20);
    let (client, mut events) = AsyncClient::new(options, 100);
    for t in topics {
        client
            .subscribe(t.clone(), QoS::AtLeastOnce)
            .await
            .map_err(|e| ReplayError::Mqtt(e.to_string()))?;
    }
    let mut writer = CaptureWriter::create(out)?;
    let mut first: Option<Instant> = None;
    let mut written = 0;
    let mut subscribed = Some(subscribed);
    let mut unconfirmed = topics.len();
    let deadline = limits.duration.map(|d| tokio::time::Instant::now() + d);
    tokio::pin!(stop);
    loop {
        let until_deadline = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut stop => break,
            _ = until_deadline => break,
            event = events.poll() => match event {
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    let start = *first.get_or_insert_with(Instant::now);
                    let t_ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
                    writer.write(&CaptureRecord::new(t_ns, p.topic.clone(), &p.payload))?;
                    written += 1;
                    if limits.count.is_some_and(|n| written >= n) {
                        break;
                    }
                }
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    unconfirmed = unconfirmed.saturating_sub(1);
                    if unconfirmed == 0
                        && let Some(ready) = subscribed.take()
                    {
                        ready();
                    }
                }
                Ok(_) => {}
                Err(e) => return Err(ReplayError::Mqtt(e.to_string())),
            }
        }
    }
    writer.finish()?;
    Ok(written)
}

/// How fast a live replay runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pacing {
    /// Original gaps divided by this factor.
    Speed(f64),
    /// Original pacing, but never above this many messages per second.
    MaxRate(f64),
}

/// Publishes a capture at QoS 1 with its pacing; returns (published, acked).
pub async fn replay_live(
    records: &[CaptureRecord],
    url: &str,
    pacing: Pacing,
    progress: bool,
) -> Result<(usize, usize), ReplayError> {
    let (host, port) = parse_url(url)?;
    let mut options = MqttOptions::new(client_id("geogate-replay"), host, port);
    options
        .set_keep_alive(Duration::from_secs(15))
        .set_max_packet_size(4 << 20, 4 << 20)
        .set_inflight(1000);
    let (client, mut events) = AsyncClient::new(options, 2000);
    let acks = tokio::spawn(async move {
        let mut acked = 0usize;
        loop {
            match events.poll().await {
                Ok(Event::Incoming(Packet::PubAck(_))) => acked += 1,
                Ok(Event::Outgoing(rumqttc::Outgoing::Disconnect)) => return Ok(acked),
                Ok(_) => {}
                Err(e) => return Err(ReplayError::Mqtt(e.to_string())),
            }
        }
    });
    let bar = if progress {
        ProgressBar::new(records.len() as u64)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} msgs, {per_sec}, ETA {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let start = tokio::time::Instant::now();
    let mut not_before = start;
    for record in records {
        let due = match pacing {
            Pacing::Speed(s) => {
                start + Duration::from_nanos((record.t_ns as f64 / s.max(1e-9)) as u64)
            }
            Pacing::MaxRate(r) => {
                let original = start + Duration::from_nanos(record.t_ns);
                let due = original.max(not_before);
                not_before = due + Duration::from_secs_f64(1.0 / r.max(1e-9));
                due
            }
        };
        // Timers tick in whole milliseconds: sleeping for every sub-ms gap
        // would cap the replay near 1,000 msg/s. Publish anything due within
        // 2 ms now; the schedule, not the sleeps, keeps the average pacing.
        if due > tokio::time::Instant::now() + Duration::from_millis(2) {
            tokio::time::sleep_until(due).await;
        }
        client
            .publish(
                record.topic.clone(),
                QoS::AtLeastOnce,
                false,
                record.payload_bytes(),
            )
            .await
            .map_err(|e| ReplayError::Mqtt(e.to_string()))?;
        bar.inc(1);
    }
    bar.finish();
    // Let the last PubAcks arrive, then disconnect.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = client.disconnect().await;
    let acked = tokio::time::timeout(Duration::from_secs(30), acks)
        .await
        .map_err(|_| ReplayError::Mqtt("timed out waiting for PubAcks".into()))?
        .map_err(|e| ReplayError::Mqtt(e.to_string()))??;
    Ok((records.len(), acked))
}

/// Writes `summary.csv`, `shed_per_second.csv`, `shed_per_second.svg` and
/// `report.html` for a virtual replay.
pub fn write_virtual_report(dir: &Path, reports: &[GateReport]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let header = [
        "gate",
        "offered",
        "admitted",
        "shed",
        "shed_pct_of_all",
        "shed_pct_of_low",
        "invalid",
        "peak_fill",
        "seconds_above_watermark",
        "high_delay_p50_ms",
        "high_delay_p99_ms",
    ];
    let rows: Vec<Vec<String>> = reports
        .iter()
        .map(|r| {
            vec![
                r.gate.clone(),
                r.offered.to_string(),
                r.admitted.to_string(),
                r.shed.to_string(),
                format!("{:.3}", r.shed_pct_of_all),
                format!("{:.3}", r.shed_pct_of_low),
                r.invalid.values().sum::<u64>().to_string(),
                format!("{:.3}", r.peak_fill),
                format!("{:.3}", r.seconds_above_watermark),
                format!("{:.3}", r.high_delay_p50_ms),
                format!("{:.3}", r.high_delay_p99_ms),
            ]
        })
        .collect();
    let mut csv = header.join(",") + "\n";
    for row in &rows {
        csv.push_str(&format!("\"{}\",{}\n", row[0], row[1..].join(",")));
    }
    std::fs::write(dir.join("summary.csv"), &csv)?;
    let seconds = reports
        .iter()
        .map(|r| r.shed_per_second.len())
        .max()
        .unwrap_or(0);
    let mut per_second = String::from("second");
    for r in reports {
        per_second.push_str(&format!(",\"{}\"", r.gate));
    }
    per_second.push('\n');
    for s in 0..seconds {
        per_second.push_str(&s.to_string());
        for r in reports {
            per_second.push_str(&format!(
                ",{}",
                r.shed_per_second.get(s).copied().unwrap_or(0)
            ));
        }
        per_second.push('\n');
    }
    std::fs::write(dir.join("shed_per_second.csv"), per_second)?;
    let series: Vec<Series> = reports
        .iter()
        .enumerate()
        .map(|(i, r)| Series {
            name: r.gate.clone(),
            points: r
                .shed_per_second
                .iter()
                .enumerate()
                .map(|(s, &n)| (s as f64, n as f64))
                .collect(),
            color: PALETTE[i % PALETTE.len()],
        })
        .collect();
    let chart = line_chart(
        "Shed per second",
        "capture second",
        "events shed",
        &series,
        None,
    );
    std::fs::write(dir.join("shed_per_second.svg"), &chart)?;
    let invalid: Vec<Vec<String>> = reports
        .first()
        .map(|r| {
            r.invalid
                .iter()
                .map(|(k, v)| vec![k.clone(), v.to_string()])
                .collect()
        })
        .unwrap_or_default();
    let html = html_page(
        "geogate replay --virtual",
        &[
            ("Gates compared".into(), html_table(&header, &rows)),
            ("Shed per second".into(), chart),
            (
                "Invalid payloads (same for every gate)".into(),
                html_table(&["reason", "count"], &invalid),
            ),
        ],
    );
    std::fs::write(dir.join("report.html"), html)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_or_say_why_not() {
        assert_eq!(
            parse_url("mqtt://127.0.0.1:1884").unwrap(),
            ("127.0.0.1".into(), 1884)
        );
        assert_eq!(parse_url("mqtt://broker").unwrap(), ("broker".into(), 1883));
        for bad in ["tcp://x:1", "mqtt://:1", "mqtt://h:port"] {
            assert!(
                parse_url(bad)
                    .unwrap_err()
                    .to_string()
                    .contains("mqtt://HOST:PORT")
            );
        }
    }
}
