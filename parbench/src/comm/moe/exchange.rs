//! The bytes of one dispatch and one combine on every rank: what each rank
//! sends, and what it must receive, from the routing and the seed alone.
//!
//! A copy is one token's hidden state sent to one rank, for the experts
//! of that rank it carries (all of them when deduplicated, one per copy
//! otherwise). A message from rank s to rank d is its copies in token
//! order (then expert order); dispatch sends [`super::Payload`]s, combine
//! sends back, for each copy, the bf16 sum over its experts of gate x the
//! dequantised input (the experts stand in as the identity), and the
//! source sums a token's copies in f32, in expert order, into bf16.

use super::routing::{gate, Routing};
use super::{Copies, MoeShape, Payload, FP8_GROUP};
use crate::comm::{CommResult, VCounts, F8E4M3};
use crate::seed::splitmix64;
use half::bf16;

/// The largest finite E4M3 value: an fp8 group's scale maps its largest
/// magnitude there.
const E4M3_MAX: f32 = 448.0;

/// A salt for the hidden states' values.
const SALT_HIDDEN: u64 = 0x5EED_0004;

/// One layer's exchange on `world` ranks: the shape, every rank's routing
/// and the copies between every pair of ranks.
pub struct MoePlan {
    pub shape: MoeShape,
    pub world: usize,
    pub routing: Routing,
    /// `copies[s][d]`: copies rank s sends rank d in dispatch.
    copies: Vec<Vec<usize>>,
}

impl MoePlan {
    /// Routes every rank's tokens (see [`Routing::new`]).
    pub fn new(shape: &MoeShape, world: usize) -> MoePlan {
        let routing = Routing::new(shape, world);
        let mut plan = MoePlan {
            shape: shape.clone(),
            world,
            routing,
            copies: vec![vec![0; world]; world],
        };
        for s in 0..world {
            for d in 0..world {
                let mut n = 0;
                plan.for_each_copy(s, d, |_, _| n += 1);
                plan.copies[s][d] = n;
            }
        }
        plan
    }

    /// Calls `f(token, experts)` for each copy rank `s` sends rank `d`, in order.
    pub fn for_each_copy(&self, s: usize, d: usize, mut f: impl FnMut(usize, &[usize])) {
        let mut xs = Vec::with_capacity(self.shape.topk);
        for t in 0..self.shape.tokens {
            xs.clear();
            xs.extend(
                self.routing
                    .kept(s, t)
                    .filter(|&x| self.shape.rank_of(x, self.world) == d),
            );
            match self.shape.copies {
                Copies::Dedup if !xs.is_empty() => f(t, &xs),
                Copies::Dedup => {}
                Copies::PerExpert => xs.iter().for_each(|x| f(t, std::slice::from_ref(x))),
            }
        }
    }

    /// Copies rank `s` sends rank `d` in dispatch.
    pub fn copies(&self, s: usize, d: usize) -> usize {
        self.copies[s][d]
    }

    /// Bytes of one dispatched copy.
    pub fn dispatch_bytes(&self) -> usize {
        self.shape.payload.token_bytes(self.shape.hidden)
    }

    /// Bytes of one combined copy (bf16).
    pub fn combine_bytes(&self) -> usize {
        2 * self.shape.hidden
    }

    /// Rank `rank`'s dispatch counts, in bytes.
    pub fn dispatch_counts(&self, rank: usize) -> CommResult<VCounts> {
        let b = self.dispatch_bytes();
        VCounts::of_matrix(self.world, rank, |s, d| self.copies[s][d] * b)
    }

    /// Rank `rank`'s combine counts, in bytes: dispatch's reversed, in bf16.
    pub fn combine_counts(&self, rank: usize) -> CommResult<VCounts> {
        let b = self.combine_bytes();
        VCounts::of_matrix(self.world, rank, |d, s| self.copies[s][d] * b)
    }

    /// Bytes each rank receives in dispatch.
    pub fn dispatch_received(&self) -> Vec<usize> {
        (0..self.world)
            .map(|d| {
                (0..self.world).map(|s| self.copies[s][d]).sum::<usize>() * self.dispatch_bytes()
            })
            .collect()
    }

    /// Bytes each rank sends in dispatch.
    pub fn dispatch_sent(&self) -> Vec<usize> {
        (0..self.world)
            .map(|s| self.copies[s].iter().sum::<usize>() * self.dispatch_bytes())
            .collect()
    }

