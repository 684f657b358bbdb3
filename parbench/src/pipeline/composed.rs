//! The composed step's gradient check: every weight gradient of a
//! `dp x tp x pp` step, gathered across the tensor shards and the
//! pipeline stages after the data-parallel reduction, against one rank
//! running the whole model on the whole global batch
//! ([`super::tp_stage::reference_grads`]).

use super::exec::{recv_f64s, send_f64s};
use super::tp_stage::{reference_grads, TpStageConfig, TpStages};
use super::PipelineError;
use crate::comm::Communicator;
use crate::compute::Compute;
use crate::schedule::Schedule;

/// What the check found on one data replica.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GradCheck {
    /// Largest difference relative to the largest reference value.
    pub max_rel_err: f64,
    /// Values that differ from the reference at all (0: bit for bit).
    pub differing: usize,
    /// Values compared.
    pub values: usize,
    /// ZeRO-3: values of the weights, gathered from the shares after the
    /// run, that differ from the seeded ones (any difference is a broken
    /// gather or shard), and the values compared; 0 and 0 otherwise.
    pub weights_differing: usize,
    pub weights_compared: usize,
}

/// Gathers the step's gradients (a collective of the three groups: every
/// rank calls it, after the run) and compares them with the reference on
/// the first rank of each replica's pipeline (tensor rank 0, stage rank
/// 0), which returns the result; every other rank returns `None`. Every
/// replica checks its own copy, so replicas that disagree fail too.
pub fn check_composed<C, T, D, P>(
    c: &C,
    stages: &mut TpStages<'_, C, T, D>,
    pp: &mut P,
    schedule: &Schedule,
    cfg: &TpStageConfig,
) -> Result<Option<GradCheck>, PipelineError>
where
    C: Compute,
    T: Communicator<Buffer = C::Buf>,
    D: Communicator<Buffer = C::Buf>,
    P: Communicator<Buffer = C::Buf>,
{
    let (differ, compared) = stages.gathered_params_vs_seed(c)?;
    let (mut w_differ, mut w_compared) = stages.sum_over_tensor_group(differ, compared)?;
    let whole = stages.whole_grads(c)?;
    let (t_rank, _) = stages.place();
    if t_rank != 0 {
        return Ok(None);
    }
    let rank = pp.rank();
    let flat = |stage: &Vec<Vec<f32>>| -> Vec<f64> {
        stage.iter().flatten().map(|&v| f64::from(v)).collect()
    };
    if rank != 0 {
        for stage in &whole {
            send_f64s(pp, &flat(stage), 0)?;
        }
        send_f64s(pp, &[w_differ as f64, w_compared as f64], 0)?;
        return Ok(None);
    }
    let mut got: Vec<Vec<f64>> = vec![Vec::new(); schedule.num_stages];
    for (st, g) in schedule.stages_of(0).into_iter().zip(&whole) {
        got[st] = flat(g);
    }
    for r in 1..pp.world() {
        for st in schedule.stages_of(r) {
            got[st] = recv_f64s(pp, r)?;
        }
        if let [d, n] = recv_f64s(pp, r)?[..] {
            w_differ += d as usize;
            w_compared += n as usize;
        }
    }
    let want = reference_grads(c, pp, cfg, schedule.num_stages, schedule.microbatches)?;
    let (mut max_ref, mut max_diff) = (0f64, 0f64);
    let (mut differing, mut values) = (0usize, 0usize);
    for (st, w) in want.iter().enumerate() {
        let w: Vec<f64> = flat(w);
        if w.len() != got[st].len() {
            return Err(PipelineError::Protocol(format!(
                "stage {st}: {} gradient values, expected {}",
                got[st].len(),
                w.len()
            )));
        }
        for (a, b) in got[st].iter().zip(&w) {
            max_ref = max_ref.max(b.abs());
            let d = (a - b).abs();
            if d.is_nan() || d > max_diff {
                max_diff = d;
            }
            differing += usize::from(a.to_bits() != b.to_bits());
            values += 1;
        }
    }
    Ok(Some(GradCheck {
        max_rel_err: if max_ref > 0.0 {
            max_diff / max_ref
        } else {
            max_diff
        },
        differing,
        values,
        weights_differing: w_differ,
        weights_compared: w_compared,
    }))
}
