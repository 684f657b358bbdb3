//! The executor: one rank runs its list of actions in order, over any
//! [`Communicator`] and any [`Compute`], and times each action.
//!
//! Messages carry no tags: links deliver in order, and every rank knows from
//! the schedule what the k-th message on each link is
//! ([`Schedule::link_order`]). A receive for a message that is not next on
//! its link takes the earlier ones into a mailbox first.
//!
//! Each action is timed in three parts: waiting in `recv` for its input
//! (from the first receive call to the last byte: waiting and transfer are
//! not separable through a blocking receive), running (the compute, or the
//! sleep of `--work sleep`), and sending its output (until the buffer may be
//! reused). Busy time is running plus sending; the rest of the step is idle.

use super::mlp::{self, MlpShape, StageModel, Stash};
use super::{PipelineConfig, PipelineError, Work};
use crate::comm::{CommBuffer, Communicator, DType};
use crate::compute::Compute;
use crate::schedule::{Action, ActionKind, Message, Schedule};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// When one action ran, in microseconds from its rank's step start.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ActionTiming {
    pub action: Action,
    /// The first receive call for its input (equals `start_us` if none).
    pub wait_us: f64,
    /// Input in hand; work begins.
    pub start_us: f64,
    /// Work done; the send begins.
    pub work_end_us: f64,
    /// Output sent (equals `work_end_us` if none).
    pub end_us: f64,
}

impl ActionTiming {
    /// Time the rank spent on this action itself (work and send).
    pub fn busy_us(&self) -> f64 {
        self.end_us - self.start_us
    }

    const FIELDS: usize = 7;

    fn to_f64s(self, out: &mut Vec<f64>) {
        out.extend([
            self.action.stage as f64,
            self.action.kind.index() as f64,
            self.action.mb as f64,
            self.wait_us,
            self.start_us,
            self.work_end_us,
            self.end_us,
        ]);
    }

    fn from_f64s(v: &[f64]) -> Option<Self> {
        let kind = *ActionKind::ALL.get(*v.get(1)? as usize)?;
        Some(ActionTiming {
            action: Action::new(*v.first()? as usize, kind, *v.get(2)? as usize),
            wait_us: *v.get(3)?,
            start_us: *v.get(4)?,
            work_end_us: *v.get(5)?,
            end_us: *v.get(6)?,
        })
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
}

/// Everything a run measured, gathered on rank 0.
#[derive(Clone, Debug, PartialEq)]
pub struct RunRecord {
    /// `steps[i][rank]`: each timed step, each rank.
    pub steps: Vec<Vec<RankStep>>,
    /// Largest difference between a pipelined gradient and the reference,
    /// relative to the largest reference gradient; `None` under `--work sleep`.
    pub grad_max_err: Option<f64>,
    /// One-way time of one activation message between ranks 0 and 1
    /// (half a round trip), microseconds; 0 with one rank.
    pub message_us: f64,
}

/// Where each stage's layers start in the whole model.
fn first_layers(stage_layers: &[usize]) -> Vec<usize> {
    stage_layers
        .iter()
        .scan(0, |acc, &l| {
            let first = *acc;
            *acc += l;
            Some(first)
        })
        .collect()
}

/// Receives in link order, keeping messages that arrive before they are needed.
struct Mailbox<B> {
    /// Per peer: the messages it sends this rank, in order, and how many arrived.
    expected: Vec<(Vec<Message>, usize)>,
    early: HashMap<Message, B>,
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

