//! The data-parallel reduction overlapped with the backward, as PyTorch
//! DDP and Megatron-LM's `overlap_grad_reduce` run it: a bucket's
//! all-reduce (or the distributed optimizer's reduce-scatter) starts as
//! soon as every gradient in it is final and runs while the rank computes
//! the rest of its backward.
//!
//! The reduction runs on a thread of its own ([`with_overlap`]) over a
//! data-parallel group of its own: the group is split from a duplicate of
//! the world ([`Communicator::duplicate_host`], channels of its own on
//! local threads and tcp processes), so its messages never meet the
//! tensor- and pipeline-parallel traffic the compute thread sends at the
//! same time. The compute thread hands it each bucket when it is ready
//! ([`Reducer::submit`]: a copy of the bucket's gradients, packed on the
//! compute thread as DDP's hooks copy into the bucket on the compute
//! stream) and takes the reduced buckets back at the end of the step
//! ([`Reducer::take_back`], first in, first out).
//!
//! Waits: every collective on the thread has the communicator's deadline;
//! the compute thread waits for a bucket at most that deadline and a
//! margin, then fails naming its rank. The thread's wait for the next
//! bucket ends when the compute thread drops its [`Reducer`], which it
//! does when the body returns, with a result or an error. An error on the
//! thread (a peer that timed out, a lost peer) comes back as that bucket's
//! result and becomes the rank's error; a panic there is an error too.

use super::PipelineError;
use crate::comm::group::split;
use crate::comm::mesh::{axis_group, Axis, MeshShape};
use crate::comm::{Algo, CommError, Communicator, DType, DupComm, HostBuffer, Io, ReduceOp};
use crate::measure::clock_sync::host_now_us;
use std::sync::mpsc;
use std::time::Duration;

/// How long past the communicator's deadline the compute thread still
/// waits for a bucket: the thread's own collective fails at the deadline
/// and reports it, which is the better error.
const MARGIN: Duration = Duration::from_secs(5);

/// What the thread does with a buffer handed to it, over its group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobKind {
    /// Averaged in place (DDP's bucket).
    AllReduce,
    /// Averaged, this rank keeping its share (the distributed optimizer's bucket).
    ReduceScatter,
    /// Every rank's share gathered whole (ZeRO-3's prefetched weights).
    AllGather,
}

/// A buffer handed to the thread.
struct Job<B> {
    /// Elements in the buffer (for a reduce-scatter a multiple of the
    /// group's size; for an all-gather one rank's share).
    len: usize,
    dtype: DType,
    buf: B,
    kind: JobKind,
}

/// A bucket back from the reduction thread: the bucket reduced in place
/// (all-reduce) or this rank's share of it (reduce-scatter), and when the
/// thread took it up and finished it (host clock, microseconds).
pub struct Reduced<B> {
    pub buf: B,
    /// Elements of `buf` that hold the result.
    pub len: usize,
    pub taken_us: f64,
    pub end_us: f64,
}

/// The compute thread's end of the reduction thread.
pub struct Reducer<B> {
    jobs: Option<mpsc::Sender<Job<B>>>,
    done: mpsc::Receiver<Result<Reduced<B>, PipelineError>>,
    rank: usize,
    /// The data group's size.
    group: usize,
    patience: Duration,
    in_flight: usize,
}

impl<B> Reducer<B> {
    /// Ranks of the data-parallel group the thread reduces over.
    pub fn group_size(&self) -> usize {
        self.group
    }

    /// Buckets handed over and not yet taken back.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Hands a buffer of `len` elements of `dtype` to the thread, which
    /// runs `kind` on it once the jobs before it are done.
    pub fn submit(
        &mut self,
        buf: B,
        len: usize,
        dtype: DType,
        kind: JobKind,
    ) -> Result<(), PipelineError> {
        let job = Job {
            len,
            dtype,
            buf,
            kind,
        };
        let sent = self.jobs.as_ref().is_some_and(|tx| tx.send(job).is_ok());
        if !sent {
            // The thread ended: its error is waiting in the results.
            return Err(self.ended_early());
        }
        self.in_flight += 1;
        Ok(())
    }

