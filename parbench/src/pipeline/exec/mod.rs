//! The executor: one rank runs its list of actions in order, over any
//! [`Communicator`] and any [`Compute`], and stamps each action.
//!
//! Messages carry no tags: links deliver in order, and every rank knows from
//! the schedule what the k-th message on each link is
//! ([`Schedule::link_order`]). A receive for a message that is not next on
//! its link takes the earlier ones into a mailbox first.
//!
//! Every rank stamps with its host's monotonic clock
//! ([`clock_sync::host_now_us`]), per action: when it asks for its input,
//! when the input's receive completed, when the work starts and ends, when
//! its output's send is posted and when it completed. Before and after the
//! timed steps the ranks estimate their clock offsets to rank 0
//! ([`clock_sync::estimate_offsets`]); rank 0 gathers every record, moves
//! it onto its own clock and matches each receive with its send
//! ([`super::align`]). On a device backend the work's start and end come
//! from events on the stream, put on the host clock by an anchor event
//! ([`clock_sync::StreamAnchor`]).

use super::mlp::MlpStages;
use super::stage::StageWork;
use super::{align, PipelineConfig, PipelineError, Work};
use crate::comm::{CommBuffer, Communicator, DType, StreamClock};
use crate::compute::Compute;
use crate::measure::clock_sync::{
    self, estimate_offsets, host_now_us, RankClock, StreamAnchor, TimeBase,
};
use crate::schedule::{Action, ActionKind, Message, Schedule};
use std::collections::HashMap;
use std::time::{Duration, Instant};

mod grad_check;
mod records;

use grad_check::check_grads;
use records::gather_steps;
pub(crate) use records::{decode_steps, encode_steps, recv_f64s, send_f64s};

/// When one action ran, in microseconds: on the rank's own clock while the
/// run lasts, on the common base from its step's first work start in a
/// [`RunRecord`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ActionTiming {
    pub action: Action,
    /// The rank asks for the action's input (equals `start_us` if it needs none).
    pub asked_us: f64,
    /// The input's receive completed, when the input crossed a wire. It may
    /// precede `asked_us`: a message taken early, while the rank waited for
    /// an earlier one on the same link.
    pub arrived_us: Option<f64>,
    /// When the producer posted the send of that input, on the common base
    /// (set on rank 0 when the records meet).
    pub input_sent_us: Option<f64>,
    /// Input in hand; work begins.
    pub start_us: f64,
    /// Work done.
    pub work_end_us: f64,
    /// The output's send was posted, when the output crosses a wire.
    pub sent_us: Option<f64>,
    /// Output sent: its buffer may be reused (equals `work_end_us` if none).
    pub end_us: f64,
}

impl ActionTiming {
    /// Time the rank spent on this action itself (work and send).
    pub fn busy_us(&self) -> f64 {
        self.end_us - self.start_us
    }

    /// From asking for the input to having it: waiting and transfer.
    pub fn recv_us(&self) -> f64 {
        (self.start_us - self.asked_us).max(0.0)
    }

    /// Waiting for the peer: from asking until the peer posted its send.
    /// Zero when the input crossed no wire or was sent before it was asked for.
    pub fn waiting_us(&self) -> f64 {
        match self.input_sent_us {
            Some(sent) => (sent.min(self.start_us) - self.asked_us).max(0.0),
            None => 0.0,
        }
    }

    /// The transfer: from the later of asking and the peer's send to having
    /// the input. With [`Self::waiting_us`] it makes up [`Self::recv_us`].
    pub fn transfer_us(&self) -> f64 {
        match self.input_sent_us {
            Some(sent) => (self.start_us - sent.max(self.asked_us)).max(0.0),
            None => 0.0,
        }
    }

    /// From posting the output's send to its completion (0 if none).
    pub fn send_us(&self) -> f64 {
        self.sent_us.map_or(0.0, |s| (self.end_us - s).max(0.0))
    }

    /// Every stamp moved by `f` (onto another clock or origin).
    pub(crate) fn map_times(&mut self, f: impl Fn(f64) -> f64) {
        self.asked_us = f(self.asked_us);
        self.arrived_us = self.arrived_us.map(&f);
        self.input_sent_us = self.input_sent_us.map(&f);
        self.start_us = f(self.start_us);
        self.work_end_us = f(self.work_end_us);
        self.sent_us = self.sent_us.map(&f);
        self.end_us = f(self.end_us);
    }
}