    fn take<Cm: Communicator<Buffer = B>>(
        &mut self,
        comm: &mut Cm,
        want: Message,
        peer: usize,
        mut alloc: impl FnMut() -> Result<B, PipelineError>,
        count: usize,
        dtype: DType,
    ) -> Result<B, PipelineError> {
        loop {
            if let Some(b) = self.early.remove(&want) {
                return Ok(b);
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
            *got += 1;
            self.early.insert(next, buf);
        }
    }
}

/// Runs the whole benchmark on this rank: link probe, warm-up and timed
/// steps, then the gathers and the gradient check. Rank 0 returns the
/// record; the others return `None`.
pub fn run_rank<Cm, C>(
    comm: &mut Cm,
    compute: &C,
    cfg: &PipelineConfig,
) -> Result<Option<RunRecord>, PipelineError>
where
    Cm: Communicator,
    C: Compute<Buf = Cm::Buffer>,
{
    let s = &cfg.schedule;
    let rank = comm.rank();
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
    let firsts = first_layers(&cfg.stage_layers);
    let mut models: HashMap<usize, StageModel<C::Buf>> = HashMap::new();
    if cfg.work == Work::Compute {
        for st in s.stages_of(rank) {
            let m = StageModel::new(
                compute,
                st,
                firsts[st],
                cfg.stage_layers[st],
                cfg.shape,
                cfg.seed,
            )?;
            models.insert(st, m);
        }
    }
    let message_us = probe_link(comm, compute, cfg.shape)?;
    let mut steps = Vec::with_capacity(cfg.steps);
    for i in 0..cfg.warmup + cfg.steps {
        for m in models.values_mut() {
            m.zero_grads(compute)?;
        }
        comm.barrier()?;
        let rec = run_step(comm, compute, cfg, &mut models)?;
        if i >= cfg.warmup {
            steps.push(rec);
        }
    }
    comm.barrier()?;
    let gathered = gather_steps(comm, &steps)?;
    let grad_max_err = if cfg.work == Work::Compute {
        check_grads(comm, compute, cfg, &models)?
    } else {
        None
    };
    Ok(gathered.map(|steps| RunRecord {
        steps,
        grad_max_err,
        message_us,
    }))
}

/// One step of this rank's actions.
fn run_step<Cm, C>(
    comm: &mut Cm,
    compute: &C,
    cfg: &PipelineConfig,
    models: &mut HashMap<usize, StageModel<C::Buf>>,
) -> Result<RankStep, PipelineError>
where
    Cm: Communicator,
    C: Compute<Buf = Cm::Buffer>,
{
    let s = &cfg.schedule;
    let rank = comm.rank();
    let count = cfg.shape.act_len();
    let dtype = compute.dtype();
    let mut mailbox = Mailbox::new(s, rank);
    // Messages between stages of this same rank: no wire.
    let mut local: HashMap<Message, C::Buf> = HashMap::new();
    let mut stashes: HashMap<(usize, usize), Stash<C::Buf>> = HashMap::new();
    let mut held = 0usize;
    let mut out = RankStep::default();
    let extra = match cfg.straggler {
        Some((r, d)) if r == rank => d,
        _ => Duration::ZERO,
    };
    let t0 = Instant::now();
    let us = |t: Instant| t.duration_since(t0).as_secs_f64() * 1e6;
    for a in s.compute_actions(rank) {
        let wait = Instant::now();
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
                    let buf = mailbox.take(comm, m, peer, alloc, count, dtype)?;
                    // Device backends receive asynchronously: the wait
                    // belongs to the receive, not to the work after it.
                    comm.sync()?;
                    Some(buf)
                }
            }
        };
        let start = Instant::now();
        let output = match &cfg.work {
            Work::Sleep(d) => {
                let base = match a.kind {
                    ActionKind::B => *d * 2,
                    _ => *d,
                };
                std::thread::sleep(base + extra);
                match s.output_of(a) {
                    Some(_) => Some(compute.alloc(count)?),
                    None => None,
                }
            }
            Work::Compute => {
                let out = compute_action(compute, cfg, models, &mut stashes, a, input)?;
                compute.sync()?;
                if !extra.is_zero() {
                    std::thread::sleep(extra);
                }
                out
            }
        };
        let work_end = Instant::now();
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
        let bytes: usize = stashes.values().map(Stash::bytes).sum();
        out.peak_activation_bytes = out.peak_activation_bytes.max(bytes);
        if let (Some((m, to_stage)), Some(buf)) = (s.output_of(a), output) {
            let peer = s.rank_of(to_stage).unwrap_or(rank);
            if peer == rank {
                local.insert(m, buf);
            } else {
                comm.send(&buf, count, dtype, peer)?;
                comm.sync()?;
            }
        }
        let end = Instant::now();
        out.actions.push(ActionTiming {
            action: a,
            wait_us: us(wait),
            start_us: us(start),
            work_end_us: us(work_end),
            end_us: us(end),
        });
    }
    comm.sync()?;
    Ok(out)
}

