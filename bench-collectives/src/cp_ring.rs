//! `bench-collectives cp-ring`: the exchange of context parallelism's ring
//! attention (Megatron-Core's `p2p`): each rank sends the block it holds
//! to the next rank and receives the previous rank's, C-1 steps, each step
//! beside a compute stand-in (a calibrated busy loop on a thread of its
//! own). Per size: the exchange alone, the compute alone, the two
//! overlapped, and the share of the exchange the compute hid, beside the
//! model's C-1 sendrecv steps and the wire's ceiling. Every rank checks
//! that it ends with every other rank's block. Records: `cp-ring.csv` (one
//! row per size) and run.json.

use crate::cli::SweepJob;
use crate::start::Finished;
use anyhow::Result;
use parbench::comm::{Collective, CommBuffer, CommError, CommResult, Communicator, DType};
use parbench::launch::ranks::{RankBody, Ranks};
use parbench::launch::UsageError;
use parbench::measure::busy::{busy_steps, BusyLoop};
use parbench::measure::noise::{CpuSnapshot, ForeignCpu};
use parbench::measure::placement::Placement;
use parbench::measure::wire::{measure_wire, SweepRows, WireFigures};
use parbench::measure::{time_loop, LoopSpec, LoopStats};
use parbench::model;
use parbench::results::{self, CpRingRow, RunMeta};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

/// The pattern's name on the command line.
pub const NAME: &str = "cp-ring";

/// How long each step's compute stand-in is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum StandIn {
    /// As long as the size's exchange step alone (`auto`): where a ring
    /// that overlaps perfectly hides all of it.
    Exchange,
    /// This many microseconds of the busy loop at the rank's calibrated rate.
    Us(f64),
}

impl std::str::FromStr for StandIn {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.trim().eq_ignore_ascii_case("auto") {
            return Ok(StandIn::Exchange);
        }
        // Below a nanosecond no busy loop is calibrated (and no record holds it).
        match s.trim().parse::<f64>() {
            Ok(us) if us == 0.0 || (us.is_finite() && (1e-3..=60e6).contains(&us)) => {
                Ok(StandIn::Us(us))
            }
            _ => Err(format!(
                "'{s}': microseconds, 0 or 0.001 to 60000000, or auto"
            )),
        }
    }
}

impl std::fmt::Display for StandIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StandIn::Exchange => f.write_str("auto (each size's exchange step alone)"),
            StandIn::Us(us) => write!(f, "{us} us"),
        }
    }
}

/// Runs the ring on the ranks the launcher chose for the backend.
pub fn run(plan: &SweepJob, stand_in: StandIn, run_id: &str, ranks: Ranks) -> Result<Finished> {
    let backend = ranks.backend();
    if backend.on_gpus() {
        return Err(UsageError(format!(
            "cp-ring: --backend {backend} would need a GPU kernel of known length as the compute stand-in, and parbench has none; run it on local, tcp or mpi"
        ))
        .into());
    }
    let world = ranks.world().unwrap_or(0);
    if let Some(why) = ranks.world().and_then(refusal) {
        return Err(UsageError(why).into());
    }
    let ranks_here = crate::start::ranks_here(&ranks, world);
    let largest = plan.sweep.sizes.iter().copied().max().unwrap_or(0) as u128;
    // The two ring buffers, the check's copy of one and its expected block.
    parbench::limits::check_host_memory(
        4 * largest * ranks_here as u128,
        "cp-ring -e/--max-bytes",
        &format!(
            "{ranks_here} rank(s) on this host, each two ring buffers and the check's two blocks"
        ),
    )
    .map_err(|e| UsageError(e.0))?;
    if crate::start::writes_records(&ranks) {
        results::prepare_out::<CpRingRow>(&plan.out)
            .map_err(|e| UsageError(format!("--out {e}")))?;
    }
    let mut meta = RunMeta::start(NAME, run_id, backend.name(), world);
    let body = Ring {
        plan,
        stand_in,
        run_id,
    };
    let report = match crate::start::run_pattern(plan, ranks, &body)? {
        Ok(report) => report,
        Err(ended) => return Ok(ended),
    };
    meta.world = report.rows.first().map_or(world, |r| r.world);
    finish(plan, &mut meta, report)
}

/// Why a ring of `world` ranks cannot run, or `None`.
fn refusal(world: usize) -> Option<String> {
    (world < 2).then(|| format!("cp-ring -np {world}: a ring needs at least 2 ranks"))
}

