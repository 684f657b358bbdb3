//! `report`: reads parbench results folders, puts each figure beside the
//! analytical model, writes one self-contained HTML report, and compares a
//! run against a baseline for nightly regression tracking.
//!
//! Exit codes: 0 fine; 1 `compare` found a regression; 2 bad flags or bad
//! files (one line naming the file and line), or a compare whose rows match
//! nothing; 3 `compare` found no regression but left figures of noisy runs
//! unjudged ("noisy: not judged").

mod charts;
mod compare;
mod html;
mod load;
mod model_cmd;
mod plan_cmd;
mod predict;
mod table;
mod text_file;
mod timeline;
mod trend;
mod units;

use clap::{Parser, Subcommand};
use parbench::vocab;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    // A negative number reaches the flag's own check (as in every
    // parbench binary); a flag given twice is refused.
    allow_negative_numbers = true,
    name = "report",
    version,
    // -V is nccl-tests' CTA count: the version is --version alone.
    disable_version_flag = true,
    about = "Reports on parbench results: the model's tables, an HTML report, and baseline comparison"
)]
struct Cli {
    /// Print the version.
    #[arg(long, action = clap::ArgAction::Version)]
    version: Option<bool>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the analytical tables (tensor-parallel traffic per token, pipeline bubble) for a model shape and wires.
    Model(model_cmd::ModelArgs),
    /// Write one self-contained HTML report (inline SVG charts) from results folders.
    Html {
        /// Results folders (each with collectives.csv, layers.csv, pipeline.csv, run.json); several are shown side by side.
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        #[arg(long = vocab::output_file::LONG, value_name = vocab::output_file::VALUE, help = vocab::output_file::HELP, default_value = "report.html")]
        output_file: PathBuf,
        /// Report title.
        #[arg(long, default_value = "parbench report")]
        title: String,
    },
    /// Plan a training cluster: every data x tensor x pipeline layout, microbatching and schedule, costed with measured figures and ranked by tokens/s.
    Plan(Box<plan_cmd::PlanArgs>),
    /// Compare the last folder against the baseline folder(s) before it (pooled): exit 1 when a figure regressed beyond the threshold, the runs' noise and the floor; 2 when nothing matched; 3 when noisy runs were not judged.
    Compare(compare::CompareArgs),
    /// Draw a nightly results folder's key figures night by night against the baseline's band (busbw at the largest size, bench-layers' step, each schedule's bubble), the nights the gate called marked.
    Trend {
        /// The folder scripts/nightly.sh writes into (its --results).
        dir: PathBuf,
        #[arg(long = vocab::output_file::LONG, value_name = vocab::output_file::VALUE, help = vocab::output_file::HELP, default_value = "trend.html")]
        output_file: PathBuf,
    },
    /// Whether every run in the folders was quiet: exit 0 when no run's noise guard marked it noisy, 3 naming each one that did (scripts/nightly.sh keeps only quiet nights in its baseline).
    Quiet {
        /// Results folders whose runs are checked.
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        /// Largest share of the machine other processes may take in a quiet run (0.10 = 10%), as in compare.
        #[arg(long, value_name = "FRACTION", default_value_t = parbench::measure::noise::NOISY_FRACTION)]
        noise_limit: f64,
    },
}

/// `report quiet`: the noisy runs of `dirs`, one line each on stderr.
fn quiet(dirs: &[PathBuf], noise_limit: f64) -> anyhow::Result<ExitCode> {
    compare::check_noise_limit(noise_limit)?;
    let sources = load::load_sources(dirs, false)?;
    let mut noisy = 0;
    for s in &sources {
        for r in &s.runs {
            if let Some(n) = r.noise().filter(|n| n.fraction > noise_limit) {
                noisy += 1;
                // A run id or folder from the records reaches the terminal
                // with its control characters escaped.
                parbench::launch::eprint_line(&format!(
                    "report: {}: run {} noisy: other processes took {} of the machine",
                    s.dir.display(),
                    r.run_id,
                    units::percent(n.fraction)
                ));
            }
        }
    }
    Ok(if noisy == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(3)
    })
}

fn main() -> ExitCode {
    // The last release's spellings become today's, each with its notice.
    let (argv, notices) = vocab::rewrite::modernize(vocab::Tool::Report, std::env::args_os());
    vocab::rewrite::print_notices(&notices);
    let cli = match Cli::try_parse_from(argv) {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version are not errors; everything else is one line, exit 2.
            if !e.use_stderr() {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            let text = e.to_string();
            parbench::launch::eprint_line(&parbench::launch::report::cli_error_line(
                "report", &text,
            ));
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Model(args) => model_cmd::run(&args).map(|()| ExitCode::SUCCESS),
        Command::Html {
            dirs,
            output_file,
            title,
        } => html::run(&dirs, &output_file, &title).map(|()| ExitCode::SUCCESS),
        Command::Plan(args) => plan_cmd::run(&args).map(|()| ExitCode::SUCCESS),
        Command::Compare(args) => compare::run(&args),
        Command::Quiet { dirs, noise_limit } => quiet(&dirs, noise_limit),
        Command::Trend { dir, output_file } => {
            trend::run(&dir, &output_file).map(|()| ExitCode::SUCCESS)
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            parbench::launch::eprint_line(&format!("report: {e:#}"));
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
#[path = "../../test-support/vocab.rs"]
mod vocab_check;

#[cfg(test)]
#[path = "../../test-support/help.rs"]
mod help_check;

#[cfg(test)]
mod tests {
    #[test]
    fn plan_help_lists_the_registries() {
        use clap::CommandFactory;
        use parbench::model::{device::Device, plan::Shard, stack::Stack, Preset};
        use parbench::schedule::ScheduleKind;
        let cmd = super::Cli::command();
        let plan = Some("plan");
        super::help_check::assert_lists(&cmd, plan, "model", Preset::names());
        super::help_check::assert_lists(&cmd, plan, "device", Device::names());
        super::help_check::assert_lists(&cmd, plan, "stack", Stack::names());
        let schedules = ScheduleKind::ALL.map(ScheduleKind::name);
        super::help_check::assert_lists(&cmd, plan, "schedules", schedules);
        let shards = Shard::ALL.map(|(name, _)| name);
        super::help_check::assert_lists(&cmd, plan, "shard", shards);
    }

    #[test]
    fn help_has_no_rustdoc_and_words_for_every_flag() {
        use clap::CommandFactory;
        super::help_check::assert_plain_help(super::Cli::command(), &[]);
    }

    #[test]
    fn flags_are_the_shared_vocabulary() {
        use clap::CommandFactory;
        super::vocab_check::assert_shared_vocabulary(
            super::vocab::Tool::Report,
            super::Cli::command(),
        );
    }
}