/// One rank's record of one step.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct RankStep {
    pub actions: Vec<ActionTiming>,
    /// Most microbatches whose activations this rank held at once.
    pub peak_activations: usize,
    /// Most bytes of stashed activations this rank held at once.
    pub peak_activation_bytes: usize,
    /// How far the work times taken from the device's stream clock may be
    /// off the host clock ([`StreamAnchor`]); 0 where the host stamps the work.
    pub device_uncertainty_us: f64,
}

/// Everything a run measured, gathered on rank 0, on one time base.
#[derive(Clone, Debug, PartialEq)]
pub struct RunRecord {
    /// `steps[i][rank]`: each timed step, each rank; every time on rank 0's
    /// clock, from the step's first work start.
    pub steps: Vec<Vec<RankStep>>,
    /// Largest difference between a pipelined gradient and the reference,
    /// relative to the largest reference gradient; `None` under `--work sleep`.
    pub grad_max_err: Option<f64>,
    /// One-way time of one activation message between ranks 0 and 1
    /// (half a round trip), microseconds; 0 with one rank.
    pub message_us: f64,
    /// Each rank's clock against rank 0's (estimated before and after the
    /// timed steps).
    pub clocks: Vec<RankClock>,
    /// Each timed step's origin: its first work start, on rank 0's own
    /// clock (the raw stamp), so that records of pipelines that ran at once
    /// (the composed step's) can be put on one base with each other.
    pub origins_us: Vec<f64>,
}

impl RunRecord {
    /// How far rank `rank`'s times may be off the base: its clock offset's
    /// bound plus, on a device, the stream anchor's (largest over steps).
    pub fn uncertainty_us(&self, rank: usize) -> f64 {
        let clock = self.clocks.get(rank).map_or(0.0, RankClock::uncertainty_us);
        let device = self
            .steps
            .iter()
            .filter_map(|st| st.get(rank))
            .map(|r| r.device_uncertainty_us)
            .fold(0.0, f64::max);
        clock + device
    }
}

/// Receives in link order, keeping messages that arrive before they are needed.
struct Mailbox<B> {
    /// Per peer: the messages it sends this rank, in order, and how many arrived.
    expected: Vec<(Vec<Message>, usize)>,
    /// Messages received before they were wanted, with when they arrived.
    early: HashMap<Message, (B, f64)>,
}

impl<B: CommBuffer> Mailbox<B> {
    fn new(s: &Schedule, rank: usize) -> Self {
        Mailbox {
            expected: (0..s.ranks())
                .map(|p| {
                    if p == rank {
                        (Vec::new(), 0)
                    } else {
                        (s.link_order(p, rank), 0)
                    }
                })
                .collect(),
            early: HashMap::new(),
        }
    }

    /// The message `want` from `peer`, and when its receive completed.
    fn take<Cm: Communicator<Buffer = B>>(
        &mut self,
        comm: &mut Cm,
        want: Message,
        peer: usize,
        mut alloc: impl FnMut() -> Result<B, PipelineError>,
        count: usize,
        dtype: DType,
    ) -> Result<(B, f64), PipelineError> {
        loop {
            if let Some(got) = self.early.remove(&want) {
                return Ok(got);
            }
            let (order, got) = self
                .expected
                .get_mut(peer)
                .ok_or_else(|| PipelineError::Protocol(format!("no link from rank {peer}")))?;
            let Some(&next) = order.get(*got) else {
                return Err(PipelineError::Protocol(format!(
                    "rank {}: waits for {want:?} from rank {peer}, which sends nothing more",
                    comm.rank()
                )));
            };
            let mut buf = alloc()?;
            comm.recv(&mut buf, count, dtype, peer)?;
            // Device backends receive asynchronously: the message is here
            // once the stream has it.
            comm.sync()?;
            let arrived = host_now_us();
            *got += 1;
            self.early.insert(next, (buf, arrived));
        }
    }
}

