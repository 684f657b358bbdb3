//! `bench-collectives moe`: one mixture-of-experts layer's dispatch and
//! combine over `Communicator::all_to_all_v` (the exchange and its check
//! are the library's `comm::moe`), timed apart, each phase's busbw by
//! nccl-tests' alltoall definition beside the wire's ceiling and the
//! model's all_to_all at the same bytes, with the imbalance that explains
//! the gap. Records: `moe.csv` (one row per phase) and run.json.

use crate::cli::SweepJob;
use crate::start::Finished;
use anyhow::Result;
use parbench::comm::moe::exchange::MoePlan;
use parbench::comm::moe::MoeShape;
use parbench::comm::{CommBuffer, CommError, CommResult, Communicator, DType, VCounts};
use parbench::launch::ranks::{RankBody, Ranks};
use parbench::launch::UsageError;
use parbench::measure::noise::{CpuSnapshot, ForeignCpu};
use parbench::measure::placement::Placement;
use parbench::measure::wire::{measure_wire, SweepRows, WireFigures};
use parbench::measure::{time_loop, LoopSpec, LoopStats};
use parbench::model;
use parbench::results::{self, MoeRow, RunMeta};

/// Runs the exchange on the ranks the launcher chose for the backend.
pub fn run(plan: &SweepJob, shape: &MoeShape, run_id: &str, ranks: Ranks) -> Result<Finished> {
    let backend = ranks.backend().name();
    let world = ranks.world().unwrap_or(0);
    if let Some(why) = ranks.world().and_then(|w| shape.refusal(w)) {
        return Err(UsageError(why).into());
    }
    let writes = crate::start::writes_records(&ranks);
    if writes {
        results::prepare_out::<MoeRow>(&plan.out).map_err(|e| UsageError(format!("--out {e}")))?;
    }
    let ranks_here = crate::start::ranks_here(&ranks, world);
    if ranks_here > 0 && world > 0 {
        check_memory(&MoePlan::new(shape, world), ranks_here).map_err(UsageError)?;
    }
    let mut meta = RunMeta::start("moe", run_id, backend, world);
    let body = Exchange {
        plan,
        shape,
        run_id,
    };
    let report = match crate::start::run_pattern(plan, ranks, &body)? {
        Ok(report) => report,
        Err(ended) => return Ok(ended),
    };
    meta.world = report.rows.first().map_or(world, |r| r.world);
    finish(plan, &mut meta, report)
}

/// Host bytes a rank holds at most: each phase's send and receive
/// buffers, and the host copies the check builds of each (three in all).
fn check_memory(plan: &MoePlan, ranks_here: usize) -> std::result::Result<(), String> {
    let mut most = 0u128;
    for r in 0..plan.world {
        let d = plan.dispatch_counts(r).map_err(|e| e.to_string())?;
        let c = plan.combine_counts(r).map_err(|e| e.to_string())?;
        let bytes = d.send_total() + d.recv_total() + c.send_total() + c.recv_total();
        most = most.max(3 * bytes as u128);
    }
    parbench::limits::check_host_memory(
        most * ranks_here.max(1) as u128,
        "moe --tokens/--hidden/--topk",
        &format!("{ranks_here} rank(s) on this host, each its dispatch and combine buffers and their checks"),
    )
    .map_err(|e| e.0)
}

/// What rank 0 brings back.
struct Report {
    rows: Vec<MoeRow>,
    wire: WireFigures,
    noise: Option<ForeignCpu>,
    /// The rank that receives most in dispatch.
    busiest: usize,
}

/// The exchange as the launcher runs it on each rank.
struct Exchange<'a> {
    plan: &'a SweepJob,
    shape: &'a MoeShape,
    run_id: &'a str,
}

impl RankBody for Exchange<'_> {
    type Out = Option<Report>;
    fn run<C: Communicator>(&self, comm: &mut C) -> CommResult<Option<Report>> {
        comm.set_timeout(self.plan.sweep.timeout);
        // Under mpi the world is known only now.
        if let Some(why) = self.shape.refusal(comm.world()) {
            return Err(CommError::InvalidArgument(why));
        }
        measure(comm, self.plan, self.shape, self.run_id)
    }
}

