//! What one pipeline stage computes: `L` MLP layers, each `y = gelu(x W + b)`
//! with `W` of `hidden x hidden`, over microbatches of `rows` rows, with the
//! backward split into its input-gradient half (`I`: `dz = dy * gelu'(z)`,
//! `dx = dz W^T`) and its weight-gradient half (`W`: `dW += x^T dz`,
//! `db += sum_rows dz`), as zero-bubble schedules need.
//!
//! Weights, inputs and loss targets come from a seed and the global layer
//! or microbatch index, so every rank builds the same model and one rank can
//! run the whole model as the reference for the gradient check.
//!
//! The loss is `sum <y, t>` over the last stage's outputs `y` with a fixed
//! random target `t` per microbatch, so its gradient is `t`: the backward of
//! the last stage needs no extra kernel, and every gradient still depends on
//! every activation that crossed a stage boundary.

use super::stage::StageWork;
use super::{PipelineConfig, PipelineError, Work};
use crate::compute::{Compute, ComputeResult, Gemm};
use crate::seed::splitmix64;
use std::collections::HashMap;

/// Sizes of every layer and microbatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlpShape {
    /// Width of every layer (`W` is `hidden x hidden`).
    pub hidden: usize,
    /// Rows of one microbatch (`--microbatch-size`).
    pub rows: usize,
}

impl MlpShape {
    /// Elements of one activation or gradient message.
    pub fn act_len(&self) -> usize {
        self.rows * self.hidden
    }
}

/// `len` values uniform in `[-scale, scale)`, from (seed, tag, index).
pub fn seeded(seed: u64, tag: u64, index: u64, len: usize, scale: f32) -> Vec<f32> {
    let base =
        splitmix64(seed ^ splitmix64(tag.wrapping_mul(0x1000_0000_01B3) ^ splitmix64(index)));
    (0..len as u64)
        .map(|i| {
            let u = (splitmix64(base ^ i) >> 40) as f32 / (1u64 << 24) as f32;
            (2.0 * u - 1.0) * scale
        })
        .collect()
}

const TAG_WEIGHT: u64 = 1;
const TAG_BIAS: u64 = 2;
const TAG_INPUT: u64 = 3;
const TAG_TARGET: u64 = 4;

/// Microbatch `mb`'s input to the first stage.
pub fn input<C: Compute>(c: &C, seed: u64, mb: usize, shape: MlpShape) -> ComputeResult<C::Buf> {
    upload(c, &seeded(seed, TAG_INPUT, mb as u64, shape.act_len(), 1.0))
}

/// Microbatch `mb`'s loss gradient at the last stage's output.
pub fn loss_grad<C: Compute>(
    c: &C,
    seed: u64,
    mb: usize,
    shape: MlpShape,
) -> ComputeResult<C::Buf> {
    let scale = 1.0 / shape.rows as f32;
    upload(
        c,
        &seeded(seed, TAG_TARGET, mb as u64, shape.act_len(), scale),
    )
}

fn upload<C: Compute>(c: &C, host: &[f32]) -> ComputeResult<C::Buf> {
    let mut b = c.alloc(host.len())?;
    c.upload(host, &mut b)?;
    Ok(b)
}

struct Layer<B> {
    w: B,
    b: B,
    dw: B,
    db: B,
}

/// What a forward leaves for its backward: each layer's input `x` and
/// pre-activation `z`; after `I`, `z` is replaced by `dz` (what `W` reads).
pub struct Stash<B> {
    xs: Vec<B>,
    zs: Vec<B>,
    dzs: Vec<B>,
    elem_bytes: usize,
    act_len: usize,
}

impl<B> Stash<B> {
    /// Bytes this stash holds on the device.
    pub fn bytes(&self) -> usize {
        (self.xs.len() + self.zs.len() + self.dzs.len()) * self.act_len * self.elem_bytes
    }
}

/// The layers of one stage, with their gradients.
pub struct StageModel<B> {
    /// Global index of this stage.
    pub stage: usize,
    layers: Vec<Layer<B>>,
    shape: MlpShape,
}

impl<B> StageModel<B> {
    /// Number of layers.
    pub fn layers(&self) -> usize {
        self.layers.len()
    }
}

impl<B: Send> StageModel<B> {
    /// Stage `stage` holding layers `first_layer .. first_layer + layers` of the
    /// whole model, initialised from `seed`, gradients zero.
    pub fn new<C: Compute<Buf = B>>(
        c: &C,
        stage: usize,
        first_layer: usize,
        layers: usize,
        shape: MlpShape,
        seed: u64,
    ) -> ComputeResult<Self> {
        let h = shape.hidden;
        let scale = 1.0 / (h as f32).sqrt();
        let layers = (first_layer..first_layer + layers)
            .map(|l| {
                Ok(Layer {
                    w: upload(c, &seeded(seed, TAG_WEIGHT, l as u64, h * h, scale))?,
                    b: upload(c, &seeded(seed, TAG_BIAS, l as u64, h, 0.1))?,
                    dw: c.alloc(h * h)?,
                    db: c.alloc(h)?,
                })
            })
            .collect::<ComputeResult<Vec<_>>>()?;
        Ok(StageModel {
            stage,
            layers,
            shape,
        })
    }

