//! Is the sharded block the same block? Gathers every rank's output (and in
//! train mode the input gradient and every weight gradient), builds the
//! unsharded block (t = 1, same seed) on rank 0, and measures
//! `max |sharded - unsharded| / max |unsharded|` per tensor.

use super::block::{PhaseClock, TpBlock};
use super::layout::{DataSpecs, ParamSpecs, TensorSpec};
use super::{LayerError, LayerResult, Mode};
use crate::comm::{CommBuffer, Communicator, DType, Io};
use crate::compute::Compute;

/// The outcome of one comparison, the same on every rank.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckReport {
    /// The largest relative error over every tensor compared.
    pub max_err: f64,
    /// Each tensor's relative error, by name (`y`, `dx`, `grad w_qkv`, ...).
    pub tensors: Vec<(String, f64)>,
    /// What the storage type allows (see [`tolerance`]).
    pub tolerance: f64,
}

impl CheckReport {
    /// The report of each tensor's error, held to `dtype`'s tolerance
    /// (the largest error is NaN if any is).
    pub fn of(tensors: Vec<(String, f64)>, dtype: DType) -> Self {
        let max_err = tensors.iter().map(|(_, e)| *e).fold(0f64, |m, e| {
            if e.is_nan() || m.is_nan() {
                f64::NAN
            } else {
                m.max(e)
            }
        });
        CheckReport {
            max_err,
            tensors,
            tolerance: tolerance(dtype),
        }
    }

    /// Whether every tensor is within the tolerance (NaN never is).
    pub fn passed(&self) -> bool {
        self.max_err <= self.tolerance
    }

    /// This report if it passed, else an error: `what` (the sharded
    /// computation, named) differs beyond the tolerance, in which tensors.
    pub fn required(self, what: &str) -> LayerResult<Self> {
        if self.passed() {
            return Ok(self);
        }
        Err(LayerError::Config(format!(
            "{what} differs from the unsharded one beyond {:.0e}: {}",
            self.tolerance,
            self.failures().join(", ")
        )))
    }

    /// The tensors outside the tolerance, for an error message.
    pub fn failures(&self) -> Vec<String> {
        self.tensors
            .iter()
            .filter(|(_, e)| e.is_nan() || *e > self.tolerance)
            .map(|(n, e)| format!("{n}: {e:.3e}"))
            .collect()
    }
}

/// The relative error a sharded block may show in `dtype`: the sharded and
/// unsharded blocks add the same products in a different order and, in the
/// 16-bit types, round their partial sums before the all-reduce. Set a few
/// times the type's rounding of a sum of a few hundred terms.
///
/// `F8E4M3` (bf16 storage, FP8 products): each product's operands are
/// rounded to E4M3, 3 mantissa bits, a relative step of up to 2^-4, with a
/// scale from the operand's own amax, and a shard's amax is not the whole
/// tensor's, so the two blocks round differently. A product of two rounded
/// operands is off by up to 2 x 2^-4 per term, and the block chains its
/// products (QKV, projection, the two MLP layers), so allow 4 x 2^-4.
pub fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-10,
        DType::F32 => 1e-4,
        DType::F16 => 2e-2,
        DType::F8E4M3 => FP8_TOLERANCE,
        _ => 6e-2,
    }
}

/// [`tolerance`] of FP8 products: 4 x E4M3's relative step 2^-4.
pub const FP8_TOLERANCE: f64 = 4.0 / 16.0;

/// The type a device's check is held to: its products' where they
/// multiply in FP8, else its storage type.
pub fn checked_type<C: Compute>(dev: &C) -> DType {
    match dev.gemm_math().multiply {
        DType::F8E4M3 => DType::F8E4M3,
        _ => dev.dtype(),
    }
}

/// `max |a - b| / max |b|` (absolute when `b` is all zeros; NaN stays NaN).
pub fn relative_error(got: &[f32], want: &[f32]) -> f64 {
    if got.len() != want.len() {
        return f64::NAN;
    }
    let mut diff = 0f64;
    let mut scale = 0f64;
    for (g, w) in got.iter().zip(want) {
        let d = (*g as f64 - *w as f64).abs();
        if d.is_nan() || d > diff {
            diff = d;
        }
        scale = scale.max((*w as f64).abs());
        if diff.is_nan() {
            return f64::NAN;
        }
    }
    if scale > 0.0 {
        diff / scale
    } else {
        diff
    }
}

