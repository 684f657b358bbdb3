//! One context-parallel degree: check the sharded attention against the
//! unsharded one, then time it; every figure the slowest rank's.

use super::attend::{unsharded_attention, Heads};
use super::forward::{all_gather_f32, cp_forward, CpClock, CpInputs};
use super::{positions, seeded, CpComm, CpConfig, Qkv};
use crate::comm::{Communicator, DType, DupComm};
use crate::layers::check::{broadcast_f64, relative_error, tolerance, CheckReport};
use crate::layers::run::{all_gather_f64, slowest};
use crate::layers::{LayerResult, RunOptions, TpTiming};
use std::time::Instant;

/// What one degree measured, the same on every rank.
#[derive(Clone, Debug, PartialEq)]
pub struct CpOutcome {
    /// Per call, microseconds: `compute_us` the attention, `comm_us` the
    /// time it waited for communication (what was not hidden), `total_us`
    /// the call's wall time.
    pub timing: TpTiming,
    /// The slowest rank's transfers per call from start to end, hidden or
    /// not, microseconds (equal to the wait where nothing overlaps).
    pub transfer_us: f64,
    /// Whether the ring's transfers ran on a thread beside the attention.
    pub overlapped: bool,
    pub check: Option<CheckReport>,
}

/// A second communicator for the ring's transfers where the method is the
/// ring, there is more than one rank and the backend can make one.
/// Collective: every rank calls it.
fn ring_comm<M: Communicator>(comm: &mut M, cfg: &CpConfig) -> LayerResult<Option<DupComm>> {
    if cfg.method != CpComm::P2p || comm.world() < 2 {
        return Ok(None);
    }
    Ok(comm.duplicate_host()?)
}

/// Compares this rank's output `out` of the attention seeded by `seed`
/// with the unsharded attention on rank 0. Collective; every rank gets the
/// same report.
pub fn check_cp<M: Communicator>(
    comm: &mut M,
    cfg: &CpConfig,
    out: &[f32],
    seed: u64,
) -> LayerResult<CheckReport> {
    let (cp, rank) = (comm.world(), comm.rank());
    let n = out.len();
    let all = all_gather_f32(comm, out)?;
    let mut err = [0f64];
    if rank == 0 {
        let (w, ls) = (cfg.width(), cfg.local_seq(cp));
        let mut got = vec![0f32; cfg.batch * cfg.seq * w];
        for (src, block) in all.chunks_exact(n.max(1)).enumerate() {
            for (t, &p) in positions(cfg.seq, cp, src).iter().enumerate() {
                for b in 0..cfg.batch {
                    let from = (b * ls + t) * w;
                    let to = (b * cfg.seq + p) * w;
                    got[to..to + w].copy_from_slice(&block[from..from + w]);
                }
            }
        }
        let every: Vec<usize> = (0..cfg.seq).collect();
        let [q, k, v] = [Qkv::Q, Qkv::K, Qkv::V].map(|t| seeded(seed, t, cfg, &every));
        let shape = Heads {
            batch: cfg.batch,
            heads: cfg.heads,
            head_dim: cfg.head_dim,
        };
        let want = unsharded_attention(shape, cfg.seq, &q, &k, &v);
        err[0] = relative_error(&got, &want);
    }
    let err = broadcast_f64(comm, &err)?;
    let e = err.first().copied().unwrap_or(f64::NAN);
    Ok(CheckReport {
        max_err: e,
        tensors: vec![("out".into(), e)],
        tolerance: tolerance(DType::F32),
    })
}

