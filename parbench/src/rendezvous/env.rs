//! Rank discovery from the variables each launcher sets.

use super::RendezvousError;
use std::fmt;

/// `MASTER_ADDR` when a launcher family sets none (mpirun, PMI, srun): one host.
pub const DEFAULT_MASTER_ADDR: &str = "127.0.0.1";
/// `MASTER_PORT` when none is set: torchrun's default.
pub const DEFAULT_MASTER_PORT: u16 = 29500;
/// The job token when neither `PARBENCH_JOB_TOKEN` nor a launcher job id is
/// set: public, so no rank joins a job over the store with it (the launcher
/// refuses, see `launch::ranks`); it stays for the backends that never
/// meet there (mpi).
pub const DEFAULT_TOKEN: &str = "parbench-default-token";

/// The largest world size accepted from the environment: far beyond any job
/// parbench runs, small enough that tables sized by it stay small.
const MAX_WORLD: usize = 65_536;

/// Which launcher's variables gave the rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaunchSource {
    /// `--nprocs` (this crate's `launch::spawn_local_ranks`); sets torchrun's variables too.
    Spawned,
    /// torchrun / torch.distributed: `RANK`, `WORLD_SIZE`.
    Torchrun,
    /// Open MPI's mpirun: `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`.
    OpenMpi,
    /// A PMI launcher (MPICH / Intel MPI hydra): `PMI_RANK`, `PMI_SIZE`.
    Pmi,
    /// Slurm's srun: `SLURM_PROCID`, `SLURM_NTASKS`.
    Slurm,
}

impl fmt::Display for LaunchSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LaunchSource::Spawned => "--nprocs",
            LaunchSource::Torchrun => "torchrun",
            LaunchSource::OpenMpi => "mpirun (Open MPI)",
            LaunchSource::Pmi => "PMI",
            LaunchSource::Slurm => "srun",
        })
    }
}

/// Who this process is in a multi-process job, and where the job meets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankInfo {
    /// This process's rank, in `0..world`.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
    /// Rank among the processes on this host (`LOCAL_RANK`,
    /// `OMPI_COMM_WORLD_LOCAL_RANK`, `MPI_LOCALRANKID`, `SLURM_LOCALID`): the GPU index.
    pub local_rank: Option<usize>,
    /// Host of rank 0's rendezvous store (`MASTER_ADDR`).
    pub master_addr: String,
    /// Port of rank 0's rendezvous store (`MASTER_PORT`).
    pub master_port: u16,
    /// The per-job token every connection of the job must carry.
    pub token: String,
    /// Where the token came from (the variable's name, or `default`).
    pub token_from: &'static str,
    /// Which launcher's variables gave the rank.
    pub source: LaunchSource,
}