/// One phase's buffers and counts on this rank.
struct Phase<B> {
    counts: VCounts,
    send: B,
    recv: B,
}

impl<B: CommBuffer> Phase<B> {
    fn new<C: Communicator<Buffer = B>>(
        comm: &C,
        counts: VCounts,
        input: &[u8],
    ) -> CommResult<Self> {
        let mut send = comm.alloc(input.len())?;
        send.write_from_host(input)?;
        let recv = comm.alloc(counts.recv_total())?;
        Ok(Phase { counts, send, recv })
    }

    /// One exchange, its result read back (the receive buffer first set
    /// to the complement of `expected`, so a call that writes nothing fails).
    fn checked<C: Communicator<Buffer = B>>(
        &mut self,
        comm: &mut C,
        expected: &[u8],
    ) -> CommResult<Vec<u8>> {
        let sentinel: Vec<u8> = expected.iter().map(|b| !b).collect();
        self.recv.write_from_host(&sentinel)?;
        comm.all_to_all_v(&self.send, &mut self.recv, &self.counts, DType::U8)?;
        comm.sync()?;
        let mut got = vec![0u8; self.counts.recv_total()];
        self.recv.read_to_host(&mut got)?;
        // The checker's self-test (`PARBENCH_SELFTEST_CORRUPT_RANK`).
        if crate::sweep::corrupts(comm.rank()) {
            if let Some(b) = got.first_mut() {
                *b = !*b;
            }
        }
        Ok(got)
    }

    fn timed<C: Communicator<Buffer = B>>(
        &mut self,
        comm: &mut C,
        spec: &LoopSpec,
    ) -> CommResult<parbench::measure::RankTimes> {
        time_loop(comm, spec, |c| {
            c.all_to_all_v(&self.send, &mut self.recv, &self.counts, DType::U8)
        })
    }
}

/// Differing units of `unit` bytes (missing ones count).
fn wrong_units(got: &[u8], want: &[u8], unit: usize) -> u64 {
    let differing = got
        .chunks(unit.max(1))
        .zip(want.chunks(unit.max(1)))
        .filter(|(a, b)| a != b)
        .count();
    let missing = want.len().saturating_sub(got.len()).div_ceil(unit.max(1));
    (differing + missing) as u64
}

