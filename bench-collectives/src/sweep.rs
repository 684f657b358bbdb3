//! The sweep every rank runs, written once for every collective and every
//! backend: fill, warm up, time, check, combine across ranks, print (rank 0).

use crate::config::SweepConfig;
use crate::data::Inputs;
use crate::expected::expected;
use crate::print::{Point, Printer};
use parbench::comm::{
    CollArgs, Collective, CommBuffer, CommError, CommResult, Communicator, DType, Io, ReduceOp,
};
use parbench::measure::noise::{CpuSnapshot, ForeignCpu};
use parbench::measure::wire::{row_count, WireFigures};
use parbench::measure::{time_loop, LoopSpec, LoopStats, StragglerTally, StragglerVerdict};
use parbench::model;
use parbench::results::{CollectiveRow, SCHEMA_VERSION};

/// Where a run stands: what it measured and what it found.
#[derive(Debug, Default)]
pub struct Outcome {
    /// One row per (collective, dtype, op, size, placement), the same on every rank.
    pub rows: Vec<CollectiveRow>,
    /// Wrong elements summed over ranks and rows.
    pub wrong: u64,
    /// Who arrived last in each timed iteration, over the whole run.
    pub tally: StragglerTally,
    /// Other processes' CPU time during each collective's table, in order.
    pub noise: Vec<(Collective, Option<ForeignCpu>)>,
    /// Per row (same order as `rows`): each timed iteration's time, the
    /// slowest rank's, us (what `-J` writes as nccl-tests' `times_us`).
    pub iter_times_us: Vec<Vec<f64>>,
    /// Per row (same order as `rows`): per rank, each timed iteration's
    /// time on that rank, us (nccl-tests' `per_process_max_times_us`).
    pub rank_iter_us: Vec<Vec<Vec<f64>>>,
    /// Per row (same order as `rows`): the ranks that found a wrong element.
    pub ranks_wrong: Vec<u64>,
}

impl Outcome {
    /// The persistently late rank, if one is.
    pub fn straggler(&self) -> Option<StragglerVerdict> {
        self.tally.verdict()
    }
}

/// Keeps one size's rows (appends them to the records).
pub type KeepRows<'a> = &'a dyn Fn(&[CollectiveRow]) -> CommResult<()>;

/// What identifies a run in its rows, and where rank 0 keeps them.
pub struct RunIds<'a> {
    pub run_id: &'a str,
    /// Takes each size's rows as soon as they are measured (rank 0, when
    /// it writes the records): a run stopped later keeps them.
    pub keep: Option<KeepRows<'a>>,
}

/// Runs every (collective, dtype, op, size) of `cfg` on this rank; rank 0 prints.
pub fn run_sweep<C: Communicator>(
    comm: &mut C,
    cfg: &SweepConfig,
    ids: &RunIds<'_>,
    wire: &WireFigures,
    printer: &mut Printer,
) -> CommResult<Outcome> {
    let mut run = Sweep {
        cfg,
        ids,
        wire,
        printer,
        outcome: Outcome::default(),
    };
    for &coll in &cfg.collectives {
        sweep_collective(comm, coll, &mut run)?;
    }
    Ok(run.outcome)
}

/// What every table of a sweep shares: the flags, the records, the wire,
/// the printer, and what the tables before found.
struct Sweep<'a, 'r> {
    cfg: &'a SweepConfig,
    ids: &'a RunIds<'r>,
    wire: &'a WireFigures,
    printer: &'a mut Printer,
    outcome: Outcome,
}

/// Before anything is measured (the wire included): a type the user named
/// that the backend cannot run for some collective of the sweep is
/// refused, with the backend's reason (`-d all` leaves such types out
/// instead, as nccl-tests does; [`runnable`]).
pub fn refuse_types_named<C: Communicator>(comm: &C, cfg: &SweepConfig) -> CommResult<()> {
    if cfg.dtypes_all {
        return Ok(());
    }
    for &coll in &cfg.collectives {
        for &dtype in &cfg.dtypes {
            if let Some(why) = comm.cannot_run(dtype, coll.reduces()) {
                return Err(CommError::Unsupported(format!("{coll}: {why}")));
            }
        }
    }
    Ok(())
}

