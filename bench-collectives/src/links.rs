//! `bench-collectives links`: every ordered pair of ranks, one pair at a
//! time while the others wait, measured three ways: the 8-byte latency
//! (half the round trip), the one-way bandwidth at `-e` bytes (default
//! 64 MiB), and both directions at once. Printed as rank x rank matrices;
//! pairs below 70% of the median pair are named, and so is the rank that is
//! on every slow pair (the likely culprit). Records: `links.csv` and run.json.

use crate::cli::SweepJob;
use crate::start::Finished;
use anyhow::{Context, Result};
use parbench::comm::{CommBuffer, CommResult, Communicator, DType, Io, ReduceOp};
use parbench::launch::ranks::{self, Ended, RankBody, Ranks};
use parbench::launch::UsageError;
use parbench::results::{self, verdict, LinkRow, RunMeta, SLOW_SHARE};
use std::time::Instant;

/// Runs the pair sweep on the ranks the launcher chose for the backend.
pub fn run(plan: &SweepJob, run_id: &str, ranks: Ranks) -> Result<Finished> {
    let backend = ranks.backend().name();
    // Under mpi the world is the library's, known once it started.
    let world = ranks.world().unwrap_or(0);
    let gpus = matches!(ranks, Ranks::Here { backend, .. } if backend.on_gpus());
    // Ranks of this process bring their rows back to it.
    let here = matches!(ranks, Ranks::Here { .. });
    // The output folder is checked before anything is measured, by the
    // process that writes it (under mpi rank 0 is known only once started).
    let writes = crate::start::writes_records(&ranks);
    if writes {
        results::prepare_out::<LinkRow>(&plan.out).map_err(|e| UsageError(format!("--out {e}")))?;
    }
    // Before any buffer: the ranks on this host hold the pair's message
    // three times each (a spawning launcher checked for all its ranks).
    let ranks_here = crate::start::ranks_here(&ranks, world);
    if ranks_here > 0 || writes {
        let bytes = plan.sweep.sizes.last().copied().unwrap_or(64 << 20);
        crate::memory::check_links(bytes, ranks_here).map_err(|e| UsageError(e.0))?;
    }
    // Started before the pairs run: run.json's times cover the measurement.
    let mut meta = RunMeta::start("links", run_id, backend, world);
    if gpus {
        meta.gpus = crate::reference_line::gpu_names();
    }
    let body = Pairs { plan, run_id };
    let rows = match ranks::run(ranks, plan.algo, plan.sweep.timeout, &body)? {
        Ended::Launched { code, .. } => return Ok(Finished::Launched { code }),
        Ended::Ran(rows) => rows.into_iter().flatten().next(),
    };
    // Rank 0 brings the rows; every other rank of a job has none.
    let Some((rows, world_seen)) = rows else {
        if here {
            anyhow::bail!("rank 0 returned no pairs");
        }
        return Ok(Finished::Ran { wrong: 0 });
    };
    // Under mpi the world is the library's, known once it started.
    meta.world = world_seen;
    finish(plan, &mut meta, rows)
}

/// The pair sweep as the launcher runs it on each rank: rank 0 returns
/// the rows and the world it measured.
struct Pairs<'a> {
    plan: &'a SweepJob,
    run_id: &'a str,
}

impl RankBody for Pairs<'_> {
    type Out = Option<(Vec<LinkRow>, usize)>;
    fn run<C: Communicator>(&self, comm: &mut C) -> CommResult<Self::Out> {
        let world = comm.world();
        Ok(measure_pairs(comm, self.plan, self.run_id)?.map(|rows| (rows, world)))
    }
}

/// What one rank measured as the sender of a pair.
#[derive(Clone, Copy, Default)]
struct Measured {
    latency_us: f64,
    one_way_gbps: f64,
    both_ways_gbps: f64,
    /// The pair's bandwidth message ([`pair_bytes`]).
    bytes: usize,
}

/// The longest a pair's bandwidth may take, one way and again both ways:
/// the other ranks wait at a barrier meanwhile, under the run's deadline.
pub const PAIR_BUDGET_S: f64 = 1.0;

/// The first exchange of a pair: small enough to cross a 10 Mbit/s link
/// in a fifth of a second.
const PROBE_BYTES: usize = 256 << 10;

/// A probe shorter than this is doubled and sent again before its rate
/// sets the message size.
const PROBE_S: f64 = 0.05;

/// Marks a probe size sent to the receiver as "probe again" rather than
/// the pair's message size.
const AGAIN: u64 = 1 << 63;

/// The smallest bandwidth message a slow pair is cut down to.
const MIN_PAIR_BYTES: usize = 4 << 10;

