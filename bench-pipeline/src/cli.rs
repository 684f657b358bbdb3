//! Flags, and the list of runs they ask for, each validated before anything runs.

use clap::Parser;
use parbench::launch::flags::Straggler;
use parbench::pipeline::{MlpShape, PipelineConfig, Work};
use parbench::schedule::{self, Schedule, ScheduleKind};
use std::path::PathBuf;
use std::time::Duration;

/// Real pipeline schedules on real stages: step time, per-rank busy and
/// idle time, the measured bubble beside the simulated and the closed form.
#[derive(Parser, Debug, Clone)]
// A flag given twice is refused (clap's default for single values, as in
// every parbench binary); a negative number reaches the flag's own check.
#[command(name = "bench-pipeline", version, allow_negative_numbers = true)]
pub struct Args {
    /// Backend: local (one thread per stage), tcp (one process per stage) or
    /// nccl (one GPU per stage; needs --features cuda).
    #[arg(long, default_value = "local")]
    pub backend: String,
    /// Number of stage ranks S (default 4; with --backend nccl, one per
    /// visible GPU).
    #[arg(long)]
    pub stages: Option<usize>,
    /// Schedules to run, comma-separated: gpipe, 1f1b, interleaved, zb-h1.
    #[arg(long, default_value = "gpipe,1f1b,interleaved,zb-h1")]
    pub schedule: String,
    /// Microbatches per step, comma-separated (a sweep): 1,2,4,8,16,32.
    #[arg(long, default_value = "8")]
    pub microbatches: String,
    /// Stages per rank v of the interleaved schedule.
    #[arg(long, default_value_t = 2)]
    pub chunks: usize,
    /// MLP layers of every stage.
    #[arg(long, default_value_t = 2)]
    pub layers_per_stage: usize,
    /// MLP layers of each stage, comma-separated (unbalanced stages), e.g. 2,2,4,2.
    #[arg(long, conflicts_with = "layers_per_stage")]
    pub stage_layers: Option<String>,
    /// Width of every layer.
    #[arg(long, default_value_t = 256)]
    pub hidden: usize,
    /// Rows of one microbatch.
    #[arg(long, default_value_t = 32)]
    pub microbatch_size: usize,
    /// Run a hand-written schedule: PyTorch's compute-only CSV (one row per rank).
    #[arg(long)]
    pub schedule_csv: Option<PathBuf>,
    /// Slow one rank down: RANK:MS adds MS milliseconds to each of its actions.
    #[arg(long)]
    pub straggler: Option<String>,
    /// Results folder (pipeline.csv, run.json, timeline-*.json).
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// What each action does: compute (real MLP passes) or sleep:US.
    #[arg(long, default_value = "compute")]
    pub work: String,
    /// Timed steps per run (iterations; nccl-tests' -n).
    #[arg(short = 'n', long, alias = "iters", default_value_t = 5)]
    pub steps: usize,
    /// Untimed steps first (warm-up; nccl-tests' -w).
    #[arg(short = 'w', long, default_value_t = 2)]
    pub warmup: usize,
    /// Seconds any wait (and any one action) may last before it fails naming the peer.
    #[arg(long, default_value_t = 60.0)]
    pub timeout: f64,
    /// Compute threads of each stage rank (default: the cores divided among the stages).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Pin each stage rank to its own core when there are enough cores.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub pin: bool,
    /// Draw each run's median step in the terminal (default: only for small runs).
    #[arg(long)]
    pub timeline: bool,
    /// Seed of weights, inputs and targets.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Also write each generated schedule as compute-only CSV into this folder.
    #[arg(long)]
    pub dump_schedules: Option<PathBuf>,
    /// With --backend tcp: spawn this many local ranks of this binary
    /// (default: --stages); `-np N` as in mpirun and the other binaries.
    #[arg(long, visible_alias = "np")]
    pub nprocs: Option<usize>,
}

/// Stage ranks when --stages is absent (and the backend does not count GPUs).
pub const DEFAULT_STAGES: usize = 4;

/// One run of the sweep.
#[derive(Clone, Debug)]
pub struct RunPlan {
    /// The generator, or `None` for a CSV schedule.
    pub kind: Option<ScheduleKind>,
    pub cfg: PipelineConfig,
}

/// Every run, in order, and what they share.
#[derive(Clone, Debug)]
pub struct PipelineJob {
    pub runs: Vec<RunPlan>,
    pub ranks: usize,
    pub timeout: Duration,
    /// Sweep points left out (interleaved needs M a multiple of S), for rank 0 to print.
    pub skipped: Vec<String>,
}

