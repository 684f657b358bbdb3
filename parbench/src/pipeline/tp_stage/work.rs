//! [`TpStages`] as the executor's [`StageWork`]: each action's passes, the
//! sleep stand-in, and the step's reduction at its end.

use super::*;

impl<'g, C, T, D> StageWork<C> for TpStages<'g, C, T, D>
where
    C: Compute,
    T: Communicator<Buffer = C::Buf>,
    D: Communicator<Buffer = C::Buf>,
{
    /// One state per block, first to last.
    type Stash = Vec<BlockState<C::Buf>>;

    fn message_len(&self) -> usize {
        let t = self.tp.world();
        DataSpecs::new(&self.cfg.block, t).x.local_len(t)
    }

    fn zero_grads(&mut self, c: &C) -> Result<(), PipelineError> {
        let per_layer = self.cfg.reduce.per_layer();
        for layers in self.blocks.values_mut() {
            for b in layers {
                if per_layer {
                    // Made whole for each weight pass, freed after its scatter.
                    drop(b.take_grads(c).map_err(layer_err)?);
                } else {
                    b.zero_grads(c).map_err(layer_err)?;
                }
            }
        }
        self.grad_shares.clear();
        self.prefetched.clear();
        self.last_gather_end_us = f64::NEG_INFINITY;
        if self.cfg.reduce.thread_flag().is_some() && self.cfg.dp > 1 && self.reducer.is_none() {
            return Err(PipelineError::Invalid(
                "overlap needs the reduction thread (TpStages::overlap_on)".into(),
            ));
        }
        self.shares.clear();
        self.reduced.clear();
        self.launched.clear();
        self.weight_passes.clear();
        self.done = 0;
        self.step = StageStepTimes::default();
        self.step_spans.clear();
        Ok(())
    }

    fn forward(
        &mut self,
        c: &C,
        stage: usize,
        mb: usize,
        x: Option<C::Buf>,
    ) -> Result<(C::Buf, Self::Stash), PipelineError> {
        let (t, r) = (self.tp.world(), self.tp.rank());
        let mut x = match x {
            Some(x) => x,
            None => seeded_act(c, &self.cfg, t, r, self.global_mb(mb), None)?,
        };
        let mut born = host_now_us();
        let mut clock = PhaseClock::new();
        let n = self.blocks.get(&stage).ok_or_else(|| missing(stage))?.len();
        let mut stash = Vec::with_capacity(n);
        for layer in 0..n {
            self.sharded_op(&mut clock, &mut born, |s| {
                s.gather_layer(c, stage, layer, (layer + 1 < n).then_some(layer + 1))
            })?;
            let tp = &mut *self.tp;
            let b = block(&self.blocks, stage, layer)?;
            let mut st = b.new_state(c, x).map_err(layer_err)?;
            b.forward_state(c, tp, &mut clock, &mut st)
                .map_err(layer_err)?;
            x = st.take_output(c).map_err(layer_err)?;
            stash.push(st);
            self.release_layer(c, stage, layer)?;
        }
        self.charge(&clock, born);
        Ok((x, stash))
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
        let dx = self.input_pass(c, stage, mb, stash, dy)?;
        Ok(need_dx.then_some(dx))
    }

    fn backward_weight(
        &mut self,
        c: &C,
        stage: usize,
        stash: Self::Stash,
    ) -> Result<(), PipelineError> {
        self.weight_pass(c, stage, &stash)
    }

    /// Without overlap the input-gradient pass, then the weight pass, as
    /// before; with overlap layer by layer from the top (each layer's
    /// input gradients, then its weight gradients: autograd's order), so
    /// that a bucket starts as soon as its layers are done.
    fn backward(
        &mut self,
        c: &C,
        stage: usize,
        mb: usize,
        mut stash: Self::Stash,
        dy: Option<C::Buf>,
        need_dx: bool,
    ) -> Result<Option<C::Buf>, PipelineError> {
        let dx = if self.buckets_overlapped() {
            self.layered_backward(c, stage, mb, &mut stash, dy)?
        } else {
            let dx = self.input_pass(c, stage, mb, &mut stash, dy)?;
            self.weight_pass(c, stage, &stash)?;
            dx
        };
        Ok(need_dx.then_some(dx))
    }

    fn begin_action(&mut self, _a: Action, start_us: f64) {
        self.action_start_us = start_us;
    }

    fn stash_bytes(&self, stash: &Self::Stash) -> usize {
        stash.iter().map(BlockState::elems).sum::<usize>() * self.dtype.size()
    }

    fn stand_in(&mut self, c: &C, a: Action, d: Duration) -> Result<(), PipelineError> {
        if matches!(a.kind, ActionKind::B | ActionKind::W) && self.final_overlapped_pass(a.stage) {
            return self.stand_in_last_weight_pass(c, a, d);
        }
        if self.cfg.reduce.per_layer() {
            return self.stand_in_sharded(c, a, d);
        }
        let Some(layers) = self.blocks.get(&a.stage) else {
            return Err(missing(a.stage));
        };
        let st = self
            .scratch
            .get_mut(&a.stage)
            .ok_or_else(|| missing(a.stage))?;
        let per_layer = d / layers.len().max(1) as u32;
        let talks = !matches!(a.kind, ActionKind::W);
        let born = host_now_us();
        let mut clock = PhaseClock::new();
        for b in layers {
            std::thread::sleep(per_layer);
            clock.end_compute(c).map_err(layer_err)?;
            if talks {
                b.pass_collectives(c, &mut *self.tp, &mut clock, st)
                    .map_err(layer_err)?;
            }
        }
        self.charge(&clock, born);
        Ok(())
    }

    fn after_action(&mut self, _c: &C, a: Action) -> Result<(), PipelineError> {
        self.done += 1;
        if matches!(a.kind, ActionKind::B | ActionKind::W) {
            *self.weight_passes.entry(a.stage).or_insert(0) += 1;
        }
        Ok(())
    }

    fn after_step(&mut self, c: &C) -> Result<(), PipelineError> {
        if self.buckets_overlapped() {
            self.collect_overlapped(c)?;
        } else if !self.cfg.reduce.per_layer() {
            let mut stages: Vec<usize> = self.blocks.keys().copied().collect();
            stages.sort_unstable();
            for st in stages {
                self.reduce_stage(c, st)?;
            }
        }
        self.finish_sharded_step(c)?;
        self.times.push(self.step);
        self.spans.push(std::mem::take(&mut self.step_spans));
        Ok(())
    }
}