/// The real work of one action; returns the message it sends, if any.
fn compute_action<C: Compute>(
    c: &C,
    cfg: &PipelineConfig,
    models: &mut HashMap<usize, StageModel<C::Buf>>,
    stashes: &mut HashMap<(usize, usize), Stash<C::Buf>>,
    a: Action,
    input: Option<C::Buf>,
) -> Result<Option<C::Buf>, PipelineError> {
    let s = &cfg.schedule;
    let model = models.get_mut(&a.stage).ok_or_else(|| {
        PipelineError::Protocol(format!("{a}: stage {} is not on this rank", a.stage))
    })?;
    let missing = || PipelineError::Protocol(format!("{a}: its forward has not run"));
    match a.kind {
        ActionKind::F => {
            let x = match input {
                Some(x) => x,
                None => mlp::input(c, cfg.seed, a.mb, cfg.shape)?,
            };
            let (y, stash) = model.forward(c, x)?;
            stashes.insert((a.stage, a.mb), stash);
            Ok((!s.is_last(a.stage)).then_some(y))
        }
        ActionKind::B | ActionKind::I => {
            let dy = match input {
                Some(g) => g,
                None => mlp::loss_grad(c, cfg.seed, a.mb, cfg.shape)?,
            };
            let mut stash = stashes.remove(&(a.stage, a.mb)).ok_or_else(missing)?;
            let dx = model.backward_input(c, &mut stash, dy, a.stage > 0)?;
            if a.kind == ActionKind::B {
                model.backward_weight(c, stash)?;
            } else {
                stashes.insert((a.stage, a.mb), stash);
            }
            Ok(dx)
        }
        ActionKind::W => {
            let stash = stashes.remove(&(a.stage, a.mb)).ok_or_else(missing)?;
            model.backward_weight(c, stash)?;
            Ok(None)
        }
    }
}

/// Half the median round trip of one activation-sized message between ranks 0 and 1.
fn probe_link<Cm, C>(comm: &mut Cm, compute: &C, shape: MlpShape) -> Result<f64, PipelineError>
where
    Cm: Communicator,
    C: Compute<Buf = Cm::Buffer>,
{
    const TRIPS: usize = 12;
    let rank = comm.rank();
    if comm.world() < 2 || rank > 1 {
        return Ok(0.0);
    }
    let (count, dtype) = (shape.act_len(), compute.dtype());
    let mut buf = compute.alloc(count)?;
    let mut rtts = Vec::with_capacity(TRIPS);
    for _ in 0..TRIPS {
        let t = Instant::now();
        if rank == 0 {
            comm.send(&buf, count, dtype, 1)?;
            comm.recv(&mut buf, count, dtype, 1)?;
        } else {
            comm.recv(&mut buf, count, dtype, 0)?;
            comm.send(&buf, count, dtype, 0)?;
        }
        rtts.push(t.elapsed().as_secs_f64() * 1e6);
    }
    // The first trips pay for connection and page warm-up.
    let mut tail = rtts.split_off(2);
    Ok(super::median(&mut tail) / 2.0)
}

fn send_f64s<Cm: Communicator>(
    comm: &mut Cm,
    data: &[f64],
    to: usize,
) -> Result<(), PipelineError> {
    let mut head = comm.alloc(8)?;
    head.write_from_host(&(data.len() as u64).to_le_bytes())?;
    comm.send(&head, 1, DType::I64, to)?;
    if !data.is_empty() {
        let mut buf = comm.alloc(data.len() * 8)?;
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        buf.write_from_host(&bytes)?;
        comm.send(&buf, data.len(), DType::F64, to)?;
    }
    Ok(())
}