/// What rank 0 brings back.
struct Report {
    rows: Vec<CpRingRow>,
    wire: WireFigures,
    noise: Option<ForeignCpu>,
    /// Rank 0's busy-loop rate.
    busy: BusyLoop,
    stand_in: StandIn,
    /// Ranks on rank 0's host: each runs two busy threads (exchange, compute).
    ranks_here: usize,
}

/// The ring as the launcher runs it on each rank.
struct Ring<'a> {
    plan: &'a SweepJob,
    stand_in: StandIn,
    run_id: &'a str,
}

impl RankBody for Ring<'_> {
    type Out = Option<Report>;
    fn run<C: Communicator>(&self, comm: &mut C) -> CommResult<Option<Report>> {
        comm.set_timeout(self.plan.sweep.timeout);
        // Under mpi the world is known only now.
        if let Some(why) = refusal(comm.world()) {
            return Err(CommError::InvalidArgument(why));
        }
        measure(comm, self.plan, self.stand_in, self.run_id)
    }
}

/// The compute stand-in's thread: told how many busy steps to run, it
/// says when they are done. The communicator stays on the rank's own
/// thread (MPI is initialised for that thread alone).
struct Worker {
    go: Sender<u64>,
    done: Receiver<()>,
    timeout: Duration,
}

impl Worker {
    fn start(&self, steps: u64) -> CommResult<()> {
        self.go
            .send(steps)
            .map_err(|_| CommError::InvalidArgument("the compute stand-in's thread ended".into()))
    }

    fn wait(&self) -> CommResult<()> {
        match self.done.recv_timeout(self.timeout) {
            Ok(()) => Ok(()),
            Err(RecvTimeoutError::Timeout) => Err(CommError::InvalidArgument(format!(
                "the compute stand-in ran past --timeout {:?}",
                self.timeout
            ))),
            Err(RecvTimeoutError::Disconnected) => Err(CommError::InvalidArgument(
                "the compute stand-in's thread ended".into(),
            )),
        }
    }
}

/// One rank's ring buffers: the block it holds and the one arriving.
struct Blocks<B> {
    cur: B,
    nxt: B,
    bytes: usize,
}

impl<B: CommBuffer> Blocks<B> {
    /// One pass of the ring, C-1 steps; each step's compute (`steps` busy
    /// steps on `worker`) runs while its exchange does.
    fn pass<C: Communicator<Buffer = B>>(
        &mut self,
        comm: &mut C,
        compute: Option<(&Worker, u64)>,
    ) -> CommResult<()> {
        let (rank, world) = (comm.rank(), comm.world());
        let (next, prev) = ((rank + 1) % world, (rank + world - 1) % world);
        for _ in 1..world {
            if let Some((w, steps)) = compute {
                w.start(steps)?;
            }
            comm.send_recv(&self.cur, next, &mut self.nxt, prev, self.bytes, DType::U8)?;
            comm.sync()?;
            if let Some((w, _)) = compute {
                w.wait()?;
            }
            std::mem::swap(&mut self.cur, &mut self.nxt);
        }
        Ok(())
    }

    /// A pass that checks each block as it arrives: at step s the block of
    /// rank `rank - s` lands here. Wrong bytes, counting a missing block's.
    fn checked<C: Communicator<Buffer = B>>(&mut self, comm: &mut C, seed: u64) -> CommResult<u64> {
        let (rank, world) = (comm.rank(), comm.world());
        let (next, prev) = ((rank + 1) % world, (rank + world - 1) % world);
        self.cur
            .write_from_host(&block_of(seed, rank, self.bytes))?;
        let mut got = vec![0u8; self.bytes];
        let mut wrong = 0u64;
        for step in 1..world {
            let want = block_of(seed, (rank + world - step) % world, self.bytes);
            // A call that writes nothing leaves the complement, and fails.
            let sentinel: Vec<u8> = want.iter().map(|b| !b).collect();
            self.nxt.write_from_host(&sentinel)?;
            comm.send_recv(&self.cur, next, &mut self.nxt, prev, self.bytes, DType::U8)?;
            comm.sync()?;
            self.nxt.read_to_host(&mut got)?;
            // The checker's self-test (`PARBENCH_SELFTEST_CORRUPT_RANK`).
            if crate::sweep::corrupts(rank) {
                if let Some(b) = got.first_mut() {
                    *b = !*b;
                }
            }
            wrong += got.iter().zip(&want).filter(|(a, b)| a != b).count() as u64;
            std::mem::swap(&mut self.cur, &mut self.nxt);
        }
        Ok(wrong)
    }
}

