//! Starting the ranks of a job and running one body on each: the one
//! launcher every binary calls, on every backend.
//!
//! A binary works out its world once ([`Ranks`]), checks it once, and
//! calls [`run`] with a [`RankBody`]. A body that computes asks its
//! communicator for the device beside it ([`RankComm::device`]: the CPU
//! beside host buffers, the communicator's own GPU beside NCCL's), so one
//! body runs on every backend. What can only be known once a library has
//! started (MPI's world) the body checks first.
//!
//! A failed job reports one rank's error, named once (`rank N: ...`), by
//! one rule on every backend (`first_fault`): a rank's own fault before
//! the communication errors it caused on the others (their waits that
//! passed a deadline, then their lost peers), the lowest rank first.

use super::flags::Backend;
use super::{LaunchError, RankInfo};
use crate::comm::{Algo, CommError, CommResult, Communicator, DType, HostComm, Transport};
use crate::compute::cpu::CpuCompute;
use crate::compute::Compute;
use crate::error_line::rank_line;
use std::time::Duration;

pub use super::choose::{
    default_ranks, gpu_facts, gpu_memory, run_meta, visible_gpus, GpuFacts, Wanted,
};

/// How the ranks of a job start, worked out once by the binary. Each
/// variant is a way of starting, not a backend: the backend it starts is
/// [`Ranks::backend`], and a binary asks that backend what it needs to know
/// ([`Backend::on_gpus`] and its kin), so that a backend which starts in
/// one of these ways needs no binary to change.
#[derive(Debug)]
pub enum Ranks {
    /// `n` ranks in this process, one thread each: over shared memory
    /// (local), or one GPU each (nccl).
    Here { backend: Backend, n: usize },
    /// Spawn `n` ranks of this binary on loopback (they join as [`Ranks::Joined`]).
    Spawn(usize),
    /// Spawn this job of ranks of this binary: a binary that runs one job
    /// per configuration names each and hands it its own variables. Unlike
    /// [`Ranks::Spawn`], a failed rank comes back as
    /// `JobFault::Launch(LaunchError::RankFailed)`, so that the binary can
    /// say which of its jobs it was (the launcher already named the rank).
    Job(super::LocalJob),
    /// This process is one rank of a job its launcher's variables describe
    /// (spawned, torchrun, mpirun, srun): over sockets (tcp), or on one GPU
    /// (nccl, feature `cuda`).
    Joined { backend: Backend, info: RankInfo },
    /// This process is one rank of a job whose world its library knows
    /// once started (MPI's, feature `mpi`).
    LibraryWorld { backend: Backend },
}

/// What every rank runs, over whichever communicator its backend gives.
pub trait RankBody: Sync {
    /// What one rank hands back.
    type Out: Send;
    /// Runs on one rank (a body that does not compute may ask only for
    /// `C: Communicator`).
    fn run<C: RankComm>(&self, comm: &mut C) -> CommResult<Self::Out>;
}

/// A communicator the launcher starts, with the compute device a rank of
/// it computes on: products and collectives then share one kind of buffer.
pub trait RankComm: Communicator {
    /// The device whose tensors this communicator's collectives take.
    type Device: Compute<Buf = Self::Buffer>;
    /// A device storing `dtype`; `threads` is a CPU's thread budget (a GPU
    /// ignores it and waits as long as the communicator does).
    fn device(&self, dtype: DType, threads: usize) -> CommResult<Self::Device>;
    /// The version line of the library under this communicator, where it is
    /// a library's (MPI's): run.json records it.
    fn library(&self) -> Option<String> {
        None
    }
}

impl<T: Transport> RankComm for HostComm<T> {
    type Device = CpuCompute;
    fn device(&self, dtype: DType, threads: usize) -> CommResult<CpuCompute> {
        cpu_device(dtype, threads)
    }
}

#[cfg(feature = "mpi")]
impl RankComm for crate::comm::mpi::MpiComm {
    type Device = CpuCompute;
    fn device(&self, dtype: DType, threads: usize) -> CommResult<CpuCompute> {
        cpu_device(dtype, threads)
    }
    fn library(&self) -> Option<String> {
        Some(crate::comm::mpi::MpiComm::library(self).to_string())
    }
}

