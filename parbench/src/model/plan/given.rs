//! One given layout costed, not searched: a `dp x tp x pp` step of
//! `layers_per_stage` blocks per stage with a given schedule (generated or
//! a CSV's actions) and `M`,
//! from given calibration figures (a GEMM rate, the tensor and data
//! groups' fitted wires, the pipeline's one-way message time). This is
//! what `report plan --against` holds against a measured composed step, so
//! it costs the step the way the planner's search does
//! ([`super::costs`]), with the block of that run instead of a preset:
//!
//! - compute: per block and microbatch the forward's FLOP over `t` at the
//!   rate, the input-gradient pass the same, the weight-gradient pass the
//!   same (backward = twice the forward);
//! - tensor-parallel communication, exposed: each pass's collectives
//!   (the forward's and the input-gradient pass's; the weight-gradient
//!   pass has none) at the tensor group's fitted per-call time;
//! - the bubble: the schedule simulator over those stage costs and the
//!   message time, less the busiest rank's busy time;
//! - the data-parallel reduction, in buckets of at most `bucket_bytes`,
//!   each at the data group's fitted per-call time. Without overlap it is
//!   all exposed, after the rank's last action (an upper bound, as the
//!   search assumes). With overlap ([`GivenLayout::overlap`], DDP's) each
//!   bucket starts when it is ready, in the stage's last weight-gradient
//!   pass (a `W`, or a `B` run layer by layer as autograd runs it) after
//!   the lowest layer it holds, and the buckets run one after
//!   another on the reduction's own stream: on each rank the exposed part
//!   is `max(0, max_k (R_k - C_k))`, where `R_k` is the reduction time of
//!   bucket `k` and of every bucket after it and `C_k` the rank's time
//!   left (its backward compute and the pipeline's idle) from bucket `k`
//!   being ready to its last action's end ([`overlapped_exposure`]).
//!
//! What it leaves out, by design: the executor's own time between actions
//! and the sends' host time, skew between the ranks of a tensor group (a
//! collective waits for its slowest member), and ranks sharing cores.

use super::shard::Shard;
use crate::comm::Collective;
use crate::model::fit::per_call_terms;
use crate::model::sim::{simulate, SimCosts, StageCosts};
use crate::schedule::{ActionKind, Schedule};

/// A collective's time per call, fitted with the `auto` structure (one
/// latency per call, nccl-tests' bus factor on the bytes:
/// [`crate::model::fit::per_call_terms`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CallFit {
    pub collective: Collective,
    /// Ranks of the group.
    pub ranks: usize,
    pub alpha_s: f64,
    pub beta_s_per_byte: f64,
}

impl CallFit {
    /// Seconds of one call moving `bytes` (the probe's size convention).
    pub fn seconds(&self, bytes: f64) -> f64 {
        let t = per_call_terms(self.collective, self.ranks);
        t.latency_steps * self.alpha_s + t.bytes_factor * bytes * self.beta_s_per_byte
    }
}

/// The layout, as the run ran it.
#[derive(Clone, Debug, PartialEq)]
pub struct GivenLayout {
    pub dp: usize,
    pub tp: usize,
    /// The schedule the run ran (its ranks are the pipeline's, `pp`;
    /// generated, or a CSV's actions).
    pub schedule: Schedule,
    pub layers_per_stage: usize,
    /// One block's forward on one microbatch, all tensor ranks together, FLOP.
    pub block_forward_flops: f64,
    /// Tensor-parallel collectives of one block's pass, and the bytes of each.
    pub tp_calls_per_pass: usize,
    pub tp_call_bytes: f64,
    /// One rank's gradient bytes (all its stages) and the bucket cap.
    pub grad_bytes: f64,
    pub bucket_bytes: f64,
    /// Buckets reduce-scattered (the probe's bytes are then one share).
    pub dist_opt: bool,
    /// Buckets reduced concurrently with the rest of the backward.
    pub overlap: bool,
    /// Sharded data parallel as the run ran it (`--shard`), with the
    /// wires it probed; `None` for a run without it.
    pub sharded: Option<GivenShard>,
}

