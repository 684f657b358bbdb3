//! The table and the summary, printed by rank 0 only, as rows complete.

use crate::config::SweepConfig;
use crate::recheck::RecheckLines;
use crate::summary::{FitLine, Fitted, Summary};
use parbench::comm::{Collective, DType, ReduceOp};
use parbench::measure::wire::WireFigures;
use parbench::model;
use parbench::results::CollectiveRow;

/// One size of one (collective, dtype, op), as the table and rows name it.
pub struct Point {
    pub dtype: DType,
    pub op: Option<ReduceOp>,
    /// The root of a rooted collective (else unused).
    pub root: usize,
    /// Per-rank count (the communicator's).
    pub count: usize,
    /// nccl-tests' size.
    pub bytes: u64,
    /// The algorithm the communicator runs at this size.
    pub algo: String,
}

/// What a size's two placements found beyond their rows, for nccl-tests'
/// layout: each one's per-iteration times (`-I 1`'s columns) and the
/// ranks that found a wrong element (its out-of-bounds count).
pub struct PerPlacement<'a> {
    pub iter_us: [&'a [f64]; 2],
    pub ranks_wrong: [u64; 2],
}

/// Prints to stdout when enabled (rank 0); every other rank stays silent.
pub struct Printer {
    enabled: bool,
    /// `--format nccl-tests`: its table instead of parbench's (and whether #wrong was checked).
    nccl_tests: Option<(crate::nccl_tests_format::Table, bool)>,
    /// parbench's own lines in nccl-tests' layout, printed after its
    /// closing lines.
    trailer: Vec<String>,
}

/// Width of one placement's block of columns.
const BLOCK: usize = 73;

impl Printer {
    /// A printer that prints only when `enabled`.
    pub fn new(enabled: bool) -> Self {
        Printer {
            enabled,
            nccl_tests: None,
            trailer: Vec::new(),
        }
    }

    /// A printer of nccl-tests' layout (`--format nccl-tests`).
    pub fn nccl_tests(enabled: bool, checked: bool) -> Self {
        Printer {
            enabled,
            nccl_tests: Some((Default::default(), checked)),
            trailer: Vec::new(),
        }
    }

    /// Whether this printer writes nccl-tests' layout.
    pub fn is_nccl_tests(&self) -> bool {
        self.nccl_tests.is_some()
    }

    /// In nccl-tests' layout: the job every block's header names, and
    /// parbench's own lines for after the last block.
    pub fn set_nccl_tests_job(
        &mut self,
        job: &crate::nccl_tests_format::JobInfo<'_>,
        trailer: Vec<String>,
    ) {
        if let Some((t, _)) = &mut self.nccl_tests {
            t.set_job(job);
            self.trailer = trailer;
        }
    }

    /// Prints lines as they are.
    pub fn lines(&mut self, lines: &[String]) {
        for l in lines {
            self.line(l);
        }
    }

    fn line(&mut self, s: &str) {
        if self.enabled {
            // A closed stdout (a pipe into `head`) must not stop the run or
            // its records; a live progress line goes first.
            parbench::outln!("{s}");
        }
    }

    /// What runs, and the wire's figures measured before the sweep
    /// ([`header_lines`]); nccl-tests' format prints its own.
    pub fn run_header(&mut self, lines: &[String]) {
        if !self.is_nccl_tests() {
            self.lines(lines);
        }
    }

    /// The column headers of one collective's table.
    pub fn collective_header(&mut self, coll: Collective, world: usize) {
        if let Some((t, _)) = &mut self.nccl_tests {
            let lines = t.start(coll);
            return self.lines(&lines);
        }
        self.line("#");
        self.line(&format!(
            "# {coll}: busbw = algbw x {:.4}",
            model::busbw_factor(coll, world)
        ));
        for l in column_header() {
            self.line(&l);
        }
    }

    /// One size: out-of-place and in-place side by side.
    pub fn row(
        &mut self,
        coll: Collective,
        p: &Point,
        measured: &[Option<CollectiveRow>; 2],
        each: PerPlacement<'_>,
        (wire, marked): (&WireFigures, [bool; 2]),
    ) {
        if let Some((t, checked)) = &mut self.nccl_tests {
            t.add(measured, each.ranks_wrong);
            let line = crate::nccl_tests_format::row_line(
                coll,
                (p.bytes, p.count),
                p.dtype,
                p.op,
                p.root,
                measured,
                *checked,
                t.per_iter.then_some(each.iter_us),
            );
            return self.line(&line);
        }
        self.line(&format_row(coll, p, measured, (wire, marked)));
    }