/// Runs the whole benchmark on this rank: link probe, warm-up, clock
/// offsets, timed steps, clock offsets again, then the gathers and the
/// gradient check. `base` says whether the ranks share one clock (threads)
/// or not (processes). Rank 0 returns the record on its clock; the others
/// return `None`.
pub fn run_rank<Cm, C>(
    comm: &mut Cm,
    compute: &C,
    cfg: &PipelineConfig,
    base: TimeBase,
) -> Result<Option<RunRecord>, PipelineError>
where
    Cm: Communicator,
    C: Compute<Buf = Cm::Buffer>,
{
    run_rank_with(comm, compute, cfg, base, |comm, points| {
        comm.stream_clock(points)
    })
}

/// A device stream's clock with room for `points` marks, or `None`.
type StreamClockSource<'a, Cm> =
    dyn Fn(&mut Cm, usize) -> crate::comm::CommResult<Option<Box<dyn StreamClock>>> + 'a;

/// [`run_rank`] taking each step's stream clock from `stream_clock` (the
/// communicator's, or a stand-in in tests).
fn run_rank_with<Cm, C>(
    comm: &mut Cm,
    compute: &C,
    cfg: &PipelineConfig,
    base: TimeBase,
    stream_clock: impl Fn(&mut Cm, usize) -> crate::comm::CommResult<Option<Box<dyn StreamClock>>>,
) -> Result<Option<RunRecord>, PipelineError>
where
    Cm: Communicator,
    C: Compute<Buf = Cm::Buffer>,
{
    check_run(comm, cfg)?;
    let rank = comm.rank();
    let mut stages = MlpStages::new(compute, cfg, rank)?;
    let out = run_stages_with(comm, compute, cfg, base, &mut stages, stream_clock)?;
    let grad_max_err = if cfg.work == Work::Compute {
        check_grads(comm, compute, cfg, &stages.models)?
    } else {
        None
    };
    Ok(out.map(|rec| RunRecord {
        grad_max_err,
        ..rec
    }))
}

/// Runs the benchmark on this rank as [`run_rank`] does, with `stages`
/// as this rank's stages (any [`StageWork`]); no gradient check (the
/// caller checks its own model's gradients: `grad_max_err` is `None`).
pub fn run_stages<Cm, C, S>(
    comm: &mut Cm,
    compute: &C,
    cfg: &PipelineConfig,
    base: TimeBase,
    stages: &mut S,
) -> Result<Option<RunRecord>, PipelineError>
where
    Cm: Communicator,
    C: Compute<Buf = Cm::Buffer>,
    S: StageWork<C>,
{
    check_run(comm, cfg)?;
    run_stages_with(comm, compute, cfg, base, stages, |comm, points| {
        comm.stream_clock(points)
    })
}

/// The schedule fits the job and the layer counts the stages.
fn check_run<Cm: Communicator>(comm: &Cm, cfg: &PipelineConfig) -> Result<(), PipelineError> {
    let s = &cfg.schedule;
    if comm.world() != s.ranks() {
        return Err(PipelineError::Invalid(format!(
            "the schedule has {} ranks but the job has {}",
            s.ranks(),
            comm.world()
        )));
    }
    if cfg.stage_layers.len() != s.num_stages {
        return Err(PipelineError::Invalid(format!(
            "{} stage layer counts for {} stages",
            cfg.stage_layers.len(),
            s.num_stages
        )));
    }
    Ok(())
}