    /// Token `t` of rank `r`'s hidden state: seeded bf16 values in [-4, 4).
    fn hidden(&self, r: usize, t: usize) -> Vec<bf16> {
        let key =
            splitmix64(self.shape.seed ^ SALT_HIDDEN ^ splitmix64(((r as u64) << 40) ^ t as u64));
        (0..self.shape.hidden)
            .map(|c| {
                let u = (splitmix64(key.wrapping_add(c as u64)) >> 11) as f64 / (1u64 << 53) as f64;
                bf16::from_f64(u * 8.0 - 4.0)
            })
            .collect()
    }

    /// Token `t` of rank `r` as dispatch sends it: bf16, or E4M3 values then
    /// one f32 scale per [`FP8_GROUP`] channels.
    pub fn encoded(&self, r: usize, t: usize) -> Vec<u8> {
        let x = self.hidden(r, t);
        match self.shape.payload {
            Payload::Bf16 => x.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect(),
            Payload::Fp8 => {
                let mut q = Vec::with_capacity(self.dispatch_bytes());
                let mut scales = Vec::with_capacity(x.len() / FP8_GROUP * 4);
                for group in x.chunks(FP8_GROUP) {
                    let amax = group.iter().fold(0f32, |m, v| m.max(v.to_f32().abs()));
                    let scale = if amax > 0.0 { amax / E4M3_MAX } else { 1.0 };
                    q.extend(
                        group
                            .iter()
                            .map(|v| F8E4M3::from_f64(f64::from(v.to_f32() / scale)).0),
                    );
                    scales.extend(scale.to_le_bytes());
                }
                q.extend(scales);
                q
            }
        }
    }

    /// The values an expert reads from one dispatched copy.
    fn decoded(&self, copy: &[u8]) -> Vec<f32> {
        let h = self.shape.hidden;
        match self.shape.payload {
            Payload::Bf16 => copy
                .chunks_exact(2)
                .map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
                .collect(),
            Payload::Fp8 => (0..h)
                .map(|c| {
                    let at = h + 4 * (c / FP8_GROUP);
                    let scale =
                        f32::from_le_bytes([copy[at], copy[at + 1], copy[at + 2], copy[at + 3]]);
                    F8E4M3(copy[c]).to_f64() as f32 * scale
                })
                .collect(),
        }
    }

    /// What the experts of one copy send back: the bf16 sum, in expert
    /// order, of gate x the decoded input.
    fn expert_output(&self, s: usize, t: usize, experts: &[usize], copy: &[u8], out: &mut Vec<u8>) {
        let x = self.decoded(copy);
        let mut acc = vec![0f32; x.len()];
        for &e in experts {
            let g = gate(self.shape.seed, s, t, e);
            acc.iter_mut().zip(&x).for_each(|(a, v)| *a += g * v);
        }
        out.extend(
            acc.iter()
                .flat_map(|a| bf16::from_f32(*a).to_bits().to_le_bytes()),
        );
    }

    /// Rank `rank`'s dispatch send buffer: its copies, by destination.
    pub fn dispatch_input(&self, rank: usize) -> Vec<u8> {
        let tokens: Vec<Vec<u8>> = (0..self.shape.tokens)
            .map(|t| self.encoded(rank, t))
            .collect();
        let mut out = Vec::new();
        for d in 0..self.world {
            self.for_each_copy(rank, d, |t, _| out.extend_from_slice(&tokens[t]));
        }
        out
    }

    /// What rank `rank` must receive in dispatch: every rank's copies for it.
    pub fn dispatch_expected(&self, rank: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for s in 0..self.world {
            self.for_each_copy(s, rank, |t, _| out.extend(self.encoded(s, t)));
        }
        out
    }

    /// Rank `rank`'s combine send buffer, from what it received in dispatch:
    /// its experts' output for each copy, back to the copy's source.
    pub fn experts_output(&self, rank: usize, received: &[u8]) -> Vec<u8> {
        let b = self.dispatch_bytes();
        let mut out = Vec::new();
        let mut at = 0;
        for s in 0..self.world {
            self.for_each_copy(s, rank, |t, xs| {
                let copy = received.get(at..at + b).unwrap_or(&[]);
                if copy.len() == b {
                    self.expert_output(s, t, xs, copy, &mut out);
                }
                at += b;
            });
        }
        out
    }

    /// Rank `rank`'s combined tokens (`tokens x hidden` bf16) from what it
    /// received in combine: each token's copies summed in f32, in order.
    pub fn combined(&self, rank: usize, received: &[u8]) -> Vec<u8> {
        let (h, b) = (self.shape.hidden, self.combine_bytes());
        let mut acc = vec![0f32; self.shape.tokens * h];
        let mut at = 0;
        for d in 0..self.world {
            self.for_each_copy(rank, d, |t, _| {
                if let Some(copy) = received.get(at..at + b) {
                    for (a, v) in acc[t * h..(t + 1) * h].iter_mut().zip(copy.chunks_exact(2)) {
                        *a += bf16::from_bits(u16::from_le_bytes([v[0], v[1]])).to_f32();
                    }
                }
                at += b;
            });
        }
        acc.iter()
            .flat_map(|a| bf16::from_f32(*a).to_bits().to_le_bytes())
            .collect()
    }

