//! TEMPORARY minimal CLI on the `doctor` branch so `tests/doctor_cli.rs` runs; the lead's
//! main.rs replaces this and wires `Command::Doctor(DoctorArgs)` the same way.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use shardline::doctor::{run_doctor_cli, DoctorArgs};

#[derive(Parser)]
#[command(name = "shardline", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check the host (sysctls, NICs, memlock, storage, CPU) and print what to tune.
    Doctor(DoctorArgs),
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Doctor(args) => run_doctor_cli(&args),
    }
}
