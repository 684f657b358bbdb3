//! The timed loop of one operation on one rank.

use super::clock::IterClock;
use crate::comm::{CommError, CommResult, Communicator, StreamClock};
use std::time::{Duration, Instant};

/// How a timed loop runs.
#[derive(Clone, Debug, PartialEq)]
pub struct LoopSpec {
    /// Untimed iterations first (caches, connections, page faults).
    pub warmup: usize,
    /// Timed iterations.
    pub iters: usize,
    /// Injected delay before each timed iteration on this rank (`--straggler`),
    /// to show how one slow rank paces the others.
    pub delay: Option<Duration>,
    /// Calls captured per graph and replayed (`--graph N`; device backends
    /// only): the time per call without the host's launch cost.
    pub graph: Option<usize>,
}

/// One rank's timings of one loop.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RankTimes {
    /// The whole timed loop, one clock pair around it, including the final
    /// [`Communicator::sync`]: nccl-tests' measure (divide by `iters`).
    pub total: Duration,
    /// Per iteration, nanoseconds from the end of the previous iteration (or
    /// the loop's start) to the end of this one, injected delay included.
    pub iter_ns: Vec<u64>,
    /// Per iteration, nanoseconds from entering the call (after any injected
    /// delay) to its return. A rank that arrives late waits least, so across
    /// ranks this shows who arrives last (no clock synchronisation needed).
    pub in_call_ns: Vec<u64>,
}

impl RankTimes {
    /// Mean time per iteration in microseconds (nccl-tests' time), 0 for no iterations.
    pub fn mean_us(&self) -> f64 {
        if self.iter_ns.is_empty() {
            0.0
        } else {
            self.total.as_secs_f64() * 1e6 / self.iter_ns.len() as f64
        }
    }
}

/// Runs `op` `spec.warmup` times untimed, aligns the ranks with a barrier,
/// then `spec.iters` times under the clock.
///
/// The reported time is one clock pair around the whole loop, as nccl-tests
/// does; the per-iteration times come from one extra read per iteration of
/// [`IterClock`] (about 12 ns where it is the time-stamp counter), so the
/// loop costs about what a bare loop of the same calls costs. Device backends (those with a
/// [`Communicator::stream_clock`]) are timed on the device instead: CUDA
/// events before the loop and after each call, so per-iteration times are
/// device times, and the total is their sum (the loop still ends with
/// [`Communicator::sync`]). With `spec.graph = Some(N)` the calls are
/// captured N at a time as a graph and its replays are timed (see `time_graph`).
pub fn time_loop<C, F>(comm: &mut C, spec: &LoopSpec, mut op: F) -> CommResult<RankTimes>
where
    C: Communicator,
    F: FnMut(&mut C) -> CommResult<()>,
{
    for _ in 0..spec.warmup {
        op(comm)?;
    }
    comm.sync()?;
    comm.barrier()?;
    // Device backends: the whole loop on the host clock (nccl-tests' time),
    // then each call's device time from events on the stream; or graphs.
    if let Some(n) = spec.graph {
        return time_graph(comm, spec, n, &mut op);
    }
    if let Some(mut clock) = comm.stream_clock(spec.iters + 1)? {
        let total = whole_loop(comm, spec, spec.iters, &mut op)?;
        // The second loop starts together too, as the first did.
        comm.barrier()?;
        let mut times = time_on_stream(comm, spec, clock.as_mut(), &mut op)?;
        times.total = total;
        return Ok(times);
    }

    // Per iteration, one read of the cheap clock into a vector reserved
    // beforehand; conversion to nanoseconds waits until after the loop.
    let clock = IterClock::get();
    let mut ends = Vec::with_capacity(spec.iters);
    let mut enters = Vec::with_capacity(if spec.delay.is_some() { spec.iters } else { 0 });
    let start = Instant::now();
    let first = clock.now();
    for _ in 0..spec.iters {
        if let Some(d) = spec.delay {
            std::thread::sleep(d);
            enters.push(clock.now());
        }
        op(comm)?;
        ends.push(clock.now());
    }
    comm.sync()?;
    let total = start.elapsed();
    let mut iter_ns = Vec::with_capacity(spec.iters);
    let mut prev = first;
    for &end in &ends {
        iter_ns.push(clock.ns(prev, end));
        prev = end;
    }
    let in_call_ns = if spec.delay.is_some() {
        enters
            .iter()
            .zip(&ends)
            .map(|(&enter, &end)| clock.ns(enter, end))
            .collect()
    } else {
        iter_ns.clone()
    };
    Ok(RankTimes {
        total,
        iter_ns,
        in_call_ns,
    })
}

