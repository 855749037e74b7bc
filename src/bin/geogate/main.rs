//! The `geogate` command line: argument parsing, output format and exit
//! codes only; every command's work lives in the library.

/// mimalloc rather than the system allocator: events are allocated on one
/// thread (decode lanes) and freed on another (shard workers), where
/// glibc's malloc spent a fifth of the pipeline's time
/// (docs/decisions/0003-mimalloc-global-allocator.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use geogate::cli::eval::evaluate_positions;
use geogate::geofence::{
    EvaluatorSettings, FenceIndex, load_fences, load_fences_with_warnings, summarize,
};
use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

mod commands;
mod huge_pages;

#[derive(Parser)]
#[command(
    name = "geogate",
    version,
    about = "Live GPS telemetry over MQTT: shed idle pings under load, evaluate geofences"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a GeoJSON fence file and summarise it.
    #[command(subcommand)]
    Fences(FencesCommand),
    /// Run the live pipeline: MQTT in, admission, geofences, events out.
    Run {
        /// The config file (`geogate config example` prints a commented one).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Start the embedded broker (rumqttd) on 127.0.0.1 and use it.
        #[arg(long)]
        embedded_broker: bool,
        /// Start from no per-vehicle state, deleting the `[state] path`
        /// file: vehicles inside fences get a fresh enter. Never implied:
        /// a missing or stale state file is otherwise an error.
        #[arg(long)]
        reset_state: bool,
        /// Start even though the events file lacks transitions the state
        /// already let go of (the file truncated, replaced or restored
        /// from an older copy): they stay lost, and the log says which.
        /// Without it such a start is refused, naming them.
        #[arg(long)]
        accept_events_gap: bool,
    },
    /// The whole product in one command: embedded broker, pipeline, the
    /// bundled shift-change capture, live progress and an HTML report.
    Demo {
        /// A config of one's own; by default the bundled one, with the demo
        /// fences and capture, so nothing is needed beside the binary.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Record messages from a broker into a capture file.
    Record {
        /// Broker, as mqtt://HOST:PORT.
        #[arg(long)]
        mqtt: String,
        /// Topic filter; repeat for several.
        #[arg(long, default_value = "#")]
        topic: Vec<String>,
        #[arg(long)]
        out: PathBuf,
        /// Stop after this long (e.g. 60s, 5m); default: until Ctrl-C.
        #[arg(long, value_parser = parse_duration)]
        duration: Option<std::time::Duration>,
        /// Stop after this many messages.
        #[arg(long)]
        count: Option<usize>,
    },
    /// Replay a capture: live to a broker, or in virtual time through gates.
    Replay(ReplayArgs),
    /// Generate deterministic synthetic captures.
    #[command(subcommand)]
    Synth(SynthCommand),
    /// Deterministic labs that show what the gates do.
    #[command(subcommand)]
    Lab(LabCommand),
    /// Validate a configuration file.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// The partitions of a fleet run with `[state] backend = "partitioned"`.
    #[command(subcommand)]
    Partitions(PartitionsCommand),
    /// Evaluate a file of positions (native NDJSON) against fences offline.
    Eval {
        #[arg(long)]
        fences: PathBuf,
        #[arg(long)]
        input: PathBuf,
        /// Where to write transitions as NDJSON (default: discard).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Global hysteresis in metres (fences may override).
        #[arg(long, default_value_t = 0.0)]
        hysteresis_m: f64,
        /// Global dwell in seconds (fences may override).
        #[arg(long, default_value_t = 0.0)]
        dwell_s: f64,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
}

#[derive(clap::Args)]
struct ReplayArgs {
    file: PathBuf,
    /// Publish to this broker (mqtt://HOST:PORT) with the original pacing.
    #[arg(long, conflicts_with = "virtual_time")]
    mqtt: Option<String>,
    /// Speed-up over the original pacing (live replay).
    #[arg(long, conflicts_with = "max_rate")]
    speed: Option<f64>,
    /// Cap on messages per second (live replay).
    #[arg(long)]
    max_rate: Option<f64>,
    /// Run through the codec, admission and queue model in virtual time.
    #[arg(long = "virtual")]
    virtual_time: bool,
    /// A gate to compare (virtual), e.g. token:rate=32000,burst=24000; repeat.
    #[arg(long)]
    gate: Vec<geogate::admission::GateSpec>,
    #[arg(long, default_value_t = 2)]
    shards: usize,
    #[arg(long, default_value_t = 4096)]
    queue: usize,
    #[arg(long, default_value_t = 0.6)]
    watermark: f64,
    /// Each shard worker's evaluations per second (virtual).
    #[arg(long, default_value_t = 32000.0)]
    service_rate: f64,
    /// Write summary.csv, shed_per_second.csv/.svg and report.html here.
    #[arg(long)]
    report: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

#[derive(Subcommand)]
enum SynthCommand {
    /// A fleet's overnight idle pings, the shift-start burst, then driving.
    ShiftChange {
        #[arg(long, default_value_t = 300)]
        vehicles: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 20.0)]
        overnight_s: f64,
        #[arg(long, default_value_t = 10.0)]
        spread_s: f64,
        #[arg(long, default_value_t = 40)]
        buffered_pings: usize,
        #[arg(long, default_value_t = 90.0)]
        drive_s: f64,
        #[arg(long, default_value_t = 0.01)]
        malformed_share: f64,
    },
}