/// Runs `cfg`'s attention at cp = `comm.world()` on this rank: checks it
/// against the unsharded attention (if asked), then times `opts.iters`
/// calls after `opts.warmup`, each started together after a barrier.
/// Collective: every rank calls it with the same arguments. A failed check
/// is an error.
pub fn run_cp<M: Communicator>(
    comm: &mut M,
    cfg: &CpConfig,
    opts: &RunOptions,
) -> LayerResult<CpOutcome> {
    let (cp, rank) = (comm.world(), comm.rank());
    cfg.validate(cp)?;
    let mut dup = ring_comm(comm, cfg)?;
    let x = CpInputs::seeded(cfg, cp, rank, opts.seed);
    let check = if opts.check {
        let out = cp_forward(comm, dup.as_mut(), cfg, &x, &mut CpClock::default())?;
        let report = check_cp(comm, cfg, &out, opts.seed)?;
        Some(report.required(&format!("cp {cp} {}: the sharded attention", cfg.method))?)
    } else {
        None
    };
    for _ in 0..opts.warmup {
        comm.barrier()?;
        cp_forward(comm, dup.as_mut(), cfg, &x, &mut CpClock::default())?;
    }
    let iters = opts.iters.max(1);
    let mut sums = CpClock::default();
    let (mut wall, mut min, mut max) = (0f64, f64::INFINITY, 0f64);
    for _ in 0..iters {
        comm.barrier()?;
        let t0 = Instant::now();
        let mut clock = CpClock::default();
        cp_forward(comm, dup.as_mut(), cfg, &x, &mut clock)?;
        let t = t0.elapsed().as_secs_f64();
        wall += t;
        min = min.min(t);
        max = max.max(t);
        sums.compute += clock.compute;
        sums.comm += clock.comm;
        sums.wait += clock.wait;
    }
    let n = iters as f64;
    // The attention's wait for communication is its communication time
    // (`comm_us`); no barrier waits apart (0).
    let mine = [
        sums.compute.as_secs_f64() / n,
        sums.wait.as_secs_f64() / n,
        0.0,
        wall / n,
        min,
        max,
        sums.comm.as_secs_f64() / n,
    ];
    let all = all_gather_f64(comm, &mine)?;
    let timing = slowest(&all, mine.len());
    let transfer_us = all
        .get(timing.slowest_rank * mine.len() + 6)
        .copied()
        .unwrap_or(0.0)
        * 1e6;
    Ok(CpOutcome {
        timing,
        transfer_us,
        overlapped: dup.is_some(),
        check,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::on_local_ranks;

    fn cfg(seq: usize, method: CpComm) -> CpConfig {
        CpConfig {
            seq,
            heads: 4,
            head_dim: 16,
            batch: 2,
            method,
        }
    }

    const OPTS: RunOptions = RunOptions {
        warmup: 0,
        iters: 1,
        check: true,
        seed: 7,
    };

    /// Every method at C = 2 and 4 (and 1) on the local backend matches
    /// the unsharded causal attention within f32's rounding, with the
    /// timing's parts in order.
    #[test]
    fn every_method_matches_the_unsharded_attention_on_local_ranks() {
        for (_, method) in CpComm::ALL {
            for cp in [1, 2, 4] {
                let c = cfg(64, method);
                let outs = on_local_ranks(cp, |comm| run_cp(comm, &c, &OPTS).unwrap());
                let o = &outs[0];
                let check = o.check.as_ref().unwrap();
                assert!(check.passed(), "{method} cp {cp}: {check:?}");
                assert!(check.max_err < 1e-5, "{method} cp {cp}: {check:?}");
                assert_eq!(o.overlapped, method == CpComm::P2p && cp > 1);
                let t = &o.timing;
                assert!(t.compute_us > 0.0 && t.total_us >= t.compute_us, "{t:?}");
                if cp > 1 {
                    assert!(o.transfer_us > 0.0, "{method} cp {cp}: {o:?}");
                }
            }
        }
    }

    /// A wrong merge shows: the output of one rank's chunks alone (no
    /// exchange) fails the check.
    #[test]
    fn the_check_fails_an_attention_that_skips_the_exchange() {
        let c = cfg(32, CpComm::P2p);
        let reports = on_local_ranks(2, |comm| {
            let x = CpInputs::seeded(&c, 2, comm.rank(), 7);
            let shape = Heads {
                batch: c.batch,
                heads: c.heads,
                head_dim: c.head_dim,
            };
            let mut part = super::super::attend::Partial::new(shape, x.pos.len());
            part.add_block(shape, (&x.q, &x.pos), (&x.k, &x.v, &x.pos));
            check_cp(comm, &c, &part.finish(c.head_dim), 7).unwrap()
        });
        assert!(!reports[0].passed(), "{:?}", reports[0]);
        assert_eq!(reports[0], reports[1]);
    }
}
