//! nccl-tests' flags beyond the sweep (`-m`, `-z`, `-g`, `-J`) and the
//! table layout, checked once the backend is known: a flag a backend cannot
//! honour is refused with one line (exit 2), never silently ignored.

use crate::cli::{Args, Backend, SweepJob};
use anyhow::{bail, Result};
use std::path::PathBuf;

/// Which table rank 0 prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableFormat {
    /// parbench's table: nccl-tests' columns plus percentiles, algo, model, ceiling.
    Parbench,
    /// Exactly nccl-tests' columns, units row and footers.
    NcclTests,
}

/// The flags, parsed; [`check_backend`] says whether the backend honours them.
#[derive(Clone, Debug, PartialEq)]
pub struct NcclTestsFlags {
    /// `-m`: operations per timed iteration (only 1 is measured).
    pub agg_iters: usize,
    /// `-z`: 1 waits for each operation before the next.
    pub blocking: bool,
    /// `-g`: GPUs this process drives (nccl only).
    pub ngpus: Option<usize>,
    pub format: TableFormat,
    /// `-J FILE`: nccl-tests' JSON.
    pub json_file: Option<PathBuf>,
}

impl NcclTestsFlags {
    /// Parses what needs no backend; [`check_backend`] does the rest.
    pub fn from_args(a: &Args) -> Result<Self> {
        let format = match a.format.to_ascii_lowercase().as_str() {
            "parbench" => TableFormat::Parbench,
            "nccl-tests" | "nccl_tests" => TableFormat::NcclTests,
            other => bail!("--format {other}: expected parbench or nccl-tests"),
        };
        let blocking = match a.blocking {
            0 => false,
            1 => true,
            z => bail!("-z {z}: expected 0 (the backend's own way) or 1 (blocking)"),
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
            ngpus: a.ngpus,
            format,
            json_file: a.json_file.clone(),
        })
    }
}

/// Refuses, with one line, what the chosen backend cannot honour.
pub fn check_backend(plan: &SweepJob, joined: bool) -> Result<(), String> {
    let f = &plan.nccl_tests;
    let nccl = plan.backend == Backend::Nccl;
    if f.agg_iters != 1 {
        return Err(format!(
            "-m {}: parbench times one operation per iteration on every backend; only -m 1 runs",
            f.agg_iters
        ));
    }
    if f.blocking && nccl {
        return Err("-z 1: the nccl backend enqueues operations on its stream without waiting for each; blocking mode is not implemented there".into());
    }
    if plan.sweep.graph.is_some() && !nccl {
        return Err("-G/--graph captures CUDA graphs: it needs --backend nccl".into());
    }
    match f.ngpus {
        Some(_) if !nccl => {
            return Err(
                "-g counts GPUs per process: it needs --backend nccl (use -np for ranks)".into(),
            )
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

/// Rank 0's printer in the layout `--format` asks for.
pub fn printer<C: parbench::comm::Communicator>(
    comm: &C,
    plan: &SweepJob,
) -> crate::print::Printer {
    let rank0 = comm.rank() == 0;
    match plan.nccl_tests.format {
        TableFormat::Parbench => crate::print::Printer::new(rank0),
        TableFormat::NcclTests => crate::print::Printer::nccl_tests(rank0, plan.sweep.check > 0),
    }
}

/// The reference line of the header (item "is my busbw normal?"), and in
/// nccl-tests' layout its whole run header around it.
pub fn print_run_header<C: parbench::comm::Communicator>(
    printer: &mut crate::print::Printer,
    comm: &C,
    plan: &SweepJob,
    wire: &crate::wire::WireFigures,
) {
    let world = comm.world();
    let reference = crate::reference_line::describe(comm.backend(), &comm.wire(), world, wire).line;
    if !printer.is_nccl_tests() {
        printer.lines(&[format!("# Reference: {reference}")]);
        return;
    }
    let in_process = match std::env::var_os("WORLD_SIZE") {
        Some(_) => 1,
        None if comm.backend() == "mpi" || comm.backend() == "tcp" => 1,
        None => world,
    };
    let job = crate::nccl_tests_format::JobInfo {
        backend: comm.backend(),
        wire: &comm.wire(),
        world,
        in_process,
        min_bytes: plan.sweep.sizes.first().copied().unwrap_or(0),
        max_bytes: plan.sweep.sizes.last().copied().unwrap_or(0),
        warmup: plan.sweep.warmup,
        iters: plan.sweep.iters,
        check: plan.sweep.check,
        graph: plan.sweep.graph.unwrap_or(0),
        reference: &reference,
    };
    printer.lines(&crate::nccl_tests_format::run_header(&job));
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
            .plan()
            .map_err(|e| e.to_string())?;
        check_backend(&plan, false)
    }

    #[test]
    fn short_flags_parse_with_nccl_tests_meanings() {
        let p = parse_args([
            "b", "-G", "4", "-T", "9", "-m", "1", "-z", "1", "-N", "3", "-g", "2",
        ])
        .unwrap()
        .plan()
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
            (&["--backend", "nccl", "-g", "2", "-np", "4"], "must agree"),
        ] {
            let e = check(args).unwrap_err();
            assert!(e.contains(says) && !e.contains('\n'), "{args:?}: {e}");
        }
        assert!(check(&["--backend", "local", "-z", "1", "-N", "2"]).is_ok());
        assert!(check(&["--backend", "nccl", "-g", "2", "-G", "1"]).is_ok());
        for bad in [
            &["-J", "/no/such/folder/x.json"][..],
            &["-J", "/tmp"],
            &["-z", "3"],
            &["-m", "0"],
            &["-N", "0"],
            &["--format", "csv"],
        ] {
            assert!(check(bad).is_err(), "{bad:?}");
        }
    }
}
