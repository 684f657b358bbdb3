//! What rank 0 prints and records of a composed `dp x tp x pp` run: the
//! per-rank breakdown, the check line, pipeline.csv's mesh columns, and
//! run.json's `composed` section with the calibration a planner needs to
//! predict this layout, all measured in the same run.

use crate::cli::{Args, ComposedJob, PipelineJob, RunPlan};
use parbench::model::plan::Shard;
use parbench::pipeline::tp_stage::bytes_per_param;
use parbench::pipeline::{ComposedRecord, GradCheck, RankBreakdown, Summary, WireProbe, Work};
use parbench::results::PipelineRow;
use serde_json::{json, Value};

/// Largest relative difference of an f32 gradient from the one-rank
/// reference that the check passes (the sums' order differs across
/// shards and replicas; f32 keeps 24 bits).
pub const CHECK_TOLERANCE: f64 = 1e-5;

/// Tensor-parallel collectives of one block per microbatch: two
/// all-reduces in the forward and two in the input-gradient pass
/// (without sequence parallelism, Megatron's f and g).
const TP_CALLS_PER_BLOCK: usize = 4;

/// The run's figures that the table, the row and run.json share.
pub struct Figures {
    pub breakdown: Vec<RankBreakdown>,
    /// Median, fastest and slowest world step, us.
    pub step_us: f64,
    pub step_min_us: f64,
    pub step_max_us: f64,
    /// The timed step closest to the median (the one the trace draws).
    pub median_index: usize,
    /// Block work of one rank in one step (matrix products), FLOP.
    pub flops_per_rank_step: f64,
    /// Blocks one rank holds (its stages').
    pub blocks_per_rank: usize,
}

impl Figures {
    pub fn of(job: &ComposedJob, run: &RunPlan, rec: &ComposedRecord) -> Self {
        let steps = rec.step_us();
        let (step_us, median_index) = rec.median_step();
        let s = &run.cfg.schedule;
        let blocks = s.stages_of(0).len() * job.stages.layers_per_stage;
        Figures {
            breakdown: rec.breakdown(),
            step_us,
            step_min_us: steps.iter().copied().fold(f64::INFINITY, f64::min),
            step_max_us: steps.iter().copied().fold(0.0, f64::max),
            median_index,
            flops_per_rank_step: job.stages.block.flops() / job.tp as f64
                * (blocks * s.microbatches) as f64,
            blocks_per_rank: blocks,
        }
    }

    fn mean(&self, f: impl Fn(&RankBreakdown) -> f64) -> f64 {
        self.breakdown.iter().map(f).sum::<f64>() / self.breakdown.len().max(1) as f64
    }
}

/// The run's first lines: what ran.
pub fn header(
    run_id: &str,
    backend: &str,
    plan: &PipelineJob,
    c: &ComposedJob,
    args: &Args,
    compute: &str,
) {
    let b = &c.stages.block.shape;
    let stages = plan.ranks / (c.dp * c.tp).max(1);
    parbench::outln!(
        "# bench-pipeline: backend {backend}, {} ranks = dp {} x tp {} x pp {stages} (order {})",
        plan.ranks,
        c.dp,
        c.tp,
        c.order
    );
    parbench::outln!(
        "# each stage: {} Megatron blocks (hidden {}, heads {}, ffn {}, seq {}, b {} sequences)",
        c.stages.layers_per_stage,
        b.hidden,
        b.heads,
        b.ffn,
        b.seq,
        b.batch
    );
    let reduce = format!(
        "buckets {} B{}{}{}, work {}, {compute}",
        c.stages.reduce.bucket_bytes,
        if c.stages.reduce.overlap {
            ", overlap"
        } else {
            ""
        },
        if c.stages.reduce.dist_opt() {
            ", reduce-scatter"
        } else {
            ""
        },
        shard_words(c),
        args.work
    );
    parbench::out!(
        "{}",
        parbench::term::wrap_hanging(&reduce, "# ", "#   ", parbench::term::WIDTH)
    );
    parbench::outln!(
        "# run {run_id}: {} timed steps after {} warm-up",
        args.steps,
        args.warmup
    );
}