/// A pair's bandwidth message: `-e` bytes, or, where `iters` of them would
/// take longer than [`PAIR_BUDGET_S`] at the rate one `probe`-byte message
/// crossed in `probe_s` (acknowledged), the largest power of two that fits.
pub fn pair_bytes(max: usize, probe: usize, probe_s: f64, iters: usize) -> usize {
    let rate = probe as f64 / probe_s.max(1e-9);
    let fits = rate * PAIR_BUDGET_S / iters.max(1) as f64;
    if fits >= max as f64 {
        return max;
    }
    let pow2 = 1usize << (fits.max(1.0).log2().floor() as u32).min(62);
    pow2.clamp(MIN_PAIR_BYTES.min(max), max)
}

/// Every rank runs this; rank 0 returns the rows. Pairs run one at a time,
/// between barriers, so that no other traffic shares the wire.
fn measure_pairs<C: Communicator>(
    comm: &mut C,
    plan: &SweepJob,
    run_id: &str,
) -> CommResult<Option<Vec<LinkRow>>> {
    comm.set_timeout(plan.sweep.timeout);
    let (rank, world) = (comm.rank(), comm.world());
    let bytes = plan.sweep.sizes.last().copied().unwrap_or(64 << 20).max(8) as usize;
    let iters = plan.sweep.iters.max(1);
    let warmup = plan.sweep.warmup;
    let small = comm.alloc(8)?;
    let mut small_out = comm.alloc(8)?;
    let mut small_in = comm.alloc(8)?;
    let mut big = comm.alloc(bytes)?;
    big.write_from_host(&vec![0x5a; bytes])?;
    let mut big_in = comm.alloc(bytes)?;
    let mut mine = vec![0f64; world * world * 4];
    for from in 0..world {
        for to in 0..world {
            if from == to {
                continue;
            }
            comm.barrier()?;
            let me = if rank == from {
                Some(to)
            } else if rank == to {
                Some(from)
            } else {
                None
            };
            let Some(peer) = me else { continue };
            let sender = rank == from;
            // Latency: 8-byte ping-pong, half the median round trip.
            let mut trips = Vec::with_capacity(iters);
            for k in 0..warmup + iters {
                let t = Instant::now();
                if sender {
                    comm.send(&small, 8, DType::U8, peer)?;
                    comm.recv(&mut small_in, 8, DType::U8, peer)?;
                } else {
                    comm.recv(&mut small_in, 8, DType::U8, peer)?;
                    comm.send(&small, 8, DType::U8, peer)?;
                }
                comm.sync()?;
                if k >= warmup {
                    trips.push(t.elapsed().as_secs_f64());
                }
            }
            trips.sort_by(f64::total_cmp);
            let latency_us = trips[trips.len() / 2] / 2.0 * 1e6;
            // One way: `from` sends, `to` acknowledges the last message with 8
            // bytes, so the time covers delivery, not just the send's return.
            let one_way = |c: &mut C,
                           big: &mut C::Buffer,
                           big_in: &mut C::Buffer,
                           small_in: &mut C::Buffer,
                           bytes: usize,
                           n: usize|
             -> CommResult<f64> {
                let t = Instant::now();
                if sender {
                    for _ in 0..n {
                        c.send(big, bytes, DType::U8, peer)?;
                    }
                    c.recv(small_in, 8, DType::U8, peer)?;
                } else {
                    for _ in 0..n {
                        c.recv(big_in, bytes, DType::U8, peer)?;
                    }
                    c.send(&small, 8, DType::U8, peer)?;
                }
                c.sync()?;
                Ok(t.elapsed().as_secs_f64())
            };
            // The message size from first exchanges: a pair's bandwidth
            // takes at most PAIR_BUDGET_S each way, so that every other
            // rank's wait at the barrier is bounded on the slow link too.
            // The probe doubles until it takes PROBE_S: a shaped link's
            // token bucket lets its first few hundred KiB through at once.
            let mut probe = bytes.min(PROBE_BYTES);
            let n_bytes = loop {
                let t = one_way(comm, &mut big, &mut big_in, &mut small_in, probe, 1)?;
                let mut word = [0u8; 8];
                if sender {
                    let next = if t < PROBE_S && probe < bytes {
                        AGAIN | (probe * 2).min(bytes) as u64
                    } else {
                        pair_bytes(bytes, probe, t, iters) as u64
                    };
                    word = next.to_le_bytes();
                    small_out.write_from_host(&word)?;
                    comm.send(&small_out, 8, DType::U8, peer)?;
                } else {
                    comm.recv(&mut small_in, 8, DType::U8, peer)?;
                    small_in.read_to_host(&mut word)?;
                }
                let word = u64::from_le_bytes(word);
                let size = usize::try_from(word & !AGAIN).unwrap_or(bytes).min(bytes);
                if word & AGAIN == 0 {
                    break size;
                }
                probe = size;
            };
            one_way(
                comm,
                &mut big,
                &mut big_in,
                &mut small_in,
                n_bytes,
                1.min(warmup),
            )?;
            let secs = one_way(comm, &mut big, &mut big_in, &mut small_in, n_bytes, iters)?;
            let one_way_gbps = (iters * n_bytes) as f64 / secs / 1e9;
            // Both ways at once: each sends `n_bytes` and receives `n_bytes`.
            let t = Instant::now();
            for _ in 0..iters {
                comm.send_recv(&big, peer, &mut big_in, peer, n_bytes, DType::U8)?;
            }
            comm.sync()?;
            let both = (iters * n_bytes) as f64 / t.elapsed().as_secs_f64() / 1e9;
            if sender {
                let at = (from * world + to) * 4;
                let cell = [latency_us, one_way_gbps, both, n_bytes as f64];
                mine[at..at + 4].copy_from_slice(&cell);
            }
        }
    }
    // Only the sender of each pair wrote its cell: a sum brings every cell to every rank.
    let all = sum_f64(comm, &mine)?;
    if rank != 0 {
        return Ok(None);
    }
    let mut rows = Vec::new();
    for from in 0..world {
        for to in (0..world).filter(|&t| t != from) {
            let at = (from * world + to) * 4;
            let m = Measured {
                latency_us: all[at],
                one_way_gbps: all[at + 1],
                both_ways_gbps: all[at + 2],
                bytes: all[at + 3] as usize,
            };
            rows.push(LinkRow {
                schema: results::SCHEMA_VERSION,
                run_id: run_id.to_string(),
                backend: comm.backend().to_string(),
                wire: comm.wire(),
                world,
                from,
                to,
                latency_us: m.latency_us,
                bytes: m.bytes as u64,
                one_way_gbps: m.one_way_gbps,
                both_ways_gbps: m.both_ways_gbps,
            });
        }
    }
    Ok(Some(rows))
}

