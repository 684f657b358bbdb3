//! The last release's spellings, accepted for one more: each is rewritten
//! to today's before clap reads the command line, and each rewrite is
//! one line on stderr that names the new spelling, so that a script keeps
//! running while its author learns what to change.

use super::Tool;
use crate::comm::DType;
use std::ffi::OsString;

/// One flag renamed: `old` (a long `--name` or a short `-x`) is now `new`.
#[derive(Clone, Copy, Debug)]
pub struct Renamed {
    pub tool: Tool,
    /// The `report` subcommand it belongs to; `None`: the whole tool.
    pub scope: Option<&'static str>,
    pub old: &'static str,
    pub new: &'static str,
}

impl Renamed {
    /// `old` is `new` in the whole of `tool`.
    const fn whole(tool: Tool, old: &'static str, new: &'static str) -> Renamed {
        Renamed {
            tool,
            scope: None,
            old,
            new,
        }
    }

    /// `old` is `new` in `report`'s subcommand `scope`.
    const fn in_scope(
        tool: Tool,
        scope: &'static str,
        old: &'static str,
        new: &'static str,
    ) -> Renamed {
        Renamed {
            tool,
            scope: Some(scope),
            old,
            new,
        }
    }
}

/// Every flag renamed by issue 35's one vocabulary, and by issue 53's
/// one name per concept.
pub const RENAMED: &[Renamed] = &[
    // One --mode of three passes, as report model's.
    Renamed::whole(Tool::Layers, "--decode", "--mode=decode"),
    // nccl-tests' -V is the CTA count: no other tool reads it as the version.
    Renamed::whole(Tool::Layers, "-V", "--version"),
    Renamed::whole(Tool::Pipeline, "-V", "--version"),
    Renamed::whole(Tool::Report, "-V", "--version"),
    // -n is iterations everywhere; a pipeline's iteration is a step.
    Renamed::whole(Tool::Pipeline, "--steps", "--iters"),
    // bench-collectives' straggler arrives late; bench-pipeline's is slower.
    Renamed::whole(Tool::Pipeline, "--straggler", "--slow-rank"),
    Renamed::whole(Tool::Pipeline, "--dist-opt", "--distributed-optimizer"),
    // nccl-tests' -o is the reduction operator.
    Renamed::in_scope(Tool::Report, "html", "-o", "--output-file"),
    Renamed::in_scope(Tool::Report, "html", "--output", "--output-file"),
    Renamed::in_scope(Tool::Report, "trend", "-o", "--output-file"),
    Renamed::in_scope(Tool::Report, "trend", "--output", "--output-file"),
    Renamed::in_scope(Tool::Report, "plan", "--json", "--output-file"),
    // --check is bench-collectives' check iterations (nccl-tests' -c).
    Renamed::in_scope(Tool::Report, "plan", "--check", "--against"),
    Renamed::in_scope(Tool::Report, "plan", "--schedules", "--schedule"),
    // bench-collectives' --memory is nccl-tests' -M.
    Renamed::in_scope(Tool::Report, "plan", "--memory", "--device-memory"),
    // One microbatch size b, Megatron's --micro-batch-size.
    Renamed::whole(Tool::Layers, "--batch", "--microbatch-size"),
    Renamed::whole(Tool::Pipeline, "--micro-batch", "--microbatch-size"),
    Renamed::in_scope(Tool::Report, "model", "--batch", "--microbatch-size"),
];

/// A flag whose old value syntax is still read: `rewrite` returns today's
/// form of a value written the old way (`None`: already today's).
#[derive(Clone, Copy)]
pub struct OldValue {
    pub tool: Tool,
    pub scope: Option<&'static str>,
    /// Every spelling of the flag (`--dtype`, `-d`, nccl-tests' `--datatype`).
    pub spellings: &'static [&'static str],
    pub rewrite: fn(&str) -> Option<String>,
    /// What changed, for the notice.
    pub why: &'static str,
}

