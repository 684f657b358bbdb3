//! The data-parallel buckets of a rank's stages: how the gradients are cut
//! into buckets (reverse layer order, at most `bucket_bytes`), reduced on
//! the rank's own thread after the step, or handed to the reduction thread
//! as they become final and taken back at the step's end.

use super::*;
use crate::comm::CommBuffer;
use crate::pipeline::dp_overlap::JobKind;

/// A bucket handed to the reduction thread this step.
pub(super) struct Launched {
    stage: usize,
    bucket: usize,
    /// Host time it was packed and handed over.
    ready_us: f64,
    /// The action it was handed over in, and that action's work start.
    action: usize,
    action_start_us: f64,
}

/// What the reduction thread does with a bucket: reduce-scatter it for
/// the distributed optimizer, else all-reduce it.
fn bucket_job(dist_opt: bool) -> JobKind {
    if dist_opt {
        JobKind::ReduceScatter
    } else {
        JobKind::AllReduce
    }
}

/// The layer after whose last weight-gradient pass every gradient in
/// `bucket` is final: its lowest, since the pass runs from the top layer
/// down (the order DDP's buckets follow).
pub(super) fn ready_after(bucket: &[Slot]) -> usize {
    bucket.iter().map(|s| s.layer).min().unwrap_or(0)
}

/// One parameter gradient's place in a bucket.
pub(super) struct Slot {
    pub(super) layer: usize,
    pub(super) param: usize,
    pub(super) offset: usize,
    pub(super) len: usize,
}

pub(super) fn grad<'a, C: Compute>(
    blocks: &'a [TpBlock<C>],
    s: &Slot,
) -> Result<&'a C::Buf, PipelineError> {
    let g = blocks
        .get(s.layer)
        .and_then(|b| b.param_grads())
        .ok_or_else(|| PipelineError::Protocol(format!("block {} has no gradients", s.layer)))?;
    Ok(g.all()[s.param])
}

pub(super) fn grad_mut<'a, C: Compute>(
    blocks: &'a mut [TpBlock<C>],
    s: &Slot,
) -> Result<&'a mut C::Buf, PipelineError> {
    blocks
        .get_mut(s.layer)
        .and_then(|b| b.param_grad_mut(s.param))
        .ok_or_else(|| PipelineError::Protocol(format!("block {} has no gradients", s.layer)))
}

pub(super) fn download_n<C: Compute>(
    c: &C,
    buf: &C::Buf,
    n: usize,
) -> Result<Vec<f32>, PipelineError> {
    let mut v = vec![0f32; n];
    c.download(buf, &mut v)?;
    Ok(v)
}