impl<'g, C, T, D> TpStages<'g, C, T, D>
where
    C: Compute,
    T: Communicator<Buffer = C::Buf>,
    D: Communicator<Buffer = C::Buf>,
{
    /// Under `--work sleep` with ZeRO-2 or -3: layer by layer in the
    /// order the compute runs them, each layer's gather before the sleep
    /// that stands for a pass reading its weights (ZeRO-3), its
    /// tensor-parallel collectives, and its reduce-scatter after the sleep
    /// that stands for its weight gradients: the sharded traffic is real.
    fn stand_in_sharded(&mut self, c: &C, a: Action, d: Duration) -> Result<(), PipelineError> {
        let n = self.blocks.get(&a.stage).map_or(0, Vec::len);
        let (reads, grads) = match a.kind {
            ActionKind::F | ActionKind::I => (d, Duration::ZERO),
            ActionKind::W => (Duration::ZERO, d),
            ActionKind::B => (d / 2, d - d / 2),
        };
        let per_layer = |part: Duration| part / n.max(1) as u32;
        let order: Vec<usize> = if a.kind == ActionKind::F {
            (0..n).collect()
        } else {
            (0..n).rev().collect()
        };
        let mut born = host_now_us();
        let mut clock = PhaseClock::new();
        for layer in order {
            if a.kind != ActionKind::W {
                let next = if a.kind == ActionKind::F {
                    (layer + 1 < n).then_some(layer + 1)
                } else {
                    layer.checked_sub(1)
                };
                self.sharded_op(&mut clock, &mut born, |s| {
                    s.gather_layer(c, a.stage, layer, next)
                })?;
                std::thread::sleep(per_layer(reads));
                clock.end_compute(c).map_err(layer_err)?;
                self.stand_in_collectives(c, a.stage, layer, &mut clock)?;
                self.release_layer(c, a.stage, layer)?;
            }
            if matches!(a.kind, ActionKind::B | ActionKind::W) {
                self.layer_weight_pass(c, a.stage, layer, &mut clock, &mut born, |_, clock| {
                    std::thread::sleep(per_layer(grads));
                    clock.end_compute(c).map_err(layer_err)
                })?;
            }
        }
        self.charge(&clock, born);
        Ok(())
    }
}