/// The device path's whole loop, nccl-tests' measure: the host clock from
/// before the first call to the end of the final [`Communicator::sync`],
/// the calls issued back to back with no event between them (an event
/// between calls costs the host a record each, which small calls, bound
/// by their launch, would show). `op` is called `calls` times.
fn whole_loop<C, F>(comm: &mut C, spec: &LoopSpec, calls: usize, op: &mut F) -> CommResult<Duration>
where
    C: Communicator,
    F: FnMut(&mut C) -> CommResult<()>,
{
    comm.barrier()?;
    let start = Instant::now();
    for _ in 0..calls {
        if let Some(d) = spec.delay {
            std::thread::sleep(d);
        }
        op(comm)?;
    }
    comm.sync()?;
    Ok(start.elapsed())
}

/// The device path of [`time_loop`]'s per-iteration times: CUDA events on
/// the stream (one before the loop, one after each call) give device
/// times per iteration, not launch times; the mean comes from the whole
/// loop ([`whole_loop`]), run just before. The loop ends with
/// [`Communicator::sync`] (its deadline).
fn time_on_stream<C, F>(
    comm: &mut C,
    spec: &LoopSpec,
    clock: &mut dyn StreamClock,
    op: &mut F,
) -> CommResult<RankTimes>
where
    C: Communicator,
    F: FnMut(&mut C) -> CommResult<()>,
{
    clock.mark()?;
    for _ in 0..spec.iters {
        if let Some(d) = spec.delay {
            std::thread::sleep(d);
        }
        op(comm)?;
        clock.mark()?;
    }
    comm.sync()?;
    Ok(from_intervals(&clock.intervals()?, 1))
}

/// `--graph N`: the calls captured N at a time as one graph, replayed until
/// `spec.iters` calls ran (at least once): the mean from the replays timed
/// as a whole ([`whole_loop`]), then each replay of a second run timed by
/// events, one iteration of its per-call time (replay time / N).
fn time_graph<C, F>(
    comm: &mut C,
    spec: &LoopSpec,
    launches: usize,
    op: &mut F,
) -> CommResult<RankTimes>
where
    C: Communicator,
    F: FnMut(&mut C) -> CommResult<()>,
{
    let launches = launches.max(1);
    let replays = spec.iters.div_ceil(launches).max(1);
    let mut graph = comm.capture(launches, op)?;
    let Some(mut clock) = comm.stream_clock(replays + 1)? else {
        return Err(CommError::Unsupported(format!(
            "backend {} has no device clock to time graphs with",
            comm.backend()
        )));
    };
    // One untimed replay: the graph's first launch sets up its resources.
    graph.replay()?;
    comm.sync()?;
    // nccl-tests' measure of a graph: the host clock around the replays.
    let whole = whole_loop(comm, spec, replays, &mut |_: &mut C| graph.replay())?;
    comm.barrier()?;
    clock.mark()?;
    for _ in 0..replays {
        if let Some(d) = spec.delay {
            std::thread::sleep(d);
        }
        graph.replay()?;
        clock.mark()?;
    }
    comm.sync()?;
    let mut times = from_intervals(&clock.intervals()?, launches);
    times.total = whole.div_f64(launches as f64);
    Ok(times)
}

/// Times from device intervals (seconds), each covering `calls` calls.
fn from_intervals(intervals: &[f64], calls: usize) -> RankTimes {
    let per_call: Vec<u64> = intervals
        .iter()
        .map(|s| (s.max(0.0) * 1e9 / calls as f64).round() as u64)
        .collect();
    RankTimes {
        total: Duration::from_nanos(per_call.iter().sum()),
        // On the device a call that waits for a late peer lasts longer, so
        // the device time also serves as the time spent in the call.
        in_call_ns: per_call.clone(),
        iter_ns: per_call,
    }
}