/// Whether `coll` runs `dtype` in this sweep: always, but for a type
/// `-d all` brought that the backend cannot run (refused earlier when named).
fn runnable<C: Communicator>(comm: &C, coll: Collective, dtype: DType) -> bool {
    comm.cannot_run(dtype, coll.reduces()).is_none()
}

fn sweep_collective<C: Communicator>(
    comm: &mut C,
    coll: Collective,
    run: &mut Sweep<'_, '_>,
) -> CommResult<()> {
    let (cfg, world) = (run.cfg, comm.world());
    // nccl-tests runs sendrecv once per operator and prints its name.
    let ops: Vec<Option<ReduceOp>> =
        if coll.reduces() || (cfg.nccl_tests_rows && coll == Collective::SendRecv) {
            cfg.ops.iter().copied().map(Some).collect()
        } else {
            vec![None]
        };
    // -r -1: nccl-tests runs a rooted collective from every root in turn.
    let roots: Vec<usize> = match cfg.root {
        None if coll.rooted() => (0..world).collect(),
        r => vec![r.unwrap_or(0)],
    };
    run.printer.collective_header(coll, world);
    let noise_start = CpuSnapshot::now();
    let dtypes: Vec<DType> = (cfg.dtypes.iter().copied())
        .filter(|&d| runnable(comm, coll, d))
        .collect();
    for dtype in dtypes {
        for &op in &ops {
            for &root in &roots {
                // -N: nccl-tests repeats the sizes within one table (0: until interrupted).
                let mut cycle = 0;
                while cfg.run_cycles == 0 || cycle < cfg.run_cycles {
                    cycle += 1;
                    let what = (dtype, op, root);
                    sweep_sizes(comm, coll, what, run)?;
                }
            }
        }
    }
    let noise = ForeignCpu::across_ranks(comm, noise_start.as_ref())?;
    run.outcome.noise.push((coll, noise));
    Ok(())
}

fn sweep_sizes<C: Communicator>(
    comm: &mut C,
    coll: Collective,
    (dtype, op, root): (DType, Option<ReduceOp>, usize),
    run: &mut Sweep<'_, '_>,
) -> CommResult<()> {
    let (cfg, ids, wire) = (run.cfg, run.ids, run.wire);
    let outcome = &mut run.outcome;
    let world = comm.world();
    let mut last_count = None;
    let table = match op {
        Some(op) => format!("{} {} {}", coll.name(), dtype.name(), op.name()),
        None => format!("{} {}", coll.name(), dtype.name()),
    };
    for (index, &size) in cfg.sizes.iter().enumerate() {
        let count = row_count(coll, size, dtype, world);
        // Sizes that round to the same per-rank count are one row
        // (nccl-tests' layout keeps every size, as nccl-tests does).
        if last_count == Some(count) && !cfg.nccl_tests_rows {
            continue;
        }
        last_count = Some(count);
        let bytes = coll.size_of(count, dtype.size(), world);
        let algo = comm.algo_for(coll, coll.send_elems(count, world) * dtype.size());
        let mut point = Point {
            dtype,
            op,
            root,
            count,
            bytes,
            algo,
        };
        if comm.rank() == 0 {
            crate::progress_lines::row_starts(&table, size, index, cfg.sizes.len());
        }
        let mut measured = [None, None];
        let mut iter_us: [Vec<f64>; 2] = Default::default();
        let mut ranks_wrong = [0u64; 2];
        for (slot, in_place) in [(0, false), (1, true)] {
            let wanted = if in_place {
                cfg.in_place && coll.spec().in_place_form()
            } else {
                cfg.out_of_place
            };
            if !wanted {
                continue;
            }
            let stats = measure_one(comm, coll, cfg, &point, in_place)?;
            // Asked again after the calls ran: NCCL's tuning log names its
            // choice only once a call of this size went through.
            point.algo = comm.algo_for(coll, coll.send_elems(count, world) * dtype.size());
            outcome.tally.add(&stats);
            outcome.wrong += stats.wrong;
            let row = make_row(coll, ids, comm, cfg, wire, &point, in_place, &stats);
            outcome.rows.push(row.clone());
            outcome.rank_iter_us.push(stats.rank_iter_us.clone());
            outcome.ranks_wrong.push(stats.ranks_wrong);
            ranks_wrong[slot] = stats.ranks_wrong;
            iter_us[slot] = stats
                .last_arrivals
                .iter()
                .map(|a| a.iter_ns / 1e3)
                .collect();
            outcome.iter_times_us.push(iter_us[slot].clone());
            measured[slot] = Some(row);
        }
        let per_placement = crate::print::PerPlacement {
            iter_us: [iter_us[0].as_slice(), iter_us[1].as_slice()],
            ranks_wrong,
        };
        // On disk before on screen: a signal between the two leaves no
        // printed row that the records lack.
        if let Some(keep) = ids.keep {
            let rows: Vec<CollectiveRow> = measured.iter().flatten().cloned().collect();
            keep(&rows)?;
        }
        run.printer
            .row(coll, &point, &measured, per_placement, wire);
    }
    Ok(())
}

