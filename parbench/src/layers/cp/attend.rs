//! Causal attention over blocks of keys with the online-softmax merge, and
//! the plain unsharded attention it is checked against.
//!
//! Tensors are `[batch][tokens][heads][head width]` f32, with each token's
//! global position beside them: the mask compares positions, so a rank's
//! two chunks, a ring step's chunk and a gathered sequence in any order all
//! mask right.

/// Where one call's tensors' sizes come from, and its mask.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    pub batch: usize,
    /// Heads in the tensors (all of them, or heads / C after Ulysses' all-to-all).
    pub heads: usize,
    pub head_dim: usize,
    /// Each query sees only the keys at or before its position.
    pub causal: bool,
}

impl Heads {
    /// Whether the query at `qp` sees the key at `kp`.
    fn sees(&self, qp: usize, kp: usize) -> bool {
        !self.causal || kp <= qp
    }
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
            ..
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
                        if !shape.sees(qp, kp) {
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
                        if !shape.sees(qp, kp) {
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
        self.finish_with_lse(head_dim).0
    }

    /// The output and each row's log-sum-exp of its scores (`max + ln
    /// sum`), what the backward recomputes the probabilities from.
    pub fn finish_with_lse(self, head_dim: usize) -> (Vec<f32>, Vec<f32>) {
        let mut out = self.acc;
        for (row, s) in self.sum.iter().enumerate() {
            if *s > 0.0 {
                out[row * head_dim..(row + 1) * head_dim]
                    .iter_mut()
                    .for_each(|a| *a /= s);
            }
        }
        let lse = self
            .max
            .iter()
            .zip(&self.sum)
            .map(|(m, s)| m + s.ln())
            .collect();
        (out, lse)
    }
}

/// What the backward of one query block reads besides the keys: the
/// queries, their positions, the output's gradient, each row's
/// log-sum-exp and `delta = rowsum(dO * O)`.
#[derive(Clone, Copy, Debug)]
pub struct Queries<'a> {
    pub q: &'a [f32],
    pub pos: &'a [usize],
    pub dout: &'a [f32],
    pub lse: &'a [f32],
    pub delta: &'a [f32],
}

/// `rowsum(dO * O)` for every (sequence, query, head) row: the softmax
/// backward's correction term, once per query block.
pub fn delta(head_dim: usize, dout: &[f32], out: &[f32]) -> Vec<f32> {
    dout.chunks_exact(head_dim)
        .zip(out.chunks_exact(head_dim))
        .map(|(g, o)| dot(g, o))
        .collect()
}

/// The gradients of one block of keys and values at `kv_pos` for the
/// queries `qs`, flash-attention style: each probability recomputed as
/// `exp(s - lse)` from the forward's log-sum-exp, `dS = P (dO V^T - delta)`,
/// then `dQ += scale dS K`, `dK += scale dS^T Q`, `dV += P^T dO` (added to
/// what the slices hold, so blocks and ranks accumulate).
pub fn add_block_backward(
    shape: Heads,
    qs: Queries<'_>,
    (k, v, kv_pos): (&[f32], &[f32], &[usize]),
    dq: &mut [f32],
    (dk, dv): (&mut [f32], &mut [f32]),
) {
    let Heads {
        batch,
        heads,
        head_dim: d,
        ..
    } = shape;
    let (nq, nk) = (qs.pos.len(), kv_pos.len());
    let scale = 1.0 / (d as f32).sqrt();
    for b in 0..batch {
        for (i, &qp) in qs.pos.iter().enumerate() {
            for h in 0..heads {
                let row = (b * nq + i) * heads + h;
                let r = row * d..(row + 1) * d;
                let (qv, go) = (&qs.q[r.clone()], &qs.dout[r.clone()]);
                let (lse, dl) = (qs.lse[row], qs.delta[row]);
                for (j, &kp) in kv_pos.iter().enumerate() {
                    if !shape.sees(qp, kp) {
                        continue;
                    }
                    let at = ((b * nk + j) * heads + h) * d;
                    let kr = at..at + d;
                    let p = (dot(qv, &k[kr.clone()]) * scale - lse).exp();
                    let ds = p * (dot(go, &v[kr.clone()]) - dl) * scale;
                    dq[r.clone()]
                        .iter_mut()
                        .zip(&k[kr.clone()])
                        .for_each(|(a, x)| *a += ds * x);
                    dk[kr.clone()]
                        .iter_mut()
                        .zip(qv)
                        .for_each(|(a, x)| *a += ds * x);
                    dv[kr].iter_mut().zip(go).for_each(|(a, x)| *a += p * x);
                }
            }
        }
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Whole sequences in position order (`[batch][seq][heads][d]`) of the
/// unsharded reference.
#[derive(Clone, Copy, Debug)]
pub struct Whole<'a> {
    pub seq: usize,
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
}

impl Whole<'_> {
    /// The normalised probabilities of query `i`'s row (head `h`,
    /// sequence `b`) over the keys it sees, the textbook way: every
    /// score, the row's maximum, the exponentials over their sum.
    fn probs(&self, shape: Heads, (b, h, i): (usize, usize, usize), into: &mut Vec<f32>) {
        let (heads, d, seq) = (shape.heads, shape.head_dim, self.seq);
        let at = |t: usize| ((b * seq + t) * heads + h) * d;
        let scale = 1.0 / (d as f32).sqrt();
        let keys = if shape.causal { i + 1 } else { seq };
        let qv = &self.q[at(i)..at(i) + d];
        into.clear();
        into.extend((0..keys).map(|j| dot(qv, &self.k[at(j)..at(j) + d]) * scale));
        let max = into.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        into.iter_mut().for_each(|p| *p = (*p - max).exp());
        let total: f32 = into.iter().sum();
        into.iter_mut().for_each(|p| *p /= total);
    }
}

