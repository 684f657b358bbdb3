//! `bench-pipeline`: real pipeline schedules on real stages, every action on
//! a timeline, and the bubble measured end to end beside the simulator's
//! prediction from the measured per-action costs and the closed form.
//!
//! Every schedule is generated (or loaded) and validated before any rank
//! starts: an invalid or deadlocking schedule prints its rank x step grid
//! with the offending actions in brackets and exits with code 2.

mod cli;
mod composed_out;
mod launch;
mod output;

use anyhow::Result;
use clap::Parser;
use parbench::launch::{eprint_line, interrupt, report};

pub(crate) fn say(msg: impl std::fmt::Display) {
    eprint_line(&format!("bench-pipeline: {msg}"));
}

fn main() {
    // Before any thread starts: a signal it can catch keeps the runs measured.
    let _ = interrupt::install("bench-pipeline");
    // The noise guard's window starts here: run.json records the CPU time
    // other processes took while the whole run measured.
    parbench::measure::noise::mark_start();
    output::note_cores();
    // `-np N` is ranks (mpirun's spelling), not `-n p` (iterations); the
    // last release's spellings become today's, each with its notice.
    let (argv, notices) =
        parbench::vocab::rewrite::modernize(parbench::vocab::Tool::Pipeline, std::env::args_os());
    parbench::vocab::rewrite::print_notices(&notices);
    let mut args = match cli::Args::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => {
            // Help and version are not errors; everything else is one line, exit 2.
            if !e.use_stderr() {
                let _ = e.print();
                std::process::exit(0);
            }
            eprint_line(&report::cli_error_line("bench-pipeline", &e.to_string()));
            std::process::exit(2);
        }
    };
    // `--backend auto`, as every binary reads it.
    if let Err(e) = parbench::launch::flags::resolve_auto(&mut args.backend) {
        eprint_line(&format!("bench-pipeline: {e}"));
        std::process::exit(2);
    }
    if let Err(e) = launch::default_stages(&mut args) {
        say(e);
        std::process::exit(2);
    }
    let plan = match cli::job(&args) {
        Ok(p) => p,
        Err(e) => {
            say(e);
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&args, plan) {
        // A machine without what the flags ask for (no GPU, too few GPUs,
        // too little memory) or an unwritable --out is bad input, as a bad
        // flag is: exit 2, not a failed measurement. After a fault the runs
        // measured before it are in the folder.
        std::process::exit(parbench::launch::end_on_error(
            "bench-pipeline",
            e.as_ref(),
            &format!("{e:#}"),
        ));
    }
}

/// The machine lacks what the command line asks for (a GPU, enough GPUs):
/// bad input, as a bad flag is.
pub use parbench::launch::UsageError as Unavailable;

fn run(args: &cli::Args, plan: cli::PipelineJob) -> Result<()> {
    launch::run(args, &plan)
}