    /// The figures after the sweep.
    pub fn summary(&mut self, s: &Summary) {
        if let Some((t, _)) = &mut self.nccl_tests {
            // nccl-tests' footers close the last block; parbench's summary stays
            // in run.json, out of the way of scripts that read nccl-tests' lines.
            let mut lines = t.close();
            lines.append(&mut self.trailer);
            return self.lines(&lines);
        }
        for l in summary_lines(s) {
            self.line(&l);
        }
    }
}

/// The header lines: what runs, the ceiling's range, the model's link, the noise.
pub fn header_lines(
    backend: &str,
    wire_name: &str,
    world: usize,
    algo: &str,
    cfg: &SweepConfig,
    wire: &WireFigures,
) -> Vec<String> {
    let mut out = vec![format!(
        "# parbench bench-collectives: backend {backend}, wire {wire_name}, {world} ranks, algo {algo}"
    )];
    let c = &wire.ceiling;
    let (first, last) = (c.rungs.first(), c.rungs.last());
    out.push(match (first, last) {
        (Some(f), Some(l)) if c.rungs.len() > 1 => {
            let peak = c.peak_gbps().unwrap_or(0.0);
            format!(
                "# Wire ceiling: {peak:.2} GB/s in cache .. {:.2} GB/s at {} per rank{} (a ladder of {} working sets from {}; {}); each row is held against the ceiling at its own working set",
                l.gbps,
                parbench::units::bytes(l.working_set as f64),
                if l.gbps < 0.5 * peak { ", out of cache" } else { "" },
                c.rungs.len(),
                parbench::units::bytes(f.working_set as f64),
                c.method
            )
        }
        (Some(f), _) => format!("# Wire ceiling: {:.2} GB/s ({})", f.gbps, c.method),
        _ => "# Wire ceiling: not measured".to_string(),
    });
    let m = &wire.model;
    let gamma = match (m.reduce.peak_gbps(), m.reduce.floor_gbps()) {
        (Some(hi), Some(lo)) => format!(
            "gamma 1/({hi:.1} .. {lo:.1}) GB/s (float sum kernel per rank, in .. out of cache)"
        ),
        _ => "gamma folded into beta".to_string(),
    };
    let ping = match (&wire.ping, &wire.exchange) {
        (Some(p), Some(x)) => format!(
            "alpha {:.2} us per exchange step (median of {} timed 8 B exchanges, every rank at once, after {} warm-up; p10..p90 {:.2}..{:.2} us), {:.2} us per one-way step (median of {} ping-pong half trips 0<->1; p10..p90 {:.2}..{:.2} us)",
            x.median_us, x.trips, x.warmup, x.p10_us, x.p90_us, p.median_us, p.trips, p.p10_us, p.p90_us
        ),
        _ => "alpha 0 (one rank)".to_string(),
    };
    out.push(format!(
        "# Model, measured before the sweep (not fitted): {ping}, beta 1/(the ladder at the row's working set), {gamma}{}",
        if wire.model.cache_states() {
            "; shared memory: a byte costs what its cache lines' state costs (pull, claim, both ladders)"
        } else {
            ""
        }
    ));
    if let Some(why) = wire.model_at_row_why(world) {
        out.push(format!(
            "#   each row from {} KiB whose call the pre-sweep model puts at {} ms or less: every rung its model reads measured again just before the row, in place of the pre-sweep one ({why}; run.json extra.model_at_row)",
            parbench::measure::wire::MODEL_AT_ROW_FROM >> 10,
            parbench::measure::wire::MODEL_AT_ROW_LONGEST_CALL_S * 1e3
        ));
    }
    out.push(format!(
        "# Ladders, latencies and clock took {:.2} s; floor of the compare gate {:.3} us (the larger of the clock resolution, {:.3} us, and the latency jitter p90-p10){}",
        wire.cost_s,
        wire.floor_us(),
        wire.clock_us,
        dipped_note(&wire.rungs_dipped)
    ));
    out.push(placement_line(wire));
    if let Some(l) = &wire.link {
        out.push(format!(
            "# Sockets: congestion control {} ({}); {} segments retransmitted while measuring the wire{}",
            l.congestion_control.join(", "),
            l.chosen_by,
            l.retransmitted_segments,
            if l.retransmitted_segments > 0 {
                " (loss recovery is part of these figures)"
            } else {
                ""
            }
        ));
    }
    if let Some(n) = &wire.noise {
        let line = format!("# Noise while measuring the wire: {}", n.describe());
        out.push(if n.noisy() {
            format!("{line}\n# WARNING: other processes are using the machine: these figures measure what they leave")
        } else {
            line
        });
    }
    // On GPUs the calls of the whole loop issue back to back, as in
    // nccl-tests; the per-iteration events of the percentiles' loop cost the
    // host a record between calls, so they get a loop of their own.
    let on_gpus = parbench::launch::flags::Backend::named(backend).is_some_and(|b| b.on_gpus());
    let percentiles = match (on_gpus, cfg.graph) {
        (true, None) => "p50/p99 over the iterations of a second timed loop with an event after each call, each the slowest rank's",
        (true, Some(_)) => "p50/p99 over the replays of a second timed run with an event after each replay, per call, each the slowest rank's",
        (false, _) => "p50/p99 over iterations, each the slowest rank's",
    };
    out.push(format!(
        "# {} warm-up, {} timed, {} check iterations per size; time(us) = whole timed loop / {} ({}); {percentiles}",
        cfg.warmup,
        cfg.iters,
        cfg.check,
        cfg.iters,
        match cfg.average.code() {
            0 => "rank 0's",
            1 => "mean over ranks",
            2 => "fastest rank's",
            _ => "slowest rank's",
        }
    ));
    if let Some((r, d)) = cfg.straggler {
        out.push(format!(
            "# Straggler injected: rank {r} sleeps {:.3} ms before each timed iteration",
            d.as_secs_f64() * 1e3
        ));
    }
    out
}

