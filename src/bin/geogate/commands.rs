//! Output for the replay, synth, lab and demo commands: each calls the
//! library and prints text or JSON.

use crate::{Format, ReplayArgs, print_json};
use anyhow::{Context, Result, bail};
use geogate::admission::GateSpec;
use geogate::codec::CodecSettings;
use geogate::config::Config;
use geogate::lab::{shaping, shaping_report, trace, window};
use geogate::replay::capture::{self, CaptureWriter};
use geogate::replay::sim::{SimSettings, simulate};
use geogate::replay::{self, Pacing};
use std::path::PathBuf;
use std::process::ExitCode;

/// The pipeline's runtime ([`geogate::runtime`]); the record and replay
/// clients are not the pipeline and keep the policy geogate was started
/// with.
fn runtime(sched_batch: bool) -> Result<tokio::runtime::Runtime> {
    Ok(geogate::runtime::builder(sched_batch).build()?)
}

/// `geogate demo`: the bundled config and files unless `--config` names a
/// config of one's own.
pub fn demo(config_path: Option<PathBuf>) -> Result<ExitCode> {
    let config = match config_path {
        Some(path) => Config::load(&path).with_context(|| format!("loading {}", path.display()))?,
        None => geogate::cli::demo::bundled().context("preparing the bundled demo")?,
    };
    let outcome = runtime(config.pipeline.sched_batch)?
        .block_on(geogate::cli::demo::run(config, |line| println!("{line}")))?;
    println!("{}", outcome.balance.line());
    println!("report: {}", outcome.report.display());
    Ok(if outcome.balance.balances() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

pub fn record(
    url: String,
    topics: Vec<String>,
    out: PathBuf,
    limits: replay::RecordLimits,
) -> Result<ExitCode> {
    let listening = || eprintln!("recording: subscribed to {topics:?}");
    let n = runtime(false)?.block_on(replay::record(
        &url,
        &topics,
        &out,
        limits,
        listening,
        async {
            let _ = tokio::signal::ctrl_c().await;
        },
    ))?;
    println!("recorded {n} messages to {}", out.display());
    Ok(ExitCode::SUCCESS)
}

pub fn synth(params: geogate::replay::synth::ShiftChange, out: PathBuf) -> Result<ExitCode> {
    let records = geogate::replay::synth::shift_change(&params);
    let mut w =
        CaptureWriter::create(&out).with_context(|| format!("creating {}", out.display()))?;
    for r in &records {
        w.write(r)?;
    }
    w.finish()?;
    println!("wrote {} messages to {}", records.len(), out.display());
    Ok(ExitCode::SUCCESS)
}

pub fn replay(args: ReplayArgs) -> Result<ExitCode> {
    let records = capture::read(&args.file)?;
    if args.virtual_time {
        if args.gate.is_empty() {
            bail!(
                "--virtual needs at least one --gate SPEC, e.g. --gate token:rate=32000,burst=24000"
            );
        }
        let settings = SimSettings {
            shards: args.shards,
            queue_capacity: args.queue,
            watermark: args.watermark,
            service_rate: args.service_rate,
        };
        let codec = CodecSettings::default();
        let reports = args
            .gate
            .iter()
            .map(|g| simulate(&records, g, &settings, &codec))
            .collect::<Result<Vec<_>, String>>()
            .map_err(anyhow::Error::msg)?;
        if let Some(dir) = &args.report {
            replay::write_virtual_report(dir, &reports)?;
        }
        match args.format {
            Format::Json => {
                print_json(&serde_json::json!({ "settings": settings, "gates": reports }))?
            }
            Format::Text => {
                println!(
                    "{} messages, {} shards × queue {}, watermark {}, service {}/s per shard",
                    records.len(),
                    settings.shards,
                    settings.queue_capacity,
                    settings.watermark,
                    settings.service_rate
                );
                for r in &reports {
                    println!(
                        "{}: offered {} admitted {} shed {} ({:.2}% of all, {:.2}% of low) | invalid {} | peak fill {:.0}% | above watermark {:.1} s | High delay p50 {:.2} ms p99 {:.2} ms",
                        r.gate,
                        r.offered,
                        r.admitted,
                        r.shed,
                        r.shed_pct_of_all,
                        r.shed_pct_of_low,
                        r.invalid.values().sum::<u64>(),
                        r.peak_fill * 100.0,
                        r.seconds_above_watermark,
                        r.high_delay_p50_ms,
                        r.high_delay_p99_ms
                    );
                }
                if let Some(dir) = &args.report {
                    println!("report: {}", dir.join("report.html").display());
                }
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    let Some(url) = args.mqtt else {
        bail!(
            "give --mqtt mqtt://HOST:PORT to replay live, or --virtual to replay in virtual time"
        );
    };
    let pacing = match (args.speed, args.max_rate) {
        (_, Some(r)) if r > 0.0 => Pacing::MaxRate(r),
        (Some(s), _) if s > 0.0 => Pacing::Speed(s),
        (None, None) => Pacing::Speed(1.0),
        _ => bail!("--speed and --max-rate must be > 0"),
    };
    let (sent, acked) =
        runtime(false)?.block_on(replay::replay_live(&records, &url, pacing, true))?;
    println!("published {sent} messages, {acked} acknowledged by the broker");
    Ok(if sent == acked {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

pub fn lab_shaping(out: PathBuf, format: Format) -> Result<ExitCode> {
    let rows = shaping::sweep();
    shaping_report::write(&out, &rows)?;
    match format {
        Format::Json => print_json(&rows)?,
        Format::Text => {
            print!("{}", shaping::rows_csv(&rows));
            println!("conventions:");
            for c in shaping::CONVENTIONS {
                println!("  - {c}");
            }
            println!("report: {}", out.join("report.html").display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn lab_window(rate: f64, burst: u32, format: Format) -> Result<ExitCode> {
    let lab = window::window_lab(rate, burst).map_err(anyhow::Error::msg)?;
    match format {
        Format::Json => print_json(&lab)?,
        Format::Text => {
            println!("trace (ms): {:?}", lab.trace_ms);
            println!(
                "bound for any 1 s window: b + r·t = {} + {}·1 = {}",
                lab.burst, lab.rate, lab.bound_per_second
            );
            for r in [&lab.token_bucket, &lab.fixed_window] {
                println!(
                    "{:<24} admitted {:>2} of {:>2}, worst 1 s window {}",
                    r.limiter, r.admitted, r.offered, r.worst_second
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn lab_trace(gate: GateSpec, path: PathBuf, format: Format) -> Result<ExitCode> {
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let parsed =
        trace::parse_trace(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let report = trace::run_trace(&gate, &parsed).map_err(anyhow::Error::msg)?;
    match format {
        Format::Json => print_json(&report)?,
        Format::Text => {
            println!(
                "{:>10} {:>4} {:>7} {:>8} {:>11} {:>14}",
                "t_ms", "cost", "result", "level", "release_ms", "retry_after_ms"
            );
            for d in &report.decisions {
                let opt = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{x:.3}"));
                println!(
                    "{:>10.3} {:>4} {:>7} {:>8.3} {:>11} {:>14}",
                    d.t_ms,
                    d.cost,
                    if d.admitted { "admit" } else { "reject" },
                    d.level_after,
                    opt(d.release_ms),
                    opt(d.retry_after_ms)
                );
            }
            println!(
                "{}: {} admitted, {} rejected; worst window excess over b + r·t: {} ({})",
                report.gate,
                report.admitted,
                report.rejected,
                report.worst_window_excess,
                if report.bound_holds {
                    "bound holds on every window"
                } else {
                    "BOUND VIOLATED"
                }
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The `[state]` of a partitioned fleet's config.
fn partitioned_state(
    config_path: &std::path::Path,
) -> Result<geogate::state::partitioned::config::PartitionedConfig> {
    let config = Config::load(config_path).with_context(|| format!("{}", config_path.display()))?;
    if config.state.backend != geogate::config::StateBackend::Partitioned {
        bail!(
            "{}: [state] backend is not \"partitioned\": there are no partitions",
            config_path.display()
        );
    }
    Ok(config.state.partitioned)
}

pub fn partitions_events(config_path: PathBuf, after: u64, follow: bool) -> Result<ExitCode> {
    let state = partitioned_state(&config_path)?;
    let runtime = tokio::runtime::Runtime::new()?;
    let mut out = std::io::stdout().lock();
    runtime.block_on(geogate::scale_out::events_tail::tail(
        &state, after, follow, &mut out,
    ))?;
    Ok(ExitCode::SUCCESS)
}

pub fn partitions_status(config_path: PathBuf, format: Format) -> Result<ExitCode> {
    let state = partitioned_state(&config_path)?;
    let runtime = tokio::runtime::Runtime::new()?;
    let rows = runtime.block_on(geogate::scale_out::status::read(&state))?;
    match format {
        Format::Json => print_json(&rows)?,
        Format::Text => {
            println!(
                "{:>9}  {:<16} {:>10} {:>10} {:>8} {:>9} {:>7} {:>6} {:>6} {:>6}",
                "partition",
                "owner",
                "input",
                "committed",
                "lag",
                "evaluated",
                "refused",
                "late",
                "enters",
                "exits"
            );
            for r in &rows {
                println!(
                    "{:>9}  {:<16} {:>10} {:>10} {:>8} {:>9} {:>7} {:>6} {:>6} {:>6}",
                    r.partition,
                    r.holder.as_deref().unwrap_or("-"),
                    r.input_last,
                    r.committed,
                    r.lag,
                    r.totals.evaluated + r.totals.held,
                    r.totals.refused,
                    r.totals.late,
                    r.totals.enters,
                    r.totals.exits
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
