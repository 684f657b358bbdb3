//! Every tensor of the MoE block: its global shape, how expert parallelism
//! splits it, and its seeded values (the dense block's [`TensorSpec`], so a
//! rank builds its shard alone and the unsharded block sees the same numbers).

use super::super::layout::{Split, TensorSpec};
use super::MoeConfig;

/// The block's parameters and data, in a fixed order.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeSpecs {
    /// Router `h x E`, replicated.
    pub router: TensorSpec,
    /// Every expert's fused gate and up projections, `(E h) x 2F`: expert
    /// `e`'s `h x 2F` matrix is rows `e h .. (e+1) h` (gate columns first),
    /// so the row split is the expert split.
    pub up: TensorSpec,
    /// Every expert's down projection, `(E F) x h`, split the same way.
    pub down: TensorSpec,
    /// The shared experts' fused gate and up projections, `h x 2 S F`, replicated.
    pub shared_up: TensorSpec,
    /// The shared experts' down projection, `S F x h`, replicated.
    pub shared_down: TensorSpec,
    /// Input `tokens x h`, token rows per rank; `y` and `dx` share its split.
    pub x: TensorSpec,
    /// Output gradient, as `x`.
    pub dy: TensorSpec,
}

impl MoeSpecs {
    /// The tensors of `cfg`'s block. Weights are scaled by `1/sqrt(fan_in)`.
    pub fn new(cfg: &MoeConfig) -> Self {
        let (h, f, e, s) = (cfg.hidden, cfg.ffn, cfg.experts, cfg.shared);
        let w = |name, tag, rows: usize, cols, fan_in: usize, split| TensorSpec {
            name,
            tag,
            rows,
            cols,
            split,
            scale: 1.0 / (fan_in.max(1) as f32).sqrt(),
        };
        let act = |name, tag| TensorSpec {
            name,
            tag,
            rows: cfg.tokens,
            cols: h,
            split: Split::Rows,
            scale: 1.0,
        };
        MoeSpecs {
            router: w("w_router", 21, h, e, h, Split::Whole),
            up: w("w_up", 22, e * h, 2 * f, h, Split::Rows),
            down: w("w_down", 23, e * f, h, f, Split::Rows),
            shared_up: w("w_shared_up", 24, h, 2 * s * f, h, Split::Whole),
            shared_down: w("w_shared_down", 25, s * f, h, s * f, Split::Whole),
            x: act("x", 26),
            dy: act("dy", 27),
        }
    }

    /// The parameters, in the order [`super::MoeBlock`] keeps them.
    pub fn params(&self) -> [TensorSpec; 5] {
        [
            self.router,
            self.up,
            self.down,
            self.shared_up,
            self.shared_down,
        ]
    }

    /// How the gradients are split: the experts' like their weights; the
    /// replicated router and shared experts see only their rank's tokens,
    /// so their gradients are partial sums across ranks (what the data-
    /// parallel all-reduce adds up after the block).
    pub fn grads(&self) -> [TensorSpec; 5] {
        self.params().map(|mut g| {
            if g.split == Split::Whole {
                g.split = Split::Summed;
            }
            g
        })
    }
}