    /// Sets every gradient to zero (before a step).
    pub fn zero_grads<C: Compute<Buf = B>>(&mut self, c: &C) -> ComputeResult<()> {
        let h = self.shape.hidden;
        for l in &mut self.layers {
            l.dw = c.alloc(h * h)?;
            l.db = c.alloc(h)?;
        }
        Ok(())
    }

    /// Forward of one microbatch: returns the stage's output and the stash.
    pub fn forward<C: Compute<Buf = B>>(&self, c: &C, x: B) -> ComputeResult<(B, Stash<B>)> {
        let (n, h) = (self.shape.rows, self.shape.hidden);
        let mut stash = Stash {
            xs: Vec::with_capacity(self.layers.len()),
            zs: Vec::with_capacity(self.layers.len()),
            dzs: Vec::new(),
            elem_bytes: c.dtype().size(),
            act_len: n * h,
        };
        let mut x = x;
        for l in &self.layers {
            let mut z = c.alloc(n * h)?;
            c.gemm(&Gemm::dense(n, h, h), &x, &l.w, &mut z)?;
            c.add_bias(&mut z, &l.b, n, h)?;
            let mut y = c.alloc(n * h)?;
            c.gelu(&z, &mut y, n * h)?;
            stash.xs.push(x);
            stash.zs.push(z);
            x = y;
        }
        Ok((x, stash))
    }

    /// Input-gradient half of the backward: from `dy` at the stage's output,
    /// fills the stash's `dz`s and returns the gradient at the stage's input
    /// (skipped when `need_dx` is false: the first stage's input needs none).
    pub fn backward_input<C: Compute<Buf = B>>(
        &self,
        c: &C,
        stash: &mut Stash<B>,
        dy: B,
        need_dx: bool,
    ) -> ComputeResult<Option<B>> {
        let (n, h) = (self.shape.rows, self.shape.hidden);
        let zs = std::mem::take(&mut stash.zs);
        let mut dzs = Vec::with_capacity(zs.len());
        let mut dy = Some(dy);
        for (i, (l, z)) in self.layers.iter().zip(&zs).enumerate().rev() {
            let Some(g) = dy.take() else { break };
            let mut dz = c.alloc(n * h)?;
            c.gelu_backward(z, &g, &mut dz, n * h)?;
            if i > 0 || need_dx {
                let mut dx = c.alloc(n * h)?;
                let g = Gemm {
                    trans_b: true,
                    ..Gemm::dense(n, h, h)
                };
                c.gemm(&g, &dz, &l.w, &mut dx)?;
                dy = Some(dx);
            }
            dzs.push(dz);
        }
        dzs.reverse();
        stash.dzs = dzs;
        Ok(dy)
    }

    /// Weight-gradient half: accumulates `dW += x^T dz`, `db += sum dz`
    /// from a stash that [`StageModel::backward_input`] has run on.
    pub fn backward_weight<C: Compute<Buf = B>>(
        &mut self,
        c: &C,
        stash: Stash<B>,
    ) -> ComputeResult<()> {
        let (n, h) = (self.shape.rows, self.shape.hidden);
        if stash.dzs.len() != self.layers.len() {
            return Err(crate::compute::ComputeError::InvalidArgument(format!(
                "stage {}: weight gradient before input gradient",
                self.stage
            )));
        }
        for ((l, x), dz) in self.layers.iter_mut().zip(&stash.xs).zip(&stash.dzs) {
            let g = Gemm {
                trans_a: true,
                lda: h,
                beta: 1.0,
                ..Gemm::dense(h, h, n)
            };
            c.gemm(&g, x, dz, &mut l.dw)?;
            let mut db = c.alloc(h)?;
            c.bias_grad(dz, &mut db, n, h)?;
            c.add(&mut l.db, &db, h)?;
        }
        Ok(())
    }

    /// Every gradient on the host, layer by layer: `dW` then `db`.
    pub fn grads<C: Compute<Buf = B>>(&self, c: &C) -> ComputeResult<Vec<Vec<f32>>> {
        let h = self.shape.hidden;
        let mut out = Vec::with_capacity(2 * self.layers.len());
        for l in &self.layers {
            let mut dw = vec![0.0; h * h];
            c.download(&l.dw, &mut dw)?;
            let mut db = vec![0.0; h];
            c.download(&l.db, &mut db)?;
            out.push(dw);
            out.push(db);
        }
        Ok(out)
    }
}