fn list<T: std::str::FromStr>(flag: &str, s: &str) -> Result<Vec<T>, String>
where
    T::Err: std::fmt::Display,
{
    let v: Result<Vec<T>, String> = s
        .split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(|x| x.parse::<T>().map_err(|e| format!("{flag}: '{x}': {e}")))
        .collect();
    let v = v?;
    if v.is_empty() {
        return Err(format!("{flag}: empty list"));
    }
    Ok(v)
}

/// `RANK:MS` through the library's one parser (one set of bounds for
/// every binary), the rank one of the schedule's.
fn straggler(s: &str, ranks: usize) -> Result<(usize, Duration), String> {
    let st: Straggler = s.parse().map_err(|e| format!("--straggler {e}"))?;
    if st.rank >= ranks {
        return Err(format!(
            "--straggler: rank {} but only {ranks} ranks",
            st.rank
        ));
    }
    Ok((st.rank, st.delay))
}

fn stage_layers(args: &Args, stages: usize) -> Result<Vec<usize>, String> {
    match &args.stage_layers {
        Some(s) => {
            let v: Vec<usize> = list("--stage-layers", s)?;
            if v.len() != stages {
                return Err(format!(
                    "--stage-layers has {} entries for {stages} stages",
                    v.len()
                ));
            }
            if v.contains(&0) {
                return Err("--stage-layers: every stage needs at least one layer".into());
            }
            Ok(v)
        }
        None if args.layers_per_stage == 0 => Err("--layers-per-stage must be at least 1".into()),
        None => Ok(vec![args.layers_per_stage; stages]),
    }
}