/// Name of the environment variable that makes a rank (or each of a comma
/// list) corrupt one element of every checked output: a self-test of the checker (the run must then
/// report wrong elements and exit 7).
pub const CORRUPT_ENV: &str = "PARBENCH_SELFTEST_CORRUPT_RANK";

/// Whether `rank` corrupts: the variable names a rank, or a comma list.
pub(crate) fn corrupts(rank: usize) -> bool {
    std::env::var(CORRUPT_ENV).is_ok_and(|v| {
        v.split(',')
            .any(|r| r.trim().parse::<usize>().ok() == Some(rank))
    })
}

fn measure_one<C: Communicator>(
    comm: &mut C,
    coll: Collective,
    cfg: &SweepConfig,
    p: &Point,
    in_place: bool,
) -> CommResult<LoopStats> {
    let (rank, world) = (comm.rank(), comm.world());
    let size = p.dtype.size();
    let op = p.op.unwrap_or(ReduceOp::Sum);
    let inputs = Inputs {
        seed: cfg.seed,
        dtype: p.dtype,
        op: p.op,
        world,
    };
    let send_elems = coll.send_elems(p.count, world);
    let recv_elems = coll.recv_elems(p.count, world);
    let args = CollArgs::new(p.count, p.dtype).op(op).root(p.root);
    let input = inputs.bytes(rank, 0, send_elems);
    // Built only for a check: at 1 GiB it takes the host seconds.
    let expected = if cfg.check > 0 {
        expected(coll, &inputs, args, rank)
    } else {
        None
    };
    // On a device, each call takes the next of several buffer sets, as
    // nccl-tests moves each iteration through its buffers: a call must not
    // find the data of the call before in the cache. Set 0 is checked.
    let largest = cfg.sizes.iter().copied().max().unwrap_or(p.bytes);
    let sets = comm.cache_free_sets(p.bytes, largest);
    let spec = LoopSpec {
        warmup: cfg.warmup,
        iters: cfg.iters,
        delay: cfg.straggler.filter(|(r, _)| *r == rank).map(|(_, d)| d),
        graph: cfg.graph,
    };
    let call = |c: &mut C, io: Io<'_, C::Buffer>| c.collective(coll, io, args);
    let mut wrong = 0u64;
    let times = if in_place {
        // One buffer, the input at its place in it.
        let elems = send_elems.max(recv_elems);
        let mut image = vec![0u8; elems * size];
        let at = coll.in_place_input(p.count, rank) * size;
        image[at..at + input.len()].copy_from_slice(&input);
        let mut bufs = (0..sets)
            .map(|_| {
                let mut b = comm.alloc(image.len())?;
                b.write_from_host(&image)?;
                Ok(b)
            })
            .collect::<CommResult<Vec<_>>>()?;
        let mut next = 0;
        let times = time_loop(comm, &spec, |c| {
            let k = next % sets;
            next += 1;
            call(c, Io::InPlace(&mut bufs[k]))
        })?;
        bufs.truncate(1);
        let buf = &mut bufs[0];
        let out_at = coll.in_place_output(p.count, rank) * size;
        let mut got = vec![0u8; image.len()];
        for _ in 0..cfg.check {
            buf.write_from_host(&image)?;
            call(comm, Io::InPlace(buf))?;
            comm.sync()?;
            if let Some(exp) = &expected {
                buf.read_to_host(&mut got)?;
                let end = (out_at + exp.len()).min(got.len());
                wrong += count_wrong(&mut got[out_at..end], exp, size, rank);
            }
        }
        times
    } else {
        let mut sends = Vec::with_capacity(sets);
        let mut recvs = Vec::with_capacity(sets);
        for _ in 0..sets {
            let mut send = comm.alloc(input.len())?;
            send.write_from_host(&input)?;
            sends.push(send);
            recvs.push(comm.alloc(recv_elems * size)?);
        }
        let mut next = 0;
        let times = time_loop(comm, &spec, |c| {
            let k = next % sets;
            next += 1;
            call(
                c,
                Io::OutOfPlace {
                    send: &sends[k],
                    recv: &mut recvs[k],
                },
            )
        })?;
        sends.truncate(1);
        recvs.truncate(1);
        let (send, recv) = (&sends[0], &mut recvs[0]);
        let mut got = vec![0u8; recv_elems * size];
        for _ in 0..cfg.check {
            // The bitwise complement of the expected output: a call that
            // writes nothing cannot pass the check.
            if let Some(exp) = &expected {
                let sentinel: Vec<u8> = exp.iter().map(|b| !b).collect();
                recv.write_from_host(&sentinel)?;
            }
            call(comm, Io::OutOfPlace { send, recv })?;
            comm.sync()?;
            if let Some(exp) = &expected {
                recv.read_to_host(&mut got)?;
                wrong += count_wrong(&mut got, exp, size, rank);
            }
        }
        times
    };
    LoopStats::gather(comm, &times, wrong, cfg.average)
}

