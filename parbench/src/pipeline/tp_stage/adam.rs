//! The optimizer of the sharded modes: Adam over one unit's share, with
//! fp32 moments (and fp32 master weights under 16-bit weights), at
//! learning rate 0 so that every step's gradients, and the check's
//! reference from the seeded weights, stay the same.

/// Adam's first and second moment decay and epsilon (PyTorch's defaults).
const BETA1: f32 = 0.9;
const BETA2: f32 = 0.999;
const EPS: f32 = 1e-8;
/// Zero: the weights stay the ones the check's reference starts from.
const LEARNING_RATE: f32 = 0.0;

/// Adam's state for one unit's share: fp32 moments, and the fp32 master
/// weights when the weights are stored in 16 bits.
pub(super) struct AdamState {
    m: Vec<f32>,
    v: Vec<f32>,
    master: Option<Vec<f32>>,
    t: i32,
}

impl AdamState {
    pub(super) fn new(n: usize, weights: &[f32], narrow: bool) -> Self {
        AdamState {
            m: vec![0.0; n],
            v: vec![0.0; n],
            master: narrow.then(|| weights.to_vec()),
            t: 0,
        }
    }

    pub(super) fn bytes(&self) -> usize {
        (self.m.len() + self.v.len() + self.master.as_ref().map_or(0, Vec::len)) * 4
    }

    /// One Adam step of the weights `w` from the gradients `g`.
    pub(super) fn step(&mut self, w: &mut [f32], g: &[f32]) {
        self.t += 1;
        let c1 = 1.0 - BETA1.powi(self.t);
        let c2 = 1.0 - BETA2.powi(self.t);
        for i in 0..w.len().min(g.len()) {
            let gi = g[i];
            self.m[i] = BETA1 * self.m[i] + (1.0 - BETA1) * gi;
            self.v[i] = BETA2 * self.v[i] + (1.0 - BETA2) * gi * gi;
            let update = LEARNING_RATE * (self.m[i] / c1) / ((self.v[i] / c2).sqrt() + EPS);
            match self.master.as_mut() {
                Some(master) => {
                    master[i] -= update;
                    w[i] = master[i];
                }
                None => w[i] -= update,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adam_at_learning_rate_zero_keeps_the_weights_and_moves_the_moments() {
        let mut s = AdamState::new(2, &[1.0, -2.0], false);
        let mut w = [1.0f32, -2.0];
        s.step(&mut w, &[0.5, -0.25]);
        assert_eq!(w, [1.0, -2.0]);
        assert!((s.m[0] - 0.05).abs() < 1e-7 && (s.v[1] - 0.0000625).abs() < 1e-9);
        assert_eq!(s.bytes(), 16);
    }
}