/// Warm-up, clocks, timed steps, clocks again and the gathers, over any stages.
fn run_stages_with<Cm, C, S>(
    comm: &mut Cm,
    compute: &C,
    cfg: &PipelineConfig,
    base: TimeBase,
    stages: &mut S,
    stream_clock: impl Fn(&mut Cm, usize) -> crate::comm::CommResult<Option<Box<dyn StreamClock>>>,
) -> Result<Option<RunRecord>, PipelineError>
where
    Cm: Communicator,
    C: Compute<Buf = Cm::Buffer>,
    S: StageWork<C>,
{
    let s = &cfg.schedule;
    let rank = comm.rank();
    let message_us = probe_link(comm, compute, stages.message_len())?;
    let actions = s.compute_actions(rank).len();
    let step = |comm: &mut Cm, stages: &mut S| {
        stages.zero_grads(compute)?;
        // Events made and anchored before the barrier, off the step's time.
        let device = DeviceMarks::start(comm, &stream_clock, cfg, actions)?;
        comm.barrier()?;
        run_step(comm, compute, cfg, stages, device)
    };
    for _ in 0..cfg.warmup {
        step(comm, stages)?;
    }
    comm.barrier()?;
    let before = estimate_offsets(comm, clock_sync::EXCHANGES)?;
    let mut steps = Vec::with_capacity(cfg.steps);
    for _ in 0..cfg.steps {
        steps.push(step(comm, stages)?);
    }
    comm.barrier()?;
    let after = estimate_offsets(comm, clock_sync::EXCHANGES)?;
    let gathered = gather_steps(comm, &steps)?;
    let (Some(gathered), Some(before), Some(after)) = (gathered, before, after) else {
        return Ok(None);
    };
    let clocks = clock_sync::rank_clocks(base, &before, &after);
    let (steps, origins_us) = align::onto_base(s, gathered, &clocks)?;
    Ok(Some(RunRecord {
        steps,
        grad_max_err: None,
        message_us,
        clocks,
        origins_us,
    }))
}

/// Marks on a device's stream around each action's work, and the anchor
/// that puts them on the host clock.
struct DeviceMarks {
    clock: Box<dyn StreamClock>,
    anchor: StreamAnchor,
}

impl DeviceMarks {
    /// A stream clock with room for two marks per action after the anchor,
    /// where the backend has one and the work runs on the device; `None`
    /// otherwise (host stamps are the work's times). Marks after the anchor
    /// may come any time later: their times add up from it.
    fn start<Cm: Communicator>(
        comm: &mut Cm,
        stream_clock: &StreamClockSource<'_, Cm>,
        cfg: &PipelineConfig,
        actions: usize,
    ) -> Result<Option<Self>, PipelineError> {
        if cfg.work != Work::Compute {
            return Ok(None);
        }
        let Some(mut clock) = stream_clock(comm, 2 * actions + 1)? else {
            return Ok(None);
        };
        // On an idle stream the anchor event completes between the stamps.
        comm.sync()?;
        let before = host_now_us();
        clock.mark()?;
        comm.sync()?;
        let anchor = StreamAnchor::between(before, host_now_us());
        Ok(Some(DeviceMarks { clock, anchor }))
    }

    /// Replaces each action's work start and end by the stream's, on the
    /// host clock; host time spent after the work (a straggler's sleep) is
    /// kept after the device's end.
    fn apply(mut self, out: &mut RankStep, host_after_work: &[f64]) -> Result<(), PipelineError> {
        let times = self.anchor.map(&self.clock.intervals()?);
        if times.len() != 2 * out.actions.len() {
            return Err(PipelineError::Protocol(format!(
                "the stream clock gave {} marks for {} actions",
                times.len(),
                out.actions.len()
            )));
        }
        for ((a, pair), &extra) in out
            .actions
            .iter_mut()
            .zip(times.chunks_exact(2))
            .zip(host_after_work)
        {
            a.start_us = pair[0];
            a.work_end_us = pair[1] + extra;
        }
        out.device_uncertainty_us = self.anchor.uncertainty_us;
        Ok(())
    }
}