fn recv_f64s<Cm: Communicator>(comm: &mut Cm, from: usize) -> Result<Vec<f64>, PipelineError> {
    let mut head = comm.alloc(8)?;
    comm.recv(&mut head, 1, DType::I64, from)?;
    let mut n = [0u8; 8];
    head.read_to_host(&mut n)?;
    let n = u64::from_le_bytes(n) as usize;
    if n > (1 << 31) {
        return Err(PipelineError::Protocol(format!(
            "rank {from} announced {n} values"
        )));
    }
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut buf = comm.alloc(n * 8)?;
    comm.recv(&mut buf, n, DType::F64, from)?;
    let mut bytes = vec![0u8; n * 8];
    buf.read_to_host(&mut bytes)?;
    Ok(bytes
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .collect())
}

fn encode_steps(steps: &[RankStep]) -> Vec<f64> {
    let mut v = vec![steps.len() as f64];
    for st in steps {
        v.extend([
            st.actions.len() as f64,
            st.peak_activations as f64,
            st.peak_activation_bytes as f64,
        ]);
        for a in &st.actions {
            a.to_f64s(&mut v);
        }
    }
    v
}

fn decode_steps(v: &[f64], from: usize) -> Result<Vec<RankStep>, PipelineError> {
    let bad = || PipelineError::Protocol(format!("rank {from} sent a malformed timing record"));
    let mut it = 0usize;
    let mut next = |n: usize| -> Result<&[f64], PipelineError> {
        let s = v.get(it..it + n).ok_or_else(bad)?;
        it += n;
        Ok(s)
    };
    let steps = next(1)?[0] as usize;
    let mut out = Vec::with_capacity(steps.min(1 << 16));
    for _ in 0..steps {
        let h = next(3)?;
        let (n, peak, bytes) = (h[0] as usize, h[1] as usize, h[2] as usize);
        let mut actions = Vec::with_capacity(n.min(1 << 20));
        for _ in 0..n {
            actions.push(ActionTiming::from_f64s(next(ActionTiming::FIELDS)?).ok_or_else(bad)?);
        }
        out.push(RankStep {
            actions,
            peak_activations: peak,
            peak_activation_bytes: bytes,
        });
    }
    Ok(out)
}

/// Every rank's steps on rank 0, as `steps[i][rank]`.
fn gather_steps<Cm: Communicator>(
    comm: &mut Cm,
    mine: &[RankStep],
) -> Result<Option<Vec<Vec<RankStep>>>, PipelineError> {
    if comm.rank() != 0 {
        send_f64s(comm, &encode_steps(mine), 0)?;
        return Ok(None);
    }
    let mut per_rank = vec![mine.to_vec()];
    for r in 1..comm.world() {
        let v = recv_f64s(comm, r)?;
        per_rank.push(decode_steps(&v, r)?);
    }
    let steps = mine.len();
    if per_rank.iter().any(|p| p.len() != steps) {
        return Err(PipelineError::Protocol(
            "ranks timed different numbers of steps".into(),
        ));
    }
    Ok(Some(
        (0..steps)
            .map(|i| per_rank.iter().map(|p| p[i].clone()).collect())
            .collect(),
    ))
}

