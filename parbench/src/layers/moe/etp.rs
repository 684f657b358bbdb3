//! The expert-tensor group's exchanges around the experts (Megatron's
//! all-to-all dispatcher with expert tensor parallelism): after the
//! dispatch each rank of an expert group holds its own share of the rows
//! routed to the group's experts; an all-gather gives every rank all of
//! them (each computes its columns of every expert for every row), and
//! after the row-parallel down projection a reduce-scatter sums the
//! ranks' partial outputs and hands each rank back its own rows. Both run
//! as one all-to-all-v inside the group ([`exchange_rows_in`]); their time
//! is communication, kept apart from the all-to-alls' by [`EtpShares`]'s
//! own account.

use super::super::block::PhaseClock;
use super::super::LayerResult;
use super::exchange::{exchange_counts_in, exchange_rows_in, wait_for_peers};
use crate::comm::Communicator;
use crate::compute::Compute;
use std::cell::Cell;
use std::time::Duration;

/// How many rows of each local expert each rank of the expert-tensor
/// group holds after the dispatch.
#[derive(Clone, Debug, Default)]
pub(super) struct EtpShares {
    /// Rows of `[group rank][local expert]`.
    counts: Vec<Vec<usize>>,
    /// This rank's place in the group.
    me: usize,
}

/// Charges the communication `f` does on `clock` to `spent` as well.
fn counted<T>(
    clock: &mut PhaseClock,
    spent: &Cell<Duration>,
    f: impl FnOnce(&mut PhaseClock) -> LayerResult<T>,
) -> LayerResult<T> {
    let before = clock.comm();
    let out = f(clock)?;
    spent.set(spent.get() + (clock.comm() - before));
    Ok(out)
}

impl EtpShares {
    /// Every group rank's row counts, from this rank's (`mine`, per local
    /// expert): a count exchange inside `group` (the layer's ranks of this
    /// expert group, in expert-tensor order), its time added to `spent`.
    pub(super) fn exchange<M: Communicator>(
        comm: &mut M,
        clock: &mut PhaseClock,
        spent: &Cell<Duration>,
        group: &[usize],
        mine: Vec<usize>,
    ) -> LayerResult<Self> {
        let me = group.iter().position(|&r| r == comm.rank()).unwrap_or(0);
        if group.len() <= 1 {
            return Ok(EtpShares {
                counts: vec![mine],
                me,
            });
        }
        let send = vec![mine; group.len()];
        let counts = counted(clock, spent, |clock| {
            let c = exchange_counts_in(comm, group, &send)?;
            clock.end_comm(comm)?;
            Ok(c)
        })?;
        Ok(EtpShares { counts, me })
    }

    /// Rows of local expert `le` over the whole group.
    pub(super) fn rows(&self, le: usize) -> usize {
        self.counts
            .iter()
            .map(|c| c.get(le).copied().unwrap_or(0))
            .sum()
    }

    /// Rows over the whole group.
    pub(super) fn total(&self) -> usize {
        self.counts.iter().flatten().sum()
    }

    /// Rows of group rank `t`.
    fn of(&self, t: usize) -> usize {
        self.counts[t].iter().sum()
    }

    /// Where group rank `t`'s rows of local expert `le` start in its block.
    fn start(&self, t: usize, le: usize) -> usize {
        self.counts[t][..le].iter().sum()
    }

    /// All-gathers `mine` (this rank's rows, grouped by local expert,
    /// `width` wide) over the group: every rank's rows, grouped by local
    /// expert, then by group rank.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gather<C, M>(
        &self,
        dev: &C,
        comm: &mut M,
        clock: &mut PhaseClock,
        spent: &Cell<Duration>,
        group: &[usize],
        mine: Vec<f32>,
        width: usize,
    ) -> LayerResult<Vec<f32>>
    where
        C: Compute,
        M: Communicator<Buffer = C::Buf>,
    {
        if group.len() <= 1 {
            return Ok(mine);
        }
        wait_for_peers(dev, comm, clock)?;
        let recv: Vec<usize> = (0..group.len()).map(|t| self.of(t) * width).collect();
        let send = vec![mine; group.len()];
        let got = counted(clock, spent, |clock| {
            exchange_rows_in(dev, comm, clock, group, send, &recv)
        })?;
        let mut out = Vec::with_capacity(self.total() * width);
        for le in 0..self.counts[self.me].len() {
            for (t, rows) in got.iter().enumerate() {
                let at = self.start(t, le) * width;
                out.extend_from_slice(&rows[at..at + self.counts[t][le] * width]);
            }
        }
        Ok(out)
    }

    /// Reduce-scatters `all` (partial sums of every group rank's rows, in
    /// [`EtpShares::gather`]'s order) over the group: this rank's rows,
    /// summed over the group in group order, grouped by local expert.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn scatter_sum<C, M>(
        &self,
        dev: &C,
        comm: &mut M,
        clock: &mut PhaseClock,
        spent: &Cell<Duration>,
        group: &[usize],
        all: Vec<f32>,
        width: usize,
    ) -> LayerResult<Vec<f32>>
    where
        C: Compute,
        M: Communicator<Buffer = C::Buf>,
    {
        if group.len() <= 1 {
            return Ok(all);
        }
        let p = group.len();
        let mut send: Vec<Vec<f32>> = (0..p)
            .map(|t| Vec::with_capacity(self.of(t) * width))
            .collect();
        let mut at = 0;
        for le in 0..self.counts[self.me].len() {
            for (t, block) in send.iter_mut().enumerate() {
                let len = self.counts[t][le] * width;
                block.extend_from_slice(&all[at..at + len]);
                at += len;
            }
        }
        wait_for_peers(dev, comm, clock)?;
        let mine = self.of(self.me) * width;
        let got = counted(clock, spent, |clock| {
            exchange_rows_in(dev, comm, clock, group, send, &vec![mine; p])
        })?;
        let mut out = vec![0f32; mine];
        for part in &got {
            for (o, v) in out.iter_mut().zip(part) {
                *o += v;
            }
        }
        Ok(out)
    }
}