/// Every value syntax changed by issue 35.
pub const OLD_VALUES: &[OldValue] = &[
    OldValue {
        tool: Tool::Collectives,
        scope: None,
        spellings: &["-d", "--dtype", "--datatype"],
        rewrite: dtype_names,
        why: "types take nccl-tests' names",
    },
    OldValue {
        tool: Tool::Layers,
        scope: None,
        spellings: &["-d", "--dtype"],
        rewrite: dtype_names,
        why: "types take nccl-tests' names",
    },
    OldValue {
        tool: Tool::Layers,
        scope: None,
        spellings: &["--mode"],
        rewrite: forward_is_prefill,
        why: "--mode is prefill, decode or train, as report model's",
    },
    OldValue {
        tool: Tool::Report,
        scope: Some("model"),
        spellings: &["-d", "--dtype"],
        rewrite: dtype_names,
        why: "types take nccl-tests' names",
    },
    OldValue {
        tool: Tool::Report,
        scope: Some("model"),
        spellings: &["--intra", "--inter"],
        rewrite: bare_bandwidth,
        why: "a wire is GBPS,US everywhere",
    },
];

/// `fp16,bf16` -> `half,bfloat16`: each name of a comma list that names a
/// type by another spelling than nccl-tests'.
fn dtype_names(v: &str) -> Option<String> {
    let parts: Vec<String> = v
        .split(',')
        .map(|p| match p.trim().parse::<DType>() {
            Ok(d) => d.name().to_string(),
            // Unknown names reach the flag's own error unchanged.
            Err(_) => p.to_string(),
        })
        .collect();
    let new = parts.join(",");
    (!new.eq_ignore_ascii_case(v)).then_some(new)
}

/// `forward` -> `prefill`: bench-layers' forward pass over whole sequences.
fn forward_is_prefill(v: &str) -> Option<String> {
    v.eq_ignore_ascii_case("forward")
        .then(|| "prefill".to_string())
}

/// `900` -> `900,0`: a bandwidth alone, the latency 0 it was read with.
fn bare_bandwidth(v: &str) -> Option<String> {
    (!v.contains(',') && v.trim().parse::<f64>().is_ok()).then(|| format!("{},0", v.trim()))
}

/// The command line in today's spellings, and one notice per old
/// spelling met. `-np N` becomes `--nprocs N` too (clap has no
/// two-letter short flags), silently: it is mpirun's and nccl-tests'.
pub fn modernize<I, S>(tool: Tool, argv: I) -> (Vec<OsString>, Vec<String>)
where
    I: IntoIterator<Item = S>,
    S: Into<OsString>,
{
    let argv = crate::term::rewrite_np(argv);
    // report's subcommand is its first word; the others have none.
    let scope = match tool {
        Tool::Report => argv.get(1).and_then(|a| a.to_str()).map(str::to_string),
        _ => None,
    };
    let in_scope =
        |t: Tool, s: Option<&str>| t == tool && s.is_none_or(|s| Some(s) == scope.as_deref());
    let renames: Vec<&Renamed> = RENAMED
        .iter()
        .filter(|r| in_scope(r.tool, r.scope))
        .collect();
    let values: Vec<&OldValue> = OLD_VALUES
        .iter()
        .filter(|v| in_scope(v.tool, v.scope))
        .collect();
    let mut notices = Vec::new();
    let mut out: Vec<OsString> = Vec::with_capacity(argv.len());
    let mut pending_value: Option<(&OldValue, String)> = None;
    let mut after_dashes = false;
    for arg in argv {
        let Some(text) = arg.to_str().map(str::to_string) else {
            out.push(arg);
            continue;
        };
        if after_dashes || out.is_empty() {
            out.push(arg);
            continue;
        }
        if let Some((rule, flag)) = pending_value.take() {
            out.push(new_value(tool, rule, &flag, &text, &mut notices).into());
            continue;
        }
        if text == "--" {
            after_dashes = true;
            out.push(arg);
            continue;
        }
        let text = match renames.iter().find_map(|r| renamed(r, &text)) {
            Some((r, new)) => {
                notices.push(format!(
                    "{}: {} is now {}; {} is accepted until the next release",
                    tool.name(),
                    r.old,
                    r.new,
                    r.old
                ));
                new
            }
            None => text,
        };
        let hit = values.iter().find_map(|&rule| {
            flag_with_value(rule, &text).map(|(flag, value)| (rule, flag, value))
        });
        match hit {
            Some((rule, flag, None)) => {
                pending_value = Some((rule, flag.to_string()));
                out.push(text.into());
            }
            Some((rule, flag, Some(value))) => {
                // Flag and value as two words: clap reads `-d X` alike
                // for short and long flags.
                let v = new_value(tool, rule, flag, &value, &mut notices);
                out.push(flag.into());
                out.push(v.into());
            }
            None => out.push(text.into()),
        }
    }
    (out, notices)
}

