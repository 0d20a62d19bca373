//! `strata`: the command-line entry point of the engine (the library does the work).

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    strata_server::run(strata_server::Cli::parse())
}