/// The per-rank breakdown and the check line.
pub fn print(job: &ComposedJob, rec: &ComposedRecord, f: &Figures) {
    parbench::outln!(
        "    composed step {:.0} us (median; {:.0} to {:.0}): first work start to the last rank's data-parallel reduction",
        f.step_us,
        f.step_min_us,
        f.step_max_us
    );
    parbench::outln!(
        "    {:>5} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "rank",
        "(d,t,p)",
        "compute",
        "tp_comm",
        "pp_wait",
        "transfer",
        "dp_comm",
        "dp_wait",
        "dp_exposed",
        "dp_hidden",
        "idle"
    );
    for b in &f.breakdown {
        parbench::outln!(
            "    {:>5} {:>9} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>10.0}",
            b.rank,
            format!("({},{},{})", b.coords.dp, b.coords.tp, b.coords.pp),
            b.compute_us,
            b.tp_comm_us,
            b.wait_us,
            b.transfer_us,
            b.dp_comm_us,
            b.dp_wait_us,
            b.dp_exposed_us,
            b.dp_hidden_us,
            b.idle_us
        );
    }
    parbench::outln!("    (us per rank per step, median over the timed steps; dp_wait: the part of dp_comm that waited for the data group's slowest replica to begin each bucket, on the world's one clock)");
    for (name, w) in [
        ("tp", &rec.tp_wire),
        ("dp", &rec.dp_wire),
        ("shard gather", &rec.shard_wires.gather),
        ("shard scatter", &rec.shard_wires.scatter),
        ("replica", &rec.shard_wires.replicas),
    ] {
        if let Some(line) = w.as_ref().map(wire_line) {
            parbench::outln!("    {name} wire (probed after the steps): {line}");
        }
    }
    print_sharded(job, rec, f);
    parbench::outln!("    check: {}", check_line(job, rec));
}

/// The header's words for `--shard`: the mode, its group, the optimizer.
fn shard_words(c: &ComposedJob) -> String {
    let r = &c.stages.reduce;
    match r.shard {
        None => String::new(),
        Some(s) => {
            let g = r.group_of(c.dp);
            let hybrid = if g < c.dp {
                format!(" hybrid: shard groups of {g}, {} replicas", c.dp / g)
            } else {
                String::new()
            };
            let prefetch = if r.prefetch { ", prefetch" } else { "" };
            format!(
                ", shard {}{hybrid}{prefetch}, Adam at learning rate 0",
                s.name()
            )
        }
    }
}

/// Bytes per parameter the ZeRO paper's split gives this run, and the
/// parameters one rank holds (its stages' blocks, its tensor shard).
fn shard_formula(job: &ComposedJob, f: &Figures, s: Shard) -> (f64, f64) {
    let params: usize = parbench::layers::layout::ParamSpecs::new(&job.stages.block)
        .all()
        .iter()
        .map(|p| p.local_len(job.tp))
        .sum::<usize>()
        * f.blocks_per_rank;
    let g = job.stages.reduce.group_of(job.dp);
    (bytes_per_param(s, 4, g), params as f64)
}

/// With `--shard`: per rank the sharded collectives, the optimizer and
/// the bytes held beside the ZeRO paper's split.
fn print_sharded(job: &ComposedJob, rec: &ComposedRecord, f: &Figures) {
    let Some(s) = job.stages.reduce.shard else {
        return;
    };
    let (per_param, params) = shard_formula(job, f, s);
    let want = per_param * params;
    parbench::outln!(
        "    sharded data parallel ({}): {:.1} B per parameter x {params:.0} parameters per rank = {} (the ZeRO paper's split: weights 4, gradients 4, Adam 8 B, over the shard group as {} shards them{})",
        s.name(),
        per_param,
        parbench::units::bytes(want),
        s.name(),
        if s == Shard::None { "; DDP's bucket copy of the gradients besides" } else { "" }
    );
    parbench::outln!(
        "    {:>5} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12} {:>12} {:>12} {:>12} {:>8} {:>12}",
        "rank",
        "gather",
        "handover",
        "scatter",
        "exposed",
        "hidden",
        "adam",
        "weights",
        "grads",
        "adam_state",
        "buffers",
        "vs_model",
        "peak"
    );
    for r in rec.sharded() {
        let h = r.held_end;
        let held = h.total();
        parbench::outln!(
            "    {:>5} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>12.0} {:>12.0} {:>12.0} {:>12.0} {:>7.1}% {:>12.0}",
            r.rank,
            r.gather_us,
            r.handover_us,
            r.scatter_us,
            r.exposed_us,
            r.hidden_us(),
            r.optimizer_us,
            h.params,
            h.grads,
            h.optimizer,
            h.buffers,
            100.0 * (held - want) / want.max(1.0),
            r.held_peak_total
        );
    }
    parbench::outln!("    (us per rank per step, median over the timed steps: the per-layer all-gathers (on the data group's thread with --prefetch, else on the compute's; handover: the part of them the thread took to take each up once it was free to start, its wake-up) and reduce-scatters (on the compute's), the part the compute waited for, the rest (hidden: ran while the compute did), Adam; bytes held at the last step's end by kind, counted from the buffers, against the split above; peak: the most held at once during the step)");
}