/// The MLP stages of one rank, as the executor runs them.
pub struct MlpStages<B> {
    /// Each stage this rank holds (none under `--work sleep`).
    pub models: HashMap<usize, StageModel<B>>,
    seed: u64,
    shape: MlpShape,
}

impl<B: Send> MlpStages<B> {
    /// Rank `rank`'s stages of `cfg`'s model (their layers numbered
    /// across the whole model); none under `--work sleep`.
    pub fn new<C: Compute<Buf = B>>(
        c: &C,
        cfg: &PipelineConfig,
        rank: usize,
    ) -> ComputeResult<Self> {
        let firsts = first_layers(&cfg.stage_layers);
        let mut models = HashMap::new();
        if cfg.work == Work::Compute {
            for st in cfg.schedule.stages_of(rank) {
                let (first, layers) = (firsts[st], cfg.stage_layers[st]);
                models.insert(
                    st,
                    StageModel::new(c, st, first, layers, cfg.shape, cfg.seed)?,
                );
            }
        }
        Ok(MlpStages {
            models,
            seed: cfg.seed,
            shape: cfg.shape,
        })
    }

    fn model(&mut self, stage: usize) -> Result<&mut StageModel<B>, PipelineError> {
        self.models
            .get_mut(&stage)
            .ok_or_else(|| PipelineError::Protocol(format!("stage {stage} is not on this rank")))
    }
}

impl<C: Compute> StageWork<C> for MlpStages<C::Buf> {
    type Stash = Stash<C::Buf>;

    fn message_len(&self) -> usize {
        self.shape.act_len()
    }

    fn zero_grads(&mut self, c: &C) -> Result<(), PipelineError> {
        for m in self.models.values_mut() {
            m.zero_grads(c)?;
        }
        Ok(())
    }

    fn forward(
        &mut self,
        c: &C,
        stage: usize,
        mb: usize,
        x: Option<C::Buf>,
    ) -> Result<(C::Buf, Self::Stash), PipelineError> {
        let x = match x {
            Some(x) => x,
            None => input(c, self.seed, mb, self.shape)?,
        };
        Ok(self.model(stage)?.forward(c, x)?)
    }

    fn backward_input(
        &mut self,
        c: &C,
        stage: usize,
        mb: usize,
        stash: &mut Self::Stash,
        dy: Option<C::Buf>,
        need_dx: bool,
    ) -> Result<Option<C::Buf>, PipelineError> {
        let dy = match dy {
            Some(g) => g,
            None => loss_grad(c, self.seed, mb, self.shape)?,
        };
        Ok(self.model(stage)?.backward_input(c, stash, dy, need_dx)?)
    }

    fn backward_weight(
        &mut self,
        c: &C,
        stage: usize,
        stash: Self::Stash,
    ) -> Result<(), PipelineError> {
        Ok(self.model(stage)?.backward_weight(c, stash)?)
    }

    fn stash_bytes(&self, stash: &Self::Stash) -> usize {
        stash.bytes()
    }
}

/// Where each stage's layers start in the whole model.
pub(super) fn first_layers(stage_layers: &[usize]) -> Vec<usize> {
    stage_layers
        .iter()
        .scan(0, |acc, &l| {
            let first = *acc;
            *acc += l;
            Some(first)
        })
        .collect()
}

