//! The `rdmx` command: lists RDMA devices (`rdmx devices`) and runs perftest-style
//! benchmarks between two processes (`rdmx perf`), of verbs-level queue pairs or of `rdmx`
//! message endpoints (`--layer msg`).
#![forbid(unsafe_code)]

mod devices;
mod error;
mod perf;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

/// RDMA messaging toolbox: device information and benchmarks.
#[derive(Debug, Parser)]
#[command(name = "rdmx", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Lists RDMA devices and their attributes (like ibv_devinfo).
    Devices(devices::DevicesArgs),
    /// Runs a perftest-style latency / bandwidth benchmark between two processes.
    Perf(Box<perf::PerfArgs>),
}

fn init_logging() {
    let filter = EnvFilter::try_from_env("RDMX_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    let result = match cli.command {
        Command::Devices(args) => devices::run(&args),
        Command::Perf(args) => perf::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rdmx: error: {e}");
            ExitCode::FAILURE
        }
    }
}