/// `softmax(Q K^T / sqrt(d)) V` over whole sequences, masked causally if
/// `shape` says so, from each row's full probabilities: the reference the
/// sharded attention is checked against.
pub fn unsharded_attention(shape: Heads, x: Whole<'_>) -> Vec<f32> {
    let (heads, d, seq) = (shape.heads, shape.head_dim, x.seq);
    let at = |b: usize, t: usize, h: usize| ((b * seq + t) * heads + h) * d;
    let mut out = vec![0f32; shape.batch * seq * heads * d];
    let mut probs = Vec::with_capacity(seq);
    for b in 0..shape.batch {
        for h in 0..heads {
            for i in 0..seq {
                x.probs(shape, (b, h, i), &mut probs);
                let o = &mut out[at(b, i, h)..at(b, i, h) + d];
                for (j, w) in probs.iter().enumerate() {
                    o.iter_mut()
                        .zip(&x.v[at(b, j, h)..at(b, j, h) + d])
                        .for_each(|(a, v)| *a += w * v);
                }
            }
        }
    }
    out
}

/// The gradients `[dQ, dK, dV]` of [`unsharded_attention`] for the
/// output's gradient `dout`, the textbook way from each row's stored
/// probabilities: `dV = P^T dO`, `dP = dO V^T`, `dS = P (dP - rowsum(dP
/// P))`, `dQ = scale dS K`, `dK = scale dS^T Q`.
pub fn unsharded_backward(shape: Heads, x: Whole<'_>, dout: &[f32]) -> [Vec<f32>; 3] {
    let (heads, d, seq) = (shape.heads, shape.head_dim, x.seq);
    let at = |b: usize, t: usize, h: usize| ((b * seq + t) * heads + h) * d;
    let scale = 1.0 / (d as f32).sqrt();
    let n = shape.batch * seq * heads * d;
    let [mut dq, mut dk, mut dv] = [vec![0f32; n], vec![0f32; n], vec![0f32; n]];
    let (mut probs, mut dp) = (Vec::with_capacity(seq), Vec::with_capacity(seq));
    for b in 0..shape.batch {
        for h in 0..heads {
            for i in 0..seq {
                x.probs(shape, (b, h, i), &mut probs);
                let go = &dout[at(b, i, h)..at(b, i, h) + d];
                dp.clear();
                dp.extend((0..probs.len()).map(|j| dot(go, &x.v[at(b, j, h)..at(b, j, h) + d])));
                let corr: f32 = dp.iter().zip(&probs).map(|(g, p)| g * p).sum();
                for (j, (&p, &g)) in probs.iter().zip(&dp).enumerate() {
                    let ds = p * (g - corr) * scale;
                    let (qi, kj) = (at(b, i, h), at(b, j, h));
                    for c in 0..d {
                        dq[qi + c] += ds * x.k[kj + c];
                        dk[kj + c] += ds * x.q[qi + c];
                        dv[kj + c] += p * go[c];
                    }
                }
            }
        }
    }
    [dq, dk, dv]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(causal: bool) -> Heads {
        Heads {
            batch: 2,
            heads: 2,
            head_dim: 3,
            causal,
        }
    }

    const SEQ: usize = 6;

    fn tensors(shape: Heads) -> [Vec<f32>; 4] {
        let n = shape.batch * SEQ * shape.heads * shape.head_dim;
        [1, 2, 3, 4].map(|k: usize| {
            (0..n)
                .map(|i| ((i * 37 + k * 11) % 17) as f32 / 8.0 - 1.0)
                .collect()
        })
    }

    /// Tokens [lo, lo + 3) of each sequence of `t`.
    fn half(shape: Heads, t: &[f32], lo: usize) -> Vec<f32> {
        let w = shape.heads * shape.head_dim;
        (0..shape.batch)
            .flat_map(|b| t[(b * SEQ + lo) * w..(b * SEQ + lo + 3) * w].to_vec())
            .collect()
    }

    /// Keys merged in two blocks, in either order, give the one-pass
    /// softmax of all of them, masked or not.
    #[test]
    fn blocks_merged_in_any_order_equal_the_whole_softmax() {
        for causal in [true, false] {
            let shape = shape(causal);
            let [q, k, v, _] = tensors(shape);
            let whole = Whole {
                seq: SEQ,
                q: &q,
                k: &k,
                v: &v,
            };
            let want = unsharded_attention(shape, whole);
            let pos: Vec<usize> = (0..SEQ).collect();
            for order in [[0, 3], [3, 0]] {
                let mut p = Partial::new(shape, SEQ);
                for lo in order {
                    let kv_pos: Vec<usize> = (lo..lo + 3).collect();
                    let (kh, vh) = (half(shape, &k, lo), half(shape, &v, lo));
                    p.add_block(shape, (&q, &pos), (&kh, &vh, &kv_pos));
                }
                let got = p.finish(shape.head_dim);
                let err = crate::layers::check::relative_error(&got, &want);
                assert!(err < 1e-6, "{order:?} causal {causal}: {err}");
            }
        }
    }

    /// The backward from the log-sum-exp, over two blocks of keys, gives
    /// the textbook backward's dQ, dK and dV; and the causal mask matters.
    #[test]
    fn blockwise_backward_equals_the_textbook_backward() {
        for causal in [true, false] {
            let shape = shape(causal);
            let [q, k, v, dout] = tensors(shape);
            let whole = Whole {
                seq: SEQ,
                q: &q,
                k: &k,
                v: &v,
            };
            let want = unsharded_backward(shape, whole, &dout);
            let pos: Vec<usize> = (0..SEQ).collect();
            let mut p = Partial::new(shape, SEQ);
            p.add_block(shape, (&q, &pos), (&k, &v, &pos));
            let (out, lse) = p.finish_with_lse(shape.head_dim);
            let dl = delta(shape.head_dim, &dout, &out);
            let qs = Queries {
                q: &q,
                pos: &pos,
                dout: &dout,
                lse: &lse,
                delta: &dl,
            };
            let mut dq = vec![0f32; q.len()];
            let (mut dk, mut dv) = (vec![0f32; 0], vec![0f32; 0]);
            for lo in [3, 0] {
                let kv_pos: Vec<usize> = (lo..lo + 3).collect();
                let (kh, vh) = (half(shape, &k, lo), half(shape, &v, lo));
                let (mut dkh, mut dvh) = (vec![0f32; kh.len()], vec![0f32; kh.len()]);
                add_block_backward(
                    shape,
                    qs,
                    (&kh, &vh, &kv_pos),
                    &mut dq,
                    (&mut dkh, &mut dvh),
                );
                // Reassemble in token order: [0, 3) first.
                if lo == 0 {
                    dk = interleave(shape, &dkh, &dk);
                    dv = interleave(shape, &dvh, &dv);
                } else {
                    (dk, dv) = (dkh, dvh);
                }
            }
            for (name, got, want) in [
                ("dq", &dq, &want[0]),
                ("dk", &dk, &want[1]),
                ("dv", &dv, &want[2]),
            ] {
                let err = crate::layers::check::relative_error(got, want);
                assert!(err < 1e-5, "{name} causal {causal}: {err}");
            }
        }
        let [q, k, v, dout] = tensors(shape(true));
        let whole = Whole {
            seq: SEQ,
            q: &q,
            k: &k,
            v: &v,
        };
        let masked = unsharded_backward(shape(true), whole, &dout);
        let open = unsharded_backward(shape(false), whole, &dout);
        assert!(crate::layers::check::relative_error(&masked[1], &open[1]) > 1e-2);
    }

    /// Per sequence, `first`'s 3 tokens then `second`'s.
    fn interleave(shape: Heads, first: &[f32], second: &[f32]) -> Vec<f32> {
        let w = 3 * shape.heads * shape.head_dim;
        (0..shape.batch)
            .flat_map(|b| [&first[b * w..(b + 1) * w], &second[b * w..(b + 1) * w]].concat())
            .collect()
    }
}