/// A sharded run's mode and the fits of its shard and replica groups.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GivenShard {
    pub shard: Shard,
    /// Ranks of a shard group (the data group's size unless hybrid).
    pub group: usize,
    /// ZeRO-3's gathers prefetched on the data group's thread.
    pub prefetch: bool,
    /// One layer's weights on one rank padded to whole shares, bytes.
    pub layer_bytes: f64,
    /// The shard group's all-gather and reduce-scatter (one share's bytes
    /// per call), the replica group's all-reduce of one share.
    pub gather: Option<CallFit>,
    pub scatter: Option<CallFit>,
    pub replicas: Option<CallFit>,
}

/// What the layout is costed from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Calibration {
    /// Matrix-product rate of one rank, FLOP/s.
    pub flop_per_s: f64,
    /// `None` for a group of one rank (it sends nothing).
    pub tp: Option<CallFit>,
    pub dp: Option<CallFit>,
    /// One-way time of one activation message between pipeline ranks, s.
    pub message_s: f64,
}

/// The layout's step and its parts, seconds, for the busiest rank.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GivenCost {
    pub compute_s: f64,
    pub tp_comm_s: f64,
    pub bubble_s: f64,
    pub dp_comm_s: f64,
    /// The part of `dp_comm_s` the step waits for after the pipeline's
    /// last action (all of it without overlap): the step less the makespan.
    pub dp_exposed_s: f64,
    pub step_s: f64,
    /// Buckets of one rank's reduction.
    pub buckets: usize,
    /// Sharded data parallel's per-layer gathers and scatters in the
    /// busiest rank's actions, and the part of them its compute waits for.
    pub shard_comm_s: f64,
    pub shard_exposed_s: f64,
}