/// Runs the whole model (every stage in order) over `microbatches`
/// microbatches on one device, as one rank without a pipeline would, and
/// returns every stage's gradients ([`StageModel::grads`] order).
pub fn reference_grads<C: Compute>(
    c: &C,
    stage_layers: &[usize],
    microbatches: usize,
    shape: MlpShape,
    seed: u64,
) -> ComputeResult<Vec<Vec<Vec<f32>>>> {
    let firsts = first_layers(stage_layers);
    let mut stages = Vec::with_capacity(stage_layers.len());
    for (s, (&first, &l)) in firsts.iter().zip(stage_layers).enumerate() {
        stages.push(StageModel::new(c, s, first, l, shape, seed)?);
    }
    for mb in 0..microbatches {
        let mut x = input(c, seed, mb, shape)?;
        let mut stashes = Vec::with_capacity(stages.len());
        for st in &stages {
            let (y, stash) = st.forward(c, x)?;
            stashes.push(stash);
            x = y;
        }
        let mut dy = Some(loss_grad(c, seed, mb, shape)?);
        for (i, (st, mut stash)) in stages.iter_mut().zip(stashes).enumerate().rev() {
            let Some(g) = dy.take() else { break };
            dy = st.backward_input(c, &mut stash, g, i > 0)?;
            st.backward_weight(c, stash)?;
        }
    }
    stages.iter().map(|s| s.grads(c)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::DType;
    use crate::compute::cpu::CpuCompute;

    fn gelu(x: f32) -> f32 {
        let k = (2.0f32 / std::f32::consts::PI).sqrt();
        0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
    }

    /// The loss `sum <y, t>` of the whole model on the host, in f64.
    fn host_loss(
        ws: &[Vec<f32>],
        bs: &[Vec<f32>],
        x: &[f32],
        t: &[f32],
        n: usize,
        h: usize,
    ) -> f64 {
        let mut x: Vec<f32> = x.to_vec();
        for (w, b) in ws.iter().zip(bs) {
            let mut y = vec![0.0f32; n * h];
            for r in 0..n {
                for j in 0..h {
                    let mut acc = b[j] as f64;
                    for k in 0..h {
                        acc += x[r * h + k] as f64 * w[k * h + j] as f64;
                    }
                    y[r * h + j] = gelu(acc as f32);
                }
            }
            x = y;
        }
        x.iter().zip(t).map(|(a, b)| *a as f64 * *b as f64).sum()
    }

    #[test]
    fn layers_are_numbered_across_stages() {
        assert_eq!(first_layers(&[2, 2, 4, 2]), vec![0, 2, 4, 8]);
    }

    #[test]
    fn gradients_match_finite_differences() {
        let c = CpuCompute::new(DType::F32, 1).unwrap();
        let shape = MlpShape { hidden: 6, rows: 3 };
        let (n, h, seed) = (shape.rows, shape.hidden, 7);
        let g = reference_grads(&c, &[2], 1, shape, seed).unwrap();
        let ws: Vec<Vec<f32>> = (0..2)
            .map(|l| seeded(seed, TAG_WEIGHT, l, h * h, 1.0 / (h as f32).sqrt()))
            .collect();
        let bs: Vec<Vec<f32>> = (0..2).map(|l| seeded(seed, TAG_BIAS, l, h, 0.1)).collect();
        let x = seeded(seed, TAG_INPUT, 0, n * h, 1.0);
        let t = seeded(seed, TAG_TARGET, 0, n * h, 1.0 / n as f32);
        let eps = 1e-2f32;
        for layer in 0..2 {
            for idx in [0, 7, h * h - 1] {
                let mut wp = ws.clone();
                wp[layer][idx] += eps;
                let mut wm = ws.clone();
                wm[layer][idx] -= eps;
                let num = (host_loss(&wp, &bs, &x, &t, n, h) - host_loss(&wm, &bs, &x, &t, n, h))
                    / (2.0 * eps as f64);
                let got = g[0][2 * layer][idx] as f64;
                assert!(
                    (num - got).abs() < 2e-3,
                    "layer {layer} dW[{idx}]: {got} vs {num}"
                );
            }
            for idx in [0, h - 1] {
                let mut bp = bs.clone();
                bp[layer][idx] += eps;
                let mut bm = bs.clone();
                bm[layer][idx] -= eps;
                let num = (host_loss(&ws, &bp, &x, &t, n, h) - host_loss(&ws, &bm, &x, &t, n, h))
                    / (2.0 * eps as f64);
                let got = g[0][2 * layer + 1][idx] as f64;
                assert!(
                    (num - got).abs() < 2e-3,
                    "layer {layer} db[{idx}]: {got} vs {num}"
                );
            }
        }
    }

    #[test]
    fn splitting_the_model_into_stages_changes_no_gradient() {
        let c = CpuCompute::new(DType::F32, 1).unwrap();
        let shape = MlpShape { hidden: 8, rows: 4 };
        let whole = reference_grads(&c, &[4], 3, shape, 1).unwrap();
        let split = reference_grads(&c, &[1, 3], 3, shape, 1).unwrap();
        let flat =
            |g: &Vec<Vec<Vec<f32>>>| g.iter().flatten().flatten().copied().collect::<Vec<f32>>();
        assert_eq!(flat(&whole), flat(&split));
    }

    #[test]
    fn stash_bytes_count_inputs_and_preactivations() {
        let c = CpuCompute::new(DType::F32, 1).unwrap();
        let shape = MlpShape { hidden: 4, rows: 2 };
        let st = StageModel::new(&c, 0, 0, 3, shape, 0).unwrap();
        let (y, mut stash) = st.forward(&c, input(&c, 0, 0, shape).unwrap()).unwrap();
        assert_eq!(stash.bytes(), 2 * 3 * 8 * 4);
        st.backward_input(&c, &mut stash, y, false).unwrap();
        assert_eq!(stash.bytes(), 2 * 3 * 8 * 4);
    }
}
