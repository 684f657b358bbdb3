//! `bench-collectives`: nccl-tests' sweep over parbench's communicators,
//! with per-iteration percentiles, the alpha-beta model's prediction, busbw
//! against the wire's ceiling measured in the same run, fits, a straggler
//! line, and records in `--out`.
//!
//! Exit codes: 0 all checks exact; 1 a wrong element or a failed run; 2 a
//! bad flag or an unsupported backend.

mod cli;
mod data;
mod json_nccl;
mod links;
mod nccl_flags;
mod nccl_tests_format;
mod ops;
mod print;
mod reference_line;
mod run;
mod summary;
mod sweep;
mod wire;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args = match cli::parse_args(std::env::args_os()) {
        Ok(a) => a,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("bad command line");
            eprintln!("bench-collectives: {}", first.trim_start_matches("error: "));
            return ExitCode::from(2);
        }
    };
    let plan = match args.plan() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("bench-collectives: {e}");
            return ExitCode::from(2);
        }
    };
    match run::run(&plan) {
        Ok(run::Finished::Launched { code }) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Ok(run::Finished::Ran { wrong: 0 }) => ExitCode::SUCCESS,
        Ok(run::Finished::Ran { wrong }) => {
            eprintln!("bench-collectives: {wrong} wrong elements (summed over ranks): results are not exact");
            ExitCode::from(1)
        }
        Err(e) => match e.downcast_ref::<run::UsageError>() {
            Some(u) => {
                eprintln!("bench-collectives: {u}");
                ExitCode::from(2)
            }
            None => {
                eprintln!("bench-collectives: {e:#}");
                ExitCode::from(1)
            }
        },
    }
}