/// Costs `l` from `cal`; a line when it cannot (a schedule that does not
/// generate, a rate that is not positive, a group without its wire).
pub fn cost_given(l: &GivenLayout, cal: &Calibration) -> Result<GivenCost, String> {
    if !(cal.flop_per_s.is_finite() && cal.flop_per_s > 0.0) {
        return Err(format!("GEMM rate {} FLOP/s: not positive", cal.flop_per_s));
    }
    let call = |fit: Option<CallFit>, ranks: usize, what: &str, bytes: f64| match fit {
        _ if ranks < 2 => Ok(0.0),
        Some(f) => Ok(f.seconds(bytes)),
        None => Err(format!(
            "no fitted {what} wire for a group of {ranks} ranks"
        )),
    };
    let tp_call = call(cal.tp, l.tp, "tensor-parallel", l.tp_call_bytes)?;
    let pass = l.layers_per_stage as f64 * l.block_forward_flops / l.tp as f64 / cal.flop_per_s;
    let pass_tp = l.layers_per_stage as f64 * l.tp_calls_per_pass as f64 * tp_call;
    let s = &l.schedule;
    let layers = l.layers_per_stage;
    // Sharded data parallel's per-layer collectives, inside the actions:
    // (F, I, W) exposed per action and all of them per (stage, microbatch).
    let (shard_f, shard_i, shard_w, shard_all) = match &l.sharded {
        Some(sh) if matches!(sh.shard, Shard::Zero2 | Shard::Zero3) => {
            let share = sh.layer_bytes / sh.group.max(1) as f64;
            let rs = call(sh.scatter, sh.group, "shard reduce-scatter", share)?;
            let ag = if sh.shard == Shard::Zero3 {
                call(sh.gather, sh.group, "shard all-gather", share)?
            } else {
                0.0
            };
            let per_layer = (pass + pass_tp) / layers.max(1) as f64;
            let gathers = if sh.prefetch {
                prefetched_wait(layers, ag, per_layer)
            } else {
                layers as f64 * ag
            };
            let scatters = layers as f64 * rs;
            (gathers, gathers, scatters, layers as f64 * (2.0 * ag + rs))
        }
        _ => (0.0, 0.0, 0.0, 0.0),
    };
    let stages = vec![
        StageCosts::split(
            pass + pass_tp + shard_f,
            pass + pass_tp + shard_i,
            pass + shard_w
        );
        s.num_stages
    ];
    let sim = simulate(
        s,
        &SimCosts {
            stages,
            latency: cal.message_s,
            bandwidth: f64::INFINITY,
            message_bytes: 0.0,
        },
    )
    .map_err(|e| e.to_string())?;
    // The busiest rank's (stage, microbatch) pairs: the most stages on one rank.
    let per_rank = ((0..s.ranks())
        .map(|r| s.stages_of(r).len())
        .max()
        .unwrap_or(0)
        * s.microbatches) as f64;
    let compute = per_rank * 3.0 * pass;
    let tp_comm = per_rank * 2.0 * pass_tp;
    let busy = sim.busy.iter().copied().fold(0.0, f64::max);
    let bubble = (sim.makespan - busy).max(0.0);
    // Buckets per stage, as the run fills them: a stage's gradients (the
    // rank's split evenly over its stages) in buckets of at most the cap.
    let stages_per_rank = (0..s.ranks())
        .map(|r| s.stages_of(r).len())
        .max()
        .unwrap_or(1)
        .max(1);
    let per_layer_shards = l
        .sharded
        .is_some_and(|sh| matches!(sh.shard, Shard::Zero2 | Shard::Zero3));
    let (per_stage, bucket_s, bucket_bytes) = if l.dp < 2 || l.grad_bytes <= 0.0 || per_layer_shards
    {
        (0, 0.0, 0.0)
    } else {
        let stage_bytes = l.grad_bytes / stages_per_rank as f64;
        let n = (stage_bytes / l.bucket_bytes.max(1.0)).ceil().max(1.0);
        let bytes = stage_bytes / n;
        let secs = match &l.sharded {
            // Hybrid ZeRO-1 scatters over its shard group.
            Some(sh) if sh.shard == Shard::Zero1 && sh.group < l.dp => call(
                sh.scatter,
                sh.group,
                "shard reduce-scatter",
                bytes / sh.group as f64,
            )?,
            _ if l.dist_opt => call(cal.dp, l.dp, "data-parallel", bytes / l.dp as f64)?,
            _ => call(cal.dp, l.dp, "data-parallel", bytes)?,
        };
        (n as usize, secs, bytes)
    };
    let buckets = per_stage * stages_per_rank;
    let dp_comm =
        buckets as f64 * bucket_s + after_step_shards(l, stages_per_rank, bucket_bytes, buckets)?;
    let (dp_exposed, step) = if l.overlap && buckets > 0 {
        let mut step = sim.makespan.max(busy);
        for (r, slices) in sim.timeline.iter().enumerate() {
            let mut ready = Vec::new();
            for st in s.stages_of(r) {
                // The stage's last weight-gradient pass (its M-th, in the rank's order).
                let Some(last_w) = slices
                    .iter()
                    .filter(|x| x.action.stage == st)
                    .rfind(|x| matches!(x.action.kind, ActionKind::B | ActionKind::W))
                else {
                    continue;
                };
                // A W pass, or a whole B run layer by layer (each layer's
                // input, then weight gradients): either way from the top.
                let w = last_w.end - last_w.start;
                let times = bucket_ready_times(last_w.end, w, l.layers_per_stage, per_stage);
                ready.extend(times.into_iter().map(|t| (t, bucket_s)));
            }
            let last_end = slices.last().map_or(0.0, |x| x.end);
            step = step.max(last_end + overlapped_exposure(&ready, last_end));
        }
        (step - sim.makespan.max(busy), step)
    } else {
        (dp_comm, sim.makespan.max(busy) + dp_comm)
    };
    let pairs = per_rank;
    let shard_comm = pairs * shard_all;
    let shard_exposed = pairs * (shard_f + shard_i + shard_w);
    Ok(GivenCost {
        compute_s: compute,
        tp_comm_s: tp_comm,
        bubble_s: bubble,
        dp_comm_s: dp_comm,
        dp_exposed_s: dp_exposed,
        step_s: step,
        buckets,
        shard_comm_s: shard_comm,
        shard_exposed_s: shard_exposed,
    })
}

/// How long a pass over `layers` layers waits for their gathers when each
/// is handed to the data group's thread one layer ahead (the first at the
/// pass's start), each taking `ag`, each layer computing `c`: the pass's
/// time less its compute.
pub fn prefetched_wait(layers: usize, ag: f64, c: f64) -> f64 {
    if layers == 0 {
        return 0.0;
    }
    let mut ends = vec![0.0; layers];
    let (mut now, mut thread_free) = (0.0f64, 0.0f64);
    ends[0] = ag;
    thread_free = thread_free.max(ends[0]);
    for k in 0..layers {
        if k + 1 < layers {
            ends[k + 1] = now.max(thread_free) + ag;
            thread_free = ends[k + 1];
        }
        now = now.max(ends[k]) + c;
    }
    now - layers as f64 * c
}