/// `text` in today's spelling if it is `r`'s old one (`--old`, `--old=V`,
/// `-o`, `-oV`, `-o=V`).
fn renamed<'r>(r: &'r Renamed, text: &str) -> Option<(&'r Renamed, String)> {
    if text == r.old {
        return Some((r, r.new.to_string()));
    }
    let rest = text.strip_prefix(r.old)?;
    let long = r.old.starts_with("--");
    match rest.strip_prefix('=') {
        Some(v) => Some((r, format!("{}={v}", r.new))),
        // A short flag's value may follow it directly (`-oFILE`).
        None if !long && !rest.is_empty() => Some((r, format!("{}={rest}", r.new))),
        None => None,
    }
}

/// Whether `text` is one of `v`'s spellings: the spelling, and the value
/// when it is attached (`--dtype=X`, `-dX`) rather than the next word.
fn flag_with_value(v: &OldValue, text: &str) -> Option<(&'static str, Option<String>)> {
    v.spellings.iter().find_map(|&s| {
        if text == s {
            return Some((s, None));
        }
        let rest = text.strip_prefix(s)?;
        match rest.strip_prefix('=') {
            Some(value) => Some((s, Some(value.to_string()))),
            None if !s.starts_with("--") && !rest.is_empty() => Some((s, Some(rest.to_string()))),
            None => None,
        }
    })
}

fn new_value(
    tool: Tool,
    rule: &OldValue,
    flag: &str,
    value: &str,
    notices: &mut Vec<String>,
) -> String {
    match (rule.rewrite)(value) {
        Some(new) => {
            notices.push(format!(
                "{}: {flag} {value} is now {flag} {new} ({}); {value} is accepted until the next release",
                tool.name(),
                rule.why
            ));
            new
        }
        None => value.to_string(),
    }
}

