//! The terminal table and the layers.csv rows of a sweep.

use crate::cli::LayerJob;
use crate::sweep::{MoeMeasurement, TpMeasurement};
use parbench::compute::cpu::{CpuCompute, GemmKernels};
use parbench::compute::GemmMath;
use parbench::layers::moe::{MoeConfig, MoeLayout};
use parbench::measure::noise::ForeignCpu;
use parbench::measure::ComputeReference;
use parbench::results::{LayerRow, SCHEMA_VERSION};

/// What the block's products compute in on the plan's device, and with
/// which kernels: a bf16 table or record says whether bf16 was arithmetic
/// or only storage.
pub fn gemm_of(plan: &LayerJob) -> (GemmMath, String) {
    #[cfg(feature = "cuda")]
    if plan.backend.on_gpus() {
        return (
            parbench::compute::cuda::CudaCompute::gemm_math_of(plan.device_dtype()),
            "cuBLASLt".into(),
        );
    }
    // The CPU backends (and a GPU backend without the cuda feature, which
    // fails before it measures).
    (
        CpuCompute::gemm_math_of(plan.dtype),
        GemmKernels::detect().map_or_else(
            |e| format!("no gemm kernels: {e}"),
            |k| format!("gemm {}", k.name()),
        ),
    )
}

/// Speed-up over the TP = 1 row (among `before`, the rows kept already,
/// and `rows`) and efficiency (speed-up / t); NaN when there is none yet.
pub fn fill_speedup(before: &[LayerRow], rows: &mut [LayerRow]) {
    let base = before
        .iter()
        .chain(rows.iter())
        .find(|r| r.tp == 1)
        .map(|r| r.total_us);
    for r in rows {
        r.speedup = base.map_or(f64::NAN, |b1| b1 / r.total_us);
        r.efficiency = r.speedup / r.tp as f64;
    }
}

/// Marks a speed-up above the ideal in a table's cell.
pub const ABOVE_IDEAL: &str = "*";

/// Whether a speed-up is above the ideal `ranks`-fold (an unknown one,
/// NaN, is not).
fn above_ideal(speedup: f64, ranks: usize) -> bool {
    speedup > ranks as f64
}

/// A speed-up over the block on one rank, two decimals, marked when it
/// is above the ideal `ranks`-fold.
pub fn speedup_cell(speedup: f64, ranks: usize) -> String {
    let mark = if above_ideal(speedup, ranks) {
        ABOVE_IDEAL
    } else {
        ""
    };
    format!("{}{mark}", num(speedup, 2))
}

/// A row's figures against the block on one rank, for the line a
/// speed-up above the ideal prints.
#[derive(Clone, Copy, Debug)]
pub struct AgainstWhole {
    /// The ranks sharing the block: the ideal speed-up.
    pub ranks: usize,
    pub speedup: f64,
    /// The slowest sharded rank's compute, us per call.
    pub compute_us: f64,
    /// The block on one rank: its compute and its total, us per call.
    pub whole_compute_us: f64,
    pub whole_total_us: f64,
}

/// The line under a table when a row's speed-up is above the ideal
/// (else none): its slowest shard's compute times N against the block's
/// compute on one rank, both measured in this run; where that is no
/// faster, the one-rank block's time beyond its compute.
pub fn above_ideal_line(degree: &str, a: AgainstWhole) -> Option<String> {
    if !above_ideal(a.speedup, a.ranks) {
        return None;
    }
    let shards = a.compute_us * a.ranks as f64;
    let head = format!(
        "# {ABOVE_IDEAL} {degree}: {:.2} above the ideal {}: compute x{} = {:.1} us",
        a.speedup, a.ranks, a.ranks, shards
    );
    Some(if shards < a.whole_compute_us {
        format!(
            "{head} < one rank's {:.1} us (both measured)",
            a.whole_compute_us
        )
    } else {
        format!(
            "{head} >= one rank's {:.1} us; one rank's other time {:.1} us",
            a.whole_compute_us,
            a.whole_total_us - a.whole_compute_us
        )
    })
}

