//! How the data-parallel ranks hold the training state: replicated, or
//! sharded as ZeRO's three stages are; the planner's layouts and input and
//! the executor's sharded stages all name a mode by this type.

/// How the data-parallel dimension holds weights, gradients and the
/// optimizer state (Rajbhandari et al., ZeRO, SC20; PyTorch FSDP).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Shard {
    /// Replicated (DDP): the gradients all-reduced.
    #[default]
    None,
    /// The optimizer state sharded (ZeRO-1, Megatron's distributed
    /// optimizer): gradients reduce-scattered, parameters all-gathered
    /// after the step.
    Zero1,
    /// Gradients sharded too (ZeRO-2, FSDP's SHARD_GRAD_OP): each layer's
    /// gradients reduce-scattered as each microbatch's backward makes them.
    Zero2,
    /// Parameters sharded too (ZeRO-3, FSDP's FULL_SHARD): each layer's
    /// parameters all-gathered before its forward and again before its
    /// backward, the next layer's prefetched during the current one.
    Zero3,
}

impl Shard {
    /// Every mode, by name.
    pub const ALL: [(&'static str, Shard); 4] = [
        ("none", Shard::None),
        ("zero1", Shard::Zero1),
        ("zero2", Shard::Zero2),
        ("zero3", Shard::Zero3),
    ];

    /// The name flags use.
    pub fn name(self) -> &'static str {
        Shard::ALL
            .iter()
            .find(|(_, s)| *s == self)
            .map_or("none", |(n, _)| n)
    }

    /// The mode called `name`.
    pub fn by_name(name: &str) -> Option<Shard> {
        Shard::ALL.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
    }

    /// Bytes per parameter a rank holds under this mode, by the ZeRO
    /// paper's split (Rajbhandari et al. 2020, section 5): weights and
    /// gradients `weight_bytes` each, and Adam's `K` (8 for the fp32
    /// moments, 4 more for fp32 master weights under narrower weights),
    /// over the sharding group `group` as the mode shards them. Mixed
    /// precision (`weight_bytes` 2): 16, 4 + 12/g, 2 + 14/g, 16/g.
    pub fn bytes_per_param(self, weight_bytes: usize, group: u64) -> f64 {
        self.state_bytes(weight_bytes, weight_bytes, group)
    }

    /// [`Self::bytes_per_param`] with gradients `grad_bytes` wide (4:
    /// Megatron's fp32 main gradients, which Megatron-LM's
    /// `theoretical_memory_usage.py` counts as 18 bytes a parameter, or
    /// `6 + 12/dp` with the distributed optimizer).
    pub fn state_bytes(self, weight_bytes: usize, grad_bytes: usize, group: u64) -> f64 {
        let master = if weight_bytes < 4 { 4.0 } else { 0.0 };
        self.state_bytes_with_master(weight_bytes, grad_bytes, master, group)
    }

    /// [`Self::state_bytes`] with `master_bytes` of master weight a
    /// parameter (4: fp32; 2: apex's 16-bit remainders) beside the fp32
    /// moments.
    pub fn state_bytes_with_master(
        self,
        weight_bytes: usize,
        grad_bytes: usize,
        master_bytes: f64,
        group: u64,
    ) -> f64 {
        let w = weight_bytes as f64;
        let d = grad_bytes as f64;
        let k = 8.0 + master_bytes;
        let g = group.max(1) as f64;
        match self {
            Shard::None => w + d + k,
            Shard::Zero1 => w + d + k / g,
            Shard::Zero2 => w + (d + k) / g,
            Shard::Zero3 => (w + d + k) / g,
        }
    }
}
