//! One context-parallel degree: check the sharded attention (and in
//! training its gradients) against the unsharded one, then time it; every
//! figure the slowest rank's.

use super::attend::{unsharded_attention, unsharded_backward, Heads, Whole};
use super::backward::{cp_backward, CpGrads};
use super::forward::{cp_forward, CpClock, CpInputs};
use super::ring::all_gather_f32;
use super::{positions, seeded, CpComm, CpConfig, Qkv};
use crate::comm::group::split;
use crate::comm::{Algo, Communicator, DType, DupComm, HostBuffer};
use crate::layers::check::{broadcast_f64, relative_error, CheckReport};
use crate::layers::run::{all_gather_f64, slowest};
use crate::layers::{LayerError, LayerResult, RunOptions, TpTiming};
use std::time::Instant;

/// What a run asks besides the attention's sizes: the tensor-parallel
/// degree (the world is tp x cp) and whether each call trains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpPlan {
    pub tp: usize,
    /// Forward and backward per call, else forward alone.
    pub train: bool,
}

/// What one degree measured, the same on every rank.
#[derive(Clone, Debug, PartialEq)]
pub struct CpOutcome {
    /// The context-parallel degree (the world over `tp`).
    pub cp: usize,
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

/// One call's results on this rank: its output and, in training, its
/// inputs' gradients.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CpResult {
    pub out: Vec<f32>,
    pub grads: Option<CpGrads>,
}

/// Where world rank `w` sits: (tp rank, cp rank), TP fastest.
fn grid_place(w: usize, tp: usize) -> (usize, usize) {
    (w % tp, w / tp)
}

/// The context-parallel degree of a world of `world` ranks at `tp`.
fn cp_of(world: usize, tp: usize) -> LayerResult<usize> {
    if tp == 0 || !world.is_multiple_of(tp) {
        return Err(LayerError::Config(format!(
            "a world of {world} ranks is not tp {tp} x cp"
        )));
    }
    Ok(world / tp)
}

/// A second communicator for the ring's transfers where the method is the
/// ring, there is more than one CP rank and the backend can make one.
/// Collective: every rank calls it.
fn ring_comm<M: Communicator>(
    comm: &mut M,
    cfg: &CpConfig,
    cp: usize,
) -> LayerResult<Option<DupComm>> {
    if cfg.method != CpComm::P2p || cp < 2 {
        return Ok(None);
    }
    Ok(comm.duplicate_host()?)
}

/// One call: the forward, and the backward in training.
fn one_call<M, D>(
    comm: &mut M,
    mut dup: Option<&mut D>,
    cfg: &CpConfig,
    x: &CpInputs,
    train: bool,
    clock: &mut CpClock,
) -> LayerResult<CpResult>
where
    M: Communicator,
    D: Communicator<Buffer = HostBuffer>,
{
    let fwd = cp_forward(comm, dup.as_deref_mut(), cfg, x, clock)?;
    let grads = if train {
        Some(cp_backward(comm, dup, cfg, x, &fwd, clock)?)
    } else {
        None
    };
    Ok(CpResult {
        out: fwd.out,
        grads,
    })
}

/// This rank's timed calls: per-call means of compute, wait, wait apart
/// (none), wall and transfer, the fastest and slowest wall, in seconds.
struct Calls {
    checked: Option<CpResult>,
    mine: [f64; 7],
}

/// The checked call (if asked), the warm-up and the timed calls of `cfg`
/// (this CP group's shard) on `comm`, each started after a barrier.
fn calls<M, D>(
    comm: &mut M,
    mut dup: Option<&mut D>,
    cfg: &CpConfig,
    x: &CpInputs,
    train: bool,
    opts: &RunOptions,
) -> LayerResult<Calls>
where
    M: Communicator,
    D: Communicator<Buffer = HostBuffer>,
{
    let mut scratch = CpClock::default();
    let checked = if opts.check {
        Some(one_call(
            comm,
            dup.as_deref_mut(),
            cfg,
            x,
            train,
            &mut scratch,
        )?)
    } else {
        None
    };
    for _ in 0..opts.warmup {
        comm.barrier()?;
        one_call(comm, dup.as_deref_mut(), cfg, x, train, &mut scratch)?;
    }
    let iters = opts.iters.max(1);
    let mut sums = CpClock::default();
    let (mut wall, mut min, mut max) = (0f64, f64::INFINITY, 0f64);
    for _ in 0..iters {
        comm.barrier()?;
        let t0 = Instant::now();
        one_call(comm, dup.as_deref_mut(), cfg, x, train, &mut sums)?;
        let t = t0.elapsed().as_secs_f64();
        wall += t;
        min = min.min(t);
        max = max.max(t);
    }
    let n = iters as f64;
    Ok(Calls {
        checked,
        // The attention's wait for communication is its communication
        // time (`comm_us`); no barrier waits apart (0).
        mine: [
            sums.compute.as_secs_f64() / n,
            sums.wait.as_secs_f64() / n,
            0.0,
            wall / n,
            min,
            max,
            sums.comm.as_secs_f64() / n,
        ],
    })
}