/// Every rank: route, check dispatch byte for byte and the combined tokens,
/// then time each phase; rank 0 returns the rows.
fn measure<C: Communicator>(
    comm: &mut C,
    job: &SweepJob,
    shape: &MoeShape,
    run_id: &str,
) -> CommResult<Option<Report>> {
    let (rank, world) = (comm.rank(), comm.world());
    let plan = MoePlan::new(shape, world);
    let sent = plan.dispatch_sent();
    let mean_sent = sent.iter().sum::<usize>() as f64 / world as f64;
    let placement = Placement {
        cpu: None,
        why: "left to the scheduler".into(),
    };
    let rows_for_wire = SweepRows {
        collectives: &[parbench::comm::Collective::AllToAllV],
        dtypes: &[DType::U8],
        sizes: &[mean_sent.max(1.0) as u64],
    };
    let wire = measure_wire(comm, &rows_for_wire, &placement)?;
    let noise_start = CpuSnapshot::now();
    let cfg = &job.sweep;
    let spec = LoopSpec {
        warmup: cfg.warmup,
        iters: cfg.iters,
        delay: cfg.straggler.filter(|(r, _)| *r == rank).map(|(_, d)| d),
        graph: None,
    };
    let mut dispatch = Phase::new(
        comm,
        plan.dispatch_counts(rank)?,
        &plan.dispatch_input(rank),
    )?;
    // The check runs first: combine sends what this rank's experts made
    // of what dispatch delivered.
    let want = plan.dispatch_expected(rank);
    let received = dispatch.checked(comm, &want)?;
    let mut wrong_dispatch = if cfg.check > 0 {
        wrong_units(&received, &want, 1)
    } else {
        0
    };
    for _ in 1..cfg.check {
        wrong_dispatch += wrong_units(&dispatch.checked(comm, &want)?, &want, 1);
    }
    let mut combine = Phase::new(
        comm,
        plan.combine_counts(rank)?,
        &plan.experts_output(rank, &received),
    )?;
    let mut wrong_combine = 0;
    if cfg.check > 0 {
        let want_back = plan.combined_expected(rank);
        for _ in 0..cfg.check {
            // The exchange's bytes are what the combined tokens are built from.
            let back = combine.checked(comm, &[])?;
            wrong_combine += wrong_units(
                &plan.combined(rank, &back),
                &want_back,
                plan.combine_bytes(),
            );
        }
    }
    let d_times = dispatch.timed(comm, &spec)?;
    let d_stats = LoopStats::gather(comm, &d_times, wrong_dispatch, cfg.average)?;
    let c_times = combine.timed(comm, &spec)?;
    let c_stats = LoopStats::gather(comm, &c_times, wrong_combine, cfg.average)?;
    let noise = ForeignCpu::across_ranks(comm, noise_start.as_ref())?;
    if rank != 0 {
        return Ok(None);
    }
    let received = plan.dispatch_received();
    let busiest = (0..world).max_by_key(|&r| received[r]).unwrap_or(0);
    let combine_unit = plan.combine_bytes() as f64 / plan.dispatch_bytes() as f64;
    let ids = RowIds {
        run_id,
        comm,
        shape,
        plan: &plan,
        wire: &wire,
    };
    let rows = vec![
        ids.row(
            "dispatch",
            mean_sent,
            imbalance(&received),
            &d_stats,
            cfg.iters,
        ),
        ids.row(
            "combine",
            mean_sent * combine_unit,
            imbalance(&sent),
            &c_stats,
            cfg.iters,
        ),
    ];
    Ok(Some(Report {
        rows,
        wire,
        noise,
        busiest,
    }))
}

/// Largest over mean; 1 when nothing moves.
fn imbalance(bytes: &[usize]) -> f64 {
    let mean = bytes.iter().sum::<usize>() as f64 / bytes.len().max(1) as f64;
    let most = bytes.iter().copied().max().unwrap_or(0) as f64;
    if mean > 0.0 {
        most / mean
    } else {
        1.0
    }
}

/// What every row of a run shares.
struct RowIds<'a, C> {
    run_id: &'a str,
    comm: &'a C,
    shape: &'a MoeShape,
    plan: &'a MoePlan,
    wire: &'a WireFigures,
}

impl<C: Communicator> RowIds<'_, C> {
    fn row(&self, phase: &str, bytes: f64, imbalance: f64, s: &LoopStats, iters: usize) -> MoeRow {
        let (world, shape) = (self.plan.world, self.shape);
        let coll = parbench::comm::Collective::AllToAllV;
        let secs = s.time_us * 1e-6;
        let algbw = model::busbw::algbw_gbps(bytes as u64, secs);
        let algo = model::ModelAlgo::of("pairwise");
        let (model_us, ceiling_gbps) =
            self.wire
                .row_references(coll, &algo, world, bytes as u64, false);
        MoeRow {
            schema: results::SCHEMA_VERSION,
            run_id: self.run_id.to_string(),
            backend: self.comm.backend().to_string(),
            wire: self.comm.wire(),
            world,
            phase: phase.to_string(),
            tokens: shape.tokens,
            hidden: shape.hidden,
            experts: shape.experts,
            topk: shape.topk,
            routing: shape.skew.to_string(),
            node_limit: shape.node_limit.unwrap_or(0),
            capacity_factor: shape.capacity_factor.unwrap_or(f64::NAN),
            payload: if phase == "dispatch" {
                shape.payload.name()
            } else {
                "bf16"
            }
            .to_string(),
            copies: shape.copies.name().to_string(),
            dropped: self.plan.routing.dropped() as u64,
            bytes: bytes.round() as u64,
            imbalance,
            iters: iters as u64,
            time_us: s.time_us,
            p50_us: s.p50_us,
            p99_us: s.p99_us,
            algbw_gbps: algbw,
            busbw_gbps: algbw * model::busbw_factor(coll, world),
            tokens_per_s: if secs > 0.0 {
                (shape.tokens * world) as f64 / secs
            } else {
                0.0
            },
            wrong: s.wrong,
            model_us,
            ceiling_gbps,
        }
    }
}

