//! Is the expert-parallel block the same block? Gathers every rank's output
//! (and in train mode the input gradient and every weight gradient) and
//! the experts each token went to, runs the unsharded block (one rank, same
//! seed) on rank 0 with those picks, and measures
//! `max |sharded - unsharded| / max |unsharded|` per tensor, as the dense
//! block's check does.
//!
//! The unsharded block follows the sharded run's picks because a token whose
//! two best logits differ by less than the type's rounding may pick either
//! when the router's products sum in another order; the check measures
//! instead how far the picks are from a top-k of the unsharded logits
//! (`routing`, zero when they are one).

use super::super::block::PhaseClock;
use super::super::check::{broadcast_f64, gather_shards, relative_error, CheckReport};
use super::super::layout::{Split, TensorSpec};
use super::super::run::all_gather_f64;
use super::super::{LayerError, LayerResult, Mode};
use super::layout::{MoeLayout, MoeSpecs};
use super::routing::routing_gap;
use super::MoeBlock;
use crate::comm::Communicator;
use crate::compute::Compute;

/// The tensors a check compares, with the split each lives in; the
/// attention's gradients (with an attention, in train) last.
fn compared<C: Compute>(block: &MoeBlock<C>) -> Vec<(TensorSpec, &C::Buf)> {
    let specs = MoeSpecs::new(block.config());
    let mut out = vec![(
        TensorSpec {
            name: "y",
            ..specs.x
        },
        block.output(),
    )];
    if let (Some(dx), Some(grads)) = (block.input_grad(), block.param_grads()) {
        out.push((
            TensorSpec {
                name: "dx",
                ..specs.x
            },
            dx,
        ));
        for (spec, buf) in specs.grads().into_iter().zip(grads.iter()) {
            if !spec.is_empty() {
                out.push((spec, buf));
            }
        }
    }
    if let Some(grads) = block.attention_grads() {
        out.extend(specs.attention.into_iter().zip(grads.iter()));
    }
    out
}

/// Compares `block` (after its forward, and backward in train mode) with
/// the unsharded block built from the same `seed`. Collective: every rank
/// of `comm` calls it and gets the same report; rank 0 runs the reference
/// alone while the others wait, so the timeout must cover it.
pub fn check_moe<C, M>(
    dev: &C,
    comm: &mut M,
    block: &MoeBlock<C>,
    seed: u64,
) -> LayerResult<CheckReport>
where
    C: Compute,
    M: Communicator<Buffer = C::Buf>,
{
    let (layout, rank) = block.shard_of();
    if comm.world() != layout.world() || comm.rank() != rank {
        return Err(LayerError::Config(format!(
            "block is rank {rank} of {layout}, communicator rank {} of {}",
            comm.rank(),
            comm.world()
        )));
    }
    let specs = MoeSpecs::new(block.config());
    let picks = block
        .picks()
        .ok_or_else(|| LayerError::Config("check before forward".into()))?;
    let picks: Vec<f64> = picks.iter().map(|&e| e as f64).collect();
    let all_picks: Vec<usize> = all_gather_f64(comm, &picks)?
        .iter()
        .map(|&e| e as usize)
        .collect();
    let mut gathered = Vec::new();
    for (spec, buf) in compared(block) {
        // Gathered as one row of the shard's length per rank, placed by
        // the layout's split.
        let flat = TensorSpec {
            rows: layout.world(),
            cols: specs.local_len(&spec, layout),
            split: Split::Rows,
            ..spec
        };
        let shards = gather_shards(dev, comm, &flat, buf)?;
        if rank == 0 {
            gathered.push(specs.assemble(&spec, layout, &shards)?);
        }
    }
    let names: Vec<String> = std::iter::once("routing".to_string())
        .chain(compared(block).into_iter().map(|(s, _)| s.name.to_string()))
        .collect();
    let mut errs = vec![0f64; names.len()];
    if rank == 0 {
        let cfg = block.config();
        let mut reference = MoeBlock::new(dev, cfg, MoeLayout::SINGLE, 0, seed)?;
        reference.force_routing(all_picks.clone())?;
        let mut clock = PhaseClock::new();
        reference.forward(dev, comm, &mut clock)?;
        // The logits of the MoE layer's input, known after the forward.
        let logits = reference.router_logits(dev)?;
        errs[0] = routing_gap(&logits, cfg.experts, cfg.topk, &all_picks);
        if cfg.mode == Mode::Train {
            reference.backward(dev, comm, &mut clock)?;
        }
        for (i, (spec, buf)) in compared(&reference).into_iter().enumerate() {
            let (Some(got), Some(e)) = (gathered.get(i), errs.get_mut(i + 1)) else {
                continue;
            };
            let mut want = vec![0f32; spec.len()];
            dev.download(buf, &mut want)?;
            *e = relative_error(got, &want);
        }
    }
    let errs = broadcast_f64(comm, &errs)?;
    Ok(CheckReport::of(
        names.into_iter().zip(errs).collect(),
        crate::layers::check::checked_type(dev),
    ))
}