#[cfg(feature = "cuda")]
impl RankComm for crate::comm::nccl::NcclComm {
    type Device = crate::compute::cuda::CudaCompute;
    fn device(&self, dtype: DType, _threads: usize) -> CommResult<Self::Device> {
        let mut dev = crate::compute::cuda::CudaCompute::on(self.gpu().clone(), dtype)
            .map_err(|e| CommError::Device(e.to_string()))?;
        dev.set_timeout(self.timeout());
        Ok(dev)
    }
}

/// The CPU beside host buffers (local, tcp and mpi ranks).
fn cpu_device(dtype: DType, threads: usize) -> CommResult<CpuCompute> {
    CpuCompute::new(dtype, threads).map_err(|e| CommError::Device(e.to_string()))
}

/// How a job ended on this process.
#[derive(Debug)]
pub enum Ended<T> {
    /// This process ran ranks; what each returned, in rank order.
    Ran(Vec<T>),
    /// This process spawned the ranks and they ended: exit with this code
    /// (0, or the first failed rank's, which the launcher already named),
    /// and that failure in the launcher's words (for the run's record:
    /// [`crate::results::record_seen_death`]).
    Launched { code: i32, failure: Option<String> },
}

/// A job that failed: the fault to report.
#[derive(Debug, thiserror::Error)]
pub enum JobFault {
    /// A rank of this process failed, named once: the root cause among
    /// this process's ranks (see `first_fault`), or its one rank's error.
    #[error("{}", rank_line(*.rank, &.error.to_string()))]
    Rank { rank: usize, error: CommError },
    /// This process's one rank could not join its `backend`'s job (a
    /// library's communicator, whose own errors do not say so).
    #[error("{}", rank_line(*.rank, &format!("joining the {} job: {}", .backend, .error)))]
    JoinFailed {
        rank: usize,
        backend: &'static str,
        error: CommError,
    },
    /// Starting the ranks failed.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// Starting the communicators of this process's ranks failed, before
    /// any rank ran (MPI's start, NCCL's for every GPU at once): the
    /// library's own message (as the error itself, so that a report of its
    /// chain does not print it twice).
    #[error(transparent)]
    Start(#[from] CommError),
    /// The build lacks the backend (bad input: exit code 2).
    #[error("{0}")]
    Unavailable(#[source] super::UsageError),
}

/// Starts the ranks `ranks` describes, runs `body` on each, and returns
/// what this process's ranks returned, or the first real fault.
pub fn run<B: RankBody>(
    ranks: Ranks,
    algo: Algo,
    timeout: Duration,
    body: &B,
) -> Result<Ended<B::Out>, JobFault> {
    match ranks {
        Ranks::Here { backend, n } if backend.on_gpus() => run_gpus(n, timeout, body),
        Ranks::Here { n, .. } => {
            let results = crate::comm::local::run(n, algo, timeout, |c| body.run(c));
            Ok(Ended::Ran(first_fault(results)?))
        }
        Ranks::Spawn(world) => {
            open_files(world)?;
            let (code, failure) = spawn_ranks(world)?;
            Ok(Ended::Launched { code, failure })
        }
        Ranks::Job(job) => {
            open_files(job.ranks())?;
            Ok(Ended::Launched {
                code: super::exit_code(job.run()?),
                failure: None,
            })
        }
        Ranks::Joined { backend, info } if backend.on_gpus() => {
            with_token(&info)?;
            run_nccl_joined(info, timeout, body)
        }
        Ranks::Joined { info, .. } => {
            open_files(info.world)?;
            with_token(&info)?;
            let rank = info.rank;
            let joined = |error| JobFault::Rank { rank, error };
            let mut comm = crate::comm::tcp::comm(&info, algo, timeout).map_err(joined)?;
            Ok(Ended::Ran(vec![body.run(&mut comm).map_err(joined)?]))
        }
        Ranks::LibraryWorld { .. } => run_mpi(timeout, body),
    }
}

/// Refuses to join a job over the rendezvous store with the fixed, public
/// default token (a job started by hand: no launcher's job id, no
/// `PARBENCH_JOB_TOKEN`): any local user could register as one of its
/// ranks, receive rank 0's handshake and stop the job. `--nprocs` jobs and
/// launchers' jobs have a token of their own; a hand-started job names one.
fn with_token(info: &RankInfo) -> Result<(), JobFault> {
    if info.token_from != "default" {
        return Ok(());
    }
    Err(JobFault::Unavailable(super::UsageError(format!(
        "rank {}: a job started by hand ({} variables, no launcher's job id) needs PARBENCH_JOB_TOKEN set to one secret its ranks share: without one, any local user could join it as a rank",
        info.rank, info.source
    ))))
}

/// [`crate::limits::check_open_files`] as a job's refusal (exit 2).
fn open_files(world: usize) -> Result<(), JobFault> {
    crate::limits::check_open_files(world).map_err(|e| JobFault::Unavailable(e.into()))
}

#[cfg(feature = "mpi")]
fn run_mpi<B: RankBody>(timeout: Duration, body: &B) -> Result<Ended<B::Out>, JobFault> {
    let mut comm = crate::comm::mpi::MpiComm::init(timeout)?;
    let rank = comm.rank();
    let out = body
        .run(&mut comm)
        .map_err(|error| JobFault::Rank { rank, error })?;
    Ok(Ended::Ran(vec![out]))
}

#[cfg(not(feature = "mpi"))]
fn run_mpi<B: RankBody>(_: Duration, _: &B) -> Result<Ended<B::Out>, JobFault> {
    unavailable(Backend::Mpi)
}

#[cfg(feature = "cuda")]
fn run_gpus<B: RankBody>(
    world: usize,
    timeout: Duration,
    body: &B,
) -> Result<Ended<B::Out>, JobFault> {
    let ordinals: Vec<usize> = (0..world).collect();
    let comms = crate::comm::nccl::NcclComm::init_all(&ordinals, timeout)?;
    Ok(Ended::Ran(first_fault(on_threads(comms, |c| body.run(c)))?))
}

#[cfg(feature = "cuda")]
fn run_nccl_joined<B: RankBody>(
    info: RankInfo,
    timeout: Duration,
    body: &B,
) -> Result<Ended<B::Out>, JobFault> {
    let rank = info.rank;
    let mut comm = crate::comm::nccl::NcclComm::join(&info, timeout).map_err(|error| {
        JobFault::JoinFailed {
            rank,
            backend: "nccl",
            error,
        }
    })?;
    let out = body
        .run(&mut comm)
        .map_err(|error| JobFault::Rank { rank, error })?;
    Ok(Ended::Ran(vec![out]))
}

/// `backend`, which this build lacks, refused
/// ([`super::flags::Backend::require_built`]).
#[cfg(not(all(feature = "cuda", feature = "mpi")))]
fn unavailable<T>(backend: Backend) -> Result<T, JobFault> {
    Err(JobFault::Unavailable(backend.not_built()))
}

#[cfg(not(feature = "cuda"))]
fn run_gpus<B: RankBody>(_: usize, _: Duration, _: &B) -> Result<Ended<B::Out>, JobFault> {
    unavailable(Backend::Nccl)
}

#[cfg(not(feature = "cuda"))]
fn run_nccl_joined<B: RankBody>(
    _: RankInfo,
    _: Duration,
    _: &B,
) -> Result<Ended<B::Out>, JobFault> {
    unavailable(Backend::Nccl)
}

/// Spawns `world` ranks of this binary on loopback with the same arguments
/// and waits for them: 0, or the exit code of the first rank that failed
/// (the launcher already named it on stderr).
fn spawn_ranks(world: usize) -> Result<(i32, Option<String>), LaunchError> {
    // The ranks take this process's run id, so that the record a dead
    // rank 0 left unended is the one its launcher completes.
    let run_id = crate::results::job_run_id().unwrap_or_default();
    match super::spawn_local_ranks(world, &[(crate::results::RUN_ID_VAR, run_id)]) {
        Ok(status) => Ok((super::exit_code(status), None)),
        Err(e @ LaunchError::RankFailed { .. }) => Ok((e.exit_code(), Some(e.to_string()))),
        Err(e) => Err(e),
    }
}

/// Runs `body` on one thread per communicator (one per GPU of this
/// process); a thread that panics is that rank's error.
#[cfg(any(feature = "cuda", test))]
fn on_threads<C, R, F>(comms: Vec<C>, body: F) -> Vec<CommResult<R>>
where
    C: Communicator,
    R: Send,
    F: Fn(&mut C) -> CommResult<R> + Sync,
{
    crate::comm::local::thread_per_rank(
        comms,
        |mut c| body(&mut c),
        |rank| CommError::Device(format!("rank {rank}: its thread panicked")),
    )
}

/// What every rank returned, in rank order (`results[r]` is rank r's),
/// or the root cause of the failure: the lowest rank whose error is its own
/// (see [`blame`]), else the lowest rank whose wait passed its deadline or
/// whose peer broke the protocol, else the lowest rank that lost a peer.
fn first_fault<T>(results: Vec<CommResult<T>>) -> Result<Vec<T>, JobFault> {
    let mut outs = Vec::with_capacity(results.len());
    let mut fault: Option<(Blame, usize, CommError)> = None;
    for (rank, r) in results.into_iter().enumerate() {
        match r {
            Ok(v) => outs.push(v),
            Err(error) => {
                let b = blame(&error, rank);
                // Strictly less: among equals, the lowest rank stays.
                if fault.as_ref().is_none_or(|(was, ..)| b < *was) {
                    fault = Some((b, rank, error));
                }
            }
        }
    }
    match fault {
        None => Ok(outs),
        Some((_, rank, error)) => Err(JobFault::Rank { rank, error }),
    }
}

/// How well a rank's error explains a failed job, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Blame {
    /// Its own fault (a device, a check, bad arguments, its own set-up):
    /// the others' errors follow from it.
    Own,
    /// It waited for a peer past the deadline, or a peer sent it something
    /// that breaks the protocol: about another rank, which may have failed.
    Peer,
    /// It lost a peer: the loss another rank's fault (or death) caused.
    Lost,
}

/// Which [`Blame`] `rank`'s `error` earns: the errors that name a peer
/// other than this rank are about that peer.
fn blame(error: &CommError, rank: usize) -> Blame {
    match error {
        CommError::PeerLost { .. } => Blame::Lost,
        CommError::Timeout { .. } => Blame::Peer,
        CommError::Protocol { peer, .. } if *peer != rank => Blame::Peer,
        _ => Blame::Own,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lost(rank: usize) -> CommError {
        CommError::PeerLost {
            rank,
            peer: 1,
            op: "all_reduce",
            detail: "gone".into(),
        }
    }

    fn timed_out(rank: usize) -> CommError {
        CommError::Timeout {
            rank,
            peer: 2,
            op: "all_reduce",
            after: Duration::from_secs(1),
        }
    }

    /// The rank and the line of the fault `results` report.
    fn fault_of(results: Vec<CommResult<u8>>) -> (usize, String) {
        match first_fault(results).unwrap_err() {
            e @ JobFault::Rank { rank, .. } => (rank, e.to_string()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_root_cause_wins_over_the_peers_it_lost() {
        let (rank, line) = fault_of(vec![
            Err(lost(0)),
            Err(CommError::Device("rank 1: out of memory".into())),
            Err(lost(2)),
        ]);
        assert_eq!((rank, line.as_str()), (1, "rank 1: out of memory"));
        // Only losses: the lowest rank's.
        let (rank, line) = fault_of(vec![Ok(1), Err(lost(1)), Err(lost(2))]);
        assert_eq!(rank, 1, "{line}");
        assert!(line.starts_with("rank 1: lost rank 1"), "{line}");
        assert_eq!(first_fault::<u8>(vec![Ok(1), Ok(2)]).unwrap(), vec![1, 2]);
    }

    #[test]
    fn a_ranks_own_fault_wins_over_the_waits_it_caused_and_is_named_once() {
        // Rank 2's check failed; rank 0 waited for it past the deadline and
        // rank 1 lost it: rank 2's own error is the cause, its rank added once.
        let (rank, line) = fault_of(vec![
            Err(timed_out(0)),
            Err(lost(1)),
            Err(CommError::Device("the block differs".into())),
        ]);
        assert_eq!((rank, line.as_str()), (2, "rank 2: the block differs"));
        // A wait past its deadline explains more than a lost peer.
        let (rank, _) = fault_of(vec![Err(lost(0)), Ok(1), Err(timed_out(2))]);
        assert_eq!(rank, 2);
        // A protocol error a rank found in its own work is its own fault;
        // one a peer caused is about that peer.
        let own = CommError::Protocol {
            rank: 1,
            peer: 1,
            detail: "schedule".into(),
        };
        let (rank, _) = fault_of(vec![Err(timed_out(0)), Err(own)]);
        assert_eq!(rank, 1);
        let from_peer = CommError::Protocol {
            rank: 0,
            peer: 1,
            detail: "short message".into(),
        };
        let (rank, _) = fault_of(vec![Err(from_peer), Err(timed_out(1))]);
        assert_eq!(rank, 0, "equals: the lowest rank");
    }

    struct RankTimesTen;
    impl RankBody for RankTimesTen {
        type Out = usize;
        fn run<C: RankComm>(&self, comm: &mut C) -> CommResult<usize> {
            comm.barrier()?;
            Ok(comm.rank() * 10)
        }
    }

    struct FailsOnRank(usize);
    impl RankBody for FailsOnRank {
        type Out = ();
        fn run<C: Communicator>(&self, comm: &mut C) -> CommResult<()> {
            if comm.rank() == self.0 {
                return Err(CommError::Device(format!("rank {}: injected", self.0)));
            }
            // The others wait for the failed rank and lose it.
            comm.barrier()
        }
    }

    /// Each rank uploads (rank, 1) to the device its communicator gives,
    /// adds it to itself there, and all-reduces the device's buffer: the
    /// device's tensors are the communicator's buffers.
    struct SumsOnItsDevice;
    impl RankBody for SumsOnItsDevice {
        type Out = Vec<f32>;
        fn run<C: RankComm>(&self, comm: &mut C) -> CommResult<Vec<f32>> {
            let on_device = |e: crate::compute::ComputeError| CommError::Device(e.to_string());
            let dev = comm.device(DType::F32, 1)?;
            let mut x = dev.alloc(2).map_err(on_device)?;
            let y = {
                let mut y = dev.alloc(2).map_err(on_device)?;
                dev.upload(&[comm.rank() as f32, 1.0], &mut y)
                    .map_err(on_device)?;
                y
            };
            dev.add(&mut x, &y, 2).map_err(on_device)?;
            dev.add(&mut x, &y, 2).map_err(on_device)?;
            comm.all_reduce(
                crate::comm::Io::InPlace(&mut x),
                2,
                DType::F32,
                crate::comm::ReduceOp::Sum,
            )?;
            let mut out = vec![0f32; 2];
            dev.download(&x, &mut out).map_err(on_device)?;
            Ok(out)
        }
    }

    #[test]
    fn a_body_computes_on_the_device_beside_its_communicator() {
        let t = Duration::from_secs(20);
        match run(Ranks::threads(3), Algo::Auto, t, &SumsOnItsDevice).unwrap() {
            // 2 x (0 + 1 + 2) and 2 x (1 + 1 + 1) on every rank.
            Ended::Ran(v) => assert_eq!(v, vec![vec![6.0, 6.0]; 3]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn threads_run_the_body_and_report_the_failing_rank() {
        let t = Duration::from_secs(20);
        match run(Ranks::threads(3), Algo::Auto, t, &RankTimesTen).unwrap() {
            Ended::Ran(v) => assert_eq!(v, vec![0, 10, 20]),
            other => panic!("{other:?}"),
        }
        let e = run(Ranks::threads(4), Algo::Auto, t, &FailsOnRank(2)).unwrap_err();
        assert!(e.to_string().contains("rank 2: injected"), "{e}");
    }

    #[test]
    fn one_thread_per_communicator_and_a_panic_is_an_error() {
        let comms: Vec<_> = crate::comm::local::LocalTransport::world(2)
            .into_iter()
            .map(|t| crate::comm::HostComm::new(t, Algo::Auto, Duration::from_secs(5)))
            .collect();
        let out = on_threads(comms, |c| {
            if c.rank() == 1 {
                panic!("injected");
            }
            Ok(c.rank())
        });
        assert_eq!(*out[0].as_ref().unwrap(), 0);
        assert!(out[1].as_ref().unwrap_err().to_string().contains("rank 1"));
    }
}
