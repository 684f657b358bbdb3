//! Causal attention over blocks of keys with the online-softmax merge, and
//! the plain unsharded attention it is checked against.
//!
//! Tensors are `[batch][tokens][heads][head width]` f32, with each token's
//! global position beside them: the mask compares positions, so a rank's
//! two chunks, a ring step's chunk and a gathered sequence in any order all
//! mask right.

/// Where one call's tensors' sizes come from.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    pub batch: usize,
    /// Heads in the tensors (all of them, or heads / C after Ulysses' all-to-all).
    pub heads: usize,
    pub head_dim: usize,
}

/// A running softmax-weighted sum for every (sequence, query, head): the
/// running maximum score, the sum of exponentials below it and the
/// unnormalised output. Blocks of keys merge in any order; [`Partial::finish`]
/// divides out the sum.
#[derive(Clone, Debug)]
pub struct Partial {
    max: Vec<f32>,
    sum: Vec<f32>,
    acc: Vec<f32>,
}

impl Partial {
    /// Nothing seen yet, for `queries` tokens per sequence.
    pub fn new(shape: Heads, queries: usize) -> Self {
        let rows = shape.batch * queries * shape.heads;
        Partial {
            max: vec![f32::NEG_INFINITY; rows],
            sum: vec![0.0; rows],
            acc: vec![0.0; rows * shape.head_dim],
        }
    }

    /// Merges the keys and values `k`, `v` at positions `kv_pos` (per
    /// sequence) into the queries `q` at `q_pos`: each query sees the keys
    /// at or before its position. The block's scores are exponentiated
    /// against the larger of the running and the block's maximum, and the
    /// running sums rescaled to it (the log-sum-exp merge).
    pub fn add_block(
        &mut self,
        shape: Heads,
        (q, q_pos): (&[f32], &[usize]),
        (k, v, kv_pos): (&[f32], &[f32], &[usize]),
    ) {
        let Heads {
            batch,
            heads,
            head_dim: d,
        } = shape;
        let (nq, nk) = (q_pos.len(), kv_pos.len());
        let scale = 1.0 / (d as f32).sqrt();
        let mut scores = vec![0f32; nk];
        for b in 0..batch {
            for (i, &qp) in q_pos.iter().enumerate() {
                for h in 0..heads {
                    let row = (b * nq + i) * heads + h;
                    let qv = &q[row * d..(row + 1) * d];
                    let mut block_max = f32::NEG_INFINITY;
                    for (j, &kp) in kv_pos.iter().enumerate() {
                        if kp > qp {
                            continue;
                        }
                        let at = ((b * nk + j) * heads + h) * d;
                        let s = dot(qv, &k[at..at + d]) * scale;
                        scores[j] = s;
                        block_max = block_max.max(s);
                    }
                    if block_max == f32::NEG_INFINITY {
                        continue;
                    }
                    let new_max = self.max[row].max(block_max);
                    let keep = (self.max[row] - new_max).exp();
                    let acc = &mut self.acc[row * d..(row + 1) * d];
                    acc.iter_mut().for_each(|a| *a *= keep);
                    let mut sum = self.sum[row] * keep;
                    for (j, &kp) in kv_pos.iter().enumerate() {
                        if kp > qp {
                            continue;
                        }
                        let p = (scores[j] - new_max).exp();
                        sum += p;
                        let at = ((b * nk + j) * heads + h) * d;
                        acc.iter_mut()
                            .zip(&v[at..at + d])
                            .for_each(|(a, x)| *a += p * x);
                    }
                    self.sum[row] = sum;
                    self.max[row] = new_max;
                }
            }
        }
    }

    /// The attention output, `[batch][queries][heads][head width]`; a query
    /// that saw no key (none can, causally: each sees itself) stays zero.
    pub fn finish(self, head_dim: usize) -> Vec<f32> {
        let mut out = self.acc;
        for (row, s) in self.sum.iter().enumerate() {
            if *s > 0.0 {
                out[row * head_dim..(row + 1) * head_dim]
                    .iter_mut()
                    .for_each(|a| *a /= s);
            }
        }
        out
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `softmax(Q K^T / sqrt(d)) V` with the causal mask over whole sequences
/// in position order (`[batch][seq][heads][d]`), the textbook way: every
/// score of a row, its maximum, the normalised probabilities, then their
/// sum of values. The reference the sharded attention is checked against.
pub fn unsharded_attention(shape: Heads, seq: usize, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f32> {
    let Heads {
        batch,
        heads,
        head_dim: d,
    } = shape;
    let scale = 1.0 / (d as f32).sqrt();
    let at = |b: usize, t: usize, h: usize| ((b * seq + t) * heads + h) * d;
    let mut out = vec![0f32; batch * seq * heads * d];
    let mut probs = vec![0f32; seq];
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..seq {
                let qv = &q[at(b, i, h)..at(b, i, h) + d];
                for (j, p) in probs.iter_mut().enumerate().take(i + 1) {
                    *p = dot(qv, &k[at(b, j, h)..at(b, j, h) + d]) * scale;
                }
                let row = &mut probs[..=i];
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                row.iter_mut().for_each(|p| *p = (*p - max).exp());
                let total: f32 = row.iter().sum();
                let o = &mut out[at(b, i, h)..at(b, i, h) + d];
                for (j, p) in row.iter().enumerate() {
                    let w = p / total;
                    o.iter_mut()
                        .zip(&v[at(b, j, h)..at(b, j, h) + d])
                        .for_each(|(a, x)| *a += w * x);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys merged in two blocks, in either order, give the one-pass
    /// softmax of all of them.
    #[test]
    fn blocks_merged_in_any_order_equal_the_whole_softmax() {
        let shape = Heads {
            batch: 2,
            heads: 2,
            head_dim: 3,
        };
        let seq = 6;
        let n = shape.batch * seq * shape.heads * shape.head_dim;
        let gen = |k: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * 37 + k * 11) % 17) as f32 / 8.0 - 1.0)
                .collect()
        };
        let (q, k, v) = (gen(1), gen(2), gen(3));
        let want = unsharded_attention(shape, seq, &q, &k, &v);
        let pos: Vec<usize> = (0..seq).collect();
        // Split keys by token into [0, 3) and [3, 6) of each sequence.
        let split = |t: &[f32], lo: usize| -> Vec<f32> {
            let w = shape.heads * shape.head_dim;
            (0..shape.batch)
                .flat_map(|b| t[(b * seq + lo) * w..(b * seq + lo + 3) * w].to_vec())
                .collect()
        };
        for order in [[0, 3], [3, 0]] {
            let mut p = Partial::new(shape, seq);
            for lo in order {
                let kv_pos: Vec<usize> = (lo..lo + 3).collect();
                p.add_block(shape, (&q, &pos), (&split(&k, lo), &split(&v, lo), &kv_pos));
            }
            let got = p.finish(shape.head_dim);
            let err = crate::layers::check::relative_error(&got, &want);
            assert!(err < 1e-6, "{order:?}: {err}");
        }
    }
}
