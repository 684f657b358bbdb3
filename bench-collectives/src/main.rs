//! `bench-collectives`: nccl-tests' sweep over parbench's communicators in
//! nccl-tests' columns, with busbw against the wire's ceiling measured in
//! the same run (`-v`: per-iteration percentiles, the alpha-beta-gamma
//! model's prediction, the algorithm), one headline per collective, and
//! records in `--out` (fits, ladders, placement).
//!
//! Exit codes: 0 all checks exact; 7 (nccl-tests' code) a wrong element or
//! an average busbw below `NCCL_TESTS_MIN_BW`; 1 a failed run; 2 a
//! bad flag, an unsupported backend, an unwritable --out or more memory
//! than the machine has; a launcher passes on the exit code of the first
//! rank that failed (128 + signal for a killed one); a signal it can catch ends it
//! with 128 + signal, the sizes measured so far kept.

mod cli;
mod config;
mod cp_ring;
mod data;
mod expected;
mod job;
mod json_nccl;
mod links;
mod memory;
mod moe;
mod nccl_flags;
mod nccl_tests_format;
mod print;
mod progress_lines;
mod reference_line;
mod run;
mod run_header;
mod start;
mod summary;
mod sweep;
#[cfg(test)]
mod test_rows;

use parbench::launch::{self, eprint_line, interrupt, report};
use std::process::ExitCode;

/// Prints one line (written whole, see [`eprint_line`]).
fn say(msg: impl std::fmt::Display) {
    eprint_line(&format!("bench-collectives: {msg}"));
}

/// nccl-tests' exit code for wrong results or a bandwidth below
/// `NCCL_TESTS_MIN_BW` (its `testNumResults`): health checks test for it.
const EXIT_NUM_RESULTS: u8 = 7;

fn main() -> ExitCode {
    // Before any thread starts: a signal it can catch keeps what was measured.
    let _ = interrupt::install("bench-collectives");
    let (args, notices) = cli::parse_command_line(std::env::args_os());
    parbench::vocab::rewrite::print_notices(&notices);
    let args = match args {
        Ok(a) => a,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            let text = e.to_string();
            eprint_line(&report::cli_error_line("bench-collectives", &text));
            return ExitCode::from(2);
        }
    };
    let plan = match args.job() {
        Ok(p) => p,
        Err(e) => {
            say(e);
            return ExitCode::from(2);
        }
    };
    match run::run(&plan) {
        Ok(start::Finished::Launched { code }) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Ok(start::Finished::Ran { wrong: 0 }) => ExitCode::SUCCESS,
        Ok(start::Finished::Ran { wrong }) => {
            say(format!(
                "{wrong} wrong elements (summed over ranks): results are not exact"
            ));
            ExitCode::from(EXIT_NUM_RESULTS)
        }
        Ok(start::Finished::BelowMinBw { why }) => {
            say(why);
            ExitCode::from(EXIT_NUM_RESULTS)
        }
        // Bad input is one line, exit 2; a fault keeps the sizes measured
        // before it in the folder, exit 1.
        Err(e) => {
            let code = launch::end_on_error("bench-collectives", e.as_ref(), &format!("{e:#}"));
            ExitCode::from(u8::try_from(code).unwrap_or(1))
        }
    }
}
