//! What the executor asks of a rank's stages: the one interface between
//! the schedule's actions and the model they run. The MLP stages
//! ([`super::mlp::MlpStages`]) and the tensor-parallel transformer stages
//! ([`super::tp_stage::TpStages`]) implement it; the executor
//! ([`super::exec`]) runs either for any schedule.

use super::PipelineError;
use crate::compute::Compute;
use crate::schedule::Action;
use std::time::Duration;

/// The stages one rank holds (one, or `v` with an interleaved schedule),
/// each keeping its parameters and gradients; a forward leaves a stash
/// per microbatch that its backward passes consume.
pub trait StageWork<C: Compute> {
    /// What a forward leaves for the backward of one (stage, microbatch).
    type Stash;

    /// Elements of one activation or gradient message between stages.
    fn message_len(&self) -> usize;

    /// Zeroes every gradient (before a step).
    fn zero_grads(&mut self, c: &C) -> Result<(), PipelineError>;

    /// Forward of microbatch `mb` on `stage`: from `x` (the previous
    /// stage's output, or `None` on the first stage: the microbatch's
    /// input) to the stage's output and its stash.
    fn forward(
        &mut self,
        c: &C,
        stage: usize,
        mb: usize,
        x: Option<C::Buf>,
    ) -> Result<(C::Buf, Self::Stash), PipelineError>;

    /// The input-gradient pass: from `dy` (the next stage's input
    /// gradient, or `None` on the last stage: the loss gradient) to the
    /// gradient at the stage's input when `need_dx`.
    fn backward_input(
        &mut self,
        c: &C,
        stage: usize,
        mb: usize,
        stash: &mut Self::Stash,
        dy: Option<C::Buf>,
        need_dx: bool,
    ) -> Result<Option<C::Buf>, PipelineError>;

    /// The weight-gradient pass, adding to the stage's gradients.
    fn backward_weight(
        &mut self,
        c: &C,
        stage: usize,
        stash: Self::Stash,
    ) -> Result<(), PipelineError>;

    /// A full backward (`B`): the input-gradient pass, then the
    /// weight-gradient pass. A stage may run the two layer by layer
    /// instead, as autograd orders them, where what it does between
    /// layers depends on it (the overlapped data-parallel reduction).
    fn backward(
        &mut self,
        c: &C,
        stage: usize,
        mb: usize,
        mut stash: Self::Stash,
        dy: Option<C::Buf>,
        need_dx: bool,
    ) -> Result<Option<C::Buf>, PipelineError> {
        let dx = self.backward_input(c, stage, mb, &mut stash, dy, need_dx)?;
        self.backward_weight(c, stage, stash)?;
        Ok(dx)
    }

    /// Bytes a stash holds on the device.
    fn stash_bytes(&self, stash: &Self::Stash) -> usize;

    /// Under `--work sleep`: stands in for action `a`'s compute, `d` long.
    /// The default sleeps; a stage whose work communicates inside the
    /// action (tensor parallelism) still makes those calls.
    fn stand_in(&mut self, c: &C, a: Action, d: Duration) -> Result<(), PipelineError> {
        let _ = (c, a);
        std::thread::sleep(d);
        Ok(())
    }

    /// Action `a` begins at `start_us` on this rank's host clock: the
    /// executor's own stamp, which the action's record starts from. A
    /// stage that times spans inside the action counts them from it (a
    /// stamp of its own, taken later, would shift every span by the time
    /// between the two reads, which a preempted thread makes milliseconds).
    fn begin_action(&mut self, a: Action, start_us: f64) {
        let _ = (a, start_us);
    }

    /// After action `a` (its output sent): where gradients that became
    /// final may start their data-parallel reduction.
    fn after_action(&mut self, c: &C, a: Action) -> Result<(), PipelineError> {
        let _ = (c, a);
        Ok(())
    }

    /// After the rank's last action of a step.
    fn after_step(&mut self, c: &C) -> Result<(), PipelineError> {
        let _ = c;
        Ok(())
    }
}
