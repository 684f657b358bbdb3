//! The one decision of how a job's ranks start, from the backend its flag
//! names and what the job asks for: every binary describes its job
//! ([`Wanted`]) and hands over the backend; the launcher answers with the
//! [`Ranks`] that [`super::ranks::run`] starts. A backend this build lacks
//! is refused here ([`Backend::require_built`]), and so is a machine
//! without the GPUs asked for, before anything runs.
//!
//! What the GPUs are (their number, memory, names and library versions)
//! is asked here too, so that no binary needs a build feature to ask it:
//! without `cuda` there are none.

use super::flags::Backend;
use super::ranks::Ranks;
use super::{LocalJob, RankInfo, UsageError};
use crate::results::RunMeta;

/// What a job asks of the launcher, beside its backend.
pub struct Wanted<'a> {
    /// The ranks asked for (`-np`): threads, or processes to spawn.
    pub ranks: Option<usize>,
    /// The GPUs this process drives when no launcher started it; every
    /// visible one when `None`.
    pub gpus: Option<usize>,
    /// The ranks when none are asked for, on the CPU backends.
    pub default: usize,
    /// Spawned under tcp: this job rather than `ranks` copies of this
    /// binary with its own arguments (a binary that runs one job per
    /// configuration names each, see [`Ranks::Job`]).
    pub job: Option<LocalJob>,
    /// The line that refuses `(asked, visible)` GPUs, in the binary's own
    /// flag's words.
    pub too_many_gpus: &'a dyn Fn(usize, usize) -> String,
}

impl Ranks {
    /// How the ranks of a job on `backend` start: under a launcher
    /// (`joined`) each process is one rank of its job (tcp, or nccl on one
    /// GPU); otherwise threads (local), spawned processes (tcp) or this
    /// process's GPUs (nccl, one thread each); under mpirun MPI's own ranks.
    /// `auto` is tcp under a launcher, local otherwise.
    pub fn choose(
        backend: Backend,
        joined: Option<RankInfo>,
        wanted: Wanted<'_>,
    ) -> Result<Ranks, UsageError> {
        let backend = backend.resolve(joined.is_some());
        backend.require_built()?;
        let asked = wanted.ranks.unwrap_or(wanted.default);
        Ok(match (backend, joined) {
            (Backend::Auto | Backend::Local, _) => Ranks::threads(asked),
            (Backend::Tcp, Some(info)) => Ranks::Joined { backend, info },
            (Backend::Tcp, None) => match wanted.job {
                Some(job) => Ranks::Job(job),
                None => Ranks::Spawn(asked),
            },
            (Backend::Nccl, joined) => {
                // Before any CUDA call: no driver or no NCCL is one line
                // (the probe only looks the symbols up; it calls nothing).
                gpus::require_nccl()?;
                if let Some(info) = joined {
                    return Ok(Ranks::Joined { backend, info });
                }
                let visible = visible_gpus()?;
                let world = wanted.gpus.unwrap_or(visible);
                if world == 0 || world > visible {
                    return Err(UsageError((wanted.too_many_gpus)(world, visible)));
                }
                Ranks::Here { backend, n: world }
            }
            (Backend::Mpi, _) => Ranks::LibraryWorld { backend },
        })
    }

    /// `n` threads of this process over shared memory (`--backend local`).
    pub fn threads(n: usize) -> Ranks {
        Ranks::Here {
            backend: Backend::Local,
            n,
        }
    }

    /// The ranks of the job, where known before it starts (under mpi the
    /// world is MPI's, known once it has started).
    pub fn world(&self) -> Option<usize> {
        match self {
            Ranks::Here { n, .. } | Ranks::Spawn(n) => Some(*n),
            Ranks::Job(job) => Some(job.ranks()),
            Ranks::Joined { info, .. } => Some(info.world),
            Ranks::LibraryWorld { .. } => None,
        }
    }

    /// The backend these ranks run, as the records name it: spawned ranks
    /// join over tcp.
    pub fn backend(&self) -> Backend {
        match self {
            Ranks::Here { backend, .. }
            | Ranks::Joined { backend, .. }
            | Ranks::LibraryWorld { backend } => *backend,
            Ranks::Spawn(_) | Ranks::Job(_) => Backend::Tcp,
        }
    }

    /// This process's rank in a job a launcher started, if it is one
    /// process of one.
    pub fn joined(&self) -> Option<&RankInfo> {
        match self {
            Ranks::Joined { info, .. } => Some(info),
            _ => None,
        }
    }
}

/// The ranks of a job that asks for none: every visible GPU on nccl (a
/// machine without them, or a build without CUDA, is one line, exit code
/// 2), the launcher's world under a launcher (`joined`), else `cpus`.
pub fn default_ranks(
    backend: Backend,
    joined: Option<&RankInfo>,
    cpus: usize,
) -> Result<usize, UsageError> {
    match backend.resolve(joined.is_some()) {
        Backend::Nccl => {
            backend.require_built()?;
            visible_gpus().map_err(|e| UsageError(format!("--backend nccl: {e}")))
        }
        _ => Ok(joined.map_or(cpus, |info| info.world)),
    }
}

/// The GPUs this process sees; a machine without a driver (or a build
/// without CUDA) is one line, exit code 2.
pub fn visible_gpus() -> Result<usize, UsageError> {
    gpus::count()
}