impl RankInfo {
    /// Reads the rank from this process's environment; `Ok(None)` when no
    /// launcher variables are set (a single process). Half-set or
    /// inconsistent variables are an error naming them.
    pub fn from_env() -> Result<Option<RankInfo>, RendezvousError> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// [`RankInfo::from_env`] over any variable lookup (tests pass a map).
    ///
    /// Families are tried in this order, so that the launcher nearest to
    /// the process wins (torchrun started by srun, mpirun inside a Slurm
    /// allocation): `RANK`/`WORLD_SIZE`, `OMPI_COMM_WORLD_*`, `PMI_*`,
    /// `SLURM_PROCID`/`SLURM_NTASKS` (`SLURM_STEP_NUM_TASKS` when set).
    pub fn from_vars(
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<RankInfo>, RendezvousError> {
        let get = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let slurm_world = if get("SLURM_STEP_NUM_TASKS").is_some() {
            "SLURM_STEP_NUM_TASKS"
        } else {
            "SLURM_NTASKS"
        };
        let families: [(
            LaunchSource,
            &'static str,
            &'static str,
            &'static str,
            &'static str,
        ); 4] = [
            (
                LaunchSource::Torchrun,
                "torchrun",
                "RANK",
                "WORLD_SIZE",
                "LOCAL_RANK",
            ),
            (
                LaunchSource::OpenMpi,
                "Open MPI",
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
            ),
            (
                LaunchSource::Pmi,
                "PMI",
                "PMI_RANK",
                "PMI_SIZE",
                "MPI_LOCALRANKID",
            ),
            (
                LaunchSource::Slurm,
                "Slurm",
                "SLURM_PROCID",
                slurm_world,
                "SLURM_LOCALID",
            ),
        ];
        for (mut source, family, rank_var, world_var, local_var) in families {
            let (rank_s, world_s) = (get(rank_var), get(world_var));
            let (rank_s, world_s) = match (rank_s, world_s) {
                (None, None) => continue,
                (Some(_), None) => {
                    return Err(RendezvousError::HalfSet {
                        family,
                        set: rank_var,
                        missing: world_var,
                    })
                }
                (None, Some(_)) if source == LaunchSource::Slurm => continue, // an allocation, not a step
                (None, Some(_)) => {
                    return Err(RendezvousError::HalfSet {
                        family,
                        set: world_var,
                        missing: rank_var,
                    })
                }
                (Some(r), Some(w)) => (r, w),
            };
            let rank = parse_num(rank_var, &rank_s)?;
            let world = parse_num(world_var, &world_s)?;
            if world == 0 || world > MAX_WORLD {
                return Err(RendezvousError::BadVar {
                    var: world_var,
                    value: world_s,
                    why: format!("must be between 1 and {MAX_WORLD}"),
                });
            }
            if rank >= world {
                return Err(RendezvousError::RankOutOfRange {
                    rank_var,
                    rank,
                    world_var,
                    world,
                });
            }
            let local_rank = match get(local_var) {
                Some(v) => Some(parse_num(local_var, &v)?),
                None => None,
            };
            check_launch_vars(&get)?;
            let master_addr = get("MASTER_ADDR").unwrap_or_else(|| DEFAULT_MASTER_ADDR.to_string());
            let master_port = match get("MASTER_PORT") {
                Some(v) => match v.trim().parse::<u16>() {
                    Ok(p) if p > 0 => p,
                    _ => {
                        return Err(RendezvousError::BadVar {
                            var: "MASTER_PORT",
                            value: v,
                            why: "not a port number (1-65535)".into(),
                        })
                    }
                },
                None => DEFAULT_MASTER_PORT,
            };
            if source == LaunchSource::Torchrun && get("PARBENCH_SPAWNED").is_some() {
                source = LaunchSource::Spawned;
            }
            let (token, token_from) = job_token(&get);
            if token.len() > super::store::MAX_TOKEN {
                return Err(too_long_token(token_from, token));
            }
            return Ok(Some(RankInfo {
                rank,
                world,
                local_rank,
                master_addr,
                master_port,
                token,
                token_from,
                source,
            }));
        }
        Ok(None)
    }

    /// Whether this rank prints results on stdout: rank 0 only.
    pub fn prints(&self) -> bool {
        self.rank == 0
    }
}

/// The variables that say how many ranks a launcher put on this host, in
/// the order [`RankInfo::from_vars`] tries the launchers (the nearest one
/// wins): torchrun's, Open MPI's, MPICH/Hydra's, then Slurm's (set only
/// with `--ntasks-per-node`).
pub const LOCAL_SIZE_VARS: [&str; 4] = [
    "LOCAL_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MPI_LOCALNRANKS",
    "SLURM_NTASKS_PER_NODE",
];

/// How many ranks of a job of `world` ranks run on this host: the first
/// of [`LOCAL_SIZE_VARS`] that holds a count of 1 or more, else `world`
/// (a launcher that says nothing may have put every rank here, and the
/// memory check and the cores' split must hold then too).
pub fn ranks_on_this_host(world: usize) -> usize {
    ranks_on_this_host_from(|k| std::env::var(k).ok(), world)
}

/// [`ranks_on_this_host`] over any variable lookup (tests pass a map).
pub fn ranks_on_this_host_from(get: impl Fn(&str) -> Option<String>, world: usize) -> usize {
    LOCAL_SIZE_VARS
        .iter()
        .find_map(|k| get(k)?.trim().parse::<usize>().ok().filter(|&n| n >= 1))
        .unwrap_or(world)
}

/// The job token: `PARBENCH_JOB_TOKEN`, else an id the launcher gives every
/// process of one job, else [`DEFAULT_TOKEN`].
fn job_token(get: &impl Fn(&str) -> Option<String>) -> (String, &'static str) {
    const SOURCES: [&str; 6] = [
        "PARBENCH_JOB_TOKEN",
        "TORCHELASTIC_RUN_ID",
        "PMIX_NAMESPACE",
        "OMPI_MCA_ess_base_jobid",
        "PMI_KVSNAME",
        "SLURM_JOB_ID",
    ];
    for var in SOURCES {
        if let Some(v) = get(var) {
            if var == "SLURM_JOB_ID" {
                // Steps of one allocation share the job id; the step id tells them apart.
                let step = get("SLURM_STEP_ID").unwrap_or_default();
                return (format!("slurm-{}.{}", v.trim(), step.trim()), var);
            }
            return (v, var);
        }
    }
    (DEFAULT_TOKEN.to_string(), "default")
}

/// The refusal of a job token longer than the store's greeting carries.
fn too_long_token(var: &'static str, value: String) -> RendezvousError {
    RendezvousError::BadVar {
        var,
        why: format!(
            "{} bytes, longer than the {} a job token may hold",
            value.len(),
            super::store::MAX_TOKEN
        ),
        value,
    }
}

/// Checks the launch variables a user sets by hand, wherever they are set
/// (a launcher passes them on to the ranks it starts), before anything
/// starts: `MASTER_ADDR` a host name or an address without a port,
/// `MASTER_PORT` a port, `PARBENCH_JOB_TOKEN` one the store's greeting
/// carries. Each refusal names its variable.
pub fn check_launch_vars(get: &impl Fn(&str) -> Option<String>) -> Result<(), RendezvousError> {
    if let Some(addr) = get("MASTER_ADDR") {
        if let Some(why) = bad_host(&addr) {
            return Err(RendezvousError::BadVar {
                var: "MASTER_ADDR",
                value: addr,
                why,
            });
        }
    }
    if let Some(v) = get("MASTER_PORT") {
        if !matches!(v.trim().parse::<u16>(), Ok(p) if p > 0) {
            return Err(RendezvousError::BadVar {
                var: "MASTER_PORT",
                value: v,
                why: "not a port number (1-65535)".into(),
            });
        }
    }
    if let Some(t) = get("PARBENCH_JOB_TOKEN") {
        if t.len() > super::store::MAX_TOKEN {
            return Err(too_long_token("PARBENCH_JOB_TOKEN", t));
        }
    }
    Ok(())
}

/// Why `addr` is not a host for `MASTER_ADDR`, if it is not: an IP
/// address (IPv6 with or without brackets) or a host name (letters,
/// digits, `-`, `_`, `.`, at most 253), never with a port.
fn bad_host(addr: &str) -> Option<String> {
    let a = addr.trim();
    let bare = a
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(a);
    if bare.parse::<std::net::IpAddr>().is_ok() {
        return None;
    }
    if a.parse::<std::net::SocketAddr>().is_ok()
        || a.rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        return Some(
            "holds a port: MASTER_ADDR is the host alone, the port goes in MASTER_PORT".into(),
        );
    }
    let name_ok = !a.is_empty()
        && a.len() <= 253
        && a.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    (!name_ok).then(|| "not a host name or IP address".into())
}