fn wire_line(w: &WireProbe) -> String {
    let pts: Vec<String> = w
        .points
        .iter()
        .map(|(b, s)| format!("{b} B {:.1} us", s * 1e6))
        .collect();
    match &w.fit {
        Some(fit) => format!(
            "{} over {} ranks: {}; fit alpha {:.1} us, {} (rms err {:.0}%)",
            w.collective,
            w.ranks,
            pts.join(", "),
            fit.alpha_us(),
            fit.bandwidth_gbps()
                .map_or("no size term".to_string(), |g| format!("busbw {g:.2} GB/s")),
            100.0 * fit.rms_rel_err
        ),
        None => format!(
            "{} over {} ranks: {} (no fit)",
            w.collective,
            w.ranks,
            pts.join(", ")
        ),
    }
}

fn check_line(job: &ComposedJob, rec: &ComposedRecord) -> String {
    if let Some(why) = &job.no_check_reason {
        return format!("not run ({why})");
    }
    let mut checks = rec.checks.clone();
    checks.sort_by_key(|c| c.0);
    let per: Vec<String> = checks
        .iter()
        .map(|(d, g)| {
            let weights = weights_words(g, g.weights_compared > 0);
            format!(
                "replica {d}: max rel err {:.2e}, {} of {} values differ{weights}",
                g.max_rel_err, g.differing, g.values
            )
        })
        .collect();
    let verdict = if check_failure(rec).is_some() {
        "FAILED"
    } else {
        "passed"
    };
    format!(
        "{verdict}: every weight gradient against one rank running the whole model on the whole batch (tolerance {CHECK_TOLERANCE:.0e}): {}",
        per.join("; ")
    )
}

/// What differed, when the check ran and failed.
pub fn check_failure(rec: &ComposedRecord) -> Option<String> {
    let bad: Vec<String> = rec
        .checks
        .iter()
        // A NaN error fails too.
        .filter(|(_, g)| {
            g.max_rel_err.is_nan() || g.max_rel_err > CHECK_TOLERANCE || g.weights_differing > 0
        })
        .map(|(d, g)| {
            let weights = weights_words(g, g.weights_differing > 0);
            format!(
                "replica {d}: max rel err {:.3e} over {CHECK_TOLERANCE:.0e}, {} of {} values differ{weights}",
                g.max_rel_err, g.differing, g.values
            )
        })
        .collect();
    (!bad.is_empty()).then(|| bad.join("; "))
}

/// A replica's clause on its gathered weights (ZeRO-3's, against the
/// seeded ones), when `said`; empty otherwise.
fn weights_words(g: &GradCheck, said: bool) -> String {
    if said {
        format!(
            ", {} of {} gathered weights differ from the seeded ones",
            g.weights_differing, g.weights_compared
        )
    } else {
        String::new()
    }
}

/// pipeline.csv's composed figures: the world's step, the means over the
/// world's ranks, the mesh columns, and the worst replica's check.
pub fn fill_row(row: &mut PipelineRow, job: &ComposedJob, rec: &ComposedRecord, f: &Figures) {
    row.dp = job.dp;
    row.tp = job.tp;
    row.step_us = f.step_us;
    row.step_min_us = f.step_min_us;
    row.step_max_us = f.step_max_us;
    row.busy_us = f.mean(|b| b.busy_us);
    row.idle_us = f.mean(|b| b.idle_us);
    row.tp_comm_us = f.mean(|b| b.tp_comm_us);
    row.dp_comm_us = f.mean(|b| b.dp_comm_us);
    row.dp_exposed_us = f.mean(|b| b.dp_exposed_us);
    row.grad_max_err = if job.check {
        rec.checks
            .iter()
            .map(|(_, g)| g.max_rel_err)
            .fold(0.0, f64::max)
    } else {
        f64::NAN
    };
}

