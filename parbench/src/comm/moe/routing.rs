//! Which experts each token of each rank chose (top-k distinct experts)
//! and which of those its capacity kept: a function of the seed, the
//! source rank and the token alone, so every rank routes every rank's
//! tokens the same way.

use super::{MoeShape, Skew};
use crate::seed::splitmix64;

/// Every rank's routing of one [`MoeShape`] on `world` ranks.
pub struct Routing {
    topk: usize,
    tokens: usize,
    /// Per rank, `tokens x topk` experts, each token's kept ones ascending
    /// and then [`DROPPED`].
    kept: Vec<Vec<u16>>,
    dropped: usize,
}

/// A choice the capacity dropped.
const DROPPED: u16 = u16::MAX;

/// Salts of the seeded draws, one per purpose.
const SALT_ORDER: u64 = 0x5EED_0001;
const SALT_DRAW: u64 = 0x5EED_0002;
const SALT_GATE: u64 = 0x5EED_0003;

/// A uniform draw in [0, 1) from one hash.
fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// The key of token `t` of rank `r` for purpose `salt`.
fn key(seed: u64, salt: u64, r: usize, t: usize) -> u64 {
    splitmix64(seed ^ salt ^ splitmix64(((r as u64) << 40) ^ t as u64))
}

/// How likely each expert is to be drawn: `None` for uniform; for Zipf,
/// the cumulative weights, the expert of the seeded popularity rank i
/// weighted `1 / (i + 1)^s`.
fn popularity(shape: &MoeShape) -> Option<Vec<f64>> {
    let Skew::Zipf(s) = shape.skew else {
        return None;
    };
    let e = shape.experts;
    let mut order: Vec<usize> = (0..e).collect();
    order.sort_by_key(|&x| splitmix64(shape.seed ^ SALT_ORDER ^ x as u64));
    let mut weight = vec![0.0; e];
    for (i, &x) in order.iter().enumerate() {
        weight[x] = 1.0 / ((i + 1) as f64).powf(s);
    }
    let total: f64 = weight.iter().sum();
    let mut acc = 0.0;
    Some(
        weight
            .iter()
            .map(|w| {
                acc += w / total;
                acc
            })
            .collect(),
    )
}

/// Token `t` of rank `r`'s top-k experts, distinct, within the node limit,
/// in the order drawn.
fn choose(shape: &MoeShape, world: usize, cdf: Option<&[f64]>, r: usize, t: usize) -> Vec<usize> {
    let (e, k) = (shape.experts, shape.topk);
    let per_rank = shape.experts_per_rank(world).max(1);
    let limit = shape.node_limit.unwrap_or(world);
    let base = key(shape.seed, SALT_DRAW, r, t);
    let mut chosen: Vec<usize> = Vec::with_capacity(k);
    let mut groups: Vec<usize> = Vec::with_capacity(limit);
    let allowed = |x: usize, chosen: &[usize], groups: &[usize]| {
        !chosen.contains(&x) && (groups.len() < limit || groups.contains(&(x / per_rank)))
    };
    let take = |x: usize, chosen: &mut Vec<usize>, groups: &mut Vec<usize>| {
        chosen.push(x);
        if !groups.contains(&(x / per_rank)) {
            groups.push(x / per_rank);
        }
    };
    // Draws with rejection, bounded; then the first allowed expert from a
    // seeded start (the shape's check makes one exist).
    for d in 0..(32 * k + 64) as u64 {
        if chosen.len() == k {
            return chosen;
        }
        let u = unit(splitmix64(base.wrapping_add(d)));
        let x = match cdf {
            None => ((u * e as f64) as usize).min(e - 1),
            Some(c) => c.partition_point(|&p| p <= u).min(e - 1),
        };
        if allowed(x, &chosen, &groups) {
            take(x, &mut chosen, &mut groups);
        }
    }
    let start = (base % e as u64) as usize;
    for i in 0..e {
        if chosen.len() == k {
            break;
        }
        let x = (start + i) % e;
        if allowed(x, &chosen, &groups) {
            take(x, &mut chosen, &mut groups);
        }
    }
    chosen
}

impl Routing {
    /// Routes every token of every rank; with a capacity factor, each
    /// source rank keeps each expert's first `capacity` tokens (in token
    /// order) and drops the rest, as Megatron-Core's position policy.
    pub fn new(shape: &MoeShape, world: usize) -> Routing {
        let cdf = popularity(shape);
        let (k, cap) = (shape.topk, shape.capacity());
        let mut dropped = 0;
        let kept = (0..world)
            .map(|r| {
                let mut load = vec![0usize; shape.experts];
                let mut out = Vec::with_capacity(shape.tokens * k);
                for t in 0..shape.tokens {
                    let mut mine: Vec<u16> = Vec::with_capacity(k);
                    for x in choose(shape, world, cdf.as_deref(), r, t) {
                        if load[x] < cap {
                            load[x] += 1;
                            mine.push(x as u16);
                        } else {
                            dropped += 1;
                        }
                    }
                    mine.sort_unstable();
                    mine.resize(k, DROPPED);
                    out.extend(mine);
                }
                out
            })
            .collect();
        Routing {
            topk: k,
            tokens: shape.tokens,
            kept,
            dropped,
        }
    }

