//! One tensor-parallel degree on any communicator and device: the block's
//! timed run and check, then the wire's samples and the prediction of the
//! block's communication from their alpha-beta fit (or from --link).

use crate::cli::LayerJob;
use parbench::comm::{Collective, Communicator};
use parbench::compute::{Compute, Gemm};
use parbench::layers::moe::{run_ep, MoeConfig, MoeLayout};
use parbench::layers::{
    run_tp, wire_samples, LayerResult, Mode, RunOptions, SampleConditions, TpOutcome,
};
use parbench::model::fit::{fit_terms, per_call_terms};
use parbench::model::{terms, AlphaBetaTerms, LinkParams, ModelAlgo};

/// The seed of every weight and input, so runs compare across machines.
pub const SEED: u64 = 0x5EED_1A7E;

/// Where the link behind `comm_model_us` came from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LinkSource {
    /// Fitted to collectives timed on the same wire in this run.
    Fit,
    /// Given with --link.
    Flag,
    /// No model: t = 1 (no communication) or the fit failed.
    None,
}

impl LinkSource {
    pub fn name(self) -> &'static str {
        match self {
            LinkSource::Fit => "fit",
            LinkSource::Flag => "flag",
            LinkSource::None => "none",
        }
    }
}

/// Everything measured at one degree, the same on every rank.
#[derive(Clone, Debug)]
pub struct TpMeasurement {
    pub tp: usize,
    pub outcome: TpOutcome,
    pub wire: String,
    /// The algorithm of each collective the block calls, `name=algo`.
    pub algos: String,
    pub link: Option<LinkParams>,
    pub link_source: LinkSource,
    /// Predicted communication per block call, microseconds (NaN without a link).
    pub comm_model_us: f64,
    pub threads: usize,
}

/// The cost structure the model uses for `coll` with the communicator's
/// algorithm: that algorithm's, or one latency and the busbw factor when the
/// model does not know it (NCCL's own choice, `auto`).
fn coll_terms(coll: Collective, algo: &ModelAlgo, p: usize, bytes: u64) -> AlphaBetaTerms {
    terms(coll, algo, p, bytes).unwrap_or_else(|| per_call_terms(coll, p))
}

/// The link fitted to `colls` (each run with its algorithm) timed on
/// `comm` in `conditions` at the block's `bytes` and a few sizes below and
/// above, so the fit sees both the latency and the bandwidth term around
/// the operating point; no link (with a line from rank 0 naming `degree`)
/// when the fit fails. Collective: every rank calls it.
fn fit_link<M: Communicator>(
    comm: &mut M,
    plan: &LayerJob,
    degree: &str,
    colls: &[(Collective, ModelAlgo)],
    bytes: u64,
    conditions: &mut SampleConditions<'_>,
) -> LayerResult<(Option<LinkParams>, LinkSource)> {
    let sizes: Vec<u64> = [16, 8, 4, 2, 1]
        .iter()
        .map(|d| bytes / d)
        .chain(std::iter::once(bytes * 2))
        .collect();
    let p = comm.world();
    let mut rows = Vec::new();
    for (c, algo) in colls {
        let counts = (plan.warmup.max(1), plan.iters);
        for s in wire_samples(comm, *c, &sizes, plan.dtype, counts, conditions)? {
            rows.push((coll_terms(*c, algo, p, s.bytes), s.bytes, s.seconds));
        }
    }
    Ok(match fit_terms(&rows) {
        Ok(f) => (Some(f.link()), LinkSource::Fit),
        Err(e) => {
            if comm.rank() == 0 {
                eprintln!("bench-layers: {degree}: no alpha-beta fit of the wire: {e}");
            }
            (None, LinkSource::None)
        }
    })
}

/// The timed loop and check every block of `plan` runs: its warm-up,
/// iterations and check, the suite's seed.
pub fn run_options(plan: &LayerJob) -> RunOptions {
    RunOptions {
        warmup: plan.warmup,
        iters: plan.iters,
        check: plan.check,
        seed: SEED,
    }
}