/// Runs `cfg`'s attention on this rank of a world of `plan.tp` x cp
/// ranks: checks it against the unsharded attention (if asked), then
/// times `opts.iters` calls after `opts.warmup`. With `tp` > 1 each TP
/// rank's heads run on a CP group of their own (split from the world).
/// Collective: every rank calls it with the same arguments. A failed
/// check is an error.
pub fn run_cp<M: Communicator>(
    comm: &mut M,
    cfg: &CpConfig,
    plan: CpPlan,
    opts: &RunOptions,
) -> LayerResult<CpOutcome> {
    let tp = plan.tp;
    let cp = cp_of(comm.world(), tp)?;
    cfg.validate_grid(tp, cp)?;
    let (tp_rank, cp_rank) = grid_place(comm.rank(), tp);
    let shard = cfg.shard(tp);
    let heads = tp_rank * shard.heads..(tp_rank + 1) * shard.heads;
    let x = CpInputs::seeded(cfg, (cp, cp_rank), heads, opts.seed, plan.train);
    let mut dup = ring_comm(comm, cfg, cp)?;
    let overlapped = dup.is_some();
    let done = if tp == 1 {
        calls(comm, dup.as_mut(), &shard, &x, plan.train, opts)?
    } else {
        let (colour, key) = (tp_rank as u32, cp_rank as u32);
        let mut ring = match dup.as_mut() {
            Some(d) => split(d, Some(colour), key, Algo::Auto)?,
            None => None,
        };
        let mut group = split(comm, Some(colour), key, Algo::Auto)?
            .ok_or_else(|| LayerError::Config("a rank left out of its cp group".into()))?;
        calls(&mut group, ring.as_mut(), &shard, &x, plan.train, opts)?
    };
    let check = match &done.checked {
        Some(got) => {
            let report = check_cp(comm, cfg, plan, got, opts.seed)?;
            let what = format!("tp {tp} x cp {cp} {}: the sharded attention", cfg.method);
            Some(report.required(&what)?)
        }
        None => None,
    };
    let all = all_gather_f64(comm, &done.mine)?;
    let timing = slowest(&all, done.mine.len());
    let transfer_us = all
        .get(timing.slowest_rank * done.mine.len() + 6)
        .copied()
        .unwrap_or(0.0)
        * 1e6;
    Ok(CpOutcome {
        cp,
        timing,
        transfer_us,
        overlapped,
        check,
    })
}

/// Compares every rank's results `got` (of the attention seeded by
/// `seed`) with the unsharded attention and its backward on rank 0: the
/// output, and in training dQ, dK and dV. Collective over the whole
/// tp x cp world; every rank gets the same report.
pub fn check_cp<M: Communicator>(
    comm: &mut M,
    cfg: &CpConfig,
    plan: CpPlan,
    got: &CpResult,
    seed: u64,
) -> LayerResult<CheckReport> {
    let tp = plan.tp;
    let cp = cp_of(comm.world(), tp)?;
    let mut names = vec!["out"];
    let mut mine = got.out.clone();
    if let Some(g) = &got.grads {
        names.extend(["dq", "dk", "dv"]);
        for t in [&g.dq, &g.dk, &g.dv] {
            mine.extend_from_slice(t);
        }
    }
    let all = all_gather_f32(comm, &mine)?;
    let mut errs = vec![0f64; names.len()];
    if comm.rank() == 0 {
        let every: Vec<usize> = (0..cfg.seq).collect();
        let [q, k, v] =
            [Qkv::Q, Qkv::K, Qkv::V].map(|t| seeded(seed, t, cfg, &every, 0..cfg.heads));
        let shape = Heads {
            batch: cfg.batch,
            heads: cfg.heads,
            head_dim: cfg.head_dim,
            causal: cfg.causal,
        };
        let whole = Whole {
            seq: cfg.seq,
            q: &q,
            k: &k,
            v: &v,
        };
        let mut want = vec![unsharded_attention(shape, whole)];
        if names.len() > 1 {
            let dout = seeded(seed, Qkv::DOut, cfg, &every, 0..cfg.heads);
            want.extend(unsharded_backward(shape, whole, &dout));
        }
        let per_rank = mine.len();
        for (t, (want, err)) in want.iter().zip(errs.iter_mut()).enumerate() {
            let sharded = |w: usize| &all[w * per_rank..][t * got.out.len()..][..got.out.len()];
            let placed = place(cfg, (tp, cp), sharded);
            *err = relative_error(&placed, want);
        }
    }
    let errs = broadcast_f64(comm, &errs)?;
    let tensors = names.iter().map(|n| n.to_string()).zip(errs).collect();
    Ok(CheckReport::of(tensors, DType::F32))
}

