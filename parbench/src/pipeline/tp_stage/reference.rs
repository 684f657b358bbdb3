//! The reference the composed step is checked against: one rank running
//! the whole model on the whole batch.

use super::*;

/// One rank running the whole model (every stage's blocks at `tp = 1`)
/// on the whole global batch, microbatch by microbatch with the
/// gradients accumulating: each block's gradients, in the order of
/// [`TpStages::reduced_grads`] over every stage. The loss is the mean
/// over the `dp x microbatches` microbatches, as the composed step's.
pub fn reference_grads<C, M>(
    c: &C,
    comm: &mut M,
    cfg: &TpStageConfig,
    stages: usize,
    microbatches: usize,
) -> Result<Vec<Vec<Vec<f32>>>, PipelineError>
where
    C: Compute,
    M: Communicator<Buffer = C::Buf>,
{
    let one = TpStageConfig {
        block: BlockConfig {
            seq_parallel: false,
            ..cfg.block
        },
        ..cfg.clone()
    };
    one.validate(1)?;
    let layers = stages * cfg.layers_per_stage;
    let mut blocks = (0..layers)
        .map(|l| TpBlock::new(c, &one.block, 1, 0, layer_seed(cfg.seed, l)).map_err(layer_err))
        .collect::<Result<Vec<_>, _>>()?;
    for b in &mut blocks {
        b.zero_grads(c).map_err(layer_err)?;
    }
    let total = cfg.dp * microbatches;
    let scale = 1.0 / total as f32;
    let mut clock = PhaseClock::new();
    for g in 0..total {
        let mut x = seeded_act(c, &one, 1, 0, g, None)?;
        let mut states = Vec::with_capacity(layers);
        for b in &blocks {
            let mut st = b.new_state(c, x).map_err(layer_err)?;
            b.forward_state(c, comm, &mut clock, &mut st)
                .map_err(layer_err)?;
            x = st.take_output(c).map_err(layer_err)?;
            states.push(st);
        }
        let mut dy = seeded_act(c, &one, 1, 0, g, Some(scale))?;
        for (b, st) in blocks.iter_mut().zip(states.iter_mut()).rev() {
            b.backward_input_state(c, comm, &mut clock, st, dy)
                .map_err(layer_err)?;
            dy = st.take_input_grad(c).map_err(layer_err)?;
            b.backward_weight_state(c, &mut clock, st)
                .map_err(layer_err)?;
        }
    }
    let per_block = blocks
        .iter()
        .map(|b| {
            let g = b
                .param_grads()
                .ok_or_else(|| PipelineError::Invalid("reference without gradients".into()))?;
            let specs = ParamSpecs::new(&one.block);
            g.all()
                .iter()
                .zip(specs.all())
                .map(|(buf, spec)| download_n(c, buf, spec.local_len(1)))
                .collect()
        })
        .collect::<Result<Vec<Vec<Vec<f32>>>, PipelineError>>()?;
    Ok(per_block
        .chunks(cfg.layers_per_stage)
        .map(|ch| ch.iter().flatten().cloned().collect())
        .collect())
}