/// What rank 0 prints: the answer (each phase's time and busbw beside its
/// references) first, then the shape, imbalance and noise.
fn report_lines(r: &Report, verbose: bool) -> Vec<String> {
    let Some(first) = r.rows.first() else {
        return Vec::new();
    };
    let cf = if first.capacity_factor.is_nan() {
        "none".to_string()
    } else {
        first.capacity_factor.to_string()
    };
    let limit = match first.node_limit {
        0 => String::new(),
        m => format!(", at most {m} rank(s) per token"),
    };
    let mut out = vec![
        format!(
            "# parbench bench-collectives moe: backend {}, wire {}, {} ranks",
            first.backend, first.wire, first.world
        ),
        format!(
            "# {} tokens/rank x hidden {}, {} experts top-{}, routing {}{limit}",
            first.tokens, first.hidden, first.experts, first.topk, first.routing
        ),
        format!("# capacity factor {cf}, copies {}", first.copies),
        format!(
            "# {:<8} {:>7} {:>11} {:>11} {:>9} {:>9} {:>8} {:>6} {:>11} {:>9} {:>6}",
            "phase",
            "payload",
            "bytes/rank",
            "time_us",
            "algbw",
            "busbw",
            "ceiling",
            "%ceil",
            "model_us",
            "imbalance",
            "wrong"
        ),
    ];
    for row in &r.rows {
        let share = if row.ceiling_gbps > 0.0 {
            format!("{:.0}%", 100.0 * row.busbw_gbps / row.ceiling_gbps)
        } else {
            "-".into()
        };
        out.push(format!(
            "  {:<8} {:>7} {:>11} {:>11.1} {:>9.3} {:>9.3} {:>8.3} {:>6} {:>11.1} {:>9.2} {:>6}",
            row.phase,
            row.payload,
            row.bytes,
            row.time_us,
            row.algbw_gbps,
            row.busbw_gbps,
            row.ceiling_gbps,
            share,
            row.model_us,
            row.imbalance,
            row.wrong
        ));
    }
    for row in &r.rows {
        out.push(format!(
            "# {}: {:.0} tokens/s over all ranks; p50 {:.1} us, p99 {:.1} us",
            row.phase, row.tokens_per_s, row.p50_us, row.p99_us
        ));
    }
    let choices = first.tokens * first.topk * first.world;
    out.push(format!(
        "# imbalance: largest bytes received over the mean per rank (rank {} most in dispatch)",
        r.busiest
    ));
    out.push(format!(
        "# {} of {} expert choices dropped by capacity",
        first.dropped, choices
    ));
    out.push("# busbw: mean bytes sent per rank / time x (n-1)/n, nccl-tests' alltoall".into());
    out.push(format!(
        "# ceiling: the wire at this working set{}; model: all_to_all at the same bytes, balanced",
        if verbose {
            format!(" ({})", r.wire.ceiling.method)
        } else {
            String::new()
        }
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
            "moe",
            serde_json::json!({
                "phases": report.rows,
                "busiest_rank": report.busiest,
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
    fn imbalance_is_most_over_mean() {
        assert_eq!(imbalance(&[1, 1, 1, 1]), 1.0);
        assert_eq!(imbalance(&[4, 0, 0, 0]), 4.0);
        assert_eq!(imbalance(&[0, 0]), 1.0);
        assert_eq!(wrong_units(&[1, 2, 3, 4], &[1, 2, 3, 5], 2), 1);
        assert_eq!(wrong_units(&[1, 2], &[1, 2, 3, 4], 2), 1);
    }
}
