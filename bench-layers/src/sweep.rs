//! One tensor-parallel degree on any communicator and device: the block's
//! timed run and check, then the wire's samples and the prediction of the
//! block's communication from their alpha-beta fit (or from --link).

use crate::cli::LayerJob;
use parbench::comm::{Collective, Communicator};
use parbench::compute::Compute;
use parbench::layers::{run_tp, wire_samples, LayerResult, RunOptions, TpOutcome};
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
    let opts = RunOptions {
        warmup: plan.warmup,
        iters: plan.iters,
        check: plan.check,
        seed: SEED,
    };
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
        // The sizes the block uses and a few below, so the fit sees both
        // the latency and the bandwidth term around the operating point.
        let sizes: Vec<u64> = [16, 8, 4, 2, 1]
            .iter()
            .map(|d| bytes / d)
            .chain(std::iter::once(bytes * 2))
            .collect();
        let mut rows = Vec::new();
        for (c, algo, _) in &algos {
            for s in wire_samples(comm, *c, &sizes, plan.dtype, plan.warmup.max(1), plan.iters)? {
                rows.push((coll_terms(*c, algo, tp, s.bytes), s.bytes, s.seconds));
            }
        }
        match fit_terms(&rows) {
            Ok(f) => (Some(f.link()), LinkSource::Fit),
            Err(e) => {
                if comm.rank() == 0 {
                    eprintln!("bench-layers: tp {tp}: no alpha-beta fit of the wire: {e}");
                }
                (None, LinkSource::None)
            }
        }
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