fn sum_f64<C: Communicator>(comm: &mut C, v: &[f64]) -> CommResult<Vec<f64>> {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut send = comm.alloc(bytes.len())?;
    send.write_from_host(&bytes)?;
    let mut recv = comm.alloc(bytes.len())?;
    comm.all_reduce(
        Io::OutOfPlace {
            send: &send,
            recv: &mut recv,
        },
        v.len(),
        DType::F64,
        ReduceOp::Sum,
    )?;
    comm.sync()?;
    let mut out = vec![0u8; bytes.len()];
    recv.read_to_host(&mut out)?;
    Ok(out
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect())
}

/// A rank x rank matrix of one figure (the diagonal is `-`).
pub fn matrix(rows: &[LinkRow], title: &str, fig: impl Fn(&LinkRow) -> f64) -> Vec<String> {
    let world = rows.first().map_or(0, |r| r.world);
    let mut out = vec![format!("# {title} (row: from, column: to)")];
    let mut head = format!("# {:>7}", "from\\to");
    for t in 0..world {
        head.push_str(&format!(" {t:>9}"));
    }
    out.push(head);
    for f in 0..world {
        let mut line = format!("  {f:>7}");
        for t in 0..world {
            match rows.iter().find(|r| r.from == f && r.to == t) {
                Some(r) => line.push_str(&format!(" {:>9.3}", fig(r))),
                None => line.push_str(&format!(" {:>9}", "-")),
            }
        }
        out.push(line);
    }
    out
}

/// What rank 0 prints: the three matrices and the verdict.
pub fn report_lines(rows: &[LinkRow]) -> Vec<String> {
    let mut out = vec![format!(
        "# parbench bench-collectives links: backend {}, wire {}, {} ranks, {} B per bandwidth message ({}); pairs one at a time",
        rows.first().map_or("-", |r| r.backend.as_str()),
        rows.first().map_or("-", |r| r.wire.as_str()),
        rows.first().map_or(0, |r| r.world),
        rows.iter().map(|r| r.bytes).max().unwrap_or(0),
        match rows.iter().map(|r| r.bytes).min() {
            Some(least) if rows.iter().any(|r| r.bytes != least) => format!(
                "down to {least} B on a pair whose -n messages would take over {PAIR_BUDGET_S} s; links.csv has each pair's"
            ),
            _ => format!("each pair's bandwidth bounded to {PAIR_BUDGET_S} s each way"),
        }
    )];
    out.extend(matrix(
        rows,
        "Latency, us: half the median 8-byte round trip",
        |r| r.latency_us,
    ));
    out.extend(matrix(rows, "One-way bandwidth, GB/s", |r| r.one_way_gbps));
    out.extend(matrix(
        rows,
        "Both directions at once, GB/s each way",
        |r| r.both_ways_gbps,
    ));
    out.extend(verdict(rows).lines().into_iter().map(|l| format!("# {l}")));
    out
}