/// Gathers every stage's gradients on rank 0 and compares them with one
/// device running the whole model on the same microbatches.
fn check_grads<Cm, C>(
    comm: &mut Cm,
    compute: &C,
    cfg: &PipelineConfig,
    models: &HashMap<usize, StageModel<C::Buf>>,
) -> Result<Option<f64>, PipelineError>
where
    Cm: Communicator,
    C: Compute<Buf = Cm::Buffer>,
{
    let s = &cfg.schedule;
    let rank = comm.rank();
    if rank != 0 {
        for st in s.stages_of(rank) {
            let m = models
                .get(&st)
                .ok_or_else(|| PipelineError::Protocol(format!("stage {st} missing")))?;
            let flat: Vec<f64> = m
                .grads(compute)?
                .into_iter()
                .flatten()
                .map(f64::from)
                .collect();
            send_f64s(comm, &flat, 0)?;
        }
        return Ok(None);
    }
    let mut got: Vec<Vec<f64>> = vec![Vec::new(); s.num_stages];
    for (st, slot) in got.iter_mut().enumerate() {
        let owner = s.rank_of(st).unwrap_or(0);
        *slot = if owner == 0 {
            let m = models
                .get(&st)
                .ok_or_else(|| PipelineError::Protocol(format!("stage {st} missing")))?;
            m.grads(compute)?
                .into_iter()
                .flatten()
                .map(f64::from)
                .collect()
        } else {
            Vec::new()
        };
    }
    // Receive in each peer's send order (its stages, increasing).
    for r in 1..comm.world() {
        for st in s.stages_of(r) {
            got[st] = recv_f64s(comm, r)?;
        }
    }
    let reference = mlp::reference_grads(
        compute,
        &cfg.stage_layers,
        s.microbatches,
        cfg.shape,
        cfg.seed,
    )?;
    let mut max_ref = 0.0f64;
    let mut max_diff = 0.0f64;
    for (st, want) in reference.iter().enumerate() {
        let want: Vec<f64> = want.iter().flatten().map(|&v| f64::from(v)).collect();
        if want.len() != got[st].len() {
            return Err(PipelineError::Protocol(format!(
                "stage {st}: {} gradient values, expected {}",
                got[st].len(),
                want.len()
            )));
        }
        for (a, b) in got[st].iter().zip(&want) {
            max_ref = max_ref.max(b.abs());
            max_diff = max_diff.max((a - b).abs());
        }
    }
    Ok(Some(if max_ref > 0.0 {
        max_diff / max_ref
    } else {
        max_diff
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_records_round_trip() {
        let steps = vec![RankStep {
            actions: vec![ActionTiming {
                action: Action::new(2, ActionKind::W, 5),
                wait_us: 1.0,
                start_us: 2.0,
                work_end_us: 3.5,
                end_us: 4.0,
            }],
            peak_activations: 3,
            peak_activation_bytes: 4096,
        }];
        assert_eq!(decode_steps(&encode_steps(&steps), 1).unwrap(), steps);
        assert!(decode_steps(&[1.0, 2.0], 1).is_err());
    }

    use crate::comm::{local, Algo};
    use crate::compute::cpu::CpuCompute;
    use crate::pipeline::{MlpShape, PipelineConfig, Work};
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

    /// Runs `cfg` on local ranks; `seed_of(rank)` may give a rank other weights.
    fn run_local(cfg: &PipelineConfig, seed_of: impl Fn(usize) -> u64 + Sync) -> RunRecord {
        let out = local::run(
            cfg.schedule.ranks(),
            Algo::Auto,
            Duration::from_secs(30),
            |comm| {
                let c = CpuCompute::new(DType::F32, 1)
                    .map_err(|e| crate::comm::CommError::Device(e.to_string()))?;
                let mut mine = cfg.clone();
                mine.seed = seed_of(comm.rank());
                run_rank(comm, &c, &mine).map_err(|e| e.into_comm(comm.rank()))
            },
        );
        let mut it = out.into_iter();
        let first = it.next().unwrap().unwrap().unwrap();
        for other in it {
            assert!(other.unwrap().is_none());
        }
        first
    }

    #[test]
    fn every_schedule_on_four_oversubscribed_ranks_matches_one_rank() {
        for kind in ScheduleKind::ALL {
            let v = if kind == ScheduleKind::Interleaved {
                2
            } else {
                1
            };
            let s = generate(kind, 4, 8, v).unwrap();
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
                    assert!(last <= a.wait_us && a.wait_us <= a.start_us);
                    assert!(a.start_us <= a.work_end_us && a.work_end_us <= a.end_us);
                    last = a.end_us;
                }
            }
        }
    }

    #[test]
    fn layers_are_numbered_across_stages() {
        assert_eq!(first_layers(&[2, 2, 4, 2]), vec![0, 2, 4, 8]);
    }
}