    /// The oldest bucket still in flight, reduced; waits at most the
    /// communicator's deadline and a margin.
    pub fn take_back(&mut self) -> Result<Reduced<B>, PipelineError> {
        if self.in_flight == 0 {
            return Err(PipelineError::Protocol(
                "asked for a reduced bucket with none in flight".into(),
            ));
        }
        match self.done.recv_timeout(self.patience) {
            Ok(Ok(r)) => {
                self.in_flight -= 1;
                Ok(r)
            }
            Ok(Err(e)) => Err(e),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(PipelineError::Comm(CommError::Timeout {
                rank: self.rank,
                peer: self.rank,
                op: "the overlapped data-parallel reduction",
                after: self.patience,
            })),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(self.ended_early()),
        }
    }

    /// The thread's own error if it sent one, else that it ended.
    fn ended_early(&self) -> PipelineError {
        match self.done.try_recv() {
            Ok(Err(e)) => e,
            _ => PipelineError::Protocol(format!(
                "rank {}: the data-parallel reduction thread ended before its buckets",
                self.rank
            )),
        }
    }
}

/// A duplicate of `world` for the data group's thread when `flag` (the
/// option that asks for it: `--overlap`, `--prefetch`) is given with more
/// than one data rank (a collective of the world: call it on every rank,
/// before the mesh borrows the world), `None` otherwise; one line when
/// the backend cannot make one.
pub fn overlap_comm<W: Communicator>(
    world: &mut W,
    shape: &MeshShape,
    flag: Option<&str>,
) -> Result<Option<DupComm>, PipelineError> {
    let Some(flag) = flag else {
        return Ok(None);
    };
    if shape.dp < 2 {
        return Ok(None);
    }
    let backend = world.backend();
    world.duplicate_host()?.map(Some).ok_or_else(|| {
        PipelineError::Invalid(format!(
            "{flag} runs data-parallel collectives on a thread and communicator of their own, \
             which the {backend} backend cannot make (local and tcp can); run without {flag}"
        ))
    })
}

/// Runs `body` with a reducer whose thread works over the data group of
/// `shape` split from `dup` (see [`overlap_comm`]), or with hybrid
/// sharding (`shard_group` below the data group's size, 0 for all of it)
/// over this rank's shard group of it; with no `dup`, `body` gets `None`
/// and no thread starts. Every rank's threads split their groups
/// together, so call it on every rank with the same `dup`-or-not.
pub fn with_overlap<R>(
    dup: Option<DupComm>,
    shape: &MeshShape,
    algo: Algo,
    shard_group: usize,
    body: impl FnOnce(Option<&mut Reducer<HostBuffer>>) -> Result<R, PipelineError>,
) -> Result<R, PipelineError> {
    let Some(dup) = dup else {
        return body(None);
    };
    let rank = dup.rank();
    let patience = dup.timeout() + MARGIN;
    let (jobs, rx_jobs) = mpsc::channel();
    let (tx_done, done) = mpsc::channel();
    let mut reducer = Reducer {
        jobs: Some(jobs),
        done,
        rank,
        group: shape.dp,
        patience,
        in_flight: 0,
    };
    let shape = *shape;
    std::thread::scope(|scope| {
        let thread = std::thread::Builder::new()
            .name(format!("parbench-dp-reduce-{rank}"))
            .spawn_scoped(scope, move || {
                serve(dup, &shape, algo, shard_group, &rx_jobs, &tx_done);
            })
            .map_err(|e| {
                PipelineError::Comm(CommError::Setup(format!(
                    "rank {rank}: cannot start the data-parallel reduction thread: {e}"
                )))
            })?;
        let out = body(Some(&mut reducer));
        // Ends the thread's wait for the next bucket.
        reducer.jobs = None;
        let joined = thread.join();
        match (out, joined) {
            (Err(e), _) => Err(e),
            (Ok(_), Err(_)) => Err(PipelineError::Protocol(format!(
                "rank {rank}: the data-parallel reduction thread panicked"
            ))),
            (Ok(v), Ok(())) => Ok(v),
        }
    })
}