/// Where the ranks run, in one line.
fn placement_line(wire: &WireFigures) -> String {
    let cpus: Vec<String> = wire
        .cpus
        .iter()
        .enumerate()
        .map(|(r, c)| match c {
            Some(c) => format!("rank {r} on CPU {c}"),
            None => format!("rank {r} unbound"),
        })
        .collect();
    format!(
        "# Placement: {} (rank 0: {}; PARBENCH_BIND=off leaves placement to the scheduler, which may stack ranks on one core)",
        cpus.join(", "),
        wire.placement_why
    )
}

fn block_header() -> String {
    format!(
        "{:>10} {:>9} {:>9} {:>8} {:>8} {:>7} {:>6} {:>9}",
        "time", "p50", "p99", "algbw", "busbw", "%ceil", "#wrong", "model"
    )
}

fn block_units() -> String {
    format!(
        "{:>10} {:>9} {:>9} {:>8} {:>8} {:>7} {:>6} {:>9}",
        "(us)", "(us)", "(us)", "(GB/s)", "(GB/s)", "", "", "(us)"
    )
}

/// The three header lines of a collective's table.
pub fn column_header() -> [String; 3] {
    let lead = format!(
        "{:>12} {:>12} {:>9} {:>6} {:>5} {:>8}",
        "", "", "", "", "", ""
    );
    [
        format!(
            "#{lead}  {:^BLOCK$}  {:^BLOCK$}",
            "out-of-place", "in-place"
        ),
        format!(
            "#{:>12} {:>12} {:>9} {:>6} {:>5} {:>8}  {}  {}",
            "size",
            "count",
            "type",
            "redop",
            "root",
            "algo",
            block_header(),
            block_header(),
        ),
        format!(
            "#{:>12} {:>12} {:>9} {:>6} {:>5} {:>8}  {}  {}",
            "(B)",
            "(elements)",
            "",
            "",
            "",
            "",
            block_units(),
            block_units(),
        ),
    ]
}

/// How far a row may sit above its ceiling before it is marked: 5% plus
/// the ceiling rung's own noise (best against median sample).
pub fn ceiling_tolerance(r: &CollectiveRow, wire: &WireFigures) -> f64 {
    let coll = r.collective.parse::<Collective>().ok();
    let ws = coll.map_or(r.bytes, |c| {
        parbench::model::wire::working_set_bytes(c, r.world, r.bytes, r.in_place)
    });
    0.05 + wire.ceiling.noise_at(ws)
}

/// Whether a row's busbw beats its ceiling by more than the noise.
pub fn above_ceiling(r: &CollectiveRow, wire: &WireFigures) -> bool {
    r.ceiling_gbps > 0.0 && r.busbw_gbps > r.ceiling_gbps * (1.0 + ceiling_tolerance(r, wire))
}