/// An MLP's products on one rank (up, then down: `n` rows, width `h`,
/// inner width `f`): the compute the block runs before its collectives,
/// which the fit's samples on the CPU follow.
struct MlpProducts<C: Compute> {
    up: Gemm,
    down: Gemm,
    x: C::Buf,
    w_up: C::Buf,
    mid: C::Buf,
    w_down: C::Buf,
    out: C::Buf,
}

impl<C: Compute> MlpProducts<C> {
    fn new(dev: &C, (n, h, f): (usize, usize, usize)) -> LayerResult<Self> {
        Ok(MlpProducts {
            up: Gemm::dense(n, f, h),
            down: Gemm::dense(n, h, f),
            x: dev.alloc(n * h)?,
            w_up: dev.alloc(h * f)?,
            mid: dev.alloc(n * f)?,
            w_down: dev.alloc(f * h)?,
            out: dev.alloc(n * h)?,
        })
    }

    fn run(&mut self, dev: &C) -> LayerResult<()> {
        dev.gemm(&self.up, &self.x, &self.w_up, &mut self.mid)?;
        dev.gemm(&self.down, &self.mid, &self.w_down, &mut self.out)?;
        dev.sync()?;
        Ok(())
    }
}

/// Whether the fit's samples follow the block's compute: on the CPU the
/// compute and the collective share the cores and caches, and a collective
/// right after the MLP's products runs slower than one back to back; on
/// GPUs the collective runs on device memory beside no host compute.
fn samples_after_compute(plan: &LayerJob) -> bool {
    !plan.backend.on_gpus()
}

/// The rank's MLP products in the dense block at degree `tp`: (rows,
/// width, inner width).
fn tp_mlp(plan: &LayerJob, tp: usize) -> (usize, usize, usize) {
    let f = plan.block.shape.ffn.div_ceil(tp.max(1));
    (plan.block.tokens(), plan.block.shape.hidden, f)
}

/// The rank's expert products in the MoE block at `layout`, its rows
/// under balanced routing: (rows, width, inner width).
pub fn moe_mlp(moe: &MoeConfig, layout: MoeLayout) -> (usize, usize, usize) {
    let rows = moe.local_tokens(layout.world()) * moe.topk * layout.etp;
    (rows, moe.hidden, moe.ffn.div_ceil(layout.etp.max(1)))
}

/// The conditions of a fit's samples after `mlp`'s products, in words, for
/// the table.
pub fn sample_text(plan: &LayerJob, (n, h, f): (usize, usize, usize)) -> String {
    if samples_after_compute(plan) {
        format!(
            "each alone after the rank's MLP products ({n} x {h} x {f}, up and down) and a barrier"
        )
    } else {
        "timed back to back".into()
    }
}

/// The TP fit's conditions in words, for the table.
pub fn tp_sample_text(plan: &LayerJob, tp: usize) -> String {
    sample_text(plan, tp_mlp(plan, tp))
}

/// The link fitted as [`fit_link`] does, its samples each after `mlp`'s
/// products on the CPU (back to back on GPUs).
fn fit_link_after<C, M>(
    dev: &C,
    comm: &mut M,
    plan: &LayerJob,
    degree: &str,
    colls: &[(Collective, ModelAlgo)],
    bytes: u64,
    mlp: (usize, usize, usize),
) -> LayerResult<(Option<LinkParams>, LinkSource)>
where
    C: Compute,
    M: Communicator<Buffer = C::Buf>,
{
    if !samples_after_compute(plan) {
        let back_to_back = &mut SampleConditions::BackToBack;
        return fit_link(comm, plan, degree, colls, bytes, back_to_back);
    }
    let mut products = MlpProducts::new(dev, mlp)?;
    let mut compute = || products.run(dev);
    let after = &mut SampleConditions::AfterCompute(&mut compute);
    fit_link(comm, plan, degree, colls, bytes, after)
}