/// The reduction thread: its data group (or shard group), then each job
/// in turn until the compute thread hangs up; an error ends it, sent as
/// the result.
fn serve(
    mut dup: DupComm,
    shape: &MeshShape,
    algo: Algo,
    shard_group: usize,
    jobs: &mpsc::Receiver<Job<HostBuffer>>,
    done: &mpsc::Sender<Result<Reduced<HostBuffer>, PipelineError>>,
) {
    let mut run = || -> Result<(), PipelineError> {
        let mut dp = axis_group(&mut dup, shape, Axis::Dp, algo)?;
        if shard_group > 0 && shard_group < dp.world() {
            // The same split as the compute thread's shard groups.
            let d = dp.rank();
            let colour = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
            let mut shard = split(
                &mut dp,
                Some(colour(d / shard_group)),
                colour(d % shard_group),
                algo,
            )?
            .ok_or_else(|| PipelineError::Protocol("left out of its shard group".into()))?;
            return serve_jobs(&mut shard, jobs, done);
        }
        serve_jobs(&mut dp, jobs, done)
    };
    if let Err(e) = run() {
        let _ = done.send(Err(e));
    }
}

/// Runs each job on `group` until the compute thread hangs up.
fn serve_jobs<G: Communicator<Buffer = HostBuffer>>(
    group: &mut G,
    jobs: &mpsc::Receiver<Job<HostBuffer>>,
    done: &mpsc::Sender<Result<Reduced<HostBuffer>, PipelineError>>,
) -> Result<(), PipelineError> {
    while let Ok(job) = jobs.recv() {
        let taken_us = host_now_us();
        let (buf, len) = run_job(group, job)?;
        let r = Reduced {
            buf,
            len,
            taken_us,
            end_us: host_now_us(),
        };
        if done.send(Ok(r)).is_err() {
            break;
        }
    }
    Ok(())
}

