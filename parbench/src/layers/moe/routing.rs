//! Top-k routing with softmax gates, and its gradient.
//!
//! Each token keeps the `k` experts of largest logit (a tie goes to the
//! lower expert index, so every rank and the unsharded block break it the
//! same way) and weighs them by the softmax of those `k` logits (Mixtral's
//! order: top-k, then softmax). Runs on the host in f32 from the router's
//! logits.

/// The experts each of `n` tokens goes to, and their gate weights.
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    /// Experts per token.
    pub k: usize,
    /// `n x k` experts, each token's in descending logit order.
    pub experts: Vec<usize>,
    /// `n x k` gate weights (each token's sum to one).
    pub gates: Vec<f32>,
}

/// Each token's `k` experts of largest logit from `logits` (`n x e`),
/// descending, a tie to the lower index; NaN sorts last.
pub fn top_k(logits: &[f32], e: usize, k: usize) -> Vec<usize> {
    let mut out = Vec::with_capacity(logits.len() / e.max(1) * k);
    let mut order: Vec<usize> = Vec::with_capacity(e);
    for row in logits.chunks_exact(e.max(1)) {
        order.clear();
        order.extend(0..e);
        order.sort_by(|&a, &b| {
            let (x, y) = (row[a], row[b]);
            match (x.is_nan(), y.is_nan()) {
                (false, true) => std::cmp::Ordering::Less,
                (true, false) => std::cmp::Ordering::Greater,
                _ => y.total_cmp(&x).then(a.cmp(&b)),
            }
        });
        out.extend_from_slice(&order[..k.min(e)]);
    }
    out
}

impl Routing {
    /// The routing of `picks` (`n x k` experts) with gates from `logits`
    /// (`n x e`): the softmax of each token's picked logits.
    pub fn new(logits: &[f32], e: usize, k: usize, picks: Vec<usize>) -> Self {
        let mut gates = vec![0f32; picks.len()];
        for ((row, p), g) in logits
            .chunks_exact(e.max(1))
            .zip(picks.chunks_exact(k.max(1)))
            .zip(gates.chunks_exact_mut(k.max(1)))
        {
            let top = p.iter().map(|&x| row[x]).fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            for (gi, &x) in g.iter_mut().zip(p) {
                *gi = (row[x] - top).exp();
                sum += *gi;
            }
            for gi in g.iter_mut() {
                *gi /= sum;
            }
        }
        Routing {
            k,
            experts: picks,
            gates,
        }
    }

    /// Tokens routed.
    pub fn tokens(&self) -> usize {
        self.experts.len() / self.k.max(1)
    }

    /// The gradient of the logits (`n x e`) from that of the gates
    /// (`dgates`, `n x k`): the softmax's backward on the picked logits,
    /// zero on the others.
    pub fn logit_grads(&self, dgates: &[f32], e: usize) -> Vec<f32> {
        let k = self.k.max(1);
        let mut out = vec![0f32; self.tokens() * e];
        for (((row, p), g), dg) in out
            .chunks_exact_mut(e.max(1))
            .zip(self.experts.chunks_exact(k))
            .zip(self.gates.chunks_exact(k))
            .zip(dgates.chunks_exact(k))
        {
            let dot: f32 = g.iter().zip(dg).map(|(a, b)| a * b).sum();
            for ((&x, gi), dgi) in p.iter().zip(g).zip(dg) {
                row[x] = gi * (dgi - dot);
            }
        }
        out
    }
}

/// How far `picks` is from a top-k of `logits` (`n x e`): the largest
/// amount by which a token's best unpicked logit exceeds its worst picked
/// one, over the largest logit magnitude (0 when every pick is a top-k;
/// within the type's rounding when sharded and unsharded logits differ
/// only in summation order).
pub fn routing_gap(logits: &[f32], e: usize, k: usize, picks: &[usize]) -> f64 {
    let scale = logits.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
    let mut gap = 0f64;
    for (row, p) in logits
        .chunks_exact(e.max(1))
        .zip(picks.chunks_exact(k.max(1)))
    {
        let worst = p.iter().map(|&x| row[x]).fold(f32::INFINITY, f32::min);
        let best_other = (0..e)
            .filter(|x| !p.contains(x))
            .map(|x| row[x])
            .fold(f32::NEG_INFINITY, f32::max);
        let d = (best_other - worst) as f64;
        if d.is_nan() {
            return f64::NAN;
        }
        gap = gap.max(d);
    }
    if scale > 0.0 {
        gap / scale
    } else {
        gap
    }
}