/// Prints the notices once per job: not again on every rank a launcher
/// started (a spawning parent already printed them; torchrun's and
/// mpirun's ranks above 0 keep quiet).
pub fn print_notices(notices: &[String]) {
    let rank_above_0 = ["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|r| r.trim() != "0"));
    if std::env::var_os("PARBENCH_SPAWNED").is_some() || rank_above_0 {
        return;
    }
    for n in notices {
        crate::error_line::eprint_line(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(tool: Tool, args: &[&str]) -> (Vec<String>, Vec<String>) {
        let (argv, notices) = modernize(tool, args.iter().copied());
        (
            argv.into_iter().map(|a| a.into_string().unwrap()).collect(),
            notices,
        )
    }

    #[test]
    fn old_spellings_become_new_with_one_notice_each() {
        let (argv, n) = run(
            Tool::Pipeline,
            &[
                "bench-pipeline",
                "--steps",
                "3",
                "--straggler=1:5",
                "-np",
                "4",
            ],
        );
        assert_eq!(
            argv,
            [
                "bench-pipeline",
                "--iters",
                "3",
                "--slow-rank=1:5",
                "--nprocs",
                "4"
            ]
        );
        assert_eq!(n.len(), 2, "{n:?}");
        assert!(n[0].contains("--steps is now --iters"), "{n:?}");
        // bench-collectives' --straggler is today's: untouched.
        let (argv, n) = run(
            Tool::Collectives,
            &["bench-collectives", "--straggler", "1:5"],
        );
        assert_eq!(argv[1], "--straggler");
        assert!(n.is_empty());
    }

    #[test]
    fn report_renames_are_per_subcommand() {
        let (argv, n) = run(Tool::Report, &["report", "html", "results", "-o", "r.html"]);
        assert_eq!(
            argv,
            ["report", "html", "results", "--output-file", "r.html"]
        );
        assert_eq!(n.len(), 1);
        let (argv, _) = run(Tool::Report, &["report", "trend", "d", "-ox.html"]);
        assert_eq!(argv[3], "--output-file=x.html");
        let (argv, _) = run(
            Tool::Report,
            &["report", "plan", "--check", "d", "--schedules", "1f1b"],
        );
        assert_eq!(
            argv,
            ["report", "plan", "--against", "d", "--schedule", "1f1b"]
        );
        // plan has no -o: left for clap to refuse.
        let (argv, n) = run(Tool::Report, &["report", "plan", "-o", "x"]);
        assert_eq!(argv[2], "-o");
        assert!(n.is_empty());
    }

    #[test]
    fn one_name_per_concept_renames() {
        let (argv, n) = run(Tool::Report, &["report", "plan", "--memory", "80"]);
        assert_eq!(argv[2..], ["--device-memory", "80"]);
        assert_eq!(n.len(), 1, "{n:?}");
        assert!(n[0].contains("--memory is now --device-memory"), "{n:?}");
        // bench-collectives' --memory is nccl-tests' -M: untouched.
        let (argv, n) = run(Tool::Collectives, &["bench-collectives", "--memory", "0"]);
        assert_eq!(argv[1], "--memory");
        assert!(n.is_empty());
        let (argv, n) = run(Tool::Layers, &["bench-layers", "--batch=4"]);
        assert_eq!(argv[1], "--microbatch-size=4");
        assert_eq!(n.len(), 1);
        let (argv, _) = run(Tool::Pipeline, &["bench-pipeline", "--micro-batch", "4"]);
        assert_eq!(argv[1], "--microbatch-size");
        let (argv, _) = run(Tool::Report, &["report", "model", "--batch", "8"]);
        assert_eq!(argv[2], "--microbatch-size");
        // Another concept that starts alike stays.
        let (argv, n) = run(Tool::Report, &["report", "plan", "--global-batch", "8"]);
        assert_eq!(argv[2], "--global-batch");
        assert!(n.is_empty());
    }

    #[test]
    fn old_values_become_new() {
        let (argv, n) = run(
            Tool::Report,
            &[
                "report",
                "model",
                "--dtype",
                "fp16",
                "--intra=900",
                "--inter",
                "25,8",
            ],
        );
        assert_eq!(
            argv,
            ["report", "model", "--dtype", "half", "--intra", "900,0", "--inter", "25,8"]
        );
        assert_eq!(n.len(), 2, "{n:?}");
        let (argv, n) = run(
            Tool::Collectives,
            &["bench-collectives", "-dbf16,float", "-d", "half"],
        );
        assert_eq!(
            argv,
            ["bench-collectives", "-d", "bfloat16,float", "-d", "half"]
        );
        assert_eq!(n.len(), 1);
        let (argv, n) = run(
            Tool::Layers,
            &["bench-layers", "--mode", "forward", "--decode"],
        );
        assert_eq!(argv[1..], ["--mode", "prefill", "--mode", "decode"]);
        assert_eq!(n.len(), 2, "{n:?}");
        // An unknown type reaches the flag's own error as written.
        let (argv, n) = run(Tool::Layers, &["bench-layers", "--dtype", "complex"]);
        assert_eq!(argv[2], "complex");
        assert!(n.is_empty());
    }

    #[test]
    fn nothing_after_double_dash_is_rewritten() {
        let (argv, n) = run(Tool::Pipeline, &["bench-pipeline", "--", "--steps"]);
        assert_eq!(argv[2], "--steps");
        assert!(n.is_empty());
    }
}