/// One job over `group`: a bucket averaged in place or to this rank's
/// share, or a share gathered whole. Returns the result and its elements.
fn run_job<G: Communicator<Buffer = HostBuffer>>(
    group: &mut G,
    mut job: Job<HostBuffer>,
) -> Result<(HostBuffer, usize), PipelineError> {
    let (g, dtype) = (group.world(), job.dtype);
    let out = match job.kind {
        JobKind::ReduceScatter => {
            let n = job.len / g;
            let mut share = group.alloc(n * dtype.size())?;
            group.reduce_scatter(
                Io::OutOfPlace {
                    send: &job.buf,
                    recv: &mut share,
                },
                n,
                dtype,
                ReduceOp::Avg,
            )?;
            (share, n)
        }
        JobKind::AllReduce => {
            group.all_reduce(Io::InPlace(&mut job.buf), job.len, dtype, ReduceOp::Avg)?;
            (job.buf, job.len)
        }
        JobKind::AllGather => {
            let mut whole = group.alloc(job.len * g * dtype.size())?;
            group.all_gather(
                Io::OutOfPlace {
                    send: &job.buf,
                    recv: &mut whole,
                },
                job.len,
                dtype,
            )?;
            (whole, job.len * g)
        }
    };
    group.sync()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::local;
    use crate::comm::mesh::Order;
    use std::time::Instant;

    fn shape() -> MeshShape {
        MeshShape::new(2, 1, 1, Order::MEGATRON).unwrap()
    }

    /// Runs `body` on each of two local ranks, given the world, the rank's
    /// reducer on a duplicate of it (`--overlap`'s) and the rank.
    fn on_two_ranks<R: Send>(
        deadline: Duration,
        body: impl Fn(&mut local::LocalComm, &mut Reducer<HostBuffer>, usize) -> Result<R, PipelineError>
            + Sync,
    ) -> Vec<crate::comm::CommResult<R>> {
        local::run(2, Algo::Auto, deadline, |w| {
            let rank = w.rank();
            let dup =
                overlap_comm(w, &shape(), Some("--overlap")).map_err(|e| e.into_comm(rank))?;
            with_overlap(dup, &shape(), Algo::Auto, 0, |r| {
                let r = r.ok_or_else(|| PipelineError::Protocol("no reducer".into()))?;
                body(w, r, rank)
            })
            .map_err(|e| e.into_comm(rank))
        })
    }

    /// Rank `r` hands over one bucket of `r + 1`s and takes it back.
    fn one_bucket(r: &mut Reducer<HostBuffer>, rank: usize) -> Result<Vec<f32>, PipelineError> {
        let vals = vec![(rank + 1) as f32; 8];
        let mut buf = HostBuffer::zeroed(8 * 4);
        buf.bytes_mut().copy_from_slice(bytemuck::cast_slice(&vals));
        r.submit(buf, 8, DType::F32, JobKind::AllReduce)?;
        let back = r.take_back()?;
        Ok(bytemuck::cast_slice(&back.buf.bytes()[..back.len * 4]).to_vec())
    }

    /// Buckets come back averaged over the data group, on a duplicate of
    /// the world while the world itself carries other traffic.
    #[test]
    fn a_bucket_comes_back_averaged_while_the_world_is_busy() {
        let out = on_two_ranks(Duration::from_secs(20), |w, r, rank| {
            // The world's own all-reduce meanwhile, on the compute thread.
            let mut x = HostBuffer::zeroed(4 * 4);
            w.all_reduce(Io::InPlace(&mut x), 4, DType::F32, ReduceOp::Sum)?;
            one_bucket(r, rank)
        });
        for o in out {
            assert_eq!(o.unwrap(), vec![1.5f32; 8]);
        }
    }

    /// A rank that fails while its peer's bucket is in flight: the peer's
    /// reduction thread stops at once with the failed rank named, and the
    /// peer's rank returns that error (no panic, no wait to the deadline).
    #[test]
    fn a_peer_failing_mid_reduction_is_the_ranks_error_naming_it() {
        let start = Instant::now();
        let out = on_two_ranks(Duration::from_secs(30), |_, r, rank| {
            if rank == 1 {
                std::thread::sleep(Duration::from_millis(200));
                return Err(PipelineError::Invalid("stopped on purpose".into()));
            }
            one_bucket(r, rank)
        });
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{:?}",
            start.elapsed()
        );
        let e = out[0]
            .as_ref()
            .expect_err("rank 0 cannot finish its bucket");
        assert!(
            matches!(
                e,
                CommError::PeerLost {
                    rank: 0,
                    peer: 1,
                    ..
                }
            ),
            "{e}"
        );
        assert!(out[1].is_err());
    }

    /// A peer whose thread never takes part: the bucket's collective gives
    /// up at the communicator's deadline, naming the peer.
    #[test]
    fn a_silent_peer_is_a_timeout_naming_it() {
        let out = on_two_ranks(Duration::from_millis(500), |_, r, rank| {
            if rank == 1 {
                // Hands nothing over, and stays until rank 0 gave up.
                std::thread::sleep(Duration::from_millis(1500));
                return Ok(Vec::new());
            }
            one_bucket(r, rank)
        });
        let e = out[0].as_ref().expect_err("rank 0 waits in vain");
        assert!(
            matches!(
                e,
                CommError::Timeout {
                    rank: 0,
                    peer: 1,
                    ..
                }
            ),
            "{e}"
        );
    }
}