impl<'g, C, T, D> TpStages<'g, C, T, D>
where
    C: Compute,
    T: Communicator<Buffer = C::Buf>,
    D: Communicator<Buffer = C::Buf>,
{
    /// After layer `layer`'s last weight-gradient pass on `stage`: packs
    /// every bucket of the stage whose gradients are now all final and
    /// hands it to the reduction thread, in bucket order.
    pub(super) fn launch_ready(
        &mut self,
        c: &C,
        stage: usize,
        layer: usize,
    ) -> Result<(), PipelineError> {
        let d = self.cfg.dp;
        let early = self.launch_early;
        let ready: Vec<(usize, Vec<Slot>)> = self
            .buckets(stage)
            .into_iter()
            .enumerate()
            .filter(|(bi, b)| {
                ready_after(b) + early >= layer
                    && !self
                        .launched
                        .iter()
                        .any(|l| l.stage == stage && l.bucket == *bi)
            })
            .collect();
        for (bi, bucket) in ready {
            let used: usize = bucket.iter().map(|s| s.len).sum();
            // A reduce-scatter needs whole shares: the bucket is padded.
            let len = used.div_ceil(d) * d;
            let mut buf = match self.bucket_bufs.remove(&(stage, bi)) {
                Some(b) => b,
                None => c.alloc(len)?,
            };
            let blocks = self.blocks.get(&stage).ok_or_else(|| missing(stage))?;
            for s in &bucket {
                c.copy(grad(blocks, s)?, 0, &mut buf, s.offset, s.len)?;
            }
            c.sync()?;
            let ready_us = host_now_us();
            let dtype = self.dtype;
            self.reducer
                .as_deref_mut()
                .ok_or_else(|| PipelineError::Protocol("no reduction thread".into()))?
                .submit(buf, len, dtype, bucket_job(self.cfg.reduce.dist_opt()))?;
            self.launched.push(Launched {
                stage,
                bucket: bi,
                ready_us,
                action: self.done,
                action_start_us: self.action_start_us,
            });
        }
        Ok(())
    }

    /// At the step's end: takes every bucket back from the reduction
    /// thread (in the order handed over) and copies it into the gradients
    /// (or keeps this rank's share). The step's reduction is each bucket's
    /// time on the thread, from when it was ready and the thread free to
    /// its end, plus the hand-back and the copies; its exposed part is
    /// what the step waited here.
    pub(super) fn collect_overlapped(&mut self, c: &C) -> Result<(), PipelineError> {
        let mut stages: Vec<usize> = self.blocks.keys().copied().collect();
        stages.sort_unstable();
        for &st in &stages {
            let n = self.launched.iter().filter(|l| l.stage == st).count();
            if n != self.buckets(st).len() {
                return Err(PipelineError::Protocol(format!(
                    "stage {st}: {n} of {} buckets were handed to the reduction thread",
                    self.buckets(st).len()
                )));
            }
        }
        let start = host_now_us();
        let reducer = self
            .reducer
            .as_deref_mut()
            .ok_or_else(|| PipelineError::Protocol("no reduction thread".into()))?;
        let mut back = Vec::with_capacity(self.launched.len());
        let mut prev_end = f64::NEG_INFINITY;
        let mut stream_us = 0.0;
        for l in &self.launched {
            let r = reducer.take_back()?;
            let from = l.ready_us.max(prev_end);
            let dur = (r.end_us - from).max(0.0);
            stream_us += dur;
            prev_end = r.end_us;
            self.step_spans.push(CommSpan {
                group: SpanGroup::DpThread,
                action: l.action,
                offset_us: from - l.action_start_us,
                dur_us: dur,
            });
            back.push(r);
        }
        let received = host_now_us();
        // Waking the compute thread after the last bucket is the reduction's too.
        let handoff = (received - prev_end.max(start)).max(0.0);
        let launched = std::mem::take(&mut self.launched);
        for (l, r) in launched.iter().zip(back) {
            if self.cfg.reduce.dist_opt() {
                self.shares.insert((l.stage, l.bucket), (r.buf, r.len));
            } else {
                let bucket = self
                    .buckets(l.stage)
                    .into_iter()
                    .nth(l.bucket)
                    .ok_or_else(|| missing(l.stage))?;
                let blocks = self
                    .blocks
                    .get_mut(&l.stage)
                    .ok_or_else(|| missing(l.stage))?;
                for s in &bucket {
                    let g = grad_mut(blocks, s)?;
                    c.copy(&r.buf, s.offset, g, 0, s.len)?;
                }
                self.bucket_bufs.insert((l.stage, l.bucket), r.buf);
            }
        }
        c.sync()?;
        let end = host_now_us();
        self.step.dp_comm_us += stream_us + handoff + (end - received);
        self.step.dp_exposed_us += end - start;
        self.step.buckets += launched.len();
        Ok(())
    }

    /// The buckets of `stage`: its gradients in reverse layer order, each
    /// bucket at most `bucket_bytes` (a larger tensor is a bucket alone).
    pub(super) fn buckets(&self, stage: usize) -> Vec<Vec<Slot>> {
        let elem = self.dtype.size();
        let cap = (self.cfg.reduce.bucket_bytes / elem).max(1);
        let specs = ParamSpecs::new(&self.cfg.block);
        let t = self.tp.world();
        let layers = self.blocks.get(&stage).map_or(0, Vec::len);
        let mut out: Vec<Vec<Slot>> = Vec::new();
        let mut fill = 0usize;
        for layer in (0..layers).rev() {
            for (param, spec) in specs.all().iter().enumerate().rev() {
                let len = spec.local_len(t);
                if out.is_empty() || (fill > 0 && fill + len > cap) {
                    out.push(Vec::new());
                    fill = 0;
                }
                if let Some(b) = out.last_mut() {
                    b.push(Slot {
                        layer,
                        param,
                        offset: fill,
                        len,
                    });
                }
                fill += len;
            }
        }
        out
    }

    /// Reduces `stage`'s gradients over the data group, bucket by bucket:
    /// each bucket's gradients copied into one buffer, averaged across
    /// the group (all-reduce, or reduce-scatter keeping this rank's share),
    /// and copied back, on this thread after the rank's last action: all
    /// of its time is this step's `dp_comm_us` and exposed.
    pub(super) fn reduce_stage(&mut self, c: &C, stage: usize) -> Result<(), PipelineError> {
        if self.reduced.contains(&stage) {
            return Ok(());
        }
        self.reduced.push(stage);
        let d = self.dp.world();
        if d == 1 {
            return Ok(());
        }
        let dtype = self.dtype;
        for (bi, bucket) in self.buckets(stage).into_iter().enumerate() {
            let used: usize = bucket.iter().map(|s| s.len).sum();
            // A reduce-scatter needs whole shares: the bucket is padded.
            let len = used.div_ceil(d) * d;
            let start = host_now_us();
            let mut buf = match self.bucket_bufs.remove(&(stage, bi)) {
                Some(b) => b,
                None => c.alloc(len)?,
            };
            let blocks = self.blocks.get(&stage).ok_or_else(|| missing(stage))?;
            for s in &bucket {
                let g = grad(blocks, s)?;
                c.copy(g, 0, &mut buf, s.offset, s.len)?;
            }
            c.sync()?;
            if self.cfg.reduce.dist_opt() {
                let mut share = c.alloc(len / d)?;
                self.dp.reduce_scatter(
                    Io::OutOfPlace {
                        send: &buf,
                        recv: &mut share,
                    },
                    len / d,
                    dtype,
                    ReduceOp::Avg,
                )?;
                self.dp.sync()?;
                self.shares.insert((stage, bi), (share, len / d));
            } else {
                self.dp
                    .all_reduce(Io::InPlace(&mut buf), len, dtype, ReduceOp::Avg)?;
                self.dp.sync()?;
                let blocks = self.blocks.get_mut(&stage).ok_or_else(|| missing(stage))?;
                for s in &bucket {
                    let g = grad_mut(blocks, s)?;
                    c.copy(&buf, s.offset, g, 0, s.len)?;
                }
                c.sync()?;
            }
            self.transient = buf.len_bytes() as f64;
            self.note_held();
            self.transient = 0.0;
            // ZeRO-1 keeps no bucket copy between steps (Megatron reduces
            // in its one gradient buffer); DDP keeps its buckets.
            if !self.cfg.reduce.dist_opt() {
                self.bucket_bufs.insert((stage, bi), buf);
            }
            let took = host_now_us() - start;
            self.step_spans.push(CommSpan {
                group: SpanGroup::Dp,
                action: self.done.saturating_sub(1),
                offset_us: start - self.action_start_us,
                dur_us: took,
            });
            self.step.dp_comm_us += took;
            self.step.dp_exposed_us += took;
            self.step.buckets += 1;
        }
        Ok(())
    }

    /// This rank's gradients after the step, per stage it holds (stage
    /// order), per block, per parameter ([`ParamSpecs::all`]'s order),
    /// as reduced over the data group. With the distributed optimizer
    /// each data rank holds a share of each bucket: the shares are
    /// gathered over the data group first (a collective of the group,
    /// for the check only; a real step would update its share instead).
    pub fn reduced_grads(&mut self, c: &C) -> Result<Vec<Vec<Vec<f32>>>, PipelineError> {
        let mut stages: Vec<usize> = self.blocks.keys().copied().collect();
        stages.sort_unstable();
        let t = self.tp.world();
        let specs = ParamSpecs::new(&self.cfg.block);
        let per_layer = self.cfg.reduce.per_layer();
        let mut out = Vec::new();
        for st in stages {
            let blocks = self.blocks.get(&st).ok_or_else(|| missing(st))?;
            let mut per = Vec::with_capacity(blocks.len());
            for (layer, _) in blocks.iter().enumerate() {
                let params = (0..8)
                    .map(|param| {
                        if per_layer {
                            // Freed after each scatter: the shares hold them.
                            return Ok(Vec::new());
                        }
                        let len = specs.all()[param].local_len(t);
                        let s = Slot {
                            layer,
                            param,
                            offset: 0,
                            len,
                        };
                        download_n(c, grad(blocks, &s)?, len)
                    })
                    .collect::<Result<Vec<_>, PipelineError>>()?;
                per.push(params);
            }
            self.gathered_grad_shares(c, st, &mut per)?;
            out.push(per.into_iter().flatten().collect());
        }
        Ok(out)
    }
}
