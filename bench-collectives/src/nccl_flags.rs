//! nccl-tests' flags beyond the sweep (`-m`, `-z`, `-g`, `-J`) and the
//! table layout, checked once the backend is known: a flag a backend cannot
//! honour is refused with one line (exit 2), never silently ignored. The
//! printers these flags choose are built in [`crate::run_header`].

use crate::cli::{Args, SweepJob};
use crate::config::{NcclTestsFlags, Step, TableFormat};
use anyhow::{bail, Result};

impl NcclTestsFlags {
    /// Parses what needs no backend, given `-b`, `-e` and the step as
    /// read; [`check_backend`] does the rest.
    pub fn from_args(a: &Args, (min_bytes, max_bytes, step): (u64, u64, Step)) -> Result<Self> {
        let format = match a.format.to_ascii_lowercase().as_str() {
            "parbench" => TableFormat::Parbench,
            "nccl-tests" | "nccl_tests" => TableFormat::NcclTests,
            other => bail!("--format {other}: expected parbench or nccl-tests"),
        };
        // nccl-tests' -z 1-3 differ in where a barrier goes between the
        // waits; every one waits for each operation before the next.
        let blocking = match a.blocking {
            0 => false,
            1..=3 => true,
            z => bail!(
                "-z {z}: expected 0 (the backend's own way) or 1-3 (nccl-tests' blocking modes)"
            ),
        };
        if a.agg_iters == 0 {
            bail!("-m/--agg-iters must be at least 1");
        }
        if a.ngpus == Some(0) {
            bail!("-g/--ngpus must be at least 1");
        }
        if let Some(p) = &a.json_file {
            if p.as_os_str().is_empty() {
                bail!("-J: the file name is empty");
            }
            // Checked before measuring: a run must not end unable to write
            // it, nor write it through a symlink, a FIFO or over a record.
            parbench::results::check_output(p, None).map_err(|e| anyhow::anyhow!("-J {e}"))?;
        }
        Ok(NcclTestsFlags {
            agg_iters: a.agg_iters,
            blocking,
            blocking_mode: a.blocking,
            min_bytes,
            max_bytes,
            step,
            ngpus: a.ngpus,
            format,
            json_file: a.json_file.clone(),
            per_iter: a.per_iter_timing.as_deref().map(str::trim) == Some("1"),
        })
    }
}

/// Refuses, with one line, what the chosen backend cannot honour.
pub fn check_backend(plan: &SweepJob, joined: bool) -> Result<(), String> {
    let f = &plan.nccl_tests;
    let nccl = plan.backend.on_gpus();
    if f.agg_iters != 1 {
        return Err(format!(
            "-m {}: parbench times one operation per iteration on every backend; only -m 1 runs",
            f.agg_iters
        ));
    }
    if f.blocking && nccl {
        return Err(format!("-z {}: the nccl backend enqueues operations on its stream without waiting for each; blocking mode is not implemented there", f.blocking_mode));
    }
    if plan.sweep.graph.is_some() && !nccl {
        return Err("-G/--graph captures CUDA graphs: it needs --backend nccl".into());
    }
    match f.ngpus {
        // -g 1 is the one device each CPU rank is.
        Some(1) if !nccl => {}
        Some(g) if !nccl => {
            return Err(format!(
                "-g {g} counts GPUs per process: it needs --backend nccl; a CPU rank is one device (-g 1; use -np for ranks)"
            ))
        }
        Some(g) if g > 1 && joined => {
            return Err(format!(
            "-g {g}: under a launcher every nccl process drives one GPU; use -g 1 or no launcher"
        ))
        }
        Some(g) if plan.nprocs.is_some_and(|n| n != g) => {
            return Err(format!(
                "-g {g} and -np {}: one process drives its GPUs, so they must agree",
                plan.nprocs.unwrap_or(0)
            ))
        }
        _ => {}
    }
    Ok(())
}