    /// What rank `rank`'s combined tokens must be: the combine of its own
    /// tokens' expert outputs, computed here.
    pub fn combined_expected(&self, rank: usize) -> Vec<u8> {
        let mut back = Vec::new();
        for d in 0..self.world {
            self.for_each_copy(rank, d, |t, xs| {
                let copy = self.encoded(rank, t);
                self.expert_output(rank, t, xs, &copy, &mut back);
            });
        }
        self.combined(rank, &back)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::shape;
    use super::super::Skew;
    use super::*;

    fn plans() -> Vec<MoePlan> {
        let mut out = Vec::new();
        for payload in Payload::ALL {
            for copies in Copies::ALL {
                for skew in [Skew::Uniform, Skew::Zipf(1.0)] {
                    let s = MoeShape {
                        payload,
                        copies,
                        skew,
                        ..shape()
                    };
                    out.push(MoePlan::new(&s, 4));
                }
            }
        }
        out
    }

    #[test]
    fn counts_agree_across_ranks_and_with_the_buffers() {
        for p in plans() {
            let sent: usize = p.dispatch_sent().iter().sum();
            assert_eq!(sent, p.dispatch_received().iter().sum::<usize>());
            for r in 0..4 {
                let c = p.dispatch_counts(r).unwrap();
                assert_eq!(c.send_total(), p.dispatch_input(r).len());
                assert_eq!(c.recv_total(), p.dispatch_expected(r).len());
                let k = p.combine_counts(r).unwrap();
                assert_eq!(
                    k.send_total() / p.combine_bytes(),
                    c.recv_total() / p.dispatch_bytes()
                );
            }
            let per_copy = match p.shape.copies {
                Copies::PerExpert => p.shape.tokens * p.shape.topk * 4,
                Copies::Dedup => sent / p.dispatch_bytes(),
            };
            assert_eq!(sent / p.dispatch_bytes(), per_copy);
        }
    }

    /// Dispatch and combine done by hand, every rank's messages routed in
    /// memory: each rank's combined tokens are what it expects, and a
    /// single flipped byte in transit is seen.
    #[test]
    fn a_hand_delivered_exchange_matches_the_expectation() {
        for p in plans() {
            let w = p.world;
            let inputs: Vec<Vec<u8>> = (0..w).map(|r| p.dispatch_input(r)).collect();
            let deliver = |bufs: &[Vec<u8>], counts: &dyn Fn(usize) -> VCounts| -> Vec<Vec<u8>> {
                (0..w)
                    .map(|d| {
                        let mut got = Vec::new();
                        for (s, buf) in bufs.iter().enumerate() {
                            got.extend_from_slice(&buf[counts(s).send_range(d)]);
                        }
                        got
                    })
                    .collect()
            };
            let received = deliver(&inputs, &|s| p.dispatch_counts(s).unwrap());
            for (d, got) in received.iter().enumerate() {
                assert_eq!(*got, p.dispatch_expected(d));
            }
            let outputs: Vec<Vec<u8>> = (0..w).map(|d| p.experts_output(d, &received[d])).collect();
            let back = deliver(&outputs, &|d| p.combine_counts(d).unwrap());
            for (s, got) in back.iter().enumerate() {
                assert_eq!(p.combined(s, got), p.combined_expected(s));
            }
            let mut bad = back[0].clone();
            if let Some(b) = bad.first_mut() {
                *b ^= 0x40;
                assert_ne!(p.combined(0, &bad), p.combined_expected(0));
            }
        }
    }

    #[test]
    fn fp8_keeps_each_groups_values_within_its_step() {
        let s = MoeShape {
            payload: Payload::Fp8,
            hidden: 512,
            ..shape()
        };
        let p = MoePlan::new(&s, 2);
        let x = p.hidden(0, 3);
        let y = p.decoded(&p.encoded(0, 3));
        for (a, b) in x.iter().zip(&y) {
            // E4M3 keeps 3 mantissa bits: within 1/16 relative, or a
            // small absolute step near zero.
            let (a, b) = (a.to_f32(), *b);
            assert!(
                (a - b).abs() <= a.abs() / 16.0 + 4.0 / 448.0 / 8.0,
                "{a} {b}"
            );
        }
    }
}
