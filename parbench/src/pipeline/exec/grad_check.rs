//! The gradient check: every stage's gradients against one device running
//! the whole model on the same microbatches.

use super::records::{recv_f64s, send_f64s};
use crate::comm::Communicator;
use crate::compute::Compute;
use crate::pipeline::mlp::{self, StageModel};
use crate::pipeline::{PipelineConfig, PipelineError};
use std::collections::HashMap;

/// Gathers every stage's gradients on rank 0 and compares them with one
/// device running the whole model on the same microbatches.
pub(super) fn check_grads<Cm, C>(
    comm: &mut Cm,
    compute: &C,
    cfg: &PipelineConfig,
    models: &HashMap<usize, StageModel<C::Buf>>,
) -> Result<Option<f64>, PipelineError>
where
    Cm: Communicator,
    C: Compute<Buf = Cm::Buffer>,
{
    let s = &cfg.schedule;
    let rank = comm.rank();
    if rank != 0 {
        for st in s.stages_of(rank) {
            let m = models
                .get(&st)
                .ok_or_else(|| PipelineError::Protocol(format!("stage {st} missing")))?;
            let flat: Vec<f64> = m
                .grads(compute)?
                .into_iter()
                .flatten()
                .map(f64::from)
                .collect();
            send_f64s(comm, &flat, 0)?;
        }
        return Ok(None);
    }
    let mut got: Vec<Vec<f64>> = vec![Vec::new(); s.num_stages];
    for (st, slot) in got.iter_mut().enumerate() {
        let owner = s.rank_of(st).unwrap_or(0);
        *slot = if owner == 0 {
            let m = models
                .get(&st)
                .ok_or_else(|| PipelineError::Protocol(format!("stage {st} missing")))?;
            m.grads(compute)?
                .into_iter()
                .flatten()
                .map(f64::from)
                .collect()
        } else {
            Vec::new()
        };
    }
    // Receive in each peer's send order (its stages, increasing).
    for r in 1..comm.world() {
        for st in s.stages_of(r) {
            got[st] = recv_f64s(comm, r)?;
        }
    }
    let reference = mlp::reference_grads(
        compute,
        &cfg.stage_layers,
        s.microbatches,
        cfg.shape,
        cfg.seed,
    )?;
    let mut max_ref = 0.0f64;
    let mut max_diff = 0.0f64;
    for (st, want) in reference.iter().enumerate() {
        let want: Vec<f64> = want.iter().flatten().map(|&v| f64::from(v)).collect();
        if want.len() != got[st].len() {
            return Err(PipelineError::Protocol(format!(
                "stage {st}: {} gradient values, expected {}",
                got[st].len(),
                want.len()
            )));
        }
        for (a, b) in got[st].iter().zip(&want) {
            max_ref = max_ref.max(b.abs());
            max_diff = max_diff.max((a - b).abs());
        }
    }
    Ok(Some(if max_ref > 0.0 {
        max_diff / max_ref
    } else {
        max_diff
    }))
}