fn finish(plan: &SweepJob, meta: &mut RunMeta, rows: Vec<LinkRow>) -> Result<Finished> {
    for l in report_lines(&rows) {
        parbench::outln!("{l}");
    }
    let v = verdict(&rows);
    meta.backend = rows
        .first()
        .map_or_else(|| meta.backend.clone(), |r| r.backend.clone());
    meta.extra.insert(
        "links".into(),
        serde_json::json!({
            "bytes": rows.first().map(|r| r.bytes),
            "median_one_way_gbps": v.median_gbps,
            "slow_share": SLOW_SHARE,
            "slow": v.slow.iter().map(|(f, t, s)| serde_json::json!({"from": f, "to": t, "share_of_median": s})).collect::<Vec<_>>(),
            "culprit": v.culprit,
            "pairs": rows,
        }),
    );
    meta.finish();
    let line = results::record_all(&plan.out, &rows, meta)
        .with_context(|| format!("writing {}", plan.out.display()))?;
    parbench::outln!("{line}");
    Ok(Finished::Ran { wrong: 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(from: usize, to: usize, gbps: f64) -> LinkRow {
        LinkRow {
            schema: 1,
            run_id: "r".into(),
            backend: "tcp".into(),
            wire: "w".into(),
            world: 5,
            from,
            to,
            latency_us: 1.0,
            bytes: 8,
            one_way_gbps: gbps,
            both_ways_gbps: gbps,
        }
    }

    #[test]
    fn one_pair_of_ranks_is_not_judged() {
        // Was: 2 ranks on one loopback, 0 -> 1 at 0.28x "the median pair".
        let rows = vec![row(0, 1, 0.28), row(1, 0, 1.0)];
        let v = verdict(&rows);
        assert!(v.slow.is_empty() && v.culprit.is_none());
        let text = report_lines(&rows).join("\n");
        assert!(text.contains("Slow pairs: not judged (1 pair(s)"), "{text}");
    }

    #[test]
    fn a_pair_measures_at_most_its_budget() {
        // 1 MiB/s: 20 messages of 32 KiB take 0.6 s, of 64 KiB 1.3 s.
        assert_eq!(pair_bytes(64 << 20, 1 << 20, 1.0, 20), 32 << 10);
        // A fast pair keeps -e.
        assert_eq!(pair_bytes(64 << 20, 256 << 10, 1e-4, 20), 64 << 20);
        // A stalled probe still gives a message, and never more than -e.
        assert_eq!(pair_bytes(64 << 20, 256 << 10, 1e6, 20), MIN_PAIR_BYTES);
        assert_eq!(pair_bytes(1024, 1024, 1e6, 20), 1024);
    }

    #[test]
    fn the_rank_on_every_slow_pair_is_named() {
        let mut rows = Vec::new();
        for f in 0..5 {
            for t in (0..5).filter(|&t| t != f) {
                rows.push(row(f, t, if f == 2 || t == 2 { 0.25 } else { 1.0 }));
            }
        }
        let v = verdict(&rows);
        assert_eq!(v.slow.len(), 8);
        assert_eq!(v.culprit, Some(2));
        let text = report_lines(&rows).join("\n");
        assert!(
            text.contains("slow: rank 2 -> rank 0 at 0.25x the median pair"),
            "{text}"
        );
        assert!(text.contains("Likely culprit: rank 2"), "{text}");
    }

    #[test]
    fn no_slow_pair_and_no_single_culprit_are_said() {
        let rows: Vec<LinkRow> = [(0, 1), (1, 0), (2, 3), (3, 2), (0, 2), (2, 0)]
            .iter()
            .map(|&(f, t)| {
                row(
                    f,
                    t,
                    if (f, t) == (0, 1) || (f, t) == (2, 3) {
                        0.1
                    } else {
                        1.0
                    },
                )
            })
            .collect();
        let v = verdict(&rows);
        assert_eq!(v.slow.len(), 2);
        assert_eq!(v.culprit, None);
        let even: Vec<LinkRow> = rows
            .iter()
            .map(|r| LinkRow {
                one_way_gbps: 1.0,
                ..r.clone()
            })
            .collect();
        assert!(verdict(&even).slow.is_empty());
    }
}