/// The block's configuration for run.json.
pub fn block_json(plan: &LayerJob) -> serde_json::Value {
    let b = &plan.block;
    let s = &b.shape;
    serde_json::json!({
        "preset": plan.preset,
        "hidden": s.hidden,
        "heads": s.heads,
        "ffn": s.ffn,
        "seq": s.seq,
        "batch": s.batch,
        "mode": b.mode.name(),
        "decode": b.decode,
        "sequence_parallel": b.seq_parallel,
        "dtype": plan.dtype.name(),
        "tp": plan.tps,
        "iters": plan.iters,
        "warmup": plan.warmup,
        "check": plan.check,
        "link": plan.link.map(|l| serde_json::json!({"alpha_us": l.alpha_us(), "gbps": l.bandwidth_gbps()})),
        "tokens_per_call": b.tokens(),
        "gemm_math": gemm_of(plan).0,
        "gemm_kernels": gemm_of(plan).1,
        "times": "per block call, slowest rank's mean: compute, the collectives after a barrier, and that barrier (wait) (phases separated by device/communicator syncs)",
    })
}

/// One row per degree (speed-up and efficiency NaN until [`fill_speedup`]).
pub fn rows(plan: &LayerJob, run_id: &str, backend: &str, ms: &[TpMeasurement]) -> Vec<LayerRow> {
    let b = &plan.block;
    let s = &b.shape;
    let tokens = b.tokens() as f64;
    ms.iter()
        .map(|m| {
            let t = &m.outcome.timing;
            let traffic = b.tp_traffic(m.tp, plan.dtype);
            let calls = traffic.calls_per_block();
            // No collective at t = 1: no bytes per call either.
            let per_call = if calls == 0 {
                0
            } else {
                traffic.bytes_per_call()
            };
            LayerRow {
                schema: SCHEMA_VERSION,
                run_id: run_id.to_string(),
                backend: backend.to_string(),
                wire: m.wire.clone(),
                mode: b.mode.name().to_string(),
                decode: b.decode,
                preset: plan.preset.clone(),
                hidden: s.hidden as u64,
                heads: s.heads as u64,
                ffn: s.ffn as u64,
                seq: s.seq as u64,
                batch: s.batch as u64,
                dtype: plan.device_dtype().name().to_string(),
                tp: m.tp,
                seq_parallel: b.seq_parallel,
                iters: plan.iters as u64,
                compute_us: t.compute_us,
                comm_us: t.comm_us,
                wait_us: t.wait_us,
                total_us: t.total_us,
                total_min_us: t.total_min_us,
                total_max_us: t.total_max_us,
                per_token_us: t.total_us / tokens,
                bytes_per_call: per_call,
                calls_per_block: calls,
                bytes_per_token: (per_call * calls) as f64 / tokens,
                comm_model_us: m.comm_model_us,
                speedup: f64::NAN,
                efficiency: f64::NAN,
                check_max_err: m.outcome.check.as_ref().map_or(f64::NAN, |c| c.max_err),
                comm_algo: m.algos.clone(),
                link_source: m.link_source.name().to_string(),
                link_alpha_us: m.link.map_or(f64::NAN, |l| l.alpha_us()),
                // A free link (tp 1 sends nothing: beta 0) has no finite
                // bandwidth: not measured, not infinity.
                link_gbps: m
                    .link
                    .map(|l| l.bandwidth_gbps())
                    .filter(|g| g.is_finite())
                    .unwrap_or(f64::NAN),
                slowest_rank: t.slowest_rank,
                threads: m.threads,
                compute_gflops: b.flops() / m.tp as f64 / (t.compute_us * 1e3),
            }
        })
        .collect()
}

fn num(v: f64, prec: usize) -> String {
    if v.is_nan() {
        "-".into()
    } else {
        format!("{v:.prec$}")
    }
}

fn bytes(b: u64) -> String {
    match b {
        0 => "0".into(),
        b if b >= 1 << 30 => format!("{:.1}G", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1}M", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1}K", b as f64 / (1u64 << 10) as f64),
        b => format!("{b}"),
    }
}