/// One step of this rank's actions, stamped on this rank's clock.
fn run_step<Cm, C, S>(
    comm: &mut Cm,
    compute: &C,
    cfg: &PipelineConfig,
    stages: &mut S,
    mut device: Option<DeviceMarks>,
) -> Result<RankStep, PipelineError>
where
    Cm: Communicator,
    C: Compute<Buf = Cm::Buffer>,
    S: StageWork<C>,
{
    let s = &cfg.schedule;
    let rank = comm.rank();
    let count = stages.message_len();
    let dtype = compute.dtype();
    let mut mailbox = Mailbox::new(s, rank);
    // Messages between stages of this same rank: no wire.
    let mut local: HashMap<Message, C::Buf> = HashMap::new();
    let mut stashes: HashMap<(usize, usize), S::Stash> = HashMap::new();
    let mut held = 0usize;
    let mut out = RankStep::default();
    let extra = match cfg.straggler {
        Some((r, d)) if r == rank => d,
        _ => Duration::ZERO,
    };
    let actions = s.compute_actions(rank);
    // Per action: host time after its device work (a straggler's sleep).
    let mut after_work = Vec::with_capacity(actions.len());
    for a in actions {
        let asked = host_now_us();
        let mut arrived = None;
        let input = match s.input_of(a) {
            None => None,
            Some((m, from_stage)) => {
                let peer = s.rank_of(from_stage).unwrap_or(rank);
                if peer == rank {
                    Some(local.remove(&m).ok_or_else(|| {
                        PipelineError::Protocol(format!(
                            "rank {rank}: {a} runs before the same rank produced its input"
                        ))
                    })?)
                } else {
                    let alloc = || compute.alloc(count).map_err(PipelineError::from);
                    let (buf, at) = mailbox.take(comm, m, peer, alloc, count, dtype)?;
                    arrived = Some(at);
                    Some(buf)
                }
            }
        };
        let start = host_now_us();
        stages.begin_action(a, start);
        let output = match &cfg.work {
            Work::Sleep(d) => {
                let base = match a.kind {
                    ActionKind::B => d.saturating_mul(2),
                    _ => *d,
                };
                // A sleep past the deadline is a stuck action: refused, as
                // a wait past it would be (on every backend).
                if base.saturating_add(extra) >= comm.timeout() {
                    return Err(PipelineError::Invalid(format!(
                        "{a} would sleep {} (--work sleep, straggler included), not less than the {} deadline",
                        crate::error_line::duration_text(base + extra),
                        crate::error_line::duration_text(comm.timeout())
                    )));
                }
                stages.stand_in(compute, a, base)?;
                std::thread::sleep(extra);
                match s.output_of(a) {
                    Some(_) => Some(compute.alloc(count)?),
                    None => None,
                }
            }
            Work::Compute => {
                if let Some(d) = device.as_mut() {
                    d.clock.mark()?;
                }
                let out = compute_action(compute, cfg, stages, &mut stashes, a, input)?;
                if let Some(d) = device.as_mut() {
                    d.clock.mark()?;
                }
                compute.sync()?;
                let slept = Instant::now();
                if !extra.is_zero() {
                    std::thread::sleep(extra);
                }
                after_work.push(slept.elapsed().as_secs_f64() * 1e6);
                out
            }
        };
        let work_end = host_now_us();
        // Activations held: the stashes alive when computing; under sleep
        // work (no stashes), what the actions would hold: a forward adds a
        // microbatch, B or W releases it.
        match a.kind {
            ActionKind::F => held += 1,
            ActionKind::B | ActionKind::W => held = held.saturating_sub(1),
            ActionKind::I => {}
        }
        let live = match cfg.work {
            Work::Compute => stashes.len(),
            Work::Sleep(_) => held,
        };
        out.peak_activations = out.peak_activations.max(live);
        let bytes: usize = stashes.values().map(|st| stages.stash_bytes(st)).sum();
        out.peak_activation_bytes = out.peak_activation_bytes.max(bytes);
        let mut sent = None;
        if let (Some((m, to_stage)), Some(buf)) = (s.output_of(a), output) {
            let peer = s.rank_of(to_stage).unwrap_or(rank);
            if peer == rank {
                local.insert(m, buf);
            } else {
                sent = Some(host_now_us());
                comm.send(&buf, count, dtype, peer)?;
                comm.sync()?;
            }
        }
        let end = host_now_us();
        stages.after_action(compute, a)?;
        out.actions.push(ActionTiming {
            action: a,
            asked_us: asked,
            arrived_us: arrived,
            input_sent_us: None,
            start_us: start,
            work_end_us: work_end,
            sent_us: sent,
            end_us: end,
        });
    }
    comm.sync()?;
    stages.after_step(compute)?;
    if let Some(d) = device {
        d.apply(&mut out, &after_work)?;
    }
    Ok(out)
}