fn parse_num(var: &'static str, value: &str) -> Result<usize, RendezvousError> {
    value
        .trim()
        .parse::<usize>()
        .map_err(|_| RendezvousError::BadVar {
            var,
            value: value.to_string(),
            why: "not a non-negative integer".into(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn launch_variables_that_would_fail_after_start_are_refused_first() {
        // Was: both passed here and failed once the job had started, exit 1.
        let long = "t".repeat(2000);
        for (pairs, var) in [
            (vec![("MASTER_ADDR", "127.0.0.1:29500")], "MASTER_ADDR"),
            (vec![("MASTER_ADDR", "node7:29500")], "MASTER_ADDR"),
            (vec![("MASTER_ADDR", "a b")], "MASTER_ADDR"),
            (
                vec![("PARBENCH_JOB_TOKEN", long.as_str())],
                "PARBENCH_JOB_TOKEN",
            ),
        ] {
            let err = check_launch_vars(&vars(&pairs)).unwrap_err();
            assert!(err.to_string().contains(var), "{err}");
            assert_eq!(err.exit_code(), 2);
            let mut with_rank = pairs.clone();
            with_rank.extend([("RANK", "0"), ("WORLD_SIZE", "2")]);
            assert!(RankInfo::from_vars(vars(&with_rank)).is_err());
        }
        for ok in [
            "node7",
            "10.0.0.1",
            "::1",
            "[fe80::1]",
            "host-a.example.org",
        ] {
            check_launch_vars(&vars(&[("MASTER_ADDR", ok)])).unwrap();
        }
        let err = RankInfo::from_vars(vars(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("TORCHELASTIC_RUN_ID", long.as_str()),
        ]))
        .unwrap_err();
        assert!(err.to_string().contains("TORCHELASTIC_RUN_ID"), "{err}");
    }

    #[test]
    fn no_variables_is_a_single_process() {
        assert_eq!(RankInfo::from_vars(vars(&[])).unwrap(), None);
        // A Slurm allocation without a step (sbatch script) is not a rank.
        assert_eq!(
            RankInfo::from_vars(vars(&[("SLURM_NTASKS", "4")])).unwrap(),
            None
        );
    }

    #[test]
    fn torchrun_variables() {
        let info = RankInfo::from_vars(vars(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "node7"),
            ("MASTER_PORT", "1234"),
            ("TORCHELASTIC_RUN_ID", "abc"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((info.rank, info.world, info.local_rank), (3, 8, Some(1)));
        assert_eq!(
            (info.master_addr.as_str(), info.master_port),
            ("node7", 1234)
        );
        assert_eq!(
            (info.token.as_str(), info.token_from),
            ("abc", "TORCHELASTIC_RUN_ID")
        );
        assert_eq!(info.source, LaunchSource::Torchrun);
        assert!(!info.prints());
    }

    #[test]
    fn open_mpi_pmi_and_slurm_variables() {
        let ompi = RankInfo::from_vars(vars(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("PMIX_NAMESPACE", "prterun-host-123@1"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (ompi.rank, ompi.world, ompi.source),
            (0, 2, LaunchSource::OpenMpi)
        );
        assert_eq!(
            (ompi.master_addr.as_str(), ompi.master_port),
            (DEFAULT_MASTER_ADDR, DEFAULT_MASTER_PORT)
        );
        assert_eq!(ompi.token, "prterun-host-123@1");
        assert!(ompi.prints());

        let pmi = RankInfo::from_vars(vars(&[("PMI_RANK", "1"), ("PMI_SIZE", "2")]))
            .unwrap()
            .unwrap();
        assert_eq!((pmi.rank, pmi.world, pmi.source), (1, 2, LaunchSource::Pmi));
        assert_eq!(
            (pmi.token.as_str(), pmi.token_from),
            (DEFAULT_TOKEN, "default")
        );

        let slurm = RankInfo::from_vars(vars(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_STEP_NUM_TASKS", "6"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_JOB_ID", "42"),
            ("SLURM_STEP_ID", "0"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((slurm.rank, slurm.world, slurm.local_rank), (5, 6, Some(1)));
        assert_eq!(slurm.token, "slurm-42.0");
        assert_eq!(slurm.source, LaunchSource::Slurm);
    }

    #[test]
    fn nearest_launcher_wins_and_spawned_is_recognised() {
        let info = RankInfo::from_vars(vars(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
            ("PARBENCH_SPAWNED", "1"),
            ("PARBENCH_JOB_TOKEN", "t0k"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((info.rank, info.source), (1, LaunchSource::Spawned));
        assert_eq!(
            (info.token.as_str(), info.token_from),
            ("t0k", "PARBENCH_JOB_TOKEN")
        );
    }

    #[test]
    fn ranks_on_this_host_nearest_launcher_first_else_the_world() {
        let here = |pairs: &[(&str, &str)]| ranks_on_this_host_from(vars(pairs), 8);
        assert_eq!(here(&[]), 8);
        assert_eq!(here(&[("SLURM_NTASKS_PER_NODE", "4")]), 4);
        assert_eq!(
            here(&[("MPI_LOCALNRANKS", "3"), ("SLURM_NTASKS_PER_NODE", "4")]),
            3
        );
        assert_eq!(
            here(&[
                ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
                ("MPI_LOCALNRANKS", "3"),
                ("SLURM_NTASKS_PER_NODE", "4"),
            ]),
            2
        );
        assert_eq!(
            here(&[
                ("LOCAL_WORLD_SIZE", "1"),
                ("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
            ]),
            1
        );
        // A count that is not one passes to the next launcher's.
        assert_eq!(
            here(&[("LOCAL_WORLD_SIZE", "0"), ("MPI_LOCALNRANKS", " 5 ")]),
            5
        );
        assert_eq!(here(&[("LOCAL_WORLD_SIZE", "many")]), 8);
    }

    #[test]
    fn bad_variables_are_errors_naming_them() {
        let half = RankInfo::from_vars(vars(&[("RANK", "0")])).unwrap_err();
        assert!(
            matches!(
                half,
                RendezvousError::HalfSet {
                    missing: "WORLD_SIZE",
                    ..
                }
            ),
            "{half}"
        );
        let half = RankInfo::from_vars(vars(&[("OMPI_COMM_WORLD_SIZE", "2")])).unwrap_err();
        assert!(matches!(
            half,
            RendezvousError::HalfSet {
                missing: "OMPI_COMM_WORLD_RANK",
                ..
            }
        ));
        let range = RankInfo::from_vars(vars(&[("PMI_RANK", "2"), ("PMI_SIZE", "2")])).unwrap_err();
        assert!(
            matches!(
                range,
                RendezvousError::RankOutOfRange {
                    rank: 2,
                    world: 2,
                    ..
                }
            ),
            "{range}"
        );
        let nan = RankInfo::from_vars(vars(&[("RANK", "one"), ("WORLD_SIZE", "2")])).unwrap_err();
        assert!(nan.to_string().contains("RANK=\"one\""), "{nan}");
        let zero = RankInfo::from_vars(vars(&[("RANK", "0"), ("WORLD_SIZE", "0")])).unwrap_err();
        assert!(matches!(
            zero,
            RendezvousError::BadVar {
                var: "WORLD_SIZE",
                ..
            }
        ));
        let port = RankInfo::from_vars(vars(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_PORT", "70000"),
        ]))
        .unwrap_err();
        assert!(matches!(
            port,
            RendezvousError::BadVar {
                var: "MASTER_PORT",
                ..
            }
        ));
        let local = RankInfo::from_vars(vars(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("LOCAL_RANK", "-1"),
        ]))
        .unwrap_err();
        assert!(matches!(
            local,
            RendezvousError::BadVar {
                var: "LOCAL_RANK",
                ..
            }
        ));
    }
}