/// Builds and validates every run; an error here is a bad flag, file or
/// schedule (exit 2). A schedule error carries the marked grid.
pub fn plan(args: &Args) -> Result<PipelineJob, String> {
    let work: Work = args.work.parse()?;
    let timeout = parbench::limits::timeout(args.timeout).map_err(|e| e.0)?;
    for (flag, v) in [
        ("--hidden", args.hidden),
        ("--microbatch-size", args.microbatch_size),
        ("--steps", args.steps),
        ("--chunks", args.chunks),
        ("--threads", args.threads.unwrap_or(1)),
        ("--nprocs", args.nprocs.unwrap_or(1)),
    ] {
        if v == 0 {
            return Err(format!("{flag} 0: at least 1"));
        }
    }
    if !matches!(args.backend.as_str(), "local" | "tcp" | "nccl") {
        return Err(format!(
            "--backend '{}': expected local, tcp or nccl",
            args.backend
        ));
    }
    if args.backend == "nccl" && !cfg!(feature = "cuda") {
        return Err(
            "--backend nccl: this build has no CUDA support (rebuild with --features cuda)".into(),
        );
    }
    let shape = MlpShape {
        hidden: args.hidden,
        rows: args.microbatch_size,
    };
    let mut schedules: Vec<(Option<ScheduleKind>, Schedule)> = Vec::new();
    let mut skipped = Vec::new();
    if let Some(path) = &args.schedule_csv {
        let s = schedule::load_csv(path).map_err(|e| e.to_string())?;
        schedules.push((None, s));
    } else {
        let stages = args.stages.unwrap_or(DEFAULT_STAGES);
        if stages == 0 {
            return Err("--stages must be at least 1".into());
        }
        let kinds: Vec<ScheduleKind> = list("--schedule", &args.schedule)?;
        let ms: Vec<usize> = list("--microbatches", &args.microbatches)?;
        let sweep = ms.len() * kinds.len();
        for kind in kinds {
            for &m in &ms {
                let v = if kind == ScheduleKind::Interleaved {
                    args.chunks
                } else {
                    1
                };
                match schedule::generate(kind, stages, m, v) {
                    Ok(s) => schedules.push((Some(kind), s)),
                    // In a sweep, interleaved skips the M it cannot run;
                    // alone, its error is the answer.
                    Err(e) if kind == ScheduleKind::Interleaved && sweep > 1 => {
                        skipped.push(e.to_string())
                    }
                    Err(e) => return Err(e.to_string()),
                }
            }
        }
    }
    if schedules.is_empty() {
        return Err(format!(
            "nothing to run: {}",
            skipped.first().map(String::as_str).unwrap_or("empty sweep")
        ));
    }
    let ranks = schedules.first().map(|(_, s)| s.ranks()).unwrap_or(1);
    if let Some(n) = args.nprocs {
        if n != ranks {
            return Err(format!("--nprocs {n} but the schedule has {ranks} ranks"));
        }
        if args.backend != "tcp" {
            return Err("--nprocs applies to --backend tcp".into());
        }
    }
    let straggler = args
        .straggler
        .as_deref()
        .map(|s| straggler(s, ranks))
        .transpose()?;
    // Every action ends within the deadline, on every backend: a backward
    // sleeps twice the forward's time, plus a straggler's delay.
    let extra = straggler.map_or(Duration::ZERO, |(_, d)| d);
    if let Work::Sleep(d) = work {
        let longest = d.saturating_mul(2).saturating_add(extra);
        if longest >= timeout {
            return Err(format!(
                "--work {}: a backward sleeps {} (twice the time{}), not less than --timeout {}",
                args.work,
                parbench::launch::duration_text(longest),
                if extra.is_zero() {
                    ""
                } else {
                    ", with the straggler's delay"
                },
                args.timeout
            ));
        }
    } else if extra >= timeout {
        return Err(format!(
            "--straggler {}: the delay is not less than --timeout {}",
            args.straggler.as_deref().unwrap_or(""),
            args.timeout
        ));
    }
    let mut runs = Vec::new();
    for (kind, s) in schedules {
        schedule::validate(&s).map_err(|e| e.to_string())?;
        if let Some(dir) = &args.dump_schedules {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let file = dir.join(format!(
                "{}-S{}-M{}-v{}.csv",
                s.name,
                s.ranks(),
                s.microbatches,
                s.chunks()
            ));
            schedule::save_csv(&s, &file).map_err(|e| e.to_string())?;
        }
        let layers = stage_layers(args, s.num_stages)?;
        runs.push(RunPlan {
            kind,
            cfg: PipelineConfig {
                stage_layers: layers,
                shape,
                work,
                straggler,
                seed: args.seed,
                warmup: args.warmup,
                steps: args.steps,
                schedule: s,
            },
        });
    }
    Ok(PipelineJob {
        runs,
        ranks,
        timeout,
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Args {
        let mut v = vec!["bench-pipeline"];
        v.extend(extra);
        Args::parse_from(v)
    }

    #[test]
    fn n_is_iterations_w_warm_up_np_ranks() {
        let a = Args::parse_from(parbench::term::rewrite_np([
            "bench-pipeline",
            "-n",
            "3",
            "-w",
            "1",
            "-np",
            "2",
        ]));
        assert_eq!((a.steps, a.warmup, a.nprocs), (3, 1, Some(2)));
    }

    #[test]
    fn the_default_sweep_is_every_schedule() {
        let p = plan(&args(&[])).unwrap();
        assert_eq!(p.runs.len(), 4);
        assert_eq!(p.ranks, 4);
        assert_eq!(p.runs[2].cfg.schedule.num_stages, 8);
        assert_eq!(p.runs[2].cfg.stage_layers, vec![2; 8]);
    }

    #[test]
    fn bad_flags_name_the_problem() {
        let e = plan(&args(&["--schedule", "pipedream"])).unwrap_err();
        assert!(e.contains("unknown schedule 'pipedream'"), "{e}");
        let e = plan(&args(&["--stage-layers", "2,2"])).unwrap_err();
        assert!(e.contains("2 entries for 4 stages"), "{e}");
        let e = plan(&args(&["--straggler", "9:5"])).unwrap_err();
        assert!(e.contains("rank 9"), "{e}");
        let e = plan(&args(&["--schedule", "interleaved", "--microbatches", "6"])).unwrap_err();
        assert!(e.contains("multiple of 4"), "{e}");
        let p = plan(&args(&["--microbatches", "2,4"])).unwrap();
        assert_eq!(p.runs.len(), 7, "interleaved M=2 is left out of the sweep");
        assert!(p.skipped[0].contains("multiple of 4"), "{:?}", p.skipped);
        let e = plan(&args(&["--work", "sleep:x"])).unwrap_err();
        assert!(e.contains("microseconds"), "{e}");
        for (a, want) in [
            (&["--timeout", "0"][..], "--timeout 0"),
            (&["--threads", "0"][..], "--threads 0"),
            (
                &["--work", "sleep:3000000", "--timeout", "5"][..],
                "--work sleep:3000000",
            ),
            (&["--stages", "100000"][..], "at most 256 stage ranks"),
            (&["--microbatches", "10000000"][..], "at most 65536"),
        ] {
            let e = plan(&args(a)).unwrap_err();
            assert!(e.contains(want), "{a:?}: {e}");
        }
    }
}