#[derive(Subcommand)]
enum LabCommand {
    /// Token bucket vs leaky shaper in front of one 100 rps server.
    Shaping {
        #[arg(long, default_value = "lab-shaping")]
        out: PathBuf,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Token bucket vs fixed window across a window boundary.
    Window {
        #[arg(long, default_value_t = 5.0)]
        rate: f64,
        #[arg(long, default_value_t = 3)]
        burst: u32,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// One gate over your trace (CSV t_ms[,cost]), with a b + r·t audit.
    Trace {
        #[arg(long)]
        gate: geogate::admission::GateSpec,
        #[arg(long)]
        trace: PathBuf,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
}

fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let (num, unit) = s.trim().split_at(
        s.trim()
            .find(|c: char| c.is_alphabetic())
            .unwrap_or(s.trim().len()),
    );
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?}: expected a duration like 60s or 5m"))?;
    let secs = match unit {
        "" | "s" => v,
        "ms" => v / 1000.0,
        "m" => v * 60.0,
        "h" => v * 3600.0,
        _ => return Err(format!("{s:?}: unit must be ms, s, m or h")),
    };
    if !(secs.is_finite() && secs > 0.0) {
        return Err(format!("{s:?}: must be > 0"));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Report every config error at once, each with its field path.
    Check {
        file: PathBuf,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Print the example config, every field shown with its default.
    Example,
}

#[derive(Subcommand)]
enum PartitionsCommand {
    /// Each partition's owner, input, committed position, lag and totals,
    /// read from the engine.
    Status {
        #[arg(long)]
        config: PathBuf,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// The fleet's transitions as NDJSON, from the engine's events stream.
    Events {
        #[arg(long)]
        config: PathBuf,
        /// Start after this stream position (0: from the start).
        #[arg(long, default_value_t = 0)]
        after: u64,
        /// Keep waiting for more.
        #[arg(long)]
        follow: bool,
    },
}

#[derive(Subcommand)]
enum FencesCommand {
    /// Report every invalid feature at once, or a summary of a valid file.
    Check {
        file: PathBuf,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Print the demo fences (GeoJSON: polygons, a MultiPolygon, circles).
    Example,
    /// Write the fence set geogate runs as GeoJSON (from its API when
    /// `[api]` answers, else from its state file).
    Export {
        #[arg(long)]
        config: PathBuf,
        /// Write here instead of to stdout.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

fn main() -> Result<ExitCode> {
    huge_pages::keep_off_unless_asked();
    let cli = Cli::parse();
    match cli.command {
        Command::Fences(FencesCommand::Check { file, format }) => fences_check(file, format),
        Command::Fences(FencesCommand::Export { config, out }) => fences_export(config, out),
        Command::Fences(FencesCommand::Example) => {
            print!("{}", geogate::cli::demo::BUNDLED_FENCES);
            Ok(ExitCode::SUCCESS)
        }
        Command::Run {
            config,
            embedded_broker,
            reset_state,
            accept_events_gap,
        } => run(config, embedded_broker, reset_state, accept_events_gap),
        Command::Demo { config } => commands::demo(config),
        Command::Record {
            mqtt,
            topic,
            out,
            duration,
            count,
        } => commands::record(
            mqtt,
            topic,
            out,
            geogate::replay::RecordLimits { duration, count },
        ),
        Command::Replay(args) => commands::replay(args),
        Command::Synth(SynthCommand::ShiftChange {
            vehicles,
            seed,
            out,
            overnight_s,
            spread_s,
            buffered_pings,
            drive_s,
            malformed_share,
        }) => {
            let params = geogate::replay::synth::ShiftChange {
                vehicles,
                seed,
                overnight_s,
                spread_s,
                buffered_pings,
                drive_s,
                malformed_share,
                ..Default::default()
            };
            commands::synth(params, out)
        }
        Command::Lab(LabCommand::Shaping { out, format }) => commands::lab_shaping(out, format),
        Command::Lab(LabCommand::Window {
            rate,
            burst,
            format,
        }) => commands::lab_window(rate, burst, format),
        Command::Lab(LabCommand::Trace {
            gate,
            trace,
            format,
        }) => commands::lab_trace(gate, trace, format),
        Command::Config(ConfigCommand::Check { file, format }) => config_check(file, format),
        Command::Partitions(PartitionsCommand::Status { config, format }) => {
            commands::partitions_status(config, format)
        }
        Command::Partitions(PartitionsCommand::Events {
            config,
            after,
            follow,
        }) => commands::partitions_events(config, after, follow),
        Command::Config(ConfigCommand::Example) => {
            print!("{}", geogate::cli::demo::BUNDLED_CONFIG);
            Ok(ExitCode::SUCCESS)
        }
        Command::Eval {
            fences,
            input,
            out,
            hysteresis_m,
            dwell_s,
            format,
        } => eval(
            fences,
            input,
            out,
            EvaluatorSettings {
                hysteresis_m,
                dwell_s,
                ..Default::default()
            },
            format,
        ),
    }
}

fn print_json(value: &impl serde::Serialize) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

fn fences_check(file: PathBuf, format: Format) -> Result<ExitCode> {
    match load_fences_with_warnings(&file) {
        Ok(loaded) => {
            let summary = summarize(&loaded.fences);
            match format {
                Format::Json => print_json(&serde_json::json!({
                    "valid": true,
                    "summary": summary,
                    "warnings": loaded.warnings,
                }))?,
                Format::Text => {
                    println!(
                        "{}: {} fences ({} polygons, {} circles), {} vertices",
                        file.display(),
                        summary.fences,
                        summary.polygons,
                        summary.circles,
                        summary.vertices
                    );
                    match summary.bbox {
                        Some([a, b, c, d]) => println!("bounding box: lon {a}..{c}, lat {b}..{d}"),
                        None => println!("bounding box: none (no fences)"),
                    }
                    for w in &loaded.warnings {
                        println!("warning: {w}");
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(errors) => {
            match format {
                Format::Json => {
                    print_json(&serde_json::json!({ "valid": false, "errors": errors.0 }))?
                }
                Format::Text => eprintln!("{}: {errors}", file.display()),
            }
            Ok(ExitCode::FAILURE)
        }
    }
}

fn fences_export(config: PathBuf, out: Option<PathBuf>) -> Result<ExitCode> {
    let config = geogate::config::Config::load(&config)?;
    let (text, version) = geogate::cli::fences_export::export(&config)?;
    match out {
        Some(path) => {
            std::fs::write(&path, text + "\n")?;
            eprintln!("fence set version {version} written to {}", path.display());
        }
        None => println!("{text}"),
    }
    Ok(ExitCode::SUCCESS)
}

fn run(
    config_path: Option<PathBuf>,
    embedded_broker: bool,
    reset_state: bool,
    accept_events_gap: bool,
) -> Result<ExitCode> {
    use geogate::config::Config;
    let Some(config_path) = config_path else {
        eprintln!(
            "geogate run needs a config: `geogate config example > geogate.toml` and `geogate fences example > fences.geojson` write commented starting points (point fences.path at the second), then `geogate run --config geogate.toml`; or try `geogate demo`, which needs nothing"
        );
        return Ok(ExitCode::from(2));
    };
    use tracing_subscriber::prelude::*;
    // geogate at info; the embedded broker and MQTT client only when amiss.
    let filter = tracing_subscriber::filter::Targets::new()
        .with_default(tracing::Level::WARN)
        .with_target("geogate", tracing::Level::INFO);
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_target(false),
        )
        .with(filter)
        .init();
    let mut config = match Config::load(&config_path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{}: {e}", config_path.display());
            return Ok(ExitCode::from(2));
        }
    };
    if reset_state && config.state.backend == geogate::config::StateBackend::Partitioned {
        eprintln!(
            "--reset-state empties the embedded state file; a partitioned fleet's state is in the engine, shared by every instance, so it is never reset by one"
        );
        return Ok(ExitCode::from(2));
    }
    config.state.reset = reset_state;
    config.state.accept_events_gap = accept_events_gap;
    let runtime = geogate::runtime::builder(config.pipeline.sched_batch).build()?;
    runtime.block_on(async move {
        // Listening before anything starts: see `shutdown_signal`.
        let shutdown = shutdown_signal();
        let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
        if embedded_broker {
            let broker = geogate::broker::start(config.embedded_broker.port)?;
            tracing::info!("embedded broker listening on {}", broker.addr);
            config.mqtt.host = broker.addr.ip().to_string();
            config.mqtt.port = broker.addr.port();
        }
        if config.metrics.enabled {
            let addr = config.metrics.listen.parse().context("metrics.listen")?;
            geogate::metrics::install(addr)?;
            tracing::info!("metrics on http://{addr}/metrics");
        }
        if config.state.backend == geogate::config::StateBackend::Partitioned {
            geogate::scale_out::run(config, shutdown, |reloader| {
                tokio::spawn(reload_on_sighup(reloader, hangup));
            })
            .await?;
            return Ok(ExitCode::SUCCESS);
        }
        let balance = geogate::service::run(config, shutdown, |reloader, _view| {
            tokio::spawn(reload_on_sighup(reloader, hangup));
        })
        .await?;
        println!("{}", balance.line());
        Ok(if balance.balances() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        })
    })
}

/// Resolves on SIGINT or SIGTERM. Both are listened for from the call, not
/// from the first poll. Why: the pipeline polls its shutdown only once it
/// has started, after its poll task may already have subscribed (and said
/// so in the log), and a SIGTERM in between took the default action,
/// ending the process without a drain or the accounting line.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let interrupt = signal(SignalKind::interrupt());
    let terminate = signal(SignalKind::terminate());
    async move {
        match (interrupt, terminate) {
            (Ok(mut interrupt), Ok(mut terminate)) => {
                tokio::select! {
                    _ = interrupt.recv() => {}
                    _ = terminate.recv() => {}
                }
            }
            (interrupt, terminate) => {
                let e = interrupt.err().or(terminate.err());
                tracing::warn!(
                    "cannot listen for SIGINT and SIGTERM ({e:?}); stopping on Ctrl-C only"
                );
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}

/// Reads the fence file again on every SIGHUP (listened for since before
/// the start, for the reason `shutdown_signal` gives: a SIGHUP's default
/// action ends the process); a bad file keeps the old fences. With
/// `fences.source = "store"` the file is not read again.
async fn reload_on_sighup(
    registry: geogate::geofence::registry::FenceRegistry,
    hangup: std::io::Result<tokio::signal::unix::Signal>,
) {
    let Ok(mut hup) = hangup else {
        tracing::warn!("cannot listen for SIGHUP; fence reload disabled");
        return;
    };
    while hup.recv().await.is_some() {
        if registry.source() == geogate::geofence::config::FencesSource::Store {
            tracing::warn!(
                "SIGHUP: fences.source = \"store\": the fence file is not read again; change fences through the API"
            );
            continue;
        }
        match registry.reload(geogate::clock::receive_now_ms()).await {
            Ok((n, version)) => tracing::info!("fences reloaded: {n} fences, version {version}"),
            Err(e) => tracing::error!("fence reload refused, keeping the old fences: {e}"),
        }
    }
}

fn config_check(file: PathBuf, format: Format) -> Result<ExitCode> {
    use geogate::config::{Config, ConfigError};
    let result = Config::load(&file);
    let problems = match &result {
        Ok(_) => Vec::new(),
        Err(ConfigError::Invalid(problems)) => problems.clone(),
        Err(other) => vec![geogate::config::ConfigProblem {
            field: String::new(),
            message: other.to_string(),
        }],
    };
    match format {
        Format::Json => {
            print_json(&serde_json::json!({ "valid": problems.is_empty(), "errors": problems }))?
        }
        Format::Text => match &result {
            Ok(_) => println!("{}: ok", file.display()),
            Err(e) => eprintln!("{}: {e}", file.display()),
        },
    }
    Ok(if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn eval(
    fences: PathBuf,
    input: PathBuf,
    out: Option<PathBuf>,
    settings: EvaluatorSettings,
    format: Format,
) -> Result<ExitCode> {
    let fences = match load_fences(&fences) {
        Ok(f) => f,
        Err(errors) => {
            eprintln!("{}: {errors}", fences.display());
            return Ok(ExitCode::FAILURE);
        }
    };
    let index = Arc::new(FenceIndex::first(fences, 0));
    let reader =
        BufReader::new(File::open(&input).with_context(|| format!("opening {}", input.display()))?);
    let writer: Box<dyn Write> = match &out {
        Some(path) => Box::new(BufWriter::new(
            File::create(path).with_context(|| format!("creating {}", path.display()))?,
        )),
        None => Box::new(std::io::sink()),
    };
    let report = evaluate_positions(index, settings, reader, writer)?;
    match format {
        Format::Json => print_json(&report)?,
        Format::Text => {
            for s in &report.skipped_lines {
                eprintln!(
                    "{}:{}: skipped ({}): {}",
                    input.display(),
                    s.line,
                    s.reason,
                    s.detail
                );
            }
            println!(
                "{} lines, {} evaluated, {} late, {} duplicate, {} skipped, {} transitions",
                report.lines,
                report.evaluated,
                report.late,
                report.duplicates,
                report.skipped,
                report.transitions
            );
            println!("{:<32} {:>8} {:>8}", "fence", "enter", "exit");
            for (fence, c) in &report.per_fence {
                println!("{fence:<32} {:>8} {:>8}", c.enter, c.exit);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
