//! `parsley`: command-line tools for Parsley.
//!
//! ```text
//! parsley clock decode [HEX]   # vc header bytes (hex) -> one line of JSON
//! parsley clock encode         # that JSON on stdin -> canonical hex
//! ```
//!
//! Failures exit non-zero with one line on stderr and nothing on stdout.
#![deny(unsafe_code)]

mod clock;

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Tools for Parsley, causal delivery order for Kafka.
#[derive(Parser)]
#[command(name = "parsley", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Inspect and build `vc` clock header values.
    #[command(subcommand)]
    Clock(ClockCommand),
}

#[derive(Subcommand)]
enum ClockCommand {
    /// Decode the hex of a `vc` header value into one line of JSON.
    #[command(after_help = "Example:\n  parsley clock decode 010000000000000000")]
    Decode {
        /// The hex bytes; read from stdin when absent.
        hex: Option<String>,
    },
    /// Read the JSON form of a clock on stdin and print its canonical hex.
    #[command(
        after_help = "Example:\n  echo '{\"version\":1,\"offsets\":[],\"sequences\":[]}' | parsley clock encode"
    )]
    Encode,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Clock(ClockCommand::Decode { hex }) => clock::decode(hex),
        Command::Clock(ClockCommand::Encode) => clock::encode(),
    };
    match result {
        Ok(line) => {
            // The whole answer is built before anything is printed, so a
            // failure never leaves partial output behind.
            let mut out = std::io::stdout().lock();
            match writeln!(out, "{line}").and_then(|()| out.flush()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: cannot write output: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}