/// The real work of one action; returns the message it sends, if any.
fn compute_action<C: Compute, S: StageWork<C>>(
    c: &C,
    cfg: &PipelineConfig,
    stages: &mut S,
    stashes: &mut HashMap<(usize, usize), S::Stash>,
    a: Action,
    input: Option<C::Buf>,
) -> Result<Option<C::Buf>, PipelineError> {
    let s = &cfg.schedule;
    let missing = || PipelineError::Protocol(format!("{a}: its forward has not run"));
    match a.kind {
        ActionKind::F => {
            let (y, stash) = stages.forward(c, a.stage, a.mb, input)?;
            stashes.insert((a.stage, a.mb), stash);
            Ok((!s.is_last(a.stage)).then_some(y))
        }
        ActionKind::B => {
            let stash = stashes.remove(&(a.stage, a.mb)).ok_or_else(missing)?;
            stages.backward(c, a.stage, a.mb, stash, input, a.stage > 0)
        }
        ActionKind::I => {
            let mut stash = stashes.remove(&(a.stage, a.mb)).ok_or_else(missing)?;
            let dx = stages.backward_input(c, a.stage, a.mb, &mut stash, input, a.stage > 0)?;
            stashes.insert((a.stage, a.mb), stash);
            Ok(dx)
        }
        ActionKind::W => {
            let stash = stashes.remove(&(a.stage, a.mb)).ok_or_else(missing)?;
            stages.backward_weight(c, a.stage, stash)?;
            Ok(None)
        }
    }
}