/// Runs plan's block at t = `comm.world()`, then models its communication.
/// Collective: every rank calls it.
pub fn measure_tp<C, M>(
    dev: &C,
    comm: &mut M,
    plan: &LayerJob,
    threads: usize,
) -> LayerResult<TpMeasurement>
where
    C: Compute,
    M: Communicator<Buffer = C::Buf>,
{
    let tp = comm.world();
    let opts = run_options(plan);
    let outcome = run_tp(dev, comm, &plan.block, &opts)?;
    let traffic = plan.block.tp_traffic(tp, plan.dtype);
    let bytes = traffic.bytes_per_call();
    let calls = traffic.collectives();
    let algos: Vec<(Collective, ModelAlgo, u64)> = calls
        .iter()
        .map(|&(c, n)| {
            (
                c,
                ModelAlgo::of(&comm.algo_for(c, c.send_bytes(bytes, tp))),
                n,
            )
        })
        .collect();
    let (link, link_source) = if calls.is_empty() {
        (None, LinkSource::None)
    } else if let Some(l) = plan.link {
        (Some(l), LinkSource::Flag)
    } else {
        let colls: Vec<_> = algos.iter().map(|(c, a, _)| (*c, a.clone())).collect();
        let degree = format!("tp {tp}");
        fit_link_after(dev, comm, plan, &degree, &colls, bytes, tp_mlp(plan, tp))?
    };
    let comm_model_us = match link {
        Some(l) => {
            algos
                .iter()
                .map(|(c, a, n)| *n as f64 * coll_terms(*c, a, tp, bytes).seconds(bytes as f64, &l))
                .sum::<f64>()
                * 1e6
        }
        None if calls.is_empty() => 0.0,
        None => f64::NAN,
    };
    Ok(TpMeasurement {
        tp,
        outcome,
        wire: comm.wire(),
        algos: algos
            .iter()
            .map(|(c, a, _)| format!("{c}={a}"))
            .collect::<Vec<_>>()
            .join(" "),
        link,
        link_source,
        comm_model_us,
        threads,
    })
}

/// Everything measured at one layout (`ep x etp` ranks), the same on every
/// rank; serialised for the tcp launcher, which reads rank 0's.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MoeMeasurement {
    pub ep: usize,
    /// Expert tensor-parallel degree.
    pub etp: usize,
    /// The attention's tensor-parallel degree (1 without an attention).
    pub tp: usize,
    pub compute_us: f64,
    /// The expert-parallel all-to-alls.
    pub a2a_us: f64,
    /// The expert-tensor groups' all-gathers and reduce-scatters.
    pub etp_us: f64,
    /// The attention's tensor groups' all-gathers and reduce-scatters.
    pub tp_us: f64,
    pub wait_us: f64,
    pub total_us: f64,
    pub slowest_rank: usize,
    /// NaN when the check was skipped.
    #[serde(with = "nan_as_null")]
    pub check_max_err: f64,
    pub check_tolerance: f64,
    /// Routed token copies each rank's expert shards processed.
    pub rows_per_rank: Vec<usize>,
    /// Max over mean of those.
    pub imbalance: f64,
    /// Bytes of one rank's all-to-all buffer in a balanced dispatch (every
    /// routed copy of its tokens, its own included: nccl-tests' alltoall size).
    pub a2a_bytes: u64,
    /// Bytes of one rank's rows of the residual stream (what the
    /// attention's exchanges move to each peer).
    pub rows_bytes: u64,
    /// All-to-alls of rows per block call (2 forward, 4 in train).
    pub a2a_calls: u64,
    /// The pairwise all-to-all's prediction for those calls and the
    /// counts' exchanges, microseconds (NaN without a link, 0 at ep 1).
    #[serde(with = "nan_as_null")]
    pub a2a_model_us: f64,
    /// The same prediction for the expert-tensor exchanges (as many, each
    /// a pairwise exchange of a rank's rows over etp ranks; 0 at etp 1).
    #[serde(with = "nan_as_null")]
    pub etp_model_us: f64,
    /// The same for the attention's exchanges (as many, each a pairwise
    /// exchange of a rank's rows of the residual stream over tp ranks).
    #[serde(with = "nan_as_null")]
    pub tp_model_us: f64,
    pub wire: String,
    pub algo: String,
    #[serde(with = "nan_as_null")]
    pub link_alpha_us: f64,
    #[serde(with = "nan_as_null")]
    pub link_gbps: f64,
    pub link_source: String,
    pub threads: usize,
}