/// One tensor of the whole sequence (`[batch][seq][heads][d]`) from each
/// world rank's shard (`[batch][its tokens][its heads][d]`).
fn place<'a>(
    cfg: &CpConfig,
    (tp, cp): (usize, usize),
    shard_of: impl Fn(usize) -> &'a [f32],
) -> Vec<f32> {
    let (w, ls) = (cfg.width(), cfg.local_seq(cp));
    let wl = w / tp;
    let mut whole = vec![0f32; cfg.batch * cfg.seq * w];
    for rank in 0..tp * cp {
        let (tp_rank, cp_rank) = grid_place(rank, tp);
        let block = shard_of(rank);
        for (t, &p) in positions(cfg.seq, cp, cp_rank).iter().enumerate() {
            for b in 0..cfg.batch {
                let from = (b * ls + t) * wl;
                let to = (b * cfg.seq + p) * w + tp_rank * wl;
                whole[to..to + wl].copy_from_slice(&block[from..from + wl]);
            }
        }
    }
    whole
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::on_local_ranks;

    fn cfg(seq: usize, method: CpComm, causal: bool) -> CpConfig {
        CpConfig {
            seq,
            heads: 4,
            head_dim: 8,
            batch: 2,
            method,
            causal,
        }
    }

    const OPTS: RunOptions = RunOptions {
        warmup: 0,
        iters: 1,
        check: true,
        seed: 7,
    };

    /// Runs `c` on `world` local ranks at `plan`, asserting the check
    /// passed with every tensor it should hold; rank 0's outcome.
    fn checked(c: &CpConfig, world: usize, plan: CpPlan) -> CpOutcome {
        let what = format!("{} causal {} {plan:?} world {world}", c.method, c.causal);
        let outs = on_local_ranks(world, |comm| run_cp(comm, c, plan, &OPTS).unwrap());
        let o = outs[0].clone();
        let check = o.check.as_ref().unwrap();
        assert!(check.passed() && check.max_err < 1e-5, "{what}: {check:?}");
        let names: Vec<&str> = check.tensors.iter().map(|(n, _)| n.as_str()).collect();
        let want: &[&str] = if plan.train {
            &["out", "dq", "dk", "dv"]
        } else {
            &["out"]
        };
        assert_eq!(names, want, "{what}");
        assert!(outs.iter().all(|x| x.check == o.check), "{what}");
        o
    }

    /// Every method, forward and train, causal or not, at C = 1, 2 and 4
    /// on the local backend matches the unsharded attention (and its
    /// gradients) within f32's rounding, with the timing's parts in order.
    #[test]
    fn every_method_and_mode_matches_the_unsharded_attention_on_local_ranks() {
        for (_, method) in CpComm::ALL {
            for causal in [true, false] {
                for train in [false, true] {
                    for cp in [1, 2, 4] {
                        let o = checked(&cfg(32, method, causal), cp, CpPlan { tp: 1, train });
                        assert_eq!(o.cp, cp);
                        assert_eq!(o.overlapped, method == CpComm::P2p && cp > 1);
                        let t = &o.timing;
                        assert!(t.compute_us > 0.0 && t.total_us >= t.compute_us, "{t:?}");
                        if cp > 1 {
                            assert!(o.transfer_us > 0.0, "{method} cp {cp}: {o:?}");
                        }
                    }
                }
            }
        }
    }

    /// tp 2 x cp 2: each TP rank's heads on a CP group of their own; the
    /// whole output and gradients match the unsharded attention.
    #[test]
    fn tensor_and_context_parallel_together_match_the_unsharded_attention() {
        for (_, method) in CpComm::ALL {
            for train in [false, true] {
                let o = checked(&cfg(16, method, true), 4, CpPlan { tp: 2, train });
                assert_eq!(o.cp, 2);
            }
        }
        // tp 4 x cp 1 and tp 2 x cp 1: heads alone split.
        checked(
            &cfg(16, CpComm::P2p, true),
            4,
            CpPlan { tp: 4, train: true },
        );
        checked(
            &cfg(16, CpComm::A2a, false),
            2,
            CpPlan { tp: 2, train: true },
        );
    }

    /// The ring without a second communicator (each step's transfers
    /// issued before its compute and waited for after it, as on mpi and
    /// nccl) gives the same output and gradients.
    #[test]
    fn the_in_line_ring_matches_the_unsharded_attention() {
        for cp in [2, 4] {
            let c = cfg(32, CpComm::P2p, true);
            let plan = CpPlan { tp: 1, train: true };
            let reports = on_local_ranks(cp, |comm| {
                let x = CpInputs::seeded(&c, (cp, comm.rank()), 0..c.heads, 7, true);
                let none: Option<&mut DupComm> = None;
                let mut clock = CpClock::default();
                let got = one_call(comm, none, &c, &x, true, &mut clock).unwrap();
                assert!(clock.comm > std::time::Duration::ZERO && clock.wait == clock.comm);
                check_cp(comm, &c, plan, &got, 7).unwrap()
            });
            let r = &reports[0];
            assert!(r.passed() && r.tensors.len() == 4, "cp {cp}: {r:?}");
        }
    }

    /// A wrong merge shows: the output of one rank's chunks alone (no
    /// exchange) fails the check.
    #[test]
    fn the_check_fails_an_attention_that_skips_the_exchange() {
        let c = cfg(32, CpComm::P2p, true);
        let plan = CpPlan {
            tp: 1,
            train: false,
        };
        let reports = on_local_ranks(2, |comm| {
            let x = CpInputs::seeded(&c, (2, comm.rank()), 0..c.heads, 7, false);
            let shape = super::super::forward::heads_of(&c, c.heads);
            let mut part = super::super::attend::Partial::new(shape, x.pos.len());
            part.add_block(shape, (&x.q, &x.pos), (&x.k, &x.v, &x.pos));
            let got = CpResult {
                out: part.finish(c.head_dim),
                grads: None,
            };
            check_cp(comm, &c, plan, &got, 7).unwrap()
        });
        assert!(!reports[0].passed(), "{:?}", reports[0]);
        assert_eq!(reports[0], reports[1]);
    }

    /// A wrong gradient shows by name: dK off by half fails the dk check
    /// while dq and dv pass.
    #[test]
    fn the_check_fails_a_wrong_key_gradient_by_name() {
        let c = cfg(32, CpComm::AllGather, true);
        let plan = CpPlan { tp: 1, train: true };
        let reports = on_local_ranks(2, |comm| {
            let x = CpInputs::seeded(&c, (2, comm.rank()), 0..c.heads, 7, true);
            let none: Option<&mut DupComm> = None;
            let mut clock = CpClock::default();
            let mut got = one_call(comm, none, &c, &x, true, &mut clock).unwrap();
            let g = got.grads.as_mut().unwrap();
            g.dk.iter_mut().for_each(|v| *v *= 0.5);
            check_cp(comm, &c, plan, &got, 7).unwrap()
        });
        let r = &reports[0];
        assert!(!r.passed(), "{r:?}");
        let err = |n: &str| r.tensors.iter().find(|(t, _)| t == n).unwrap().1;
        assert!(err("dq") < 1e-5 && err("dv") < 1e-5, "{r:?}");
        assert!(err("dk") > 1e-2, "{r:?}");
    }

    /// A world that is not tp x cp, and heads that tp does not divide,
    /// are refused by name before anything runs.
    #[test]
    fn grids_that_do_not_split_are_refused() {
        let c = cfg(16, CpComm::A2a, true);
        let e = on_local_ranks(3, |comm| {
            run_cp(
                comm,
                &c,
                CpPlan {
                    tp: 2,
                    train: false,
                },
                &OPTS,
            )
            .unwrap_err()
            .to_string()
        });
        assert!(e[0].contains("tp 2"), "{}", e[0]);
        let e = c.validate_grid(3, 1).unwrap_err().to_string();
        assert!(e.contains("heads 4"), "{e}");
        // a2a: each TP rank's 2 heads over cp 4 do not split.
        let e = c.validate_grid(2, 4).unwrap_err().to_string();
        assert!(e.contains("heads 2"), "{e}");
    }
}