fn wire_json(w: &Option<WireProbe>) -> Value {
    let Some(w) = w else {
        return Value::Null;
    };
    json!({
        "collective": w.collective.to_string(),
        "ranks": w.ranks,
        "points": w.points.iter().map(|(b, s)| json!({"bytes": b, "us": s * 1e6})).collect::<Vec<_>>(),
        "fit": w.fit.map(|f| json!({
            "structure": "one latency per call, nccl-tests' bus factor on the bytes (model::fit, 'auto')",
            "alpha_us": f.alpha_us(),
            "beta_us_per_byte": f.beta_s_per_byte * 1e6,
            "busbw_gbps": f.bandwidth_gbps(),
            "rms_rel_err": f.rms_rel_err,
        })),
    })
}

/// The run's `composed` section of run.json.
pub fn json(
    job: &ComposedJob,
    run: &RunPlan,
    rec: &ComposedRecord,
    f: &Figures,
    sum: &Summary,
    timeline: &str,
) -> Value {
    let s = &run.cfg.schedule;
    let b = &job.stages.block;
    let compute_us = f.mean(|r| r.compute_us);
    let per_rank_stages = s.stages_of(0).len();
    // Under --work sleep every (stage, microbatch) sleeps 3 US in all
    // (F + I + W, or F + B): the rate that sleep stands for.
    let nominal = match run.cfg.work {
        Work::Sleep(d) => Some(
            f.flops_per_rank_step
                / (3.0 * d.as_secs_f64() * (per_rank_stages * s.microbatches) as f64),
        ),
        Work::Compute => None,
    };
    let ranks: Vec<Value> = f
        .breakdown
        .iter()
        .map(|r| {
            json!({
                "rank": r.rank, "d": r.coords.dp, "t": r.coords.tp, "p": r.coords.pp,
                "compute_us": r.compute_us, "tp_comm_us": r.tp_comm_us,
                "busy_us": r.busy_us, "pipeline_wait_us": r.wait_us, "transfer_us": r.transfer_us,
                "dp_comm_us": r.dp_comm_us, "dp_wait_us": r.dp_wait_us,
                "dp_after_wait_us": r.dp_after_wait_us, "dp_exposed_us": r.dp_exposed_us,
                "dp_hidden_us": r.dp_hidden_us, "idle_us": r.idle_us,
            })
        })
        .collect();
    let buckets = rec
        .ranks
        .first()
        .and_then(|r| r.times.first())
        .map_or(0, |t| t.buckets);
    let grad_elems: usize = parbench::layers::layout::ParamSpecs::new(b)
        .all()
        .iter()
        .map(|p| p.local_len(job.tp))
        .sum::<usize>()
        * job.stages.layers_per_stage
        * per_rank_stages;
    json!({
        "timeline": timeline,
        "mesh": {
            "dp": job.dp, "tp": job.tp, "pp": s.ranks(), "order": job.order.to_string(),
            "world": job.dp * job.tp * s.ranks(),
        },
        "block": {
            "hidden": b.shape.hidden, "heads": b.shape.heads, "ffn": b.shape.ffn,
            "seq": b.shape.seq, "sequence_parallel": b.seq_parallel,
        },
        "layers_per_stage": job.stages.layers_per_stage,
        "microbatch_size": b.shape.batch,
        "microbatches": s.microbatches,
        "global_batch": job.dp * s.microbatches * b.shape.batch,
        "schedule": s.name, "chunks": s.chunks(), "stages": s.num_stages,
        // The actions run, so that a planner can simulate any schedule.
        "schedule_csv": parbench::schedule::to_csv(s),
        "work": run.cfg.work.to_string(),
        "dtype": "f32",
        "reduce": {
            "bucket_bytes": job.stages.reduce.bucket_bytes,
            "overlap": job.stages.reduce.overlap,
            "dist_opt": job.stages.reduce.dist_opt(),
            "shard": job.stages.reduce.shard.map(Shard::name),
            "shard_group": job.stages.reduce.group_of(job.dp),
            "prefetch": job.stages.reduce.prefetch,
            "buckets_per_rank": buckets,
            "grad_bytes_per_rank": grad_elems * 4,
        },
        "measured": {
            "step_us": f.step_us, "step_min_us": f.step_min_us, "step_max_us": f.step_max_us,
            "steps_us": rec.step_us(),
            "step_definition": "first work start on any rank to the last rank's data-parallel reduction end, every rank on world rank 0's clock",
            "bubble": sum.bubble_measured,
            "bubble_of": "world rank 0's pipeline (d 0, t 0)",
            "pipeline_step_us": sum.step_us,
            "ranks": ranks,
        },
        "sharded": sharded_json(job, rec, f),
        "check": {
            "ran": job.check,
            "reason_not_run": job.no_check_reason,
            "tolerance": CHECK_TOLERANCE,
            "replicas": rec.checks.iter().map(|(d, g)| json!({
                "d": d, "max_rel_err": g.max_rel_err, "differing": g.differing, "values": g.values,
                "weights_differing": g.weights_differing, "weights_compared": g.weights_compared,
            })).collect::<Vec<_>>(),
        },
        "calibration": {
            "gemm": {
                "flops_per_rank_step": f.flops_per_rank_step,
                "block_forward_flops": b.flops() / 3.0,
                "compute_us": compute_us,
                "flop_per_s": if compute_us > 0.0 { f.flops_per_rank_step / (compute_us * 1e-6) } else { 0.0 },
                "nominal_flop_per_s": nominal,
                "what": "the block's matrix-product FLOP of one rank's step over its measured compute time (mean over ranks); under --work sleep nominal_flop_per_s is the rate the sleeps stand for",
            },
            "tp_calls": {
                "per_rank_step": TP_CALLS_PER_BLOCK * job.stages.layers_per_stage * per_rank_stages * s.microbatches,
                "per_block_pass": TP_CALLS_PER_BLOCK / 2,
                "collective": "all_reduce",
                "bytes": b.tokens() * b.shape.hidden * 4,
            },
            "tp_wire": wire_json(&rec.tp_wire),
            "dp_wire": wire_json(&rec.dp_wire),
            "shard_gather_wire": wire_json(&rec.shard_wires.gather),
            "shard_scatter_wire": wire_json(&rec.shard_wires.scatter),
            "replica_wire": wire_json(&rec.shard_wires.replicas),
            "shard_layer_bytes": rec.shard_wires.layer_bytes,
            "pipeline_link": {
                "message_us": rec.record.message_us,
                "message_bytes": b.tokens() * b.shape.hidden * 4,
                "what": "one-way time of one activation between pipeline ranks 0 and 1 (half the probe's round trip)",
            },
        },
    })
}

