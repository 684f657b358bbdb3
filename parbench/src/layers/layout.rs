//! Every tensor of the block: its global shape, how tensor parallelism splits
//! it across ranks, and its seeded values.
//!
//! Values are a hash of (seed, tensor, global index), so rank `r` of `t`
//! builds its shard without ever holding the whole tensor, and the unsharded
//! reference (t = 1) sees exactly the same numbers. The same mapping from a
//! rank's local index to the global one gathers results for the check.

use super::{BlockConfig, LayerError, LayerResult};
use crate::seed::splitmix64;

/// How a tensor is split across the `t` ranks of a tensor-parallel group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Every rank holds the whole tensor, with the same values.
    Whole,
    /// Every rank holds a whole-sized partial sum (a replicated bias's
    /// gradient under sequence parallelism); the global tensor is their sum.
    Summed,
    /// Rank r holds rows `r rows/t .. (r+1) rows/t` (row-parallel weights,
    /// token-sharded activations).
    Rows,
    /// Rank r holds columns `r cols/t .. (r+1) cols/t` (column-parallel weights).
    Cols,
    /// The fused `[Q | K | V]` columns: rank r holds its heads' slice of each
    /// third, stored as `[Q_r | K_r | V_r]`.
    QkvCols,
}

/// One tensor's name, global shape, split and initial scale.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TensorSpec {
    /// Name used in check reports (`w_qkv`, `grad w_o`, `y`, ...).
    pub name: &'static str,
    /// Distinguishes the seeded values of tensors that share a shape.
    pub tag: u64,
    pub rows: usize,
    pub cols: usize,
    pub split: Split,
    /// Values are uniform in `[-scale, scale)`.
    pub scale: f32,
}

impl TensorSpec {
    /// The shape of one rank's shard as (rows, cols).
    pub fn local_shape(&self, tp: usize) -> (usize, usize) {
        match self.split {
            Split::Whole | Split::Summed => (self.rows, self.cols),
            Split::Rows => (self.rows / tp, self.cols),
            Split::Cols | Split::QkvCols => (self.rows, self.cols / tp),
        }
    }

    /// Elements of one rank's shard.
    pub fn local_len(&self, tp: usize) -> usize {
        let (r, c) = self.local_shape(tp);
        r * c
    }