/// Rank `rank`'s block of `bytes` bytes: the seeded generator's.
fn block_of(seed: u64, rank: usize, bytes: usize) -> Vec<u8> {
    let base = parbench::seed::splitmix64(seed ^ (rank as u64).wrapping_mul(0x1000_0000_01b3));
    (0..bytes)
        .map(|i| parbench::seed::splitmix64(base.wrapping_add(i as u64)) as u8)
        .collect()
}

/// Every rank: calibrate the busy loop, measure the wire, then per size
/// check the ring and time it three ways; rank 0 returns the rows.
fn measure<C: Communicator>(
    comm: &mut C,
    job: &SweepJob,
    stand_in: StandIn,
    run_id: &str,
) -> CommResult<Option<Report>> {
    let busy = BusyLoop::calibrate();
    let cfg = &job.sweep;
    let placement = Placement {
        cpu: None,
        why: "left to the scheduler".into(),
    };
    let rows_for_wire = SweepRows {
        collectives: &[Collective::SendRecv],
        dtypes: &[DType::U8],
        sizes: &cfg.sizes,
    };
    let wire = measure_wire(comm, &rows_for_wire, &placement)?;
    let noise_start = CpuSnapshot::now();
    let timeout = comm.timeout();
    let rows = std::thread::scope(|s| -> CommResult<Vec<CpRingRow>> {
        let (go, steps_rx) = channel::<u64>();
        let (done_tx, done) = channel::<()>();
        s.spawn(move || {
            for steps in steps_rx {
                busy_steps(steps);
                if done_tx.send(()).is_err() {
                    break;
                }
            }
        });
        let worker = Worker { go, done, timeout };
        let mut rows = Vec::with_capacity(cfg.sizes.len());
        for &size in &cfg.sizes {
            let m = one_size(comm, job, &worker, &busy, stand_in, size as usize)?;
            rows.push(m.row(comm, run_id, &wire, cfg.iters));
        }
        // Dropping `worker` ends the thread before the scope waits for it.
        Ok(rows)
    })?;
    let noise = ForeignCpu::across_ranks(comm, noise_start.as_ref())?;
    if comm.rank() != 0 {
        return Ok(None);
    }
    Ok(Some(Report {
        rows,
        wire,
        noise,
        busy,
        stand_in,
        ranks_here: parbench::launch::ranks_on_this_host(comm.world()),
    }))
}

/// One size's three timings (each per pass, combined over ranks as `-a`
/// says) and its check.
struct SizeTimes {
    bytes: usize,
    stand_in: StandIn,
    step_us: f64,
    exchange: LoopStats,
    compute: LoopStats,
    overlapped: LoopStats,
}

fn one_size<C: Communicator>(
    comm: &mut C,
    job: &SweepJob,
    worker: &Worker,
    busy: &BusyLoop,
    stand_in: StandIn,
    bytes: usize,
) -> CommResult<SizeTimes> {
    let cfg = &job.sweep;
    let rank = comm.rank();
    let spec = LoopSpec {
        warmup: cfg.warmup,
        iters: cfg.iters,
        delay: cfg.straggler.filter(|(r, _)| *r == rank).map(|(_, d)| d),
        graph: None,
    };
    let mut blocks = Blocks {
        cur: comm.alloc(bytes)?,
        nxt: comm.alloc(bytes)?,
        bytes,
    };
    let mut wrong = 0;
    for i in 0..cfg.check {
        wrong += blocks.checked(comm, cfg.seed.wrapping_add(i as u64))?;
    }
    let t = time_loop(comm, &spec, |c| blocks.pass(c, None))?;
    let exchange = LoopStats::gather(comm, &t, wrong, cfg.average)?;
    let steps = (comm.world() - 1) as f64;
    // Every rank has the same combined time, so the same `auto` length.
    let step_us = match stand_in {
        StandIn::Exchange => exchange.time_us / steps,
        StandIn::Us(us) => us,
    };
    let units = busy.steps_for(step_us);
    let t = time_loop(comm, &spec, |c| {
        for _ in 1..c.world() {
            worker.start(units)?;
            worker.wait()?;
        }
        Ok(())
    })?;
    let compute = LoopStats::gather(comm, &t, 0, cfg.average)?;
    let t = time_loop(comm, &spec, |c| blocks.pass(c, Some((worker, units))))?;
    let overlapped = LoopStats::gather(comm, &t, 0, cfg.average)?;
    Ok(SizeTimes {
        bytes,
        stand_in,
        step_us,
        exchange,
        compute,
        overlapped,
    })
}

