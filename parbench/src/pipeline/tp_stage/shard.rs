//! Sharded data parallel over the data group, as ZeRO's three stages and
//! FSDP's modes run it, and hybrid (HSDP: sharded inside groups of data
//! ranks, replicated across them):
//!
//! - ZeRO-1 (`zero1`, Megatron's distributed optimizer): every bucket
//!   reduce-scattered after the step, the rank's share written back into
//!   its gradients (as Megatron reduces in place in its gradient buffer),
//!   Adam on that share, the updated shares all-gathered into the weights.
//! - ZeRO-2 (`zero2`, FSDP's `SHARD_GRAD_OP`): each layer's gradients
//!   reduce-scattered as each microbatch's weight pass makes them, added to
//!   the rank's share and freed; after the step Adam on the share and the
//!   updated shares all-gathered.
//! - ZeRO-3 (`zero3`, FSDP's `FULL_SHARD`): the parameters sharded too; a
//!   layer's are all-gathered before its forward and freed after it
//!   (FSDP's reshard after forward), gathered again before its
//!   input-gradient pass and freed after it; gradients as ZeRO-2; Adam on
//!   the share, nothing gathered after the step.
//!
//! The unit of sharding is a bucket (ZeRO-1) or a layer's parameters,
//! flattened in [`ParamSpecs::all`]'s order and padded to a multiple of
//! the group (rank `r` owns elements `r n / g .. (r + 1) n / g`). With
//! hybrid sharding each share is averaged across the replicas after the
//! step (an all-reduce over the replica group). The optimizer is Adam with
//! fp32 moments (and an fp32 master copy when the weights are 16-bit); its
//! learning rate is 0, so that every step computes the same gradients and
//! the check's reference, which starts from the seeded weights, holds for
//! the last step: the moments and the update's arithmetic run in full.
//!
//! What the step holds is counted from the buffers themselves
//! ([`HeldBytes`]): after every sharded operation and at the step's end.

use super::adam::AdamState;
use super::buckets::{download_n, Slot};
use super::shares::{layer_slots, pack_range, padded, share_of, unpack_range, Of};
use super::*;
use crate::comm::CommBuffer;
use crate::model::plan::Shard;
use crate::pipeline::dp_overlap::JobKind;

/// A gather handed to the data group's thread ahead of its layer.
pub(super) struct Prefetch {
    stage: usize,
    layer: usize,
    submitted_us: f64,
    /// What it holds until taken back: the share's copy and the whole.
    bytes: f64,
}

/// Bytes per parameter this step holds once it is done: the ZeRO paper's
/// split ([`Shard::bytes_per_param`], the planner's too), and with
/// replicated data parallel DDP's bucket copy of the gradients besides
/// (as PyTorch's DDP holds without `gradient_as_bucket_view`).
pub fn bytes_per_param(shard: Shard, weight_bytes: usize, group: usize) -> f64 {
    let buckets = if shard == Shard::None {
        weight_bytes as f64
    } else {
        0.0
    };
    shard.bytes_per_param(weight_bytes, group as u64) + buckets
}

fn bytes_of<B: CommBuffer>(b: &B) -> f64 {
    b.len_bytes() as f64
}

