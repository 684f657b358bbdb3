//! The expert-tensor group's exchanges around the experts (Megatron's
//! all-to-all dispatcher with expert tensor parallelism): after the
//! dispatch each rank of an expert group holds its own share of the rows
//! routed to the group's experts; an all-gather gives every rank all of
//! them (each computes its columns of every expert for every row), and
//! after the row-parallel down projection a reduce-scatter sums the
//! ranks' partial outputs and hands each rank back its own rows. Both run
//! as one all-to-all-v inside the group ([`Group::exchange`]); their time
//! is communication, kept apart from the all-to-alls' on the group's own
//! account.

use super::super::block::PhaseClock;
use super::super::LayerResult;
use super::exchange::{sum_parts, Group};
use crate::comm::Communicator;
use crate::compute::Compute;

/// How many rows of each local expert each rank of the expert-tensor
/// group holds after the dispatch.
#[derive(Clone, Debug, Default)]
pub(super) struct EtpShares {
    /// Rows of `[group rank][local expert]`.
    counts: Vec<Vec<usize>>,
    /// This rank's place in the group.
    me: usize,
}

impl EtpShares {
    /// Every group rank's row counts, from this rank's (`mine`, per local
    /// expert): a count exchange inside `group` (this expert group's ranks,
    /// in expert-tensor order).
    pub(super) fn exchange<M: Communicator>(
        comm: &mut M,
        clock: &mut PhaseClock,
        group: Group<'_>,
        mine: Vec<usize>,
    ) -> LayerResult<Self> {
        let me = group
            .ranks
            .iter()
            .position(|&r| r == comm.rank())
            .unwrap_or(0);
        if group.len() <= 1 {
            return Ok(EtpShares {
                counts: vec![mine],
                me,
            });
        }
        let counts = group.exchange_counts(comm, clock, &vec![mine; group.len()])?;
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
    pub(super) fn gather<C, M>(
        &self,
        dev: &C,
        comm: &mut M,
        clock: &mut PhaseClock,
        group: Group<'_>,
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
        let recv: Vec<usize> = (0..group.len()).map(|t| self.of(t) * width).collect();
        let got = group.exchange(dev, comm, clock, vec![mine; group.len()], &recv)?;
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
    pub(super) fn scatter_sum<C, M>(
        &self,
        dev: &C,
        comm: &mut M,
        clock: &mut PhaseClock,
        group: Group<'_>,
        all: Vec<f32>,
        width: usize,
    ) -> LayerResult<Vec<f32>>
    where
        C: Compute,
        M: Communicator<Buffer = C::Buf>,
    {
        let p = group.len();
        if p <= 1 {
            return Ok(all);
        }
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
        let mine = self.of(self.me) * width;
        let got = group.exchange(dev, comm, clock, send, &vec![mine; p])?;
        Ok(sum_parts(&got, mine))
    }
}