    /// Elements of the whole tensor.
    pub fn len(&self) -> usize {
        self.rows * self.cols
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The global row-major index of element `local` of rank `rank`'s shard.
    pub fn global_index(&self, tp: usize, rank: usize, local: usize) -> usize {
        let (_, lc) = self.local_shape(tp);
        let (row, col) = (local / lc.max(1), local % lc.max(1));
        let (grow, gcol) = match self.split {
            Split::Whole | Split::Summed => (row, col),
            Split::Rows => (rank * (self.rows / tp) + row, col),
            Split::Cols => (row, rank * lc + col),
            Split::QkvCols => {
                let third = self.cols / 3;
                let part = third / tp;
                let (which, within) = (col / part.max(1), col % part.max(1));
                (row, which * third + rank * part + within)
            }
        };
        grow * self.cols + gcol
    }

    /// Rank `rank`'s shard of the seeded tensor, as f32.
    pub fn shard_values(&self, seed: u64, tp: usize, rank: usize) -> Vec<f32> {
        (0..self.local_len(tp))
            .map(|i| self.value(seed, self.global_index(tp, rank, i)))
            .collect()
    }

    /// The seeded value at global index `i`.
    pub fn value(&self, seed: u64, i: usize) -> f32 {
        let h = splitmix64(
            seed ^ self.tag.wrapping_mul(0xA24B_AED4_963E_E407)
                ^ (i as u64).wrapping_mul(0x9FB2_1C65_1E98_DF25),
        );
        // 24 random bits -> [-1, 1), exact in every storage type's f32 path.
        let unit = (h >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
        unit * self.scale
    }

    /// Places every rank's shard (`gathered[r]`) into the whole tensor.
    pub fn assemble(&self, tp: usize, gathered: &[Vec<f32>]) -> LayerResult<Vec<f32>> {
        let mut out = vec![0f32; self.len()];
        if gathered.len() != tp {
            return Err(LayerError::Config(format!(
                "{}: {} shards for {tp} ranks",
                self.name,
                gathered.len()
            )));
        }
        for (rank, shard) in gathered.iter().enumerate() {
            if shard.len() != self.local_len(tp) {
                return Err(LayerError::Config(format!(
                    "{}: rank {rank} sent {} elements, expected {}",
                    self.name,
                    shard.len(),
                    self.local_len(tp)
                )));
            }
            match self.split {
                Split::Whole => {
                    if rank == 0 {
                        out.copy_from_slice(shard);
                    }
                }
                Split::Summed => {
                    for (o, v) in out.iter_mut().zip(shard) {
                        *o += v;
                    }
                }
                _ => {
                    for (i, v) in shard.iter().enumerate() {
                        out[self.global_index(tp, rank, i)] = *v;
                    }
                }
            }
        }
        Ok(out)
    }
}

/// The block's eight parameters, as anything one holds per parameter: their
/// specs ([`ParamSpecs`]), their shards or gradients on a device; in a fixed
/// order, weights then their biases.
#[derive(Clone, Debug, PartialEq)]
pub struct Params<B> {
    pub w_qkv: B,
    pub b_qkv: B,
    pub w_o: B,
    pub b_o: B,
    pub w_1: B,
    pub b_1: B,
    pub w_2: B,
    pub b_2: B,
}

impl<B> Params<B> {
    /// Every tensor, in order.
    pub fn all(&self) -> [&B; 8] {
        [
            &self.w_qkv,
            &self.b_qkv,
            &self.w_o,
            &self.b_o,
            &self.w_1,
            &self.b_1,
            &self.w_2,
            &self.b_2,
        ]
    }

    /// Tensor `i` in [`Params::all`]'s order.
    pub fn get_mut(&mut self, i: usize) -> Option<&mut B> {
        Some(match i {
            0 => &mut self.w_qkv,
            1 => &mut self.b_qkv,
            2 => &mut self.w_o,
            3 => &mut self.b_o,
            4 => &mut self.w_1,
            5 => &mut self.b_1,
            6 => &mut self.w_2,
            7 => &mut self.b_2,
            _ => return None,
        })
    }

    /// One `T` per parameter from this one's, stopping at the first error.
    pub fn try_map<T, E>(&self, mut f: impl FnMut(&B) -> Result<T, E>) -> Result<Params<T>, E> {
        Ok(Params {
            w_qkv: f(&self.w_qkv)?,
            b_qkv: f(&self.b_qkv)?,
            w_o: f(&self.w_o)?,
            b_o: f(&self.b_o)?,
            w_1: f(&self.w_1)?,
            b_1: f(&self.b_1)?,
            w_2: f(&self.w_2)?,
            b_2: f(&self.b_2)?,
        })
    }
}

/// The block's parameters: each one's shape, split and seeded values.
pub type ParamSpecs = Params<TensorSpec>;

impl ParamSpecs {
    /// The parameters of `cfg`'s block. Weights are scaled by
    /// `1/sqrt(fan_in)` so that activations stay of order one.
    pub fn new(cfg: &BlockConfig) -> Self {
        let (h, f) = (cfg.shape.hidden, cfg.shape.ffn);
        let w = |name, tag, rows: usize, cols, split| TensorSpec {
            name,
            tag,
            rows,
            cols,
            split,
            scale: 1.0 / (rows as f32).sqrt(),
        };
        let b = |name, tag, cols, split| TensorSpec {
            name,
            tag,
            rows: 1,
            cols,
            split,
            scale: 0.1,
        };
        ParamSpecs {
            w_qkv: w("w_qkv", 1, h, 3 * h, Split::QkvCols),
            b_qkv: b("b_qkv", 2, 3 * h, Split::QkvCols),
            w_o: w("w_o", 3, h, h, Split::Rows),
            b_o: b("b_o", 4, h, Split::Whole),
            w_1: w("w_1", 5, h, f, Split::Cols),
            b_1: b("b_1", 6, f, Split::Cols),
            w_2: w("w_2", 7, f, h, Split::Rows),
            b_2: b("b_2", 8, h, Split::Whole),
        }
    }

    /// How the gradients are split: like the parameters, except that the
    /// replicated biases added after a reduce-scatter see only their rank's
    /// tokens under sequence parallelism and sum across ranks.
    pub fn grads(&self, sequence_split: bool) -> [TensorSpec; 8] {
        self.all().map(|s| {
            let mut g = *s;
            if sequence_split && g.split == Split::Whole {
                g.split = Split::Summed;
            }
            g
        })
    }
}

/// The activations that enter and leave the block: its input `x`, the
/// gradient `dy` of its output, and in decode the KV cache.
#[derive(Clone, Debug, PartialEq)]
pub struct DataSpecs {
    /// Input `tokens x h`: whole on every rank, or token rows per rank with
    /// sequence parallelism; the output `y` and input gradient `dx` share it.
    pub x: TensorSpec,
    /// Output gradient, shaped and split as `x`.
    pub dy: TensorSpec,
    /// Keys cached for `seq` earlier tokens plus a slot for the new one:
    /// `(batch kv_len) x h`, heads' columns per rank.
    pub k_cache: TensorSpec,
    /// Values, as `k_cache`.
    pub v_cache: TensorSpec,
}

impl DataSpecs {
    /// The data of `cfg`'s block at `tp` ranks.
    pub fn new(cfg: &BlockConfig, tp: usize) -> Self {
        let h = cfg.shape.hidden;
        let rows = if cfg.sequence_split(tp) {
            Split::Rows
        } else {
            Split::Whole
        };
        let act = |name, tag| TensorSpec {
            name,
            tag,
            rows: cfg.tokens(),
            cols: h,
            split: rows,
            scale: 1.0,
        };
        let cache = |name, tag| TensorSpec {
            name,
            tag,
            rows: cfg.shape.batch * cfg.kv_len(),
            cols: h,
            split: Split::Cols,
            scale: 1.0,
        };
        DataSpecs {
            x: act("x", 11),
            dy: act("dy", 12),
            k_cache: cache("k_cache", 13),
            v_cache: cache("v_cache", 14),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(rows: usize, cols: usize, split: Split) -> TensorSpec {
        TensorSpec {
            name: "t",
            tag: 1,
            rows,
            cols,
            split,
            scale: 1.0,
        }
    }

    #[test]
    fn shards_reassemble_into_the_whole_tensor() {
        for split in [Split::Whole, Split::Rows, Split::Cols, Split::QkvCols] {
            for tp in [1, 2, 3] {
                let s = spec(6, 18, split);
                let whole: Vec<f32> = (0..s.len()).map(|i| s.value(7, i)).collect();
                let shards: Vec<Vec<f32>> = (0..tp).map(|r| s.shard_values(7, tp, r)).collect();
                assert_eq!(s.assemble(tp, &shards).unwrap(), whole, "{split:?} tp {tp}");
            }
        }
    }

    #[test]
    fn qkv_shard_holds_its_heads_of_each_third() {
        // h = 4, t = 2: rank 1 holds Q cols 2,3; K cols 6,7; V cols 10,11.
        let s = spec(1, 12, Split::QkvCols);
        let got: Vec<usize> = (0..6).map(|i| s.global_index(2, 1, i)).collect();
        assert_eq!(got, vec![2, 3, 6, 7, 10, 11]);
    }

    #[test]
    fn summed_shards_add_and_bad_shards_are_errors() {
        let s = spec(1, 3, Split::Summed);
        let out = s
            .assemble(2, &[vec![1.0, 2.0, 3.0], vec![1.0, 1.0, 1.0]])
            .unwrap();
        assert_eq!(out, vec![2.0, 3.0, 4.0]);
        assert!(s.assemble(2, &[vec![1.0; 3]]).is_err());
        assert!(s.assemble(1, &[vec![1.0; 2]]).is_err());
    }

    #[test]
    fn values_are_seeded_and_bounded() {
        let s = spec(4, 4, Split::Whole);
        let a: Vec<f32> = (0..16).map(|i| s.value(1, i)).collect();
        let b: Vec<f32> = (0..16).map(|i| s.value(2, i)).collect();
        assert_ne!(a, b);
        assert!(a.iter().all(|v| (-1.0..1.0).contains(v)));
        assert_eq!(a, (0..16).map(|i| s.value(1, i)).collect::<Vec<_>>());
    }
}