/// What a sharded step does on the data group after its last action, in
/// seconds, all exposed: each unit's gradient share averaged across the
/// replicas (hybrid), and ZeRO-1's and -2's updated weights all-gathered
/// over the shard group. Units are ZeRO-1's buckets (`buckets` of
/// `bucket_bytes`) or the layers.
fn after_step_shards(
    l: &GivenLayout,
    stages_per_rank: usize,
    bucket_bytes: f64,
    buckets: usize,
) -> Result<f64, String> {
    let Some(sh) = &l.sharded else {
        return Ok(0.0);
    };
    let g = sh.group.max(1);
    let (units, unit_bytes) = match sh.shard {
        Shard::None => return Ok(0.0),
        Shard::Zero1 => (buckets, bucket_bytes),
        Shard::Zero2 | Shard::Zero3 => (l.layers_per_stage * stages_per_rank, sh.layer_bytes),
    };
    let share = unit_bytes / g as f64;
    let fit = |f: Option<CallFit>, ranks: usize, what: &str| match f {
        _ if ranks < 2 => Ok(0.0),
        Some(f) => Ok(f.seconds(share)),
        None => Err(format!(
            "no fitted {what} wire for a group of {ranks} ranks"
        )),
    };
    let replicas = l.dp / g;
    let mut per_unit = fit(sh.replicas, replicas, "replica all-reduce")?;
    if matches!(sh.shard, Shard::Zero1 | Shard::Zero2) {
        per_unit += fit(sh.gather, g, "shard all-gather")?;
    }
    Ok(units as f64 * per_unit)
}

/// When each of a stage's `n` buckets is ready in its last weight-gradient
/// pass (a `W`, or a whole `B` done layer by layer), which ends at
/// `pass_end` and takes `w_pass` over `layers` layers from the top down:
/// the stage's gradients are split evenly into the
/// buckets from the top layer (the planner knows bytes, not tensors), and
/// bucket `k` is ready once the pass has done every layer it touches.
pub fn bucket_ready_times(pass_end: f64, w_pass: f64, layers: usize, n: usize) -> Vec<f64> {
    let (layers, n) = (layers.max(1), n.max(1));
    let per_layer = w_pass / layers as f64;
    (0..n)
        .map(|k| {
            // Layers from the top that bucket k's last byte reaches into.
            let done = ((k + 1) * layers).div_ceil(n);
            pass_end - w_pass + done as f64 * per_layer
        })
        .collect()
}