/// Runs plan's MoE block split as `layout` (`comm.world()` ranks), then
/// models its all-to-alls and expert-tensor exchanges with the pairwise
/// exchange's alpha-beta terms over their groups' ranks, on a link fitted
/// to uniform all-to-alls over all the ranks around the dispatch's size
/// (or --link). Collective: every rank calls it.
pub fn measure_moe<C, M>(
    dev: &C,
    comm: &mut M,
    plan: &LayerJob,
    moe: &MoeConfig,
    layout: MoeLayout,
    threads: usize,
) -> LayerResult<MoeMeasurement>
where
    C: Compute,
    M: Communicator<Buffer = C::Buf>,
{
    let MoeLayout { ep, etp, tp } = layout;
    let world = layout.world();
    let opts = run_options(plan);
    let outcome = run_ep(dev, comm, moe, layout, &opts)?;
    let a2a_bytes = (moe.local_tokens(world) * moe.topk * moe.hidden * plan.dtype.size()) as u64;
    let a2a_calls = if moe.mode == Mode::Train { 4 } else { 2 };
    let coll = Collective::AllToAll;
    // The exchange is parbench's pairwise one on every backend.
    let algo = ModelAlgo::of("pairwise");
    let (link, link_source) = if world == 1 {
        (None, LinkSource::None)
    } else if let Some(l) = plan.link {
        (Some(l), LinkSource::Flag)
    } else {
        fit_link_after(
            dev,
            comm,
            plan,
            &layout.to_string(),
            &[(coll, algo.clone())],
            a2a_bytes,
            moe_mlp(moe, layout),
        )?
    };
    // Over `p` ranks: the calls of `bytes` (a rank's whole buffer) and,
    // with `counts`, their exchange of one f64 per local expert and peer.
    let model = |p: usize, bytes: u64, counts: bool| match link {
        _ if p == 1 => 0.0,
        Some(l) => {
            let t = |bytes: u64| coll_terms(coll, &algo, p, bytes).seconds(bytes as f64, &l);
            let counts_bytes = (moe.local_experts(ep) * 8 * p) as u64;
            let counts = if counts { t(counts_bytes) } else { 0.0 };
            (a2a_calls as f64 * t(bytes) + counts) * 1e6
        }
        None => f64::NAN,
    };
    let rows_bytes = (moe.local_tokens(world) * moe.hidden * plan.dtype.size()) as u64;
    let t = &outcome.timing;
    Ok(MoeMeasurement {
        ep,
        etp,
        tp,
        compute_us: t.compute_us,
        a2a_us: t.a2a_us,
        etp_us: t.etp_us,
        tp_us: t.tp_us,
        wait_us: t.wait_us,
        total_us: t.total_us,
        slowest_rank: t.slowest_rank,
        check_max_err: outcome.check.as_ref().map_or(f64::NAN, |c| c.max_err),
        check_tolerance: parbench::layers::check::tolerance(plan.device_dtype()),
        imbalance: outcome.imbalance(),
        rows_per_rank: outcome.rows_per_rank,
        a2a_bytes,
        a2a_calls,
        rows_bytes,
        a2a_model_us: model(ep, a2a_bytes, true),
        // A balanced rank holds a2a_bytes of rows after the dispatch and
        // sends them to each of its etp - 1 peers.
        etp_model_us: model(etp, a2a_bytes * etp as u64, true),
        // A rank's rows of the residual stream to each of its tp - 1 peers.
        tp_model_us: model(tp, rows_bytes * tp as u64, false),
        wire: comm.wire(),
        algo: algo.to_string(),
        link_alpha_us: link.map_or(f64::NAN, |l| l.alpha_us()),
        link_gbps: link.map_or(f64::NAN, |l| l.bandwidth_gbps()),
        link_source: link_source.name().into(),
        threads,
    })
}

/// JSON has no NaN: "not measured" travels as null and comes back NaN.
mod nan_as_null {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if v.is_finite() {
            s.serialize_f64(*v)
        } else {
            s.serialize_none()
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
    }
}