/// The share of the exchange hidden: (exchange + compute - overlapped) /
/// exchange (below 0 where overlapping lost time); NaN when the exchange
/// took no time.
fn hidden_share(exchange: f64, compute: f64, overlapped: f64) -> f64 {
    if exchange > 0.0 {
        (exchange + compute - overlapped) / exchange
    } else {
        f64::NAN
    }
}

impl SizeTimes {
    fn row<C: Communicator>(
        &self,
        comm: &C,
        run_id: &str,
        wire: &WireFigures,
        iters: usize,
    ) -> CpRingRow {
        let world = comm.world();
        let steps = (world - 1) as u64;
        let coll = Collective::SendRecv;
        let (step_model_us, ceiling_gbps) = wire.row_references(
            coll,
            &model::ModelAlgo::of("p2p"),
            world,
            self.bytes as u64,
            false,
        );
        let (ex, co, ov) = (
            self.exchange.time_us,
            self.compute.time_us,
            self.overlapped.time_us,
        );
        CpRingRow {
            schema: results::SCHEMA_VERSION,
            run_id: run_id.to_string(),
            backend: comm.backend().to_string(),
            wire: comm.wire(),
            world,
            bytes: self.bytes as u64,
            steps,
            iters: iters as u64,
            stand_in: match self.stand_in {
                StandIn::Exchange => "auto".into(),
                StandIn::Us(us) => us.to_string(),
            },
            compute_step_us: self.step_us,
            exchange_us: ex,
            compute_us: co,
            overlapped_us: ov,
            overlapped_p50_us: self.overlapped.p50_us,
            overlapped_p99_us: self.overlapped.p99_us,
            hidden: hidden_share(ex, co, ov).clamp(0.0, 1.0),
            lost_us: (ov - ex - co).max(0.0),
            busbw_gbps: model::busbw::algbw_gbps(self.bytes as u64, ex * 1e-6 / steps as f64),
            model_us: step_model_us * steps as f64,
            ceiling_gbps,
            wrong: self.exchange.wrong,
        }
    }
}

/// Whether `row`'s overlapped pass took less than the longer of its two
/// passes alone, which overlap cannot do: one pass alone ran slow, and the
/// share (held at 100%) says nothing.
fn faster_than_alone(row: &CpRingRow) -> bool {
    row.overlapped_us < row.exchange_us.max(row.compute_us)
}

/// Whether the ranks on this host, two busy threads each (the exchange's
/// and the compute's), outnumber its cores: then the compute waits for a
/// core and the overlap measures the cores, not the wire.
fn crowded(ranks_here: usize) -> Option<usize> {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    parbench::pipeline::analysis::oversubscribed(2 * ranks_here, cores, false).then_some(cores)
}