/// The tensors a check compares, with the split each lives in on `tp` ranks.
fn compared<C: Compute>(block: &TpBlock<C>) -> Vec<(TensorSpec, &C::Buf)> {
    let cfg = block.config();
    let (tp, _) = block.shard_of();
    let ds = DataSpecs::new(cfg, tp);
    let mut out = vec![(TensorSpec { name: "y", ..ds.x }, block.output())];
    if let (Some(dx), Some(grads)) = (block.input_grad(), block.param_grads()) {
        out.push((TensorSpec { name: "dx", ..ds.x }, dx));
        let specs = ParamSpecs::new(cfg).grads(cfg.sequence_split(tp));
        for (spec, buf) in specs.into_iter().zip(grads.all()) {
            out.push((spec, buf));
        }
    }
    out
}

/// Every rank's shard of `buf` as host f32, on every rank.
pub(crate) fn gather_shards<C, M>(
    dev: &C,
    comm: &mut M,
    spec: &TensorSpec,
    buf: &C::Buf,
) -> LayerResult<Vec<Vec<f32>>>
where
    C: Compute,
    M: Communicator<Buffer = C::Buf>,
{
    let tp = comm.world();
    let len = spec.local_len(tp);
    let mut all = vec![0f32; len * tp];
    if tp == 1 {
        dev.download(buf, &mut all)?;
    } else {
        let mut recv = dev.alloc(len * tp)?;
        comm.all_gather(
            Io::OutOfPlace {
                send: buf,
                recv: &mut recv,
            },
            len,
            dev.dtype(),
        )?;
        comm.sync()?;
        dev.download(&recv, &mut all)?;
    }
    Ok(all
        .chunks(len.max(1))
        .take(tp)
        .map(<[f32]>::to_vec)
        .collect())
}

/// Compares `block` (after its forward, and backward in train mode) with the
/// unsharded block built from the same `seed`. Collective: every rank of
/// `comm` must call it; every rank gets the same report. Rank 0 runs the
/// reference alone while the others wait in a broadcast, so the
/// communicator's timeout must cover one unsharded block.
pub fn check_block<C, M>(
    dev: &C,
    comm: &mut M,
    block: &TpBlock<C>,
    seed: u64,
) -> LayerResult<CheckReport>
where
    C: Compute,
    M: Communicator<Buffer = C::Buf>,
{
    let (tp, rank) = block.shard_of();
    if comm.world() != tp || comm.rank() != rank {
        return Err(LayerError::Config(format!(
            "block is rank {rank} of {tp}, communicator rank {} of {}",
            comm.rank(),
            comm.world()
        )));
    }
    let mut gathered = Vec::new();
    for (spec, buf) in compared(block) {
        let shards = gather_shards(dev, comm, &spec, buf)?;
        if rank == 0 {
            gathered.push((spec.name, spec.assemble(tp, &shards)?));
        }
    }

    let mut errs = vec![0f64; compared(block).len()];
    if rank == 0 {
        let cfg = block.config();
        let mut reference = TpBlock::new(dev, cfg, 1, 0, seed)?;
        let mut clock = PhaseClock::new();
        reference.forward(dev, comm, &mut clock)?;
        if cfg.mode == Mode::Train {
            reference.backward(dev, comm, &mut clock)?;
        }
        for (i, (spec, buf)) in compared(&reference).into_iter().enumerate() {
            let (Some((_, got)), Some(e)) = (gathered.get(i), errs.get_mut(i)) else {
                continue;
            };
            let mut want = vec![0f32; spec.len()];
            dev.download(buf, &mut want)?;
            *e = relative_error(got, &want);
        }
    }
    let errs = broadcast_f64(comm, &errs)?;
    let names = compared(block).into_iter().map(|(s, _)| s.name.to_string());
    Ok(CheckReport::of(
        names.zip(errs).collect(),
        checked_type(dev),
    ))
}