/// GPU `ordinal`'s memory in bytes, `None` where it cannot be asked (no
/// driver, no such GPU, a build without CUDA).
pub fn gpu_memory(ordinal: usize) -> Option<u64> {
    gpus::memory(ordinal)
}

/// What run.json records of a GPU run: the GPUs' names and the versions of
/// NCCL and the CUDA driver, each where it can be asked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuFacts {
    pub names: Vec<String>,
    pub nccl: Option<String>,
    pub cuda_driver: Option<String>,
}

/// The GPUs and libraries of this machine ([`GpuFacts`]).
pub fn gpu_facts() -> GpuFacts {
    gpus::facts()
}

/// The record a run starts ([`RunMeta::start`]); when `backend` runs its
/// ranks on GPUs, with the GPUs' names and NCCL's and the CUDA driver's
/// versions ([`GpuFacts`]), so that a run cut short records them too.
pub fn run_meta(suite: &str, run_id: &str, backend: Backend, world: usize) -> RunMeta {
    let mut m = RunMeta::start(suite, run_id, backend.name(), world);
    if backend.on_gpus() {
        let facts = gpu_facts();
        m.gpus = facts.names;
        if let Some(v) = facts.nccl {
            m.versions.insert("nccl".into(), v);
        }
        if let Some(v) = facts.cuda_driver {
            m.versions.insert("cuda_driver".into(), v);
        }
    }
    m
}

#[cfg(feature = "cuda")]
mod gpus {
    use super::{GpuFacts, UsageError};
    use crate::gpu::{self, Lib};

    pub fn require_nccl() -> Result<(), UsageError> {
        gpu::require(&[Lib::Driver, Lib::Nccl])
            .map(|_| ())
            .map_err(|e| UsageError(e.to_string()))
    }

    pub fn count() -> Result<usize, UsageError> {
        gpu::device_count().map_err(|e| UsageError(e.to_string()))
    }

    pub fn memory(ordinal: usize) -> Option<u64> {
        gpu::device_memory(ordinal).ok()
    }

    pub fn facts() -> GpuFacts {
        GpuFacts {
            names: gpu::device_names().unwrap_or_default(),
            nccl: crate::comm::nccl::nccl_version().ok(),
            cuda_driver: gpu::driver_version().ok(),
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod gpus {
    use super::{Backend, GpuFacts, UsageError};

    fn refused<T>() -> Result<T, UsageError> {
        Err(Backend::Nccl.not_built())
    }

    pub fn require_nccl() -> Result<(), UsageError> {
        refused()
    }

    pub fn count() -> Result<usize, UsageError> {
        refused()
    }

    pub fn memory(_: usize) -> Option<u64> {
        None
    }

    pub fn facts() -> GpuFacts {
        GpuFacts::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(ranks: Option<usize>) -> Wanted<'static> {
        Wanted {
            ranks,
            gpus: None,
            default: 3,
            job: None,
            too_many_gpus: &|asked, visible| format!("{asked} of {visible}"),
        }
    }

    fn joined() -> RankInfo {
        RankInfo::from_vars(|k| match k {
            "RANK" => Some("1".into()),
            "WORLD_SIZE" => Some("2".into()),
            _ => None,
        })
        .unwrap()
        .unwrap()
    }

    #[test]
    fn auto_is_tcp_under_a_launcher_and_local_otherwise() {
        let r = Ranks::choose(Backend::Auto, None, wanted(None)).unwrap();
        assert!(
            matches!(
                r,
                Ranks::Here {
                    backend: Backend::Local,
                    n: 3
                }
            ),
            "{r:?}"
        );
        let r = Ranks::choose(Backend::Auto, Some(joined()), wanted(None)).unwrap();
        assert!(
            matches!(&r, Ranks::Joined { info, .. } if info.rank == 1),
            "{r:?}"
        );
        assert_eq!((r.backend(), r.world()), (Backend::Tcp, Some(2)));
    }

    #[test]
    fn each_backend_starts_its_own_ranks() {
        let r = Ranks::choose(Backend::Local, Some(joined()), wanted(Some(5))).unwrap();
        assert!(
            matches!(
                r,
                Ranks::Here {
                    backend: Backend::Local,
                    n: 5
                }
            ),
            "{r:?}"
        );
        let r = Ranks::choose(Backend::Tcp, None, wanted(Some(4))).unwrap();
        assert!(matches!(r, Ranks::Spawn(4)), "{r:?}");
        let job = LocalJob::new(2, "/bin/true", ["x"]);
        let with_job = Wanted {
            job: Some(job),
            ..wanted(None)
        };
        let r = Ranks::choose(Backend::Tcp, None, with_job).unwrap();
        assert!(matches!(r, Ranks::Job(_)), "{r:?}");
        assert_eq!(r.world(), Some(2));
        match Ranks::choose(Backend::Mpi, None, wanted(None)) {
            Ok(r) => assert_eq!((r.backend(), r.world()), (Backend::Mpi, None)),
            Err(e) => assert!(!cfg!(feature = "mpi") && e.0.contains("--features mpi")),
        }
        if !cfg!(feature = "cuda") {
            let e = Ranks::choose(Backend::Nccl, None, wanted(None)).unwrap_err();
            assert!(e.0.contains("--features cuda"), "{e}");
        }
    }
}