/// `marked`: the row ran with the cores elsewhere than where the wire was
/// measured (its model is marked `~`: [`parbench::measure::core_state`]).
fn format_block(r: Option<&CollectiveRow>, wire: &WireFigures, marked: bool) -> String {
    match r {
        Some(r) => {
            let pct = if r.ceiling_gbps > 0.0 {
                100.0 * r.busbw_gbps / r.ceiling_gbps
            } else {
                f64::NAN
            };
            let mark = if above_ceiling(r, wire) { "!" } else { " " };
            let model = if r.model_us.is_finite() && marked {
                format!("{:>8.2}~", r.model_us)
            } else if r.model_us.is_finite() {
                format!("{:>9.2}", r.model_us)
            } else {
                format!("{:>9}", "-")
            };
            format!(
                "{:>10.2} {:>9.2} {:>9.2} {:>8.2} {:>8.2} {:>6.1}{mark} {:>6} {model}",
                r.time_us, r.p50_us, r.p99_us, r.algbw_gbps, r.busbw_gbps, pct, r.wrong
            )
        }
        None => format!(
            "{:>10} {:>9} {:>9} {:>8} {:>8} {:>7} {:>6} {:>9}",
            "n/a", "", "", "", "", "", "", ""
        ),
    }
}

/// One table line (the leading columns, then each placement's block).
pub fn format_row(
    coll: Collective,
    p: &Point,
    measured: &[Option<CollectiveRow>; 2],
    (wire, marked): (&WireFigures, [bool; 2]),
) -> String {
    let root = if coll.rooted() {
        p.root.to_string()
    } else {
        "-1".to_string()
    };
    let op = if coll.reduces() {
        p.op.map_or("none", ReduceOp::name)
    } else {
        "none"
    };
    format!(
        " {:>12} {:>12} {:>9} {:>6} {:>5} {:>8}  {}  {}",
        p.bytes,
        p.count,
        p.dtype.name(),
        op,
        root,
        p.algo,
        format_block(measured[0].as_ref(), wire, marked[0]),
        format_block(measured[1].as_ref(), wire, marked[1]),
    )
}

