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
        for layers in self.blocks.values_mut() {
            for b in layers {
                b.zero_grads(c).map_err(layer_err)?;
            }
        }
        if self.cfg.reduce.overlap && self.cfg.dp > 1 && self.reducer.is_none() {
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
        self.action_start_us = host_now_us();
        let (t, r) = (self.tp.world(), self.tp.rank());
        let mut x = match x {
            Some(x) => x,
            None => seeded_act(c, &self.cfg, t, r, self.global_mb(mb), None)?,
        };
        let born = host_now_us();
        let mut clock = PhaseClock::new();
        let tp = &mut *self.tp;
        let layers = self.blocks.get(&stage).ok_or_else(|| missing(stage))?;
        let mut stash = Vec::with_capacity(layers.len());
        for b in layers {
            let mut st = b.new_state(c, x).map_err(layer_err)?;
            b.forward_state(c, tp, &mut clock, &mut st)
                .map_err(layer_err)?;
            x = st.take_output(c).map_err(layer_err)?;
            stash.push(st);
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
        self.action_start_us = host_now_us();
        let dx = self.input_pass(c, stage, mb, stash, dy)?;
        Ok(need_dx.then_some(dx))
    }

    fn backward_weight(
        &mut self,
        c: &C,
        stage: usize,
        stash: Self::Stash,
    ) -> Result<(), PipelineError> {
        self.action_start_us = host_now_us();
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
        self.action_start_us = host_now_us();
        let dx = if self.reducer.is_some() {
            self.layered_backward(c, stage, mb, &mut stash, dy)?
        } else {
            let dx = self.input_pass(c, stage, mb, &mut stash, dy)?;
            self.weight_pass(c, stage, &stash)?;
            dx
        };
        Ok(need_dx.then_some(dx))
    }

    fn stash_bytes(&self, stash: &Self::Stash) -> usize {
        stash.iter().map(BlockState::elems).sum::<usize>() * self.dtype.size()
    }

    fn stand_in(&mut self, c: &C, a: Action, d: Duration) -> Result<(), PipelineError> {
        self.action_start_us = host_now_us();
        if matches!(a.kind, ActionKind::B | ActionKind::W) && self.final_overlapped_pass(a.stage) {
            return self.stand_in_last_weight_pass(c, a, d);
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
        if self.reducer.is_some() {
            self.collect_overlapped(c)?;
        } else {
            let mut stages: Vec<usize> = self.blocks.keys().copied().collect();
            stages.sort_unstable();
            for st in stages {
                self.reduce_stage(c, st)?;
            }
        }
        self.times.push(self.step);
        self.spans.push(std::mem::take(&mut self.step_spans));
        Ok(())
    }
}