/// A check's largest error, or `-` where none was taken.
fn check_cell(max_err: f64) -> String {
    if max_err.is_nan() {
        "-".into()
    } else {
        format!("{max_err:.1e}")
    }
}

/// One line of a fixed-width table: each column `(name, width, shown
/// without -v)` kept right-aligned to its width, one space apart, after
/// `lead` (`#` for the header, a space for a row).
fn fixed_row(
    cols: &[(&str, usize, bool)],
    lead: char,
    cells: Vec<String>,
    verbose: bool,
) -> String {
    let mut out = String::from(lead);
    let kept = cols.iter().zip(cells).filter(|(c, _)| verbose || c.2);
    for (i, ((_, width, _), cell)) in kept.enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(&format!("{cell:>width$}"));
    }
    out.push('\n');
    out
}

/// The table, one line per degree, as nccl-tests prints its sweeps.
/// `noise`: the noise guard's figure so far; in a noisy run the model is
/// not held to the measured communication (one line says why).
pub fn table(plan: &LayerJob, rows: &[LayerRow], noise: Option<&ForeignCpu>) -> String {
    let b = &plan.block;
    let s = &b.shape;
    let (math, kernels) = gemm_of(plan);
    let mut out = format!(
        "# bench-layers: {} {}{} | preset {} h={} heads={} ffn={} seq={} b={} ({} tokens/call)\n# {} | {} kernels\n",
        rows.first().map_or("", |r| r.backend.as_str()),
        parbench::layers::mode_name(b.mode, b.decode),
        if b.seq_parallel { " sequence-parallel" } else { "" },
        plan.preset,
        s.hidden,
        s.heads,
        s.ffn,
        s.seq,
        s.batch,
        b.tokens(),
        math,
        kernels,
    );
    out.push_str(&comment(
        "times per block call (forward, +backward in train), slowest rank's mean; wait: the barrier before each collective",
    ));
    // (name, width, shown without -v)
    let cols: [(&str, usize, bool); 13] = [
        ("tp", 3, true),
        ("compute_us", 11, true),
        ("comm_us", 10, true),
        ("wait_us", 9, true),
        ("total_us", 11, true),
        ("tok_us", 10, false),
        ("B/call", 9, false),
        ("calls", 5, false),
        ("model_us", 11, true),
        ("speedup", 8, true),
        ("eff", 7, true),
        ("check", 9, true),
        ("GF/s", 7, false),
    ];
    let names = cols.iter().map(|c| c.0.to_string()).collect();
    out.push_str(&fixed_row(&cols, '#', names, plan.verbose));
    for r in rows {
        out.push_str(&fixed_row(
            &cols,
            ' ',
            vec![
                r.tp.to_string(),
                num(r.compute_us, 1),
                num(r.comm_us, 1),
                num(r.wait_us, 1),
                num(r.total_us, 1),
                num(r.per_token_us, 2),
                bytes(r.bytes_per_call),
                r.calls_per_block.to_string(),
                num(r.comm_model_us, 1),
                speedup_cell(r.speedup, r.tp),
                num(r.efficiency, 2),
                check_cell(r.check_max_err),
                num(r.compute_gflops, 1),
            ],
            plan.verbose,
        ));
    }
    let whole = rows.iter().find(|r| r.tp == 1);
    for r in rows {
        let line = whole.and_then(|w| {
            above_ideal_line(
                &format!("tp {}", r.tp),
                AgainstWhole {
                    ranks: r.tp,
                    speedup: r.speedup,
                    compute_us: r.compute_us,
                    whole_compute_us: w.compute_us,
                    whole_total_us: w.total_us,
                },
            )
        });
        if let Some(l) = line {
            out.push_str(&l);
            out.push('\n');
        }
    }
    for r in rows.iter().filter(|r| r.tp > 1) {
        let fitted = format!(
            "collectives at 1/16 to 2x the block's call size, {}",
            crate::sweep::tp_sample_text(plan, r.tp)
        );
        out.push_str(&comment(&format!(
            "tp {}: {} | {}",
            r.tp,
            r.comm_algo,
            link_text(&r.link_source, r.link_alpha_us, r.link_gbps, &fitted)
        )));
    }
    let held: Vec<(usize, f64, f64)> = rows
        .iter()
        .filter(|r| r.tp > 1)
        .map(|r| (r.tp, r.comm_us, r.comm_model_us))
        .collect();
    for line in model_lines("tp", &held, noise) {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// A `# ` comment under a table, broken into lines of at most
/// [`parbench::term::WIDTH`] columns (`#   ` before each continuation).
pub fn comment(text: &str) -> String {
    parbench::term::wrap_hanging(text, "# ", "#   ", parbench::term::WIDTH)
}

/// The model held to the measured communication, per degree `(tp,
/// measured us, model us)`: a WARNING for each it misses beyond the
/// margin. In a noisy run the times measure what other processes left,
/// so instead one line says the run was noisy.
pub fn model_lines(
    label: &str,
    degrees: &[(usize, f64, f64)],
    noise: Option<&ForeignCpu>,
) -> Vec<String> {
    if let Some(w) = noise.and_then(ForeignCpu::warning) {
        let line = comment(&format!("{w}; the model is not held to it"));
        return vec![line.trim_end().to_string()];
    }
    degrees
        .iter()
        .filter_map(|&(tp, measured, model)| {
            let line = comment(&format!("{label} {tp}: {}", model_miss(measured, model)?));
            Some(line.trim_end().to_string())
        })
        .collect()
}

/// The link behind a model, and where it came from (`fitted`: what the
/// fit was of, when it was one).
fn link_text(source: &str, alpha_us: f64, gbps: f64, fitted: &str) -> String {
    let from = match source {
        "fit" => format!("fit of this run's {fitted}"),
        "flag" => "given with --link".into(),
        _ => "none".into(),
    };
    format!(
        "link {source} alpha {} us, {} GB/s ({from})",
        num(alpha_us, 2),
        num(gbps, 2)
    )
}

/// A WARNING when the model's communication time parts from the measured
/// one beyond the shared margin (`parbench::model::priced`).
pub fn model_miss(measured_us: f64, model_us: f64) -> Option<String> {
    use parbench::model::priced::{priced_well, WITHIN};
    let ratio = model_us / measured_us;
    if !(ratio.is_finite() && measured_us > 0.0) || priced_well(ratio) {
        return None;
    }
    Some(format!(
        "WARNING: the model's communication {} us is x{:.2} the measured {} us (beyond {:.0}%): the collectives inside the block ran slower or faster than the same collectives alone (ranks sharing cores with compute, or a wire that changed between the fit and the block)",
        num(model_us, 1),
        ratio,
        num(measured_us, 1),
        100.0 * WITHIN
    ))
}

/// The compute reference's record for run.json: what [`ComputeReference`]
/// writes, or why there is none.
pub fn reference_json(r: Option<&ComputeReference>) -> serde_json::Value {
    match r {
        Some(r) => r.to_json(),
        None => serde_json::json!({ "none": NO_GPU_REFERENCE }),
    }
}

const NO_GPU_REFERENCE: &str =
    "not measured on GPUs: the CPU's product says nothing of the GPU's compute speed";

/// The line under the table: the machine's compute speed in this run, and
/// the block's compute rate beside it.
pub fn reference_line(r: Option<&ComputeReference>, rows: &[LayerRow]) -> String {
    let Some(r) = r else {
        return format!("# compute reference: {NO_GPU_REFERENCE}");
    };
    let (Some(us), Some(gf)) = (r.median_us(), r.gflops_per_cpu()) else {
        return "# compute reference: no sample taken".into();
    };
    let rates: Vec<String> = rows
        .iter()
        .filter(|row| row.compute_gflops.is_finite() && row.threads > 0)
        .map(|row| {
            format!(
                "tp {} {:.2}",
                row.tp,
                row.compute_gflops / row.threads as f64 / gf
            )
        })
        .collect();
    let line = format!(
        "compute reference: {}: {:.0} us median of {} samples (spread {:.1}%), {:.1} GFLOP/s a CPU{}",
        r.kernel,
        us,
        r.samples_us.len(),
        r.spread().unwrap_or(0.0) * 100.0,
        gf,
        if rates.is_empty() {
            String::new()
        } else {
            format!(
                "; the block's compute rate a thread, over it: {}",
                rates.join(", ")
            )
        }
    );
    comment(&line).trim_end().to_string()
}

/// The MoE block's configuration for run.json.
pub fn moe_json(plan: &LayerJob, moe: &MoeConfig) -> serde_json::Value {
    serde_json::json!({
        "block": "moe",
        "preset": plan.preset,
        "hidden": moe.hidden,
        "experts": moe.experts,
        "topk": moe.topk,
        "expert_ffn": moe.ffn,
        "shared_experts": moe.shared,
        "tokens_per_call": moe.tokens,
        "mode": moe.mode.name(),
        "dtype": plan.dtype.name(),
        "ep": plan.moe_layouts.iter().map(|l| l.ep).collect::<Vec<_>>(),
        "etp": plan.moe_layouts.iter().map(|l| l.etp).collect::<Vec<_>>(),
        "tp": plan.moe_layouts.iter().map(|l| l.tp).collect::<Vec<_>>(),
        "attention": moe.attention.map(|a| serde_json::json!({"heads": a.heads, "seq": a.seq})),
        "iters": plan.iters,
        "warmup": plan.warmup,
        "check": plan.check,
        "link": plan.link.map(|l| serde_json::json!({"alpha_us": l.alpha_us(), "gbps": l.bandwidth_gbps()})),
        "gemm_math": gemm_of(plan).0,
        "gemm_kernels": gemm_of(plan).1,
        "times": "per block call, slowest rank's mean: compute, the expert-parallel all-to-alls, the expert-tensor and the attention's tensor exchanges after a barrier each, and those barriers (wait)",
    })
}

/// The MoE table's header: what ran, then the columns.
pub fn moe_header(plan: &LayerJob, moe: &MoeConfig) -> String {
    let (math, kernels) = gemm_of(plan);
    let attention = moe.attention.map_or(String::new(), |a| {
        format!(
            "attention ({} heads, seq {}, tensor-parallel, sequence-parallel) + ",
            a.heads, a.seq
        )
    });
    let names = moe_cols(moe).iter().map(|c| c.0.to_string()).collect();
    format!(
        "{}{}{}",
        comment(&format!(
            "bench-layers: {} {} {attention}MoE | h={} experts={} top-{} expert-ffn={} shared={} ({} tokens/call) | {math} | {kernels} kernels",
            plan.backend.name(),
            moe.mode.name(),
            moe.hidden,
            moe.experts,
            moe.topk,
            moe.ffn,
            moe.shared,
            moe.tokens,
        )),
        comment("times per block call, slowest rank's mean; a2a: the all-to-alls once every rank arrived, etp: the expert-tensor gathers and reduce-scatters, tp: the attention's, wait: the barrier before each"),
        fixed_row(&moe_cols(moe), '#', names, plan.verbose).trim_end()
    )
}

/// The MoE table's columns `(name, width, shown without -v)`: the
/// attention's degree and exchange shown only where the block has one
/// (`-v` shows them, `-` and 0, as the records keep them).
fn moe_cols(moe: &MoeConfig) -> [(&'static str, usize, bool); 15] {
    let attention = moe.attention.is_some();
    [
        ("ep", 3, true),
        ("etp", 4, true),
        ("tp", 3, attention),
        ("compute_us", 11, true),
        ("a2a_us", 10, true),
        ("etp_us", 9, true),
        ("tp_us", 9, attention),
        ("wait_us", 10, true),
        ("total_us", 11, true),
        ("model_us", 10, true),
        ("B/a2a", 9, false),
        ("speedup", 8, true),
        ("imbal", 6, true),
        ("check", 9, true),
        ("GF/s", 7, false),
    ]
}

/// One MoE row: `first` is the sweep's first row, for the speed-up over
/// the block on one rank.
pub fn moe_row(
    m: &MoeMeasurement,
    first: Option<&MoeMeasurement>,
    moe: &MoeConfig,
    verbose: bool,
) -> String {
    let base = first.unwrap_or(m);
    let speedup = if base.ep * base.etp == 1 {
        base.total_us / m.total_us
    } else {
        f64::NAN
    };
    let cells = vec![
        m.ep.to_string(),
        m.etp.to_string(),
        if moe.attention.is_some() {
            m.tp.to_string()
        } else {
            "-".into()
        },
        num(m.compute_us, 1),
        num(m.a2a_us, 1),
        num(m.etp_us, 1),
        num(m.tp_us, 1),
        num(m.wait_us, 1),
        num(m.total_us, 1),
        num(m.a2a_model_us + m.etp_model_us + m.tp_model_us, 1),
        bytes(if m.ep > 1 { m.a2a_bytes } else { 0 }),
        speedup_cell(speedup, m.ep * m.etp),
        num(m.imbalance, 2),
        check_cell(m.check_max_err),
        num(
            moe.flops() / (m.ep * m.etp) as f64 / (m.compute_us * 1e3),
            1,
        ),
    ];
    fixed_row(&moe_cols(moe), ' ', cells, verbose)
        .trim_end()
        .to_string()
}

/// The line a layout's speed-up above the ideal prints, against the
/// sweep's first row when that is the block on one rank.
pub fn moe_above_ideal(m: &MoeMeasurement, first: Option<&MoeMeasurement>) -> Option<String> {
    let whole = first.filter(|f| f.ep * f.etp == 1)?;
    above_ideal_line(
        &format!("ep {} etp {}", m.ep, m.etp),
        AgainstWhole {
            ranks: m.ep * m.etp,
            speedup: whole.total_us / m.total_us,
            compute_us: m.compute_us,
            whole_compute_us: whole.compute_us,
            whole_total_us: whole.total_us,
        },
    )
}

/// The lines under the MoE table for a degree: the link behind the model,
/// the tolerance the check was held to, each rank's load (the model held
/// to the all-to-all is `model_lines`').
pub fn moe_detail(plan: &LayerJob, moe: &MoeConfig, m: &MoeMeasurement) -> String {
    let layout = match m.tp {
        1 => format!("ep {} etp {}", m.ep, m.etp),
        tp => format!("ep {} etp {} tp {tp}", m.ep, m.etp),
    };
    let mut out = format!(
        "# {layout}: check {} within {:.0e} | copies per rank {:?}",
        if m.check_max_err.is_nan() {
            "skipped"
        } else {
            "held"
        },
        m.check_tolerance,
        m.rows_per_rank
    );
    if m.ep * m.etp > 1 {
        let split = MoeLayout {
            ep: m.ep,
            etp: m.etp,
            tp: m.tp,
        };
        let fitted = format!(
            "uniform all_to_all at the block's size, 1/16 to 2x, on this wire after the block, {}",
            crate::sweep::sample_text(plan, crate::sweep::moe_mlp(moe, split))
        );
        // Each exchange the layout has: its calls, bytes a rank, ranks, model.
        let parts = [
            (
                "all_to_all",
                m.a2a_bytes,
                m.ep,
                m.a2a_model_us,
                " + the counts",
            ),
            (
                "expert-tensor",
                m.a2a_bytes * m.etp as u64,
                m.etp,
                m.etp_model_us,
                " + the counts",
            ),
            (
                "attention",
                m.rows_bytes * m.tp as u64,
                m.tp,
                m.tp_model_us,
                "",
            ),
        ];
        let terms: Vec<String> = parts
            .iter()
            .filter(|p| p.2 > 1)
            .map(|(what, bytes, ranks, us, counts)| {
                format!(
                    "{what} x{} of {bytes} B a rank over {ranks} ranks ({}){counts}, {} us",
                    m.a2a_calls,
                    m.algo,
                    num(*us, 1)
                )
            })
            .collect();
        out.push('\n');
        out.push_str(
            comment(&format!(
                "{layout}: model {} us: {} | {}",
                num(m.a2a_model_us + m.etp_model_us + m.tp_model_us, 1),
                terms.join("; "),
                link_text(&m.link_source, m.link_alpha_us, m.link_gbps, &fitted)
            ))
            .trim_end(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_beyond_a_quarter_of_the_measurement_is_flagged() {
        assert!(model_miss(100.0, 120.0).is_none());
        assert!(model_miss(100.0, 80.0).is_none());
        let miss = model_miss(2659.8, 482.6).unwrap();
        assert!(miss.contains("x0.18") && miss.contains("WARNING"), "{miss}");
        assert!(model_miss(100.0, 130.0).unwrap().contains("x1.30"));
        assert!(model_miss(0.0, 10.0).is_none());
        assert!(model_miss(10.0, f64::NAN).is_none());
    }

    #[test]
    fn columns_of_the_records_alone_wait_for_v() {
        let cols = [("a", 3, true), ("detail", 6, false), ("b", 4, true)];
        let cells = || vec!["1".to_string(), "2".into(), "3".into()];
        assert_eq!(fixed_row(&cols, ' ', cells(), false), "   1    3\n");
        assert_eq!(fixed_row(&cols, ' ', cells(), true), "   1      2    3\n");
        let names = cols.iter().map(|c| c.0.to_string()).collect();
        assert_eq!(fixed_row(&cols, '#', names, false), "#  a    b\n");
    }

    #[test]
    fn a_speed_up_above_the_ideal_is_marked_with_what_was_measured() {
        let at = |speedup: f64, compute_us: f64| AgainstWhole {
            ranks: 2,
            speedup,
            compute_us,
            whole_compute_us: 300.0,
            whole_total_us: 310.0,
        };
        // Above 2x: marked, and the line says whose compute was faster.
        assert_eq!(speedup_cell(2.07, 2), "2.07*");
        let faster = above_ideal_line("tp 2", at(2.07, 140.0)).unwrap();
        assert!(faster.contains("compute x2 = 280.0 us"), "{faster}");
        assert!(faster.contains("< one rank's 300.0 us"), "{faster}");
        // Above 2x with the shards' compute at its share: not the compute.
        let other = above_ideal_line("tp 2", at(2.07, 160.0)).unwrap();
        assert!(other.contains(">= one rank's 300.0 us"), "{other}");
        assert!(other.contains("one rank's other time 10.0 us"), "{other}");
        assert!(faster.len() < 100 && other.len() < 110, "{faster}\n{other}");
        // At or below the ideal, or unknown: no mark, no line.
        for s in [2.0, 1.6, f64::NAN] {
            assert!(!speedup_cell(s, 2).contains(ABOVE_IDEAL), "{s}");
            assert!(above_ideal_line("tp 2", at(s, 140.0)).is_none(), "{s}");
        }
    }

    #[test]
    fn a_noisy_run_says_so_once_instead_of_missing_the_model() {
        let noise = |fraction: f64| ForeignCpu {
            wall_s: 10.0,
            cpus: 2,
            host_s: 20.0,
            own_s: 20.0 * (1.0 - fraction),
            steal_s: 0.0,
            foreign_s: 20.0 * fraction,
            fraction,
            resolution: 0.001,
            method: "test".into(),
        };
        // The x0.05 of a shared machine, at TP 2 and 4.
        let degrees = [(2, 2400.0, 120.0), (4, 3000.0, 150.0)];
        let quiet = model_lines("tp", &degrees, Some(&noise(0.02)));
        assert_eq!(quiet.len(), 2, "{quiet:?}");
        assert!(quiet.iter().all(|l| l.contains("WARNING: the model's")));
        // Broken into short lines, each a comment.
        for l in quiet.iter().flat_map(|l| l.lines()) {
            assert!(l.starts_with('#') && l.chars().count() <= 100, "{l}");
        }
        let noisy = model_lines("tp", &degrees, Some(&noise(0.8)));
        assert_eq!(noisy.len(), 1, "{noisy:?}");
        assert!(noisy[0].starts_with("# WARNING: a noisy run: other processes took 80%"));
        assert!(!noisy[0].contains("the model's communication"));
        assert_eq!(
            model_lines("tp", &degrees, None).len(),
            2,
            "no figure: held"
        );
    }
}