/// Half the median round trip of one activation-sized message between ranks 0 and 1.
fn probe_link<Cm, C>(comm: &mut Cm, compute: &C, count: usize) -> Result<f64, PipelineError>
where
    Cm: Communicator,
    C: Compute<Buf = Cm::Buffer>,
{
    const TRIPS: usize = 12;
    let rank = comm.rank();
    if comm.world() < 2 || rank > 1 {
        return Ok(0.0);
    }
    let dtype = compute.dtype();
    let mut buf = compute.alloc(count)?;
    let mut rtts = Vec::with_capacity(TRIPS);
    for _ in 0..TRIPS {
        let t = Instant::now();
        crate::measure::round_trip(comm, &mut buf, count, dtype)?;
        rtts.push(t.elapsed().as_secs_f64() * 1e6);
    }
    // The first trips pay for connection and page warm-up.
    let mut tail = rtts.split_off(2);
    Ok(crate::stats::median(&mut tail).unwrap_or(0.0) / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::{local, Algo, CommResult};
    use crate::compute::cpu::CpuCompute;
    use crate::pipeline::{acausal, MlpShape, PipelineConfig, Work};
    use crate::schedule::{generate, parse_csv, peak_in_flight, ScheduleKind};

    fn config(s: Schedule, work: Work) -> PipelineConfig {
        PipelineConfig {
            stage_layers: vec![2; s.num_stages],
            shape: MlpShape {
                hidden: 16,
                rows: 4,
            },
            work,
            straggler: None,
            seed: 3,
            warmup: 1,
            steps: 2,
            schedule: s,
        }
    }

    /// What every record must hold on one time base: no dependent action
    /// before its producer (beyond the recorded uncertainty), every wire
    /// input matched with its send, and each receive split exactly into
    /// waiting and transfer.
    fn assert_on_one_base(s: &Schedule, rec: &RunRecord) {
        let bad = acausal(s, rec);
        assert!(bad.is_empty(), "{}: acausal {bad:?}", s.name);
        assert_eq!(rec.clocks.len(), s.ranks());
        for step in &rec.steps {
            let first = step
                .iter()
                .flat_map(|r| r.actions.iter().map(|a| a.start_us))
                .fold(f64::INFINITY, f64::min);
            assert_eq!(first, 0.0, "{}: the step starts at its first work", s.name);
            for rs in step {
                for a in &rs.actions {
                    let wire = a.arrived_us.is_some();
                    assert_eq!(wire, a.input_sent_us.is_some(), "{}", a.action);
                    if let Some(sent) = a.input_sent_us {
                        let parts = a.waiting_us() + a.transfer_us();
                        assert!((parts - a.recv_us()).abs() < 1e-6, "{}", a.action);
                        // Nothing is in hand before it was sent.
                        let slack = (0..s.ranks()).map(|r| rec.uncertainty_us(r)).sum::<f64>();
                        assert!(a.start_us >= sent - slack, "{}: {a:?}", a.action);
                    }
                }
            }
        }
    }

    /// Runs `cfg` on local ranks on `base`; `seed_of(rank)` may give a rank
    /// other weights; with `device_clock` the work is timed by [`HostMarks`].
    fn run_local_with(
        cfg: &PipelineConfig,
        base: TimeBase,
        seed_of: impl Fn(usize) -> u64 + Sync,
        device_clock: bool,
    ) -> RunRecord {
        let out = local::run(
            cfg.schedule.ranks(),
            Algo::Auto,
            Duration::from_secs(30),
            |comm| {
                let c = CpuCompute::new(DType::F32, 1)
                    .map_err(|e| crate::comm::CommError::Device(e.to_string()))?;
                let mut mine = cfg.clone();
                mine.seed = seed_of(comm.rank());
                let rank = comm.rank();
                let r = if device_clock {
                    run_rank_with(comm, &c, &mine, base, |_, points| {
                        Ok(Some(Box::new(HostMarks(Vec::with_capacity(points)))))
                    })
                } else {
                    run_rank(comm, &c, &mine, base)
                };
                r.map_err(|e| e.into_comm(rank))
            },
        );
        let mut it = out.into_iter();
        let first = it.next().unwrap().unwrap().unwrap();
        for other in it {
            assert!(other.unwrap().is_none());
        }
        assert_on_one_base(&cfg.schedule, &first);
        first
    }

    fn run_local(cfg: &PipelineConfig, seed_of: impl Fn(usize) -> u64 + Sync) -> RunRecord {
        run_local_with(cfg, TimeBase::Shared, seed_of, false)
    }

    /// Every schedule that can be generated on `ranks` ranks and `m`
    /// microbatches (the looped ones with two stages per rank).
    fn every_generated(ranks: usize, m: usize) -> Vec<(ScheduleKind, Schedule)> {
        ScheduleKind::ALL
            .into_iter()
            .filter_map(|kind| {
                let v = if kind.chunked() { 2 } else { 1 };
                generate(kind, ranks, m, v).ok().map(|s| (kind, s))
            })
            .collect()
    }

    #[test]
    fn every_schedule_on_four_oversubscribed_ranks_matches_one_rank() {
        let all = every_generated(4, 8);
        assert_eq!(all.len(), ScheduleKind::ALL.len());
        for (kind, s) in all {
            let expected = peak_in_flight(&s);
            let rec = run_local(&config(s, Work::Compute), |_| 3);
            let err = rec.grad_max_err.unwrap();
            assert!(err < 1e-5, "{kind}: gradient error {err}");
            assert_eq!(rec.steps.len(), 2);
            for step in &rec.steps {
                let peaks: Vec<usize> = step.iter().map(|r| r.peak_activations).collect();
                assert_eq!(peaks, expected, "{kind}");
                assert!(step[0].peak_activation_bytes > 0);
            }
        }
    }

    /// With the offsets estimated and applied, as for processes, the
    /// record is causal within the estimates' bounds; on one clock every
    /// estimate holds zero within its bound.
    #[test]
    fn estimated_offsets_keep_every_schedule_causal() {
        for (kind, s) in every_generated(3, 3) {
            for work in [Work::Compute, Work::Sleep(Duration::from_micros(50))] {
                let rec =
                    run_local_with(&config(s.clone(), work), TimeBase::Estimated, |_| 3, false);
                for c in &rec.clocks {
                    for e in [c.before, c.after] {
                        assert!(
                            e.offset_us.abs() <= e.uncertainty_us + 1e-6,
                            "{kind}: {c:?}"
                        );
                    }
                    assert!(c.uncertainty_us() > 0.0 || c.rank == 0, "{c:?}");
                }
            }
        }
    }

    #[test]
    fn the_gradient_check_catches_a_stage_with_other_weights() {
        let s = generate(ScheduleKind::OneFOneB, 2, 2, 1).unwrap();
        let rec = run_local(&config(s, Work::Compute), |r| if r == 1 { 4 } else { 3 });
        assert!(rec.grad_max_err.unwrap() > 1e-2, "{:?}", rec.grad_max_err);
    }

    #[test]
    fn messages_consumed_out_of_link_order_reach_their_action() {
        // Rank 1 runs its backwards in reverse: rank 0 receives the gradient
        // of microbatch 1 before the one it needs first.
        let s = parse_csv("0F0,0F1,0B0,0B1\n1F0,1F1,1B1,1B0\n", "mem", "reversed").unwrap();
        crate::schedule::validate(&s).unwrap();
        let rec = run_local(&config(s, Work::Compute), |_| 3);
        assert!(rec.grad_max_err.unwrap() < 1e-5);
    }

    #[test]
    fn unbalanced_stages_and_a_straggler_change_timing_not_gradients() {
        let s = generate(ScheduleKind::ZbH1, 3, 4, 1).unwrap();
        let mut cfg = config(s, Work::Compute);
        cfg.stage_layers = vec![1, 3, 2];
        cfg.straggler = Some((1, Duration::from_micros(200)));
        let rec = run_local(&cfg, |_| 3);
        assert!(rec.grad_max_err.unwrap() < 1e-5);
    }

    #[test]
    fn sleep_work_times_every_action_in_order() {
        let s = generate(ScheduleKind::GPipe, 3, 3, 1).unwrap();
        let rec = run_local(
            &config(s.clone(), Work::Sleep(Duration::from_micros(100))),
            |_| 3,
        );
        assert_eq!(rec.grad_max_err, None);
        for step in &rec.steps {
            for (r, rs) in step.iter().enumerate() {
                let want: Vec<Action> = s.compute_actions(r);
                let got: Vec<Action> = rs.actions.iter().map(|a| a.action).collect();
                assert_eq!(got, want);
                let mut last = 0.0;
                for a in &rs.actions {
                    assert!(last <= a.asked_us && a.asked_us <= a.start_us);
                    assert!(a.start_us <= a.work_end_us && a.work_end_us <= a.end_us);
                    if let Some(sent) = a.sent_us {
                        assert!(a.work_end_us <= sent && sent <= a.end_us);
                    }
                    last = a.end_us;
                }
            }
        }
    }

    /// The device path on the CPU: a "stream clock" that stamps the host
    /// clock at each mark (a device in step with the host).
    /// The work times then come from the marks through the anchor; the
    /// record stays causal and carries the anchor's uncertainty.
    #[test]
    fn work_times_from_a_stream_clock_land_on_the_host_base() {
        let s = generate(ScheduleKind::OneFOneB, 2, 3, 1).unwrap();
        let mut cfg = config(s, Work::Compute);
        cfg.straggler = Some((1, Duration::from_micros(300)));
        let rec = run_local_with(&cfg, TimeBase::Shared, |_| 3, true);
        assert!(rec.grad_max_err.unwrap() < 1e-5);
        for step in &rec.steps {
            for rs in step {
                assert!(rs.device_uncertainty_us > 0.0);
                // The work's times are the anchor's estimate, good to its
                // bound: the host's own end stamp may precede it by that
                // much (a preempted anchor widens the bound, as under CI).
                let bound = rs.device_uncertainty_us + 1e-6;
                for a in &rs.actions {
                    assert!(a.start_us <= a.work_end_us, "{}", a.action);
                    assert!(
                        a.work_end_us <= a.end_us + bound,
                        "{}: work ends {:.1} us after the action, beyond the bound {bound:.1} us",
                        a.action,
                        a.work_end_us - a.end_us
                    );
                }
            }
            // The straggler's sleep stays in its work.
            for a in &step[1].actions {
                assert!(a.work_end_us - a.start_us >= 300.0, "{}", a.action);
            }
        }
        assert!(rec.uncertainty_us(1) > 0.0);
    }

    /// Marks stamped with the host clock, as [`StreamClock`] reports them.
    struct HostMarks(Vec<f64>);

    impl StreamClock for HostMarks {
        fn mark(&mut self) -> CommResult<()> {
            self.0.push(host_now_us());
            Ok(())
        }
        fn intervals(&mut self) -> CommResult<Vec<f64>> {
            Ok(self.0.windows(2).map(|w| (w[1] - w[0]) * 1e-6).collect())
        }
    }
}