/// The lines after the sweep: fits, peaks, rows above their ceiling,
/// straggler, correctness, noise.
pub fn summary_lines(s: &Summary) -> Vec<String> {
    let from = s.fits.first().map_or(1 << 20, |f| f.from);
    let mut out = vec![
        "#".to_string(),
        format!(
            "# Fits over the window of {} and up (--fit-from), per collective and algorithm (out-of-place rows; in-place when only those ran), of each row's p50:",
            parbench::units::bytes(from as f64)
        ),
        "#   structure `ladders`: t = L alpha + s x (the model's bytes term from the ladders at each row's working set): alpha the one measured before the sweep (a sliced ring's steps grow with its bytes), the scale s fitted,".to_string(),
        "#   busbw = what the fit implies at the window's first and last size; `single beta`: t = L alpha + F n beta. err = rms / max relative error.".to_string(),
        "#   peak busbw: the largest busbw of any one size, and that size (not a mean over sizes).".to_string(),
        format!(
            "# {:>14} {:>6} {:>6} {:>11} {:>10} {:>8} {:>21} {:>14} {:>12} {:>12}",
            "collective", "algo", "sizes", "structure", "alpha(us)", "scale", "busbw first..last", "err rms/max", "peak busbw", "at size(B)"
        ),
    ];
    for f in &s.fits {
        out.push(format_fit(f));
        if let Some(w) = &f.words {
            out.push(format!("#   {} {}: {w}", f.collective.name(), f.algo));
        }
    }
    if let Some(c) = &s.model_check {
        out.extend(c.lines());
    }
    if !s.above_ceiling.is_empty() {
        out.push(format!(
            "# Rows above their ceiling by more than its noise (marked !): {}",
            s.above_ceiling.len()
        ));
        let mut causes: Vec<(&str, Vec<&str>)> = Vec::new();
        for (row, cause) in &s.above_ceiling {
            match causes.iter_mut().find(|(c, _)| c == cause) {
                Some(c) => c.1.push(row),
                None => causes.push((cause, vec![row])),
            }
        }
        for (cause, rows) in causes {
            out.push(format!("#   {}: {cause}", rows.join(", ")));
        }
    } else {
        out.push("# Rows above their ceiling by more than its noise: none".to_string());
    }
    if let Some(c) = &s.recheck {
        out.extend(c.lines());
    }
    if let Some(d) = &s.ceiling_drift {
        out.push(d.line());
    }
    if let Some(st) = &s.states {
        out.extend(st.lines());
    }
    out.push(match &s.straggler {
        Some(v) => format!(
            "# Straggler: rank {} arrived last, by a median {:.1} us, in {:.0}% of {} timed iterations: the others wait for it.",
            v.rank,
            v.median_late_us,
            100.0 * v.fraction,
            v.iterations
        ),
        None => format!(
            "# Straggler: none (no rank arrived last, by >= 20% of the iteration, in more than half of {} timed iterations).",
            s.iterations
        ),
    });
    out.push(if s.wrong == 0 {
        format!(
            "# Correctness: 0 wrong elements (bit-exact checks of {} rows).",
            s.checked_rows
        )
    } else {
        format!(
            "# Correctness: {} WRONG elements summed over ranks and rows; exit code 1.",
            s.wrong
        )
    });
    match &s.noise {
        Some(n) => {
            let per: Vec<String> = s
                .noise_per_collective
                .iter()
                .filter_map(|(c, n)| {
                    n.as_ref()
                        .map(|n| format!("{c} {:.1}%", 100.0 * n.fraction))
                })
                .collect();
            out.push(format!(
                "# Noise: during the run {}{}",
                n.describe(),
                if per.is_empty() {
                    String::new()
                } else {
                    format!("; per table: {}", per.join(", "))
                }
            ));
            if n.noisy() {
                out.push("# WARNING: a noisy run: its figures measure what the other processes left; report compare will not judge it".to_string());
            }
        }
        None => out.push("# Noise: not measured (no /proc on this system)".to_string()),
    }
    if let Some(l) = &s.link {
        out.push(format!(
            "# Sockets: {} segments retransmitted during the run (every rank's kernel, congestion control {}){}",
            l.retransmitted_segments,
            l.congestion_control.join(", "),
            if l.retransmitted_segments > 0 {
                ": loss recovery is part of these figures"
            } else {
                ""
            }
        ));
    }
    out
}

fn format_fit(f: &FitLine) -> String {
    let peak = format!("{:>12.2} {:>12}", f.peak_busbw_gbps, f.peak_bytes);
    let lead = format!(
        "# {:>14} {:>6} {:>6}",
        f.collective.name(),
        f.algo,
        f.points
    );
    match &f.fit {
        Ok(Fitted::Wire(w)) => format!(
            "{lead} {:>11} {:>10.2} {:>8.3} {:>21} {:>14} {peak}",
            "ladders",
            w.alpha_s * 1e6,
            w.scale,
            format!("{:.2}..{:.2}", w.busbw_gbps.0, w.busbw_gbps.1),
            format!(
                "{:.1}%/{:.1}%",
                100.0 * w.rms_rel_err,
                100.0 * w.max_rel_err
            ),
        ),
        Ok(Fitted::Plain { fit, per_call }) => format!(
            "{lead} {:>11} {:>10.2} {:>8} {:>21} {:>14} {peak}{}",
            if *per_call { "per call" } else { "single beta" },
            fit.alpha_us(),
            "-",
            fit.bandwidth_gbps()
                .map_or("-".to_string(), |b| format!("{b:.2}")),
            format!(
                "{:.1}%/{:.1}%",
                100.0 * fit.rms_rel_err,
                100.0 * fit.max_rel_err
            ),
            if *per_call {
                "  (per-call fit: no model for this algo)"
            } else {
                ""
            }
        ),
        Err(e) => format!(
            "{lead} {:>11} {:>10} {:>8} {:>21} {:>14} {peak}  (no fit: {e})",
            "-", "-", "-", "-", "-"
        ),
    }
}

/// The header's words for the working sets measured again because a rung
/// there dipped below both its neighbours (empty when none).
fn dipped_note(sets: &[u64]) -> String {
    if sets.is_empty() {
        return String::new();
    }
    let names: Vec<String> = sets
        .iter()
        .map(|&ws| parbench::units::bytes(ws as f64))
        .collect();
    format!(
        "; measured again at {} (a rung there lay below 2/3 of both its neighbours: a stall during its samples; each ladder keeps its better rung)",
        names.join(", ")
    )
}
