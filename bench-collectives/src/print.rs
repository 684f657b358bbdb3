//! The table and the summary, printed by rank 0 only, as rows complete.

use crate::cli::SweepConfig;
use crate::summary::{FitLine, Summary};
use crate::sweep::{Point, WireFigures};
use parbench::comm::{Collective, ReduceOp};
use parbench::model;
use parbench::results::CollectiveRow;
use std::io::Write;

/// Prints to stdout when enabled (rank 0); every other rank stays silent.
pub struct Printer {
    enabled: bool,
}

/// Width of one placement's block of columns.
const BLOCK: usize = 62;

impl Printer {
    /// A printer that prints only when `enabled`.
    pub fn new(enabled: bool) -> Self {
        Printer { enabled }
    }

    fn line(&mut self, s: &str) {
        if self.enabled {
            let mut out = std::io::stdout().lock();
            // A closed stdout (a pipe into `head`) must not stop the run or its records.
            let _ = writeln!(out, "{s}");
            let _ = out.flush();
        }
    }

    /// What runs, and the wire's figures measured before the sweep.
    pub fn run_header(
        &mut self,
        backend: &str,
        wire_name: &str,
        world: usize,
        algo: &str,
        cfg: &SweepConfig,
        wire: &WireFigures,
    ) {
        let link = wire.link();
        self.line(&format!(
            "# parbench bench-collectives: backend {backend}, wire {wire_name}, {world} ranks, algo {algo}"
        ));
        self.line(&format!(
            "# Wire ceiling: {:.2} GB/s ({})",
            wire.ceiling.gbps, wire.ceiling.method
        ));
        self.line(&format!(
            "# Model link, measured before the sweep: alpha {:.2} us (half an 8 B ping-pong 0<->1), beta 1/{:.2} GB/s (the ceiling), gamma 1/{:.2} GB/s (float sum kernel per core)",
            link.alpha_us(),
            wire.ceiling.gbps,
            wire.reduce_gbps
        ));
        self.line(&format!(
            "# {} warm-up, {} timed, {} check iterations per size; time(us) = whole timed loop / {} ({}); p50/p99 over iterations, each the slowest rank's",
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
            self.line(&format!(
                "# Straggler injected: rank {r} sleeps {:.3} ms before each timed iteration",
                d.as_secs_f64() * 1e3
            ));
        }
    }

    /// The column headers of one collective's table.
    pub fn collective_header(&mut self, coll: Collective, world: usize) {
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
        root: usize,
        measured: &[Option<CollectiveRow>; 2],
    ) {
        self.line(&format_row(coll, p, root, measured));
    }

    /// The figures after the sweep.
    pub fn summary(&mut self, s: &Summary) {
        for l in summary_lines(s) {
            self.line(&l);
        }
    }
}

fn block_header() -> String {
    format!(
        "{:>10} {:>9} {:>9} {:>8} {:>8} {:>6} {:>6}",
        "time", "p50", "p99", "algbw", "busbw", "%ceil", "#wrong"
    )
}

fn block_units() -> String {
    format!(
        "{:>10} {:>9} {:>9} {:>8} {:>8} {:>6} {:>6}",
        "(us)", "(us)", "(us)", "(GB/s)", "(GB/s)", "", ""
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
            "#{:>12} {:>12} {:>9} {:>6} {:>5} {:>8}  {}  {}  {:>9}",
            "size",
            "count",
            "type",
            "redop",
            "root",
            "algo",
            block_header(),
            block_header(),
            "model"
        ),
        format!(
            "#{:>12} {:>12} {:>9} {:>6} {:>5} {:>8}  {}  {}  {:>9}",
            "(B)",
            "(elements)",
            "",
            "",
            "",
            "",
            block_units(),
            block_units(),
            "(us)"
        ),
    ]
}

fn format_block(r: Option<&CollectiveRow>) -> String {
    match r {
        Some(r) => format!(
            "{:>10.2} {:>9.2} {:>9.2} {:>8.2} {:>8.2} {:>6.1} {:>6}",
            r.time_us,
            r.p50_us,
            r.p99_us,
            r.algbw_gbps,
            r.busbw_gbps,
            if r.ceiling_gbps > 0.0 {
                100.0 * r.busbw_gbps / r.ceiling_gbps
            } else {
                f64::NAN
            },
            r.wrong
        ),
        None => format!(
            "{:>10} {:>9} {:>9} {:>8} {:>8} {:>6} {:>6}",
            "n/a", "", "", "", "", "", ""
        ),
    }
}

/// One table line (the leading columns, then each placement's block, then the model).
pub fn format_row(
    coll: Collective,
    p: &Point,
    root: usize,
    measured: &[Option<CollectiveRow>; 2],
) -> String {
    let root = if coll.rooted() {
        root.to_string()
    } else {
        "-1".to_string()
    };
    let op = if coll.reduces() {
        p.op.map_or("none", ReduceOp::name)
    } else {
        "none"
    };
    let model = if p.model_us.is_finite() {
        format!("{:>9.2}", p.model_us)
    } else {
        format!("{:>9}", "-")
    };
    format!(
        " {:>12} {:>12} {:>9} {:>6} {:>5} {:>8}  {}  {}  {}",
        p.bytes,
        p.count,
        p.dtype.name(),
        op,
        root,
        p.algo,
        format_block(measured[0].as_ref()),
        format_block(measured[1].as_ref()),
        model
    )
}

/// The lines after the sweep: fits, peaks, straggler, correctness.
pub fn summary_lines(s: &Summary) -> Vec<String> {
    let mut out = vec![
        "#".to_string(),
        "# Per collective and algorithm (out-of-place rows; in-place when only those ran):".to_string(),
        "#   alpha, beta: least-squares fit (relative error) of t = L alpha + F n beta, L and F the algorithm's".to_string(),
        "#   latency steps and bytes factor (parbench::model); t0 = the fit at 0 B; err = rms / max relative error.".to_string(),
        "#   peak busbw: the largest busbw of any one size, and that size (not a mean over sizes).".to_string(),
        format!(
            "# {:>14} {:>6} {:>6} {:>10} {:>10} {:>12} {:>14} {:>12} {:>12}",
            "collective", "algo", "sizes", "alpha(us)", "t0(us)", "beta(GB/s)", "err rms/max", "peak busbw", "at size(B)"
        ),
    ];
    for f in &s.fits {
        out.push(format_fit(f));
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
    out
}

fn format_fit(f: &FitLine) -> String {
    let peak = format!("{:>12.2} {:>12}", f.peak_busbw_gbps, f.peak_bytes);
    match &f.fit {
        Ok(fit) => format!(
            "# {:>14} {:>6} {:>6} {:>10.2} {:>10.2} {:>12} {:>14} {}{}",
            f.collective.name(),
            f.algo,
            f.points,
            fit.alpha_us(),
            fit.zero_byte_s * 1e6,
            fit.bandwidth_gbps()
                .map_or("-".to_string(), |b| format!("{b:.2}")),
            format!(
                "{:.0}%/{:.0}%",
                100.0 * fit.rms_rel_err,
                100.0 * fit.max_rel_err
            ),
            peak,
            if f.per_call {
                "  (per-call fit: no model for this algo)"
            } else {
                ""
            }
        ),
        Err(e) => format!(
            "# {:>14} {:>6} {:>6} {:>10} {:>10} {:>12} {:>14} {}  (no fit: {e})",
            f.collective.name(),
            f.algo,
            f.points,
            "-",
            "-",
            "-",
            "-",
            peak
        ),
    }
}
