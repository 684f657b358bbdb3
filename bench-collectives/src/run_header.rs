//! Rank 0's printer in the layout `--format` chose, and in nccl-tests'
//! layout the run header that names the job: the `-J` file's line and each
//! block's header.

use crate::cli::SweepJob;
use crate::config::TableFormat;
use crate::print::Printer;
use parbench::comm::Communicator;
use parbench::launch::flags::Backend;

/// Rank 0's printer in the layout `--format` asks for.
pub fn printer<C: Communicator>(comm: &C, plan: &SweepJob) -> Printer {
    let rank0 = comm.rank() == 0;
    match plan.nccl_tests.format {
        TableFormat::Parbench => Printer::new(rank0, plan.verbose),
        TableFormat::NcclTests => Printer::nccl_tests(rank0, plan.sweep.check > 0),
    }
}

/// In nccl-tests' layout its whole run header: the `-J` file's line first,
/// then each block's header; parbench's own line waits for the end.
pub fn print_run_header<C: Communicator>(printer: &mut Printer, comm: &C, plan: &SweepJob) {
    let world = comm.world();
    let json = match (&plan.nccl_tests.json_file, comm.rank()) {
        (Some(p), 0) => crate::json_nccl::reserve(p),
        _ => None,
    };
    if !printer.is_nccl_tests() {
        return;
    }
    if let Some(line) = json {
        printer.lines(&[line]);
    }
    let in_process = match std::env::var_os("WORLD_SIZE") {
        Some(_) => 1,
        // A backend whose ranks are always processes (tcp, mpi) runs one
        // each; threads of one process (local, a process's GPUs) the world.
        None if Backend::named(comm.backend())
            .is_some_and(|b| !b.in_one_process() && !b.on_gpus()) =>
        {
            1
        }
        None => world,
    };
    let f = &plan.nccl_tests;
    let job = crate::nccl_tests_format::JobInfo {
        backend: comm.backend(),
        wire: &comm.wire(),
        world,
        in_process,
        min_bytes: f.min_bytes,
        max_bytes: f.max_bytes,
        step: f.step,
        warmup: plan.sweep.warmup,
        iters: plan.sweep.iters,
        check: plan.sweep.check,
        graph: plan.sweep.graph.unwrap_or(0),
        blocking: f.blocking_mode,
        nccl_version: nccl_version_code(comm.backend()),
        per_iter: f.per_iter,
    };
    let trailer = vec![crate::nccl_tests_format::parbench_line(&job)];
    printer.set_nccl_tests_job(&job, trailer);
}

/// NCCL's version code where this run's collectives are NCCL's, else 0.
pub fn nccl_version_code(backend: &str) -> u64 {
    #[cfg(feature = "cuda")]
    if Backend::named(backend).is_some_and(Backend::on_gpus) {
        if let Ok(v) = parbench::comm::nccl::nccl_version() {
            return crate::json_nccl::nccl_version_code(&v).unwrap_or(0);
        }
    }
    let _ = backend;
    0
}