/// What rank 0 prints: the header, a row per size (each time per pass of
/// C-1 steps beside the model's), then how to read it.
fn report_lines(r: &Report, verbose: bool) -> Vec<String> {
    let Some(first) = r.rows.first() else {
        return Vec::new();
    };
    let mut out = vec![
        format!(
            "# parbench bench-collectives cp-ring: backend {}, wire {}, {} ranks, {} sendrecv steps per pass",
            first.backend, first.wire, first.world, first.steps
        ),
        format!("# compute stand-in per step: {}", r.stand_in),
    ];
    if let Some(cores) = crowded(r.ranks_here) {
        out.push(format!(
            "# {} ranks x 2 busy threads on {cores} cores: hidden measures the cores, not the wire (!)",
            r.ranks_here
        ));
    }
    out.push(format!(
        "# {:>10} {:>11} {:>11} {:>11} {:>7} {:>11} {:>8} {:>8} {:>6} {:>6}",
        "size",
        "exchange",
        "compute",
        "overlapped",
        "hidden",
        "model",
        "busbw",
        "ceiling",
        "%ceil",
        "wrong"
    ));
    out.push(format!(
        "# {:>10} {:>11} {:>11} {:>11} {:>7} {:>11} {:>8} {:>8}",
        "(B)", "(us)", "(us)", "(us)", "", "(us)", "(GB/s)", "(GB/s)"
    ));
    for row in &r.rows {
        let pct = |x: f64| {
            if x.is_finite() {
                format!("{:.0}%", 100.0 * x)
            } else {
                "-".into()
            }
        };
        let hidden = if row.lost_us > 0.0 {
            "0%!".to_string()
        } else if faster_than_alone(row) {
            "100%?".to_string()
        } else {
            pct(row.hidden)
        };
        let ceil = if row.ceiling_gbps > 0.0 {
            pct(row.busbw_gbps / row.ceiling_gbps)
        } else {
            "-".into()
        };
        out.push(format!(
            "  {:>10} {:>11.1} {:>11.1} {:>11.1} {:>7} {:>11.1} {:>8.3} {:>8.3} {:>6} {:>6}",
            row.bytes,
            row.exchange_us,
            row.compute_us,
            row.overlapped_us,
            hidden,
            row.model_us,
            row.busbw_gbps,
            row.ceiling_gbps,
            ceil,
            row.wrong
        ));
        if verbose {
            out.push(format!(
                "#   overlapped p50 {:.1} us, p99 {:.1} us; compute stand-in {:.1} us per step",
                row.overlapped_p50_us, row.overlapped_p99_us, row.compute_step_us
            ));
        }
    }
    out.push(
        "# times per pass of C-1 steps; hidden = (exchange + compute - overlapped) / exchange"
            .into(),
    );
    if let Some(worst) = r
        .rows
        .iter()
        .filter(|row| row.lost_us > 0.0)
        .max_by(|a, b| a.lost_us.total_cmp(&b.lost_us))
    {
        out.push(format!(
            "# 0%! = overlapped took longer than exchange + compute back to back (by {:.1} us at most, at {} B)",
            worst.lost_us, worst.bytes
        ));
    }
    if r.rows.iter().any(faster_than_alone) {
        out.push(
            "# 100%? = the overlapped pass beat the longer pass alone: that one ran slow (noise)"
                .into(),
        );
    }
    out.push(
        "# model: C-1 x the alpha-beta sendrecv at the size; busbw: size / exchange step".into(),
    );
    out.push(format!(
        "# ceiling: the wire at this working set{}",
        if verbose {
            format!(" ({})", r.wire.ceiling.method)
        } else {
            String::new()
        }
    ));
    out.push(format!(
        "# compute: a busy loop at {:.0} steps/us (rank 0's core)",
        r.busy.steps_per_us
    ));
    if let Some(n) = &r.noise {
        out.push(format!("# Noise: {}", n.describe()));
    }
    out
}

fn finish(plan: &SweepJob, meta: &mut RunMeta, report: Report) -> Result<Finished> {
    let end = crate::start::PatternEnd {
        lines: report_lines(&report, plan.verbose),
        rows: &report.rows,
        backend: report.rows.first().map(|r| r.backend.clone()),
        wrong: report.rows.iter().map(|r| r.wrong).sum(),
        extra: (
            "cp_ring",
            serde_json::json!({
                "sizes": report.rows,
                "busy_steps_per_us": report.busy.steps_per_us,
                "compute_stand_in": report.stand_in.to_string(),
                "noise": report.noise.as_ref().map(|n| n.describe()),
            }),
        ),
    };
    crate::start::record_pattern(plan, meta, end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stand_in_parses_and_refuses() {
        assert_eq!("auto".parse::<StandIn>(), Ok(StandIn::Exchange));
        assert_eq!("250".parse::<StandIn>(), Ok(StandIn::Us(250.0)));
        assert_eq!("0".parse::<StandIn>(), Ok(StandIn::Us(0.0)));
        for bad in ["-1", "nan", "x", "1e9", "1e-300"] {
            assert!(bad.parse::<StandIn>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_hidden_share_is_what_the_overlap_saved_of_the_exchange() {
        assert_eq!(hidden_share(100.0, 100.0, 100.0), 1.0);
        assert_eq!(hidden_share(100.0, 100.0, 200.0), 0.0);
        assert_eq!(hidden_share(100.0, 50.0, 125.0), 0.25);
        assert!(hidden_share(100.0, 100.0, 250.0) < 0.0);
        assert!(hidden_share(0.0, 1.0, 1.0).is_nan());
    }

    #[test]
    fn blocks_differ_by_rank_and_seed() {
        assert_ne!(block_of(1, 0, 64), block_of(1, 1, 64));
        assert_ne!(block_of(1, 0, 64), block_of(2, 0, 64));
        assert_eq!(block_of(1, 3, 64), block_of(1, 3, 64));
    }
}