/// nccl-tests' flags with no counterpart here: the short flag, its long
/// name, the value that asks for nothing (`None`: any value is accepted
/// and ignored, as nccl-tests ignores it), and what it does in nccl-tests
/// and why not here.
pub const OTHER_FLAGS: &[(&str, &str, Option<&str>, &str)] = &[
    ("-C", "--report_cputime", Some("0"), "reports the CPU time of the launches instead of the time to completion; parbench's time is one clock around the whole loop and its completion, on every backend"),
    ("-S", "--report_timestamps", Some("0"), "prints a timestamp column; not implemented here (run.json records each run's start and end)"),
    ("-R", "--local_register", Some("0"), "registers the buffers with NCCL (1 local, 2 symmetric); parbench registers no buffers"),
    ("-M", "--memory", Some("0"), "reports the GPU memory NCCL and the buffers took; not implemented here (the memory check before the sweep says what the buffers take)"),
    ("-u", "--unalign", Some("0"), "misaligns the buffers by N elements; parbench places its buffers itself and does not misalign them"),
    ("-p", "--parallel_init", Some("0"), "initialises NCCL from every thread at once; parbench sets up each backend its own way"),
    ("-y", "--stream_null", Some("0"), "runs on CUDA's default stream; parbench's nccl backend runs on its own stream and the CPU backends have none"),
    ("-x", "--cta_policy", None, "sets NCCL's CTA policy (NCCL 2.27+); parbench's nccl backend does not set one"),
    ("-D", "--device_implementation", Some("0"), "runs nccl-tests' own kernels over NCCL's device API (NCCL 2.28+); parbench has none"),
    // Its CTA count matters only with -D, and nccl-tests ignores it without.
    ("-V", "--device_cta_count", None, "sets the CTA count of -D's kernels; accepted and ignored, as without -D"),
    ("-K", "--per_iter_skip", Some("0"), "leaves the first N iterations out of -I's summary columns; not implemented here (every iteration counts)"),
];

/// The help of one of [`OTHER_FLAGS`], by its short flag: what it does in
/// nccl-tests, and the one value accepted here.
pub fn other_flag_help(short: &str) -> String {
    match OTHER_FLAGS.iter().find(|f| f.0 == short) {
        Some((_, _, Some(neutral), what)) => {
            format!("In nccl-tests it {what}; only {neutral} is accepted here")
        }
        Some((_, _, None, what)) => format!("In nccl-tests it {what}"),
        None => String::new(),
    }
}

fn other_flag_values(a: &Args) -> [&Option<String>; 11] {
    [
        &a.report_cputime,
        &a.report_timestamps,
        &a.local_register,
        &a.memory,
        &a.unalign,
        &a.parallel_init,
        &a.stream_null,
        &a.cta_policy,
        &a.device_implementation,
        &a.device_cta_count,
        &a.per_iter_skip,
    ]
}

/// Refuses, in one line, what nccl-tests' other flags ask for and parbench
/// cannot do; accepts what asks for nothing.
pub fn check_other_flags(a: &Args) -> Result<()> {
    for ((short, long, neutral, what), value) in OTHER_FLAGS.iter().zip(other_flag_values(a)) {
        let Some(v) = value else { continue };
        let number = v.trim().parse::<i64>();
        match (neutral, &number) {
            (_, Err(_)) => bail!("{short}/{long} {v}: expected a number"),
            (None, Ok(_)) => {}
            (Some(n), Ok(x)) if x.to_string() == *n => {}
            (Some(_), Ok(_)) => bail!("{short} {v}: in nccl-tests it {what}"),
        }
    }
    if let Some(x) = &a.cta_policy {
        // Accepted above only as a number: nccl-tests passes it to NCCL's config.
        bail!("-x {x}: in nccl-tests it sets NCCL's CTA policy (NCCL 2.27+); parbench's nccl backend does not set one");
    }
    // parbench times every iteration: -I 1 adds nccl-tests' columns to its
    // layout (parbench's own has p50 and p99 already).
    match a.per_iter_timing.as_deref().map(str::trim) {
        None | Some("0") | Some("1") => {}
        Some(v) => bail!("-I {v}: expected 0 or 1"),
    }
    match a.nthreads {
        None | Some(1) => Ok(()),
        Some(t) => bail!("-t {t}: in nccl-tests the threads of one process, each a rank; here --backend local runs its ranks as threads: use -np {t}"),
    }
}