/// Rank 0's `values` on every rank.
pub(crate) fn broadcast_f64<M: Communicator>(
    comm: &mut M,
    values: &[f64],
) -> LayerResult<Vec<f64>> {
    if comm.world() == 1 {
        return Ok(values.to_vec());
    }
    let mut buf = comm.alloc(values.len() * 8)?;
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    buf.write_from_host(&bytes)?;
    comm.broadcast(Io::InPlace(&mut buf), values.len(), DType::F64, 0)?;
    comm.sync()?;
    let mut out = vec![0u8; bytes.len()];
    buf.read_to_host(&mut out)?;
    Ok(out
        .chunks_exact(8)
        .map(|c| f64::from_ne_bytes(c.try_into().unwrap_or([0; 8])))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `x` (rows x cols) rounded to E4M3 with the scale 448 / amax and
    /// scaled back: what an FP8 product sees of an operand.
    fn through_e4m3(x: &[f32]) -> Vec<f32> {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = if amax > 0.0 { 448.0 / amax as f64 } else { 1.0 };
        x.iter()
            .map(|&v| (crate::comm::F8E4M3::from_f64(v as f64 * scale).to_f64() / scale) as f32)
            .collect()
    }

    /// `a` (m x k) times `b` (k x n), both through E4M3, summed in f32.
    fn fp8_product(a: &[f32], b: &[f32], (m, k, n): (usize, usize, usize)) -> Vec<f32> {
        let (a, b) = (through_e4m3(a), through_e4m3(b));
        let mut c = vec![0f32; m * n];
        for i in 0..m {
            for p in 0..k {
                for j in 0..n {
                    c[i * n + j] += a[i * k + p] * b[p * n + j];
                }
            }
        }
        c
    }

    fn seeded(n: usize, salt: u64) -> Vec<f32> {
        (0..n as u64)
            .map(|i| {
                (crate::seed::splitmix64(i ^ salt << 32) as f64 / u64::MAX as f64 - 0.5) as f32
            })
            .collect()
    }

    /// The FP8 tolerance holds the MLP's two products in E4M3 split over two
    /// ranks (W1 by columns, W2 by rows, each shard scaled by its own amax)
    /// against the unsharded ones, and the two do differ.
    #[test]
    fn fp8_tolerance_covers_a_sharded_mlp_in_e4m3() {
        let (t, h, f) = (16, 64, 128);
        let (x, w1, w2) = (seeded(t * h, 1), seeded(h * f, 2), seeded(f * h, 3));
        let want = fp8_product(&fp8_product(&x, &w1, (t, h, f)), &w2, (t, f, h));
        let mut got = vec![0f32; t * h];
        let half = f / 2;
        for r in 0..2 {
            let w1s: Vec<f32> = (0..h)
                .flat_map(|p| w1[p * f + r * half..p * f + (r + 1) * half].to_vec())
                .collect();
            let w2s = &w2[r * half * h..(r + 1) * half * h];
            let y = fp8_product(&fp8_product(&x, &w1s, (t, h, half)), w2s, (t, half, h));
            for (g, v) in got.iter_mut().zip(y) {
                *g += v;
            }
        }
        let err = relative_error(&got, &want);
        assert!(err > 0.0 && err < tolerance(DType::F8E4M3), "{err}");
    }

    #[test]
    fn relative_error_is_scaled_by_the_largest_reference_value() {
        assert_eq!(relative_error(&[1.0, 2.0], &[1.0, 4.0]), 0.5);
        assert_eq!(relative_error(&[0.5], &[0.0]), 0.5);
        assert!(relative_error(&[f32::NAN, 1.0], &[1.0, 1.0]).is_nan());
        assert!(relative_error(&[1.0], &[1.0, 2.0]).is_nan());
        let r = CheckReport {
            max_err: f64::NAN,
            tensors: vec![("y".into(), f64::NAN), ("dx".into(), 0.0)],
            tolerance: 1e-4,
        };
        assert!(!r.passed());
        assert_eq!(r.failures().len(), 1);
    }
}
