//! The `geogate` command line: argument parsing and exit codes only; every
//! command's work lives in the library.

use clap::{Parser, Subcommand};

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

#[derive(Subcommand)]
enum Command {}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {}
}