/// The part of an overlapped reduction the step waits for: buckets
/// `(ready, seconds)` run one after another on the reduction's stream,
/// each from the later of its readiness and the previous one's end; the
/// step waits from `last_end` (the rank's last action's end) for the last
/// one. Equal to `max(0, max_k (sum_{j >= k} seconds_j - (last_end -
/// ready_k)))` for buckets in order of readiness.
pub fn overlapped_exposure(buckets: &[(f64, f64)], last_end: f64) -> f64 {
    let mut order: Vec<(f64, f64)> = buckets.to_vec();
    order.sort_by(|a, b| a.0.total_cmp(&b.0));
    let finish = order
        .iter()
        .fold(f64::NEG_INFINITY, |free, &(ready, secs)| {
            ready.max(free) + secs
        });
    (finish - last_end).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> GivenLayout {
        GivenLayout {
            dp: 2,
            tp: 2,
            schedule: crate::schedule::generate(crate::schedule::ScheduleKind::OneFOneB, 2, 4, 1)
                .unwrap(),
            layers_per_stage: 2,
            block_forward_flops: 2e6,
            tp_calls_per_pass: 2,
            tp_call_bytes: 8192.0,
            grad_bytes: 1e6,
            bucket_bytes: 25.0 * 1048576.0,
            dist_opt: false,
            overlap: false,
            sharded: None,
        }
    }

    /// Prefetched gathers: with no compute to hide behind every gather is
    /// waited for; with a layer's compute longer than a gather only the
    /// first is; in between, what outlasts the compute.
    #[test]
    fn prefetch_hides_each_gather_behind_the_layer_before() {
        assert_eq!(prefetched_wait(4, 1.0, 0.0), 4.0);
        assert_eq!(prefetched_wait(4, 1.0, 5.0), 1.0);
        // ag 3, c 1: the thread is the bottleneck: the pass takes 4 ag + c.
        assert_eq!(prefetched_wait(4, 3.0, 1.0), 4.0 * 3.0 + 1.0 - 4.0);
        assert_eq!(prefetched_wait(0, 1.0, 1.0), 0.0);
    }

    /// ZeRO-3 by hand on one stage: each layer's gather before its forward
    /// and its input pass, its scatter after its weight pass, all exposed
    /// without prefetch; the replica all-reduce after the step.
    #[test]
    fn zero3_adds_its_per_layer_collectives_to_the_actions() {
        let fit = |coll, alpha| CallFit {
            collective: coll,
            ranks: 2,
            alpha_s: alpha,
            beta_s_per_byte: 0.0,
        };
        let mut l = layout();
        l.tp = 1;
        l.dp = 4;
        l.schedule =
            crate::schedule::generate(crate::schedule::ScheduleKind::GPipe, 1, 2, 1).unwrap();
        let cal = Calibration {
            flop_per_s: 1e9,
            tp: None,
            dp: Some(CallFit {
                ranks: 4,
                ..fit(Collective::AllReduce, 1e-2)
            }),
            message_s: 0.0,
        };
        let plain = cost_given(&l, &cal).unwrap();
        l.sharded = Some(GivenShard {
            shard: Shard::Zero3,
            group: 2,
            prefetch: false,
            layer_bytes: 1000.0,
            gather: Some(fit(Collective::AllGather, 1e-3)),
            scatter: Some(fit(Collective::ReduceScatter, 2e-3)),
            replicas: Some(fit(Collective::AllReduce, 5e-3)),
        });
        let z3 = cost_given(&l, &cal).unwrap();
        // 2 microbatches x 2 layers x (gather F + gather I + scatter W).
        let per_layer_shards = 2.0 * 2.0 * (1e-3 + 1e-3 + 2e-3);
        assert!(
            (z3.shard_exposed_s - per_layer_shards).abs() < 1e-12,
            "{z3:?}"
        );
        assert!((z3.shard_comm_s - per_layer_shards).abs() < 1e-12);
        // After the step: 2 layers' shares across the 2 replicas.
        assert!((z3.dp_comm_s - 2.0 * 5e-3).abs() < 1e-12, "{z3:?}");
        let want = plain.step_s - plain.dp_comm_s + per_layer_shards + 2.0 * 5e-3;
        assert!((z3.step_s - want).abs() < 1e-9, "{} vs {want}", z3.step_s);
    }

    /// By hand: a pass is 2 blocks x 1e6 FLOP at 1e9 FLOP/s = 2 ms; the
    /// tensor all-reduce over 2 ranks costs 10 us + 8192 B x 1 ns per call,
    /// 2 per block and pass. 1F1B on 2 ranks with 4 microbatches and free
    /// messages: rank 1 waits one forward, rank 0 ends with one backward
    /// after rank 1's: (M + S - 1) (F + B) = 5 (F + B).
    #[test]
    fn the_parts_add_up_to_the_step_and_match_the_hand_figures() {
        let fit = |coll| CallFit {
            collective: coll,
            ranks: 2,
            alpha_s: 10e-6,
            beta_s_per_byte: 1e-9,
        };
        let cal = Calibration {
            flop_per_s: 1e9,
            tp: Some(fit(Collective::AllReduce)),
            dp: Some(fit(Collective::AllReduce)),
            message_s: 0.0,
        };
        let c = cost_given(&layout(), &cal).unwrap();
        // All-reduce's bus factor over 2 ranks is 2 (p-1)/p = 1.
        let call = 10e-6 + 8192.0 * 1e-9;
        assert!((c.compute_s - 4.0 * 3.0 * 2e-3).abs() < 1e-12, "{c:?}");
        assert!(
            (c.tp_comm_s - 4.0 * 2.0 * 2.0 * 2.0 * call).abs() < 1e-12,
            "{c:?}"
        );
        let (f, b) = (2e-3 + 4.0 * call, 2.0 * 2e-3 + 4.0 * call);
        let makespan = 5.0 * (f + b);
        assert!(
            (c.step_s - c.dp_comm_s - makespan).abs() < 1e-9,
            "{c:?} {makespan}"
        );
        assert!((c.compute_s + c.tp_comm_s + c.bubble_s - makespan).abs() < 1e-9);
        assert_eq!(c.buckets, 1);
        assert!((c.dp_comm_s - (10e-6 + 1e6 * 1e-9)).abs() < 1e-12);
        // Smaller buckets: more calls, more latency.
        let small = GivenLayout {
            bucket_bytes: 1e5,
            ..layout()
        };
        let c2 = cost_given(&small, &cal).unwrap();
        assert_eq!(c2.buckets, 10);
        assert!((c2.dp_comm_s - 10.0 * (10e-6 + 1e5 * 1e-9)).abs() < 1e-12);
        assert_eq!(c.dp_exposed_s, c.dp_comm_s);
        // A group of two without its wire cannot be costed.
        let e = cost_given(&layout(), &Calibration { tp: None, ..cal }).unwrap_err();
        assert!(e.contains("tensor-parallel"), "{e}");
    }

    /// By hand: the stream runs each bucket from the later of its
    /// readiness and the previous end; the step waits for what ends past
    /// the last action.
    #[test]
    fn overlapped_buckets_expose_only_what_outlasts_the_compute_left() {
        // Ready at 1, 2 and 3 s, 1 s each, last action ends at 4 s: the
        // stream ends at 4 s, nothing exposed.
        assert_eq!(
            overlapped_exposure(&[(1.0, 1.0), (2.0, 1.0), (3.0, 1.0)], 4.0),
            0.0
        );
        // 2 s each: 1-3, 3-5, 5-7: 3 s past the end, = max_k (R_k - C_k)
        // = max(6 - 3, 4 - 2, 2 - 1).
        assert_eq!(
            overlapped_exposure(&[(3.0, 2.0), (1.0, 2.0), (2.0, 2.0)], 4.0),
            3.0
        );
        // All ready at the end: the whole reduction.
        assert_eq!(overlapped_exposure(&[(4.0, 1.5), (4.0, 0.5)], 4.0), 2.0);
        // A pass of 4 layers over 1 s ending at 10 s: one bucket is ready
        // at its end; two after 2 and 4 layers; three after 2, 3 and 4.
        assert_eq!(bucket_ready_times(10.0, 1.0, 4, 1), vec![10.0]);
        assert_eq!(bucket_ready_times(10.0, 1.0, 4, 2), vec![9.5, 10.0]);
        assert_eq!(bucket_ready_times(10.0, 1.0, 4, 3), vec![9.5, 9.75, 10.0]);
    }

    /// With one bucket per rank and one stage per rank under 1F1B, the
    /// bucket is ready at the rank's last action's end: overlap hides
    /// nothing, as in the run; with many buckets some of it hides.
    #[test]
    fn overlap_hides_only_behind_work_left() {
        let fit = CallFit {
            collective: Collective::AllReduce,
            ranks: 2,
            alpha_s: 10e-6,
            beta_s_per_byte: 1e-9,
        };
        let cal = Calibration {
            flop_per_s: 1e9,
            tp: Some(fit),
            dp: Some(fit),
            message_s: 0.0,
        };
        let plain = cost_given(&layout(), &cal).unwrap();
        let one = cost_given(
            &GivenLayout {
                overlap: true,
                ..layout()
            },
            &cal,
        )
        .unwrap();
        assert!((one.dp_exposed_s - one.dp_comm_s).abs() < 1e-12, "{one:?}");
        assert!(
            (one.step_s - plain.step_s).abs() < 1e-9,
            "{one:?} {plain:?}"
        );
        let many = cost_given(
            &GivenLayout {
                overlap: true,
                bucket_bytes: 1e5,
                ..layout()
            },
            &cal,
        )
        .unwrap();
        assert!(many.dp_exposed_s < many.dp_comm_s, "{many:?}");
        // The pipeline's makespan plus only the exposed part.
        let makespan = plain.step_s - plain.dp_comm_s;
        assert!(
            (many.step_s - makespan - many.dp_exposed_s).abs() < 1e-9,
            "{many:?}"
        );
    }
}
