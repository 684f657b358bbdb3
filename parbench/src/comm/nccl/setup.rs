//! Building an [`NcclComm`]: all GPUs of one process, or one rank of a
//! multi-process job found through the rendezvous store.

use super::wire::local_wire;
use super::{nccl_err, unique_id, NcclComm, UniqueId};
use crate::comm::{CommError, CommResult, Communicator};
use crate::gpu::{self, Gpu, Lib};
use crate::rendezvous::{RankInfo, Store};
use cudarc::nccl::sys;
use std::time::{Duration, Instant};

impl NcclComm {
    /// One communicator per GPU in `ordinals`, all in this process
    /// (`ncclCommInitAll`); rank i drives `ordinals[i]`.
    pub fn init_all(ordinals: &[usize], timeout: Duration) -> CommResult<Vec<NcclComm>> {
        gpu::require(&[Lib::Driver, Lib::Nccl])?;
        if ordinals.is_empty() {
            return Err(CommError::InvalidArgument("no GPU given".into()));
        }
        let gpus = ordinals
            .iter()
            .map(|&o| Gpu::open(o))
            .collect::<Result<Vec<_>, _>>()?;
        let world = gpus.len();
        let devs: Vec<i32> = ordinals.iter().map(|&o| o as i32).collect();
        let mut comms = vec![std::ptr::null_mut(); world];
        gpu::guarded("ncclCommInitAll", || {
            // SAFETY: `comms` has room for `world` handles and `devs` lists as many devices.
            unsafe { sys::ncclCommInitAll(comms.as_mut_ptr(), world as i32, devs.as_ptr()) }
                .result()
                .map(|_| ())
                .map_err(|e| nccl_err("ncclCommInitAll", e.0))
        })?;
        let wire = local_wire(ordinals);
        // Wrapped first, so that a failure below still destroys every communicator.
        let comms: Vec<NcclComm> = comms
            .into_iter()
            .zip(gpus)
            .enumerate()
            .map(|(rank, (comm, gpu))| {
                NcclComm::wrap(comm, gpu, (rank, world), timeout, wire.clone())
            })
            .collect();
        comms.into_iter().map(NcclComm::with_token).collect()
    }

