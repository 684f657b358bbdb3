//! What a composed stage is asked to be: the model's blocks, stages,
//! batch and seed ([`TpStageConfig`]), and how the data group reduces or
//! shards the gradients ([`DpReduce`]), checked once before anything runs.

use super::super::PipelineError;
use crate::layers::{BlockConfig, Mode};
use crate::model::plan::Shard;

/// How the data-parallel group reduces the gradients after the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DpReduce {
    /// Most bytes in one bucket (DDP's `bucket_cap_mb`, 25 MiB by default).
    pub bucket_bytes: usize,
    /// Reduce each bucket on a thread of its own as soon as its gradients
    /// are final, concurrently with the rest of the backward (needs a
    /// [`super::dp_overlap::Reducer`]: [`TpStages::overlap_on`]).
    pub overlap: bool,
    /// Sharded data parallel ([`shard`]'s module notes): `None` reduces
    /// the gradients and stops (no optimizer); `Some(mode)` ends each
    /// step in Adam over what `mode` shards (`Shard::None`: replicated,
    /// DDP; `Zero1`: the distributed optimizer's reduce-scatter).
    pub shard: Option<Shard>,
    /// Data ranks one shard spans (hybrid sharding, HSDP: shards inside
    /// groups of this many consecutive data ranks, replicated across the
    /// groups); 0: the whole data group.
    pub shard_group: usize,
    /// ZeRO-3: each layer's weights all-gathered on the data group's
    /// thread while the layer before it computes (FSDP's prefetch), so
    /// the compute waits only for what the thread has not finished.
    pub prefetch: bool,
}

impl DpReduce {
    /// Each bucket reduce-scattered, each data rank keeping its share
    /// (the distributed optimizer's, ZeRO-1).
    pub fn dist_opt(&self) -> bool {
        self.shard == Some(Shard::Zero1)
    }

    /// ZeRO-2 or -3: each layer's gradients reduce-scattered as each
    /// microbatch's backward makes them (no buckets).
    pub fn per_layer(&self) -> bool {
        matches!(self.shard, Some(Shard::Zero2 | Shard::Zero3))
    }

    /// The flag that asks for the data group's own thread and
    /// communicator, when one does.
    pub fn thread_flag(&self) -> Option<&'static str> {
        if self.overlap {
            Some("--overlap")
        } else if self.prefetch {
            Some("--prefetch")
        } else {
            None
        }
    }

    /// Ranks a shard spans out of `dp` data ranks.
    pub fn group_of(&self, dp: usize) -> usize {
        // Replicated data parallel has nothing to shard: one group.
        if self.shard_group == 0 || matches!(self.shard, None | Some(Shard::None)) {
            dp
        } else {
            self.shard_group
        }
    }
}

impl Default for DpReduce {
    fn default() -> Self {
        DpReduce {
            bucket_bytes: 25 << 20,
            overlap: false,
            shard: None,
            shard_group: 0,
            prefetch: false,
        }
    }
}

/// The composed model: blocks, stages, batch and reduction.
#[derive(Clone, Debug)]
pub struct TpStageConfig {
    /// One block; `shape.batch` is the microbatch's sequences `b`. Train
    /// mode, prefill.
    pub block: BlockConfig,
    /// Blocks per stage `L`.
    pub layers_per_stage: usize,
    /// Seed of weights, inputs and loss gradients.
    pub seed: u64,
    /// Data-parallel degree `D` (the global batch is `D M` microbatches).
    pub dp: usize,
    pub reduce: DpReduce,
}

impl TpStageConfig {
    /// Checks the sizes for `tp` ranks; one line naming what is wrong.
    pub fn validate(&self, tp: usize) -> Result<(), PipelineError> {
        let invalid = |m: String| Err(PipelineError::Invalid(m));
        if self.block.mode != Mode::Train || self.block.decode {
            return invalid("a pipeline stage trains a prefill block".into());
        }
        if self.layers_per_stage == 0 || self.dp == 0 {
            return invalid("a stage needs at least one block and one data rank".into());
        }
        if self.reduce.bucket_bytes == 0 {
            return invalid("the bucket size must be positive".into());
        }
        let g = self.reduce.group_of(self.dp);
        if g == 0 || !self.dp.is_multiple_of(g) {
            return invalid(format!(
                "a shard group of {g} data ranks does not divide the {} data ranks",
                self.dp
            ));
        }
        if self.reduce.prefetch && self.reduce.shard != Some(Shard::Zero3) {
            return invalid("--prefetch gathers ZeRO-3's weights ahead: give --shard zero3".into());
        }
        if self.reduce.per_layer() && self.reduce.overlap {
            return invalid(
                "--overlap overlaps the buckets of replicated and ZeRO-1 data parallel; zero2 and zero3 reduce-scatter each layer as it is done".into(),
            );
        }
        self.block
            .validate(tp)
            .map_err(|e| PipelineError::Invalid(e.to_string()))
    }
}