/// run.json's `sharded` section: null without `--shard`.
fn sharded_json(job: &ComposedJob, rec: &ComposedRecord, f: &Figures) -> Value {
    let Some(s) = job.stages.reduce.shard else {
        return Value::Null;
    };
    let (per_param, params) = shard_formula(job, f, s);
    let ranks: Vec<Value> = rec
        .sharded()
        .iter()
        .map(|r| {
            let h = r.held_end;
            json!({
                "rank": r.rank, "gather_us": r.gather_us, "scatter_us": r.scatter_us,
                "exposed_us": r.exposed_us, "hidden_us": r.hidden_us(), "handover_us": r.handover_us, "optimizer_us": r.optimizer_us, "calls": r.calls,
                "held_bytes": {"weights": h.params, "grads": h.grads, "optimizer": h.optimizer, "buffers": h.buffers, "total": h.total()},
                "held_peak_bytes": r.held_peak_total,
            })
        })
        .collect();
    json!({
        "mode": s.name(),
        "group": job.stages.reduce.group_of(job.dp),
        "replicas": job.dp / job.stages.reduce.group_of(job.dp).max(1),
        "optimizer": "Adam, fp32 moments, learning rate 0 (the weights stay the seeded ones the check starts from)",
        "formula_bytes_per_param": per_param,
        "params_per_rank": params,
        "formula_bytes": per_param * params,
        "ranks": ranks,
    })
}