    /// Joins rank `rank` of `world` on GPU `ordinal`, all ranks holding the
    /// same `id` (`ncclCommInitRank`). NCCL's initialisation has no deadline
    /// of its own, so it runs on a helper thread: past `timeout` this returns
    /// [`CommError::Timeout`] and leaves that thread blocked (the process is
    /// expected to exit).
    pub fn init_rank(
        id: &UniqueId,
        rank: usize,
        world: usize,
        ordinal: usize,
        timeout: Duration,
    ) -> CommResult<NcclComm> {
        gpu::require(&[Lib::Driver, Lib::Nccl])?;
        if rank >= world {
            return Err(CommError::InvalidArgument(format!(
                "rank {rank} of a world of {world}"
            )));
        }
        let gpu = Gpu::open(ordinal)?;
        let uid = sys::ncclUniqueId {
            internal: id.map(|b| b as std::ffi::c_char),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let g = gpu.clone();
        std::thread::Builder::new()
            .name(format!("nccl-init-{rank}"))
            .spawn(move || {
                let r = gpu::guarded("ncclCommInitRank", || {
                    g.bind()?;
                    let mut comm = std::ptr::null_mut();
                    // SAFETY: valid out-pointer; the id is the one rank 0 made.
                    unsafe { sys::ncclCommInitRank(&mut comm, world as i32, uid, rank as i32) }
                        .result()
                        .map_err(|e| nccl_err("ncclCommInitRank", e.0))?;
                    Ok(comm as usize)
                });
                let _ = tx.send(r);
            })
            .map_err(CommError::Io)?;
        match rx.recv_timeout(timeout) {
            Ok(r) => {
                let comm = r? as sys::ncclComm_t;
                NcclComm::wrap(comm, gpu, (rank, world), timeout, "nccl".into()).with_token()
            }
            Err(_) => Err(CommError::Timeout {
                rank,
                peer: 0,
                op: "ncclCommInitRank (waiting for every rank to join rank 0's bootstrap)",
                after: timeout,
            }),
        }
    }

    /// Joins the multi-process job `info` describes (torchrun, mpirun, srun
    /// or `--nprocs` self-spawn): rank 0 makes the NCCL unique id and puts it
    /// in the job's rendezvous store, every rank reads it and initialises.
    /// The GPU is chosen by [`device_for_rank`] before anything else. The
    /// wire is recorded as NVLink/PCIe when all ranks share one host and
    /// this process sees their GPUs, `intra-node` when it sees only its own,
    /// `network` across hosts.
    pub fn join(info: &RankInfo, timeout: Duration) -> CommResult<NcclComm> {
        gpu::require(&[Lib::Driver, Lib::Nccl])?;
        let visible = gpu::device_count()?;
        let ordinal = device_for_rank(
            info.rank,
            info.local_rank,
            visible,
            std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
        )
        .map_err(CommError::InvalidArgument)?;
        let deadline = Instant::now() + timeout;
        let mut store = Store::join(info, timeout)?;
        let id = if info.rank == 0 {
            let id = unique_id()?;
            store.put("nccl/unique_id", &id, deadline)?;
            id
        } else {
            let v = store.get("nccl/unique_id", deadline)?;
            v.as_slice().try_into().map_err(|_| CommError::Protocol {
                rank: info.rank,
                peer: 0,
                detail: format!("NCCL unique id of {} bytes, expected 128", v.len()),
            })?
        };
        // Which hosts the ranks are on decides the recorded wire.
        let host = hostname();
        store.put(
            &format!("nccl/host/{}", info.rank),
            host.as_bytes(),
            deadline,
        )?;
        let mut hosts = std::collections::BTreeSet::new();
        for r in 0..info.world {
            hosts.insert(store.get(&format!("nccl/host/{r}"), deadline)?);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let mut comm = NcclComm::init_rank(
            &id,
            info.rank,
            info.world,
            ordinal,
            left.max(Duration::from_secs(1)),
        )?;
        comm.set_timeout(timeout);
        comm.wire = if hosts.len() > 1 {
            "network".into()
        } else if visible < info.world.min(2) {
            // One GPU per process (CUDA_VISIBLE_DEVICES): the peers' GPUs
            // cannot be queried from here.
            "intra-node".into()
        } else {
            local_wire(&(0..visible).collect::<Vec<_>>())
        };
        comm._store = Some(store);
        Ok(comm)
    }

    pub(super) fn wrap(
        comm: sys::ncclComm_t,
        gpu: Gpu,
        (rank, world): (usize, usize),
        timeout: Duration,
        wire: String,
    ) -> NcclComm {
        gpu.set_timeout(timeout);
        NcclComm {
            comm,
            gpu,
            rank,
            world,
            timeout,
            wire,
            aborted: None,
            pending: Vec::new(),
            staging: Vec::new(),
            scratch: None,
            token: None,
            sizing: false,
            premul: None,
            _store: None,
        }
    }

    /// Allocates the barrier's token, so that no barrier allocates (a
    /// barrier inside a capture must not); dropping `self` on failure
    /// destroys the communicator.
    pub(super) fn with_token(mut self) -> CommResult<NcclComm> {
        self.token = Some(self.gpu.alloc(4)?);
        Ok(self)
    }

    /// Sets the wire recorded for this communicator (the launcher knows
    /// whether the ranks share a node: `nvlink`, or the network's name).
    pub fn set_wire(&mut self, wire: impl Into<String>) {
        self.wire = wire.into();
    }

    /// The GPU this rank drives.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }
}

/// The GPU a rank of a multi-process job drives, among the `visible` GPUs
/// this process sees (`cuDeviceGetCount`, which CUDA_VISIBLE_DEVICES
/// narrows; `cuda_visible_devices` is its value, for the message).
///
/// - One visible GPU: device 0, whatever the local rank (the launcher gave
///   each process its own GPU through CUDA_VISIBLE_DEVICES, or there is one).
/// - A local rank: that device, refused in one line when it is not visible.
/// - Neither: the rank modulo the visible GPUs.
pub fn device_for_rank(
    rank: usize,
    local_rank: Option<usize>,
    visible: usize,
    cuda_visible_devices: Option<&str>,
) -> Result<usize, String> {
    let shown = match cuda_visible_devices {
        Some(v) => format!("CUDA_VISIBLE_DEVICES={v}"),
        None => "CUDA_VISIBLE_DEVICES unset".into(),
    };
    match (visible, local_rank) {
        (0, _) => Err(format!("rank {rank}: no GPU visible to this process ({shown})")),
        (1, _) => Ok(0),
        (v, Some(l)) if l >= v => Err(format!(
            "rank {rank}: local rank {l} but this process sees {v} GPUs ({shown}); one process per GPU needs a local rank below {v}, or one GPU made visible to each process"
        )),
        (_, Some(l)) => Ok(l),
        (v, None) => Ok(rank % v),
    }
}

/// This host's name, to tell ranks on one node from ranks across nodes.
pub(super) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is writable for its length; gethostname NUL-terminates on success.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    if ok {
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        String::from("unknown-host")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn one_visible_gpu_is_device_zero_whatever_the_local_rank() {
        // torchrun with CUDA_VISIBLE_DEVICES=$LOCAL_RANK per process.
        for l in [None, Some(0), Some(3), Some(7)] {
            assert_eq!(device_for_rank(3, l, 1, Some("3")), Ok(0), "{l:?}");
        }
    }

    #[test]
    pub(super) fn the_local_rank_picks_among_several_visible_gpus() {
        assert_eq!(device_for_rank(9, Some(1), 8, None), Ok(1));
        assert_eq!(device_for_rank(9, Some(7), 8, None), Ok(7));
        // No local rank: the rank modulo the visible GPUs.
        assert_eq!(device_for_rank(9, None, 8, None), Ok(1));
        assert_eq!(device_for_rank(3, None, 2, Some("4,5")), Ok(1));
    }

    #[test]
    pub(super) fn a_local_rank_beyond_the_visible_gpus_is_one_line() {
        let e = device_for_rank(5, Some(5), 4, Some("0,1,2,3")).unwrap_err();
        assert!(e.contains("local rank 5") && e.contains("4 GPUs"), "{e}");
        assert!(e.contains("CUDA_VISIBLE_DEVICES=0,1,2,3"), "{e}");
        assert!(!e.contains('\n'), "{e}");
        let e = device_for_rank(0, Some(0), 0, Some("")).unwrap_err();
        assert!(e.contains("no GPU visible"), "{e}");
    }
}