    /// The experts token `t` of rank `r` goes to, ascending (kept ones only).
    pub fn kept(&self, r: usize, t: usize) -> impl Iterator<Item = usize> + '_ {
        self.kept[r][t * self.topk..(t + 1) * self.topk]
            .iter()
            .take_while(|&&x| x != DROPPED)
            .map(|&x| x as usize)
    }

    /// Tokens per rank.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Choices the capacity dropped, over every rank.
    pub fn dropped(&self) -> usize {
        self.dropped
    }
}

/// The gate weight of expert `x` for token `t` of rank `r`: seeded, in
/// [1/8, 1), a whole number of 1/256 (exact in bf16 and f32).
pub fn gate(seed: u64, r: usize, t: usize, x: usize) -> f32 {
    let h = splitmix64(key(seed, SALT_GATE, r, t) ^ x as u64);
    (32 + (h % 224)) as f32 / 256.0
}

#[cfg(test)]
mod tests {
    use super::super::tests::shape;
    use super::*;

    #[test]
    fn every_token_gets_k_distinct_experts() {
        for skew in [Skew::Uniform, Skew::Zipf(1.5)] {
            let s = MoeShape {
                skew,
                topk: 4,
                ..shape()
            };
            let r = Routing::new(&s, 4);
            for rank in 0..4 {
                for t in 0..s.tokens {
                    let mut v: Vec<usize> = r.kept(rank, t).collect();
                    assert_eq!(v.len(), 4);
                    v.dedup();
                    assert_eq!(v.len(), 4);
                }
            }
        }
    }

    #[test]
    fn zipf_skews_the_load_and_uniform_spreads_it() {
        let load = |skew| {
            let s = MoeShape {
                skew,
                tokens: 4000,
                experts: 16,
                ..shape()
            };
            let r = Routing::new(&s, 4);
            let mut n = [0usize; 16];
            for t in 0..s.tokens {
                r.kept(0, t).for_each(|x| n[x] += 1);
            }
            *n.iter().max().unwrap() as f64 / *n.iter().min().unwrap().max(&1) as f64
        };
        assert!(load(Skew::Uniform) < 1.5, "{}", load(Skew::Uniform));
        assert!(load(Skew::Zipf(1.2)) > 5.0, "{}", load(Skew::Zipf(1.2)));
    }

    #[test]
    fn node_limit_holds_each_tokens_ranks() {
        let s = MoeShape {
            experts: 16,
            topk: 4,
            node_limit: Some(2),
            ..shape()
        };
        let r = Routing::new(&s, 4);
        for t in 0..s.tokens {
            let mut ranks: Vec<usize> = r.kept(1, t).map(|x| s.rank_of(x, 4)).collect();
            ranks.dedup();
            assert!(ranks.len() <= 2, "{ranks:?}");
            assert_eq!(r.kept(1, t).count(), 4);
        }
    }

    #[test]
    fn capacity_drops_what_exceeds_it() {
        let s = MoeShape {
            skew: Skew::Zipf(2.0),
            capacity_factor: Some(1.0),
            ..shape()
        };
        let r = Routing::new(&s, 2);
        assert!(r.dropped() > 0);
        let mut load = vec![0usize; s.experts];
        for t in 0..s.tokens {
            r.kept(0, t).for_each(|x| load[x] += 1);
        }
        assert!(load.iter().all(|&n| n <= s.capacity()), "{load:?}");
        assert_eq!(Routing::new(&shape(), 2).dropped(), 0);
    }

    #[test]
    fn routing_is_the_seeds() {
        let a = Routing::new(&shape(), 2);
        let b = Routing::new(&shape(), 2);
        let c = Routing::new(&MoeShape { seed: 2, ..shape() }, 2);
        let all = |r: &Routing| {
            (0..64)
                .flat_map(|t| r.kept(1, t).collect::<Vec<_>>())
                .collect::<Vec<_>>()
        };
        assert_eq!(all(&a), all(&b));
        assert_ne!(all(&a), all(&c));
        assert!((0..1000).all(|t| (0.125..1.0).contains(&gate(1, 0, t, 3))));
    }
}