/// Elements of `got` that differ bitwise from `expected` (missing ones count as wrong).
fn count_wrong(got: &mut [u8], expected: &[u8], elem: usize, rank: usize) -> u64 {
    if corrupts(rank) {
        if let Some(b) = got.first_mut() {
            *b = !*b;
        }
    }
    let elem = elem.max(1);
    let compared = got.len().min(expected.len()) / elem;
    let missing = (expected.len() / elem).saturating_sub(compared);
    let differing = got
        .chunks_exact(elem)
        .zip(expected.chunks_exact(elem))
        .filter(|(a, b)| a != b)
        .count();
    (differing + missing) as u64
}

// A row has that many sources (the run, the rank, the flags, the model,
// the point, the stats), each borrowed from elsewhere.
#[allow(clippy::too_many_arguments)]
fn make_row(
    coll: Collective,
    ids: &RunIds<'_>,
    comm: &impl Communicator,
    cfg: &SweepConfig,
    wire: &WireFigures,
    p: &Point,
    in_place: bool,
    s: &LoopStats,
) -> CollectiveRow {
    let world = comm.world();
    let secs = s.time_us * 1e-6;
    let algbw = model::busbw::algbw_gbps(p.bytes, secs);
    // The record keeps the name; the model reads what it means.
    let algo = model::ModelAlgo::of(&p.algo);
    let (model_us, ceiling_gbps) = wire.row_references(coll, &algo, world, p.bytes, in_place);
    CollectiveRow {
        schema: SCHEMA_VERSION,
        run_id: ids.run_id.to_string(),
        backend: comm.backend().to_string(),
        wire: comm.wire(),
        algo: p.algo.clone(),
        collective: coll.name().to_string(),
        dtype: p.dtype.name().to_string(),
        op: p.op.map_or("none", ReduceOp::name).to_string(),
        root: if coll.rooted() { p.root as i64 } else { -1 },
        world,
        bytes: p.bytes,
        count: p.count as u64,
        in_place,
        iters: cfg.iters as u64,
        time_us: s.time_us,
        time_min_us: s.iter_min_us,
        time_max_us: s.iter_max_us,
        p50_us: s.p50_us,
        p99_us: s.p99_us,
        algbw_gbps: algbw,
        busbw_gbps: algbw * model::busbw_factor(coll, world),
        wrong: s.wrong,
        model_us,
        ceiling_gbps,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_wrong_elements_bitwise() {
        let exp = [1u8, 2, 3, 4, 5, 6];
        let mut got = [1u8, 2, 3, 9, 5, 6];
        assert_eq!(count_wrong(&mut got, &exp, 2, usize::MAX), 1);
        let mut short = [1u8, 2];
        assert_eq!(
            count_wrong(&mut short, &exp, 2, usize::MAX),
            2,
            "missing elements are wrong"
        );
        let mut same = exp;
        assert_eq!(count_wrong(&mut same, &exp, 2, usize::MAX), 0);
    }
}