/// The types `-d all` runs: in nccl-tests' layout, in nccl-tests' order
/// (its `test_types`: int8 uint8 int32 uint32 int64 uint64 half float
/// double bfloat16 f8e4m3 f8e5m2).
pub fn all_types(format: &str) -> &'static [parbench::comm::DType] {
    use parbench::comm::DType;
    if format.eq_ignore_ascii_case("parbench") {
        &DType::ALL
    } else {
        &DType::NCCL_TESTS_ORDER
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::parse_args;

    fn check(args: &[&str]) -> Result<(), String> {
        let mut v = vec!["bench-collectives"];
        v.extend_from_slice(args);
        let plan = parse_args(v)
            .map_err(|e| e.to_string())?
            .job()
            .map_err(|e| e.to_string())?;
        check_backend(&plan, false)
    }

    #[test]
    fn short_flags_parse_with_nccl_tests_meanings() {
        let p = parse_args([
            "b", "-G", "4", "-T", "9", "-m", "1", "-z", "1", "-N", "3", "-g", "2",
        ])
        .unwrap()
        .job()
        .unwrap();
        assert_eq!(p.sweep.graph, Some(4));
        assert_eq!(p.sweep.timeout, std::time::Duration::from_secs(9));
        assert_eq!(p.sweep.run_cycles, 3);
        assert_eq!(p.nccl_tests.agg_iters, 1);
        assert!(p.nccl_tests.blocking);
        assert_eq!(p.nccl_tests.ngpus, Some(2));
    }

    #[test]
    fn what_a_backend_cannot_honour_is_refused_in_one_line() {
        for (args, says) in [
            (&["--backend", "local", "-m", "4"][..], "-m 4"),
            (&["--backend", "nccl", "-z", "1"], "-z 1"),
            (&["--backend", "tcp", "-G", "2"], "CUDA graphs"),
            (&["--backend", "local", "-g", "2"], "GPUs per process"),
            (&["--backend", "local", "-g", "2"], "-g 2"),
            (&["--backend", "nccl", "-g", "2", "-np", "4"], "must agree"),
        ] {
            let e = check(args).unwrap_err();
            assert!(e.contains(says) && !e.contains('\n'), "{args:?}: {e}");
        }
        assert!(check(&["--backend", "local", "-z", "1", "-N", "2"]).is_ok());
        // What Azure's, FlagPerf's and superbench's scripts pass.
        assert!(check(&["--backend", "local", "-g", "1", "-t", "1", "-G", "0"]).is_ok());
        assert!(check(&[
            "--backend",
            "tcp",
            "-C",
            "0",
            "-R",
            "0",
            "-S",
            "0",
            "-M",
            "0",
            "-u",
            "0",
            "-p",
            "0",
            "-y",
            "0",
            "-D",
            "0",
            "-V",
            "16",
            "-I",
            "0",
            "-K",
            "0",
            "-N",
            "0",
            "-T",
            "0",
            "-r",
            "-1"
        ])
        .is_ok());
        assert!(check(&[
            "--minbytes",
            "8",
            "--maxbytes",
            "1.5K",
            "--stepfactor",
            "2",
            "--iters",
            "2",
            "--warmup_iters",
            "1",
            "--check",
            "1",
            "--op",
            "sum",
            "--datatype",
            "float",
            "--root",
            "0",
            "--blocking",
            "0",
            "--cudagraph",
            "0",
            "--run_cycles",
            "1",
            "--agg_iters",
            "1",
            "--nthreads",
            "1",
            "--ngpus",
            "1"
        ])
        .is_ok());
        assert!(check(&["--backend", "nccl", "-g", "2", "-G", "1"]).is_ok());
        for bad in [
            &["-J", "/no/such/folder/x.json"][..],
            &["-J", "/tmp"],
            &["-z", "4"],
            &["-m", "0"],
            &["-C", "1"],
            &["-R", "2"],
            &["-x", "1"],
            &["-I", "2"],
            &["-t", "2"],
            &["-d", "float8"],
            &["-o", "premul"],
            &["-S", "yes"],
            &["--format", "csv"],
        ] {
            assert!(check(bad).is_err(), "{bad:?}");
        }
    }
}
