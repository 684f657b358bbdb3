//! `bench-pipeline`: real pipeline schedules on real stages, every action on
//! a timeline, and the bubble measured end to end beside the simulator's
//! prediction from the measured per-action costs and the closed form.
//!
//! Every schedule is generated (or loaded) and validated before any rank
//! starts: an invalid or deadlocking schedule prints its rank x step grid
//! with the offending actions in brackets and exits with code 2.

mod cli;
mod launch;
mod output;

use anyhow::Result;
use clap::Parser;

fn main() {
    // The noise guard's window starts here: run.json records the CPU time
    // other processes took while the whole run measured.
    parbench::measure::noise::mark_start();
    // `-np N` is ranks (mpirun's spelling), not `-n p` (iterations).
    let mut args = cli::Args::parse_from(parbench::term::rewrite_np(std::env::args_os()));
    if let Err(e) = launch::default_stages(&mut args) {
        eprintln!("bench-pipeline: {e}");
        std::process::exit(2);
    }
    let plan = match cli::plan(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("bench-pipeline: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&args, plan) {
        eprintln!("bench-pipeline: {e:#}");
        // A machine without what the flags ask for (no GPU, too few GPUs) is
        // bad input, as a bad flag is: exit 2, not a failed measurement.
        let code = if e.downcast_ref::<Unavailable>().is_some() {
            2
        } else {
            1
        };
        std::process::exit(code);
    }
}

/// The machine lacks what the command line asks for (a GPU, enough GPUs).
#[derive(Debug)]
pub struct Unavailable(pub String);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unavailable {}

fn run(args: &cli::Args, plan: cli::Plan) -> Result<()> {
    launch::run(args, &plan)
}