impl<'g, C, T, D> TpStages<'g, C, T, D>
where
    C: Compute,
    T: Communicator<Buffer = C::Buf>,
    D: Communicator<Buffer = C::Buf>,
{
    /// The sharding mode, when the step shards or runs the optimizer.
    pub(super) fn shard(&self) -> Option<Shard> {
        self.cfg.reduce.shard
    }

    /// Ranks one share spans: the shard group's size.
    fn group(&self) -> usize {
        self.dp.world()
    }

    /// Layer `layer`'s slots on this rank's tensor-parallel shard.
    fn slots(&self, layer: usize) -> Vec<Slot> {
        layer_slots(&self.cfg.block, self.tp.world(), layer)
    }

    /// Layer `layer`'s unit padded to whole shares of the group, elements.
    fn padded_len(&self, layer: usize) -> usize {
        padded(&self.slots(layer), self.group())
    }

    /// The units the optimizer and the sharding work in: ZeRO-1's buckets,
    /// otherwise one per layer.
    pub(super) fn units(&self, stage: usize) -> Vec<Vec<Slot>> {
        if self.shard() == Some(Shard::Zero1) {
            return self.buckets(stage);
        }
        let layers = self.blocks.get(&stage).map_or(0, Vec::len);
        (0..layers).map(|l| self.slots(l)).collect()
    }

    /// One layer's weights on this rank padded to whole shares, over the
    /// shard group: one rank's share, elements.
    pub fn layer_share_elems(&self) -> usize {
        self.padded_len(0) / self.group()
    }

    /// ZeRO-3, once when the stages are built: every layer keeps only this
    /// rank's share of its weights.
    pub(super) fn shard_params_at_start(&mut self, c: &C) -> Result<(), PipelineError> {
        if self.shard() != Some(Shard::Zero3) {
            return Ok(());
        }
        let (g, r) = (self.group(), self.dp.rank());
        let mut stages: Vec<usize> = self.blocks.keys().copied().collect();
        stages.sort_unstable();
        for st in stages {
            for (layer, slots) in self.units(st).into_iter().enumerate() {
                let (start, n) = share_of(padded(&slots, g), g, r);
                let mut share = c.alloc(n)?;
                let blocks = self.blocks.get_mut(&st).ok_or_else(|| missing(st))?;
                pack_range(c, blocks, &slots, Of::Params, start, n, &mut share)?;
                let b = blocks.get_mut(layer).ok_or_else(|| missing(st))?;
                drop(b.take_params(c).map_err(layer_err)?);
                self.param_shares.insert((st, layer), share);
            }
        }
        c.sync()?;
        self.note_held();
        Ok(())
    }

    /// ZeRO-3: `layer`'s weights gathered into its block before a pass
    /// that reads them, `next` the layer the pass reads after it. With
    /// prefetch the gathers run on the data group's thread: `next`'s is
    /// handed over before this one's is waited for, so it runs while this
    /// layer computes. Without, the gather runs here and all of it is
    /// exposed.
    pub(super) fn gather_layer(
        &mut self,
        c: &C,
        stage: usize,
        layer: usize,
        next: Option<usize>,
    ) -> Result<(), PipelineError> {
        if self.shard() != Some(Shard::Zero3) {
            return Ok(());
        }
        let start = host_now_us();
        let flat = if self.cfg.reduce.prefetch && self.reducer.is_some() {
            self.gathered_on_thread(c, stage, layer, next)?
        } else {
            let g = self.group();
            let len = self.padded_len(layer);
            let share = weights_share(&self.param_shares, stage, layer)?;
            let mut flat = c.alloc(len)?;
            self.dp.all_gather(
                Io::OutOfPlace {
                    send: share,
                    recv: &mut flat,
                },
                len / g,
                self.dtype,
            )?;
            self.dp.sync()?;
            let took = host_now_us() - start;
            self.shard_span(SpanGroup::ShardGather, start, took);
            self.step.shard_gather_us += took;
            flat
        };
        self.install_gathered(c, stage, layer, &flat)?;
        self.transient = bytes_of(&flat);
        self.note_held();
        drop(flat);
        self.transient = 0.0;
        self.step.shard_exposed_us += host_now_us() - start;
        self.step.shard_calls += 1;
        Ok(())
    }

    /// `flat` (a layer's weights, whole) copied into its block's tensors.
    fn install_gathered(
        &mut self,
        c: &C,
        stage: usize,
        layer: usize,
        flat: &C::Buf,
    ) -> Result<(), PipelineError> {
        let slots = self.slots(layer);
        let mut tensors = Vec::with_capacity(slots.len());
        for s in &slots {
            let mut buf = c.alloc(s.len)?;
            c.copy(flat, s.offset, &mut buf, 0, s.len)?;
            tensors.push(buf);
        }
        let mut it = tensors.into_iter();
        let mut take = || it.next().ok_or_else(|| missing(stage));
        let params = crate::layers::layout::Params {
            w_qkv: take()?,
            b_qkv: take()?,
            w_o: take()?,
            b_o: take()?,
            w_1: take()?,
            b_1: take()?,
            w_2: take()?,
            b_2: take()?,
        };
        c.sync()?;
        let b = block_mut(&mut self.blocks, stage, layer)?;
        b.put_params(params);
        Ok(())
    }

    /// Hands `layer`'s gather to the data group's thread (a copy of this
    /// rank's share goes; the share stays for the optimizer).
    fn submit_gather(&mut self, c: &C, stage: usize, layer: usize) -> Result<(), PipelineError> {
        let g = self.group();
        let len = self.padded_len(layer);
        let share = weights_share(&self.param_shares, stage, layer)?;
        let mut copy = c.alloc(len / g)?;
        c.copy(share, 0, &mut copy, 0, len / g)?;
        c.sync()?;
        let dtype = self.dtype;
        // Before the hand-over: the thread may finish a small gather first.
        let submitted_us = host_now_us();
        self.reducer
            .as_deref_mut()
            .ok_or_else(|| PipelineError::Protocol("no thread for the prefetch".into()))?
            .submit(copy, len / g, dtype, JobKind::AllGather)?;
        self.in_flight_bytes += ((len + len / g) * dtype.size()) as f64;
        self.prefetched.push_back(Prefetch {
            stage,
            layer,
            submitted_us,
            bytes: ((len + len / g) * dtype.size()) as f64,
        });
        Ok(())
    }

    /// With prefetch: `layer`'s gather (handed over now if no earlier
    /// layer prefetched it), `next`'s handed over behind it, then this
    /// one's result taken back. Each gather's time is its span on the
    /// thread, from when it was handed over and the thread free to its end.
    fn gathered_on_thread(
        &mut self,
        c: &C,
        stage: usize,
        layer: usize,
        next: Option<usize>,
    ) -> Result<C::Buf, PipelineError> {
        let queued = |s: &Self, l: usize| {
            s.prefetched
                .iter()
                .any(|p| p.stage == stage && p.layer == l)
        };
        if !queued(self, layer) {
            self.submit_gather(c, stage, layer)?;
        }
        if let Some(n) = next {
            if !queued(self, n) {
                self.submit_gather(c, stage, n)?;
            }
        }
        loop {
            let p = self.prefetched.pop_front().ok_or_else(|| {
                PipelineError::Protocol("a prefetched gather went missing".into())
            })?;
            let r = self
                .reducer
                .as_deref_mut()
                .ok_or_else(|| PipelineError::Protocol("no thread for the prefetch".into()))?
                .take_back()?;
            self.in_flight_bytes -= p.bytes;
            let from = p.submitted_us.max(self.last_gather_end_us);
            self.last_gather_end_us = r.end_us;
            let took = (r.end_us - from).max(0.0);
            self.shard_span(SpanGroup::ShardGather, from, took);
            self.step.shard_gather_us += took;
            self.step.shard_handover_us += (r.taken_us - from).clamp(0.0, took);
            if p.stage == stage && p.layer == layer {
                return Ok(r.buf);
            }
        }
    }

    /// ZeRO-3: frees `layer`'s gathered weights after the pass that read them.
    pub(super) fn release_layer(
        &mut self,
        c: &C,
        stage: usize,
        layer: usize,
    ) -> Result<(), PipelineError> {
        if self.shard() != Some(Shard::Zero3) {
            return Ok(());
        }
        let b = block_mut(&mut self.blocks, stage, layer)?;
        drop(b.take_params(c).map_err(layer_err)?);
        Ok(())
    }

    /// One layer's weight pass, `pass`, framed by what ZeRO-2 and -3 do
    /// around it: before it, whole zeroed gradients to accumulate one
    /// microbatch into (they were freed after the last); after it, their
    /// reduce-scatter ([`Self::scatter_layer_grads`]).
    pub(super) fn layer_weight_pass(
        &mut self,
        c: &C,
        stage: usize,
        layer: usize,
        clock: &mut PhaseClock,
        born: &mut f64,
        pass: impl FnOnce(&mut Self, &mut PhaseClock) -> Result<(), PipelineError>,
    ) -> Result<(), PipelineError> {
        if self.cfg.reduce.per_layer() {
            let b = block_mut(&mut self.blocks, stage, layer)?;
            b.zero_grads(c).map_err(layer_err)?;
        }
        pass(self, clock)?;
        self.sharded_op(clock, born, |s| s.scatter_layer_grads(c, stage, layer))
    }

    /// ZeRO-2 and -3, after a layer's weight pass on one microbatch: its
    /// gradients reduce-scattered over the shard group (averaged), added
    /// to this rank's share, and freed.
    pub(super) fn scatter_layer_grads(
        &mut self,
        c: &C,
        stage: usize,
        layer: usize,
    ) -> Result<(), PipelineError> {
        if !self.cfg.reduce.per_layer() {
            return Ok(());
        }
        let start = host_now_us();
        let g = self.group();
        let slots = self.slots(layer);
        let len = padded(&slots, g);
        let mut flat = c.alloc(len)?;
        let blocks = self.blocks.get(&stage).ok_or_else(|| missing(stage))?;
        pack_range(c, blocks, &slots, Of::Grads, 0, len, &mut flat)?;
        c.sync()?;
        let mut part = c.alloc(len / g)?;
        self.dp.reduce_scatter(
            Io::OutOfPlace {
                send: &flat,
                recv: &mut part,
            },
            len / g,
            self.dtype,
            ReduceOp::Avg,
        )?;
        self.dp.sync()?;
        self.transient = bytes_of(&flat) + bytes_of(&part);
        self.note_held();
        match self.grad_shares.get_mut(&(stage, layer)) {
            Some(acc) => c.add(acc, &part, len / g)?,
            None => {
                self.grad_shares.insert((stage, layer), part);
            }
        }
        let b = block_mut(&mut self.blocks, stage, layer)?;
        drop(b.take_grads(c).map_err(layer_err)?);
        c.sync()?;
        self.transient = 0.0;
        let took = host_now_us() - start;
        self.shard_span(SpanGroup::ShardScatter, start, took);
        self.step.shard_scatter_us += took;
        self.step.shard_exposed_us += took;
        self.step.shard_calls += 1;
        Ok(())
    }

    /// A sharded collective's span in the trace, on the data group's track.
    fn shard_span(&mut self, group: SpanGroup, start: f64, took: f64) {
        self.step_spans.push(CommSpan {
            group,
            action: self.done,
            offset_us: start - self.action_start_us,
            dur_us: took,
        });
    }

    /// At the step's end, with an optimizer: each unit's gradient share
    /// averaged across the replicas (hybrid), Adam on the share, and
    /// (ZeRO-1, -2, replicated) the weights made whole again. The
    /// collectives count in the data-parallel reduction, all exposed; the
    /// optimizer in `optimizer_us`.
    pub(super) fn finish_sharded_step(&mut self, c: &C) -> Result<(), PipelineError> {
        let Some(shard) = self.shard() else {
            return Ok(());
        };
        let (g, r) = (self.group(), self.dp.rank());
        let mut stages: Vec<usize> = self.blocks.keys().copied().collect();
        stages.sort_unstable();
        let narrow = self.dtype.size() < 4;
        for st in stages {
            for (ui, slots) in self.units(st).into_iter().enumerate() {
                let len = padded(&slots, g);
                let (start, n) = match shard {
                    Shard::None => (0, slots.iter().map(|s| s.len).sum()),
                    _ => share_of(len, g, r),
                };
                // The gradients of the share, reduced over the shard group.
                let comm_start = host_now_us();
                let mut grads = c.alloc(n)?;
                match shard {
                    Shard::None => {
                        let blocks = self.blocks.get(&st).ok_or_else(|| missing(st))?;
                        pack_range(c, blocks, &slots, Of::Grads, 0, n, &mut grads)?;
                    }
                    Shard::Zero1 => {
                        let (share, _) = self.shares.remove(&(st, ui)).ok_or_else(|| {
                            PipelineError::Protocol(format!(
                                "bucket {ui} of stage {st} not reduced"
                            ))
                        })?;
                        grads = share;
                    }
                    Shard::Zero2 | Shard::Zero3 => {
                        grads = self.grad_shares.remove(&(st, ui)).ok_or_else(|| {
                            PipelineError::Protocol(format!("layer {ui} of stage {st} not reduced"))
                        })?;
                    }
                }
                if let Some(across) = self.replicas.as_deref_mut() {
                    if shard != Shard::None {
                        across.all_reduce(Io::InPlace(&mut grads), n, self.dtype, ReduceOp::Avg)?;
                        across.sync()?;
                    }
                }
                let comm_took = host_now_us() - comm_start;
                // Adam on the share.
                let opt_start = host_now_us();
                let mut w = vec![0f32; n];
                match shard {
                    Shard::Zero3 => {
                        let share = self
                            .param_shares
                            .get(&(st, ui))
                            .ok_or_else(|| missing(st))?;
                        c.download(share, &mut w)?;
                    }
                    _ => {
                        let mut buf = c.alloc(n)?;
                        let blocks = self.blocks.get(&st).ok_or_else(|| missing(st))?;
                        pack_range(c, blocks, &slots, Of::Params, start, n, &mut buf)?;
                        c.download(&buf, &mut w)?;
                    }
                }
                let g_host = download_n(c, &grads, n)?;
                let state = self
                    .adam
                    .entry((st, ui))
                    .or_insert_with(|| AdamState::new(n, &w, narrow));
                state.step(&mut w, &g_host);
                let mut updated = c.alloc(n)?;
                c.upload(&w, &mut updated)?;
                self.step.optimizer_us += host_now_us() - opt_start;
                // Where the reduced gradients and the updated weights go.
                let comm_start2 = host_now_us();
                match shard {
                    Shard::None => {}
                    Shard::Zero1 => {
                        // Written back in place, as Megatron's buffer holds them.
                        let blocks = self.blocks.get_mut(&st).ok_or_else(|| missing(st))?;
                        unpack_range(c, &grads, start, n, &slots, Of::Grads, blocks)?;
                    }
                    Shard::Zero2 | Shard::Zero3 => {
                        self.grad_shares.insert((st, ui), grads);
                    }
                }
                match shard {
                    Shard::None => {
                        let blocks = self.blocks.get_mut(&st).ok_or_else(|| missing(st))?;
                        unpack_range(c, &updated, 0, n, &slots, Of::Params, blocks)?;
                    }
                    Shard::Zero3 => {
                        self.param_shares.insert((st, ui), updated);
                    }
                    Shard::Zero1 | Shard::Zero2 => {
                        let mut flat = c.alloc(len)?;
                        self.dp.all_gather(
                            Io::OutOfPlace {
                                send: &updated,
                                recv: &mut flat,
                            },
                            n,
                            self.dtype,
                        )?;
                        self.dp.sync()?;
                        let blocks = self.blocks.get_mut(&st).ok_or_else(|| missing(st))?;
                        unpack_range(c, &flat, 0, len, &slots, Of::Params, blocks)?;
                        self.transient = bytes_of(&flat);
                        self.note_held();
                        self.transient = 0.0;
                    }
                }
                c.sync()?;
                let comm_took2 = host_now_us() - comm_start2;
                let comm = comm_took + comm_took2;
                self.step.dp_comm_us += comm;
                self.step.dp_exposed_us += comm;
            }
        }
        self.note_held();
        Ok(())
    }

    /// What the rank holds now, by kind, counted from its buffers; the
    /// step's peak keeps the larger of each.
    pub(super) fn note_held(&mut self) {
        let mut h = HeldBytes::default();
        for blocks in self.blocks.values() {
            for b in blocks {
                h.params += b.params().all().iter().map(|x| bytes_of(*x)).sum::<f64>();
                if let Some(g) = b.param_grads() {
                    h.grads += g.all().iter().map(|x| bytes_of(*x)).sum::<f64>();
                }
            }
        }
        h.params += self.param_shares.values().map(bytes_of).sum::<f64>();
        h.grads += self.grad_shares.values().map(bytes_of).sum::<f64>();
        h.grads += self.shares.values().map(|(b, _)| bytes_of(b)).sum::<f64>();
        h.optimizer = self.adam.values().map(|a| a.bytes() as f64).sum();
        h.buffers = self.bucket_bufs.values().map(bytes_of).sum::<f64>()
            + self.transient
            + self.in_flight_bytes;
        self.step.held_end = h;
        self.step.held_peak = self.step.held_peak.max(h);
        let total = h.total();
        if total > self.step.held_peak_total {
            self.step.held_peak_total = total;
        }
    }

    /// ZeRO-1 and -2: this rank's reduced gradient shares gathered over
    /// the shard group into whole tensors (for the check only), per block.
    pub(super) fn gathered_grad_shares(
        &mut self,
        c: &C,
        stage: usize,
        per: &mut [Vec<Vec<f32>>],
    ) -> Result<(), PipelineError> {
        let Some(shard) = self.shard() else {
            return Ok(());
        };
        if shard == Shard::None || self.group() == 1 {
            return Ok(());
        }
        let (g, r) = (self.group(), self.dp.rank());
        for (ui, slots) in self.units(stage).into_iter().enumerate() {
            let len = padded(&slots, g);
            let (start, n) = share_of(len, g, r);
            let share = match shard {
                Shard::Zero1 => {
                    let mut b = c.alloc(n)?;
                    let blocks = self.blocks.get(&stage).ok_or_else(|| missing(stage))?;
                    pack_range(c, blocks, &slots, Of::Grads, start, n, &mut b)?;
                    b
                }
                _ => {
                    let s = self
                        .grad_shares
                        .get(&(stage, ui))
                        .ok_or_else(|| missing(stage))?;
                    let mut b = c.alloc(n)?;
                    c.copy(s, 0, &mut b, 0, n)?;
                    b
                }
            };
            let flat = gather_to_host(c, &mut *self.dp, &share, n, self.dtype)?;
            for s in &slots {
                per[s.layer][s.param] = flat[s.offset..s.offset + s.len].to_vec();
            }
        }
        Ok(())
    }

    /// ZeRO-3: whether every layer's weights, gathered from the shares,
    /// equal the seeded ones bit for bit (a collective of the shard group;
    /// for the check). Returns the values that differ and those compared.
    pub fn gathered_params_vs_seed(&mut self, c: &C) -> Result<(usize, usize), PipelineError> {
        if self.shard() != Some(Shard::Zero3) {
            return Ok((0, 0));
        }
        let (g, t, rank) = (self.group(), self.tp.world(), self.tp.rank());
        let mut stages: Vec<usize> = self.blocks.keys().copied().collect();
        stages.sort_unstable();
        let (mut differing, mut values) = (0, 0);
        for st in stages {
            for layer in 0..self.blocks.get(&st).map_or(0, Vec::len) {
                let slots = layer_slots(&self.cfg.block, t, layer);
                let len = padded(&slots, g);
                let share = weights_share(&self.param_shares, st, layer)?;
                let flat = gather_to_host(c, &mut *self.dp, share, len / g, self.dtype)?;
                let global = st * self.cfg.layers_per_stage + layer;
                let seeded = TpBlock::new(
                    c,
                    &self.cfg.block,
                    t,
                    rank,
                    layer_seed(self.cfg.seed, global),
                )
                .map_err(layer_err)?;
                for s in &slots {
                    let want = download_n(c, seeded.params().all()[s.param], s.len)?;
                    let got = &flat[s.offset..s.offset + s.len];
                    differing += want
                        .iter()
                        .zip(got)
                        .filter(|(a, b)| a.to_bits() != b.to_bits())
                        .count();
                    values += s.len;
                }
            }
        }
        Ok((differing, values))
    }

    /// Two counts summed over the tensor group onto its rank 0 (a
    /// collective of the group; the other ranks get their own back).
    pub fn sum_over_tensor_group(
        &mut self,
        a: usize,
        b: usize,
    ) -> Result<(usize, usize), PipelineError> {
        use crate::pipeline::exec::{recv_f64s, send_f64s};
        let tp = &mut *self.tp;
        if tp.rank() != 0 {
            send_f64s(tp, &[a as f64, b as f64], 0)?;
            return Ok((a, b));
        }
        let (mut a, mut b) = (a, b);
        for r in 1..tp.world() {
            if let [x, y] = recv_f64s(tp, r)?[..] {
                a += x as usize;
                b += y as usize;
            }
        }
        Ok((a, b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_formula_is_the_zero_papers_split() {
        // Mixed precision (2-byte weights): 16 bytes replicated, 16/g at
        // ZeRO-3, 2 + 2 + 12/g at ZeRO-1, 2 + 14/g at ZeRO-2 (and DDP's
        // bucket copy of the gradients on top when replicated).
        assert_eq!(bytes_per_param(Shard::Zero3, 2, 8), 2.0);
        assert_eq!(bytes_per_param(Shard::Zero1, 2, 4), 7.0);
        assert_eq!(bytes_per_param(Shard::Zero2, 2, 7), 4.0);
        assert_eq!(bytes_per_param(Shard::None, 2, 8), 18.0);
        // fp32 weights: no master copy.
        assert_eq!(bytes_per_param(Shard::Zero3, 4, 2), 8.0);
    }
}
