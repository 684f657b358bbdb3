//! The table and its footer, printed by rank 0 only, as rows complete:
//! nccl-tests' columns plus `%ceil` (with `-v`, p50, p99, the model and
//! the algorithm), nccl-tests' footer lines, one headline per collective,
//! and a WARNING line only when one fires.

use crate::config::SweepConfig;
use crate::nccl_tests_format::{c_g, fit_float, mean_busbw, preamble};
use crate::summary::{above_ceiling, Summary};
use parbench::comm::{Collective, DType, ReduceOp};
use parbench::measure::wire::WireFigures;
use parbench::model;
use parbench::results::CollectiveRow;
use parbench::units;

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
    /// `-v`: p50, p99, the model and the algorithm beside nccl-tests' columns.
    verbose: bool,
    /// `--format nccl-tests`: its table instead of parbench's (and whether #wrong was checked).
    nccl_tests: Option<(crate::nccl_tests_format::Table, bool)>,
    /// parbench's own lines in nccl-tests' layout, printed after its
    /// closing lines.
    trailer: Vec<String>,
    /// Every busbw printed (nccl-tests' average) and the ranks that found
    /// a wrong element, summed over placements (its out-of-bounds count).
    busbw: Vec<f64>,
    errors: u64,
}

impl Printer {
    /// parbench's table, printed only when `enabled`.
    pub fn new(enabled: bool, verbose: bool) -> Self {
        Printer {
            enabled,
            verbose,
            nccl_tests: None,
            trailer: Vec::new(),
            busbw: Vec::new(),
            errors: 0,
        }
    }

    /// A printer of nccl-tests' layout (`--format nccl-tests`).
    pub fn nccl_tests(enabled: bool, checked: bool) -> Self {
        Printer {
            nccl_tests: Some((Default::default(), checked)),
            ..Printer::new(enabled, false)
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

    /// What runs and the wire's ceiling ([`header_lines`]); nccl-tests'
    /// format prints its own.
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
        let lines = column_header(coll, world, self.verbose);
        self.lines(&lines);
    }

    /// One size: out-of-place and in-place side by side.
    pub fn row(
        &mut self,
        coll: Collective,
        p: &Point,
        measured: &[Option<CollectiveRow>; 2],
        each: PerPlacement<'_>,
        wire: &WireFigures,
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
        for (r, ranks) in measured.iter().zip(each.ranks_wrong) {
            if let Some(r) = r {
                self.busbw.push(r.busbw_gbps);
                self.errors += ranks;
            }
        }
        let line = format_row(coll, p, measured, wire, self.verbose);
        self.line(&line);
    }

    /// The lines after the table.
    pub fn summary(&mut self, s: &Summary) {
        if let Some((t, _)) = &mut self.nccl_tests {
            // nccl-tests' footers close the last block; parbench's own lines
            // follow, `#` lines that scripts reading nccl-tests skip.
            let mut lines = t.close();
            lines.append(&mut self.trailer);
            lines.extend(noise_warning(s));
            return self.lines(&lines);
        }
        let lines = footer_lines(s, self.errors, &self.busbw);
        self.lines(&lines);
    }
}

/// The run header, at most three lines of at most 120 characters: what
/// runs; the ceiling's range and alpha; the noise while the wire was
/// measured, only when it was noisy. `-v` adds the model's and the
/// placement's lines.
pub fn header_lines(
    (backend, wire_name, world): (&str, &str, usize),
    algo: &str,
    cfg: &SweepConfig,
    wire: &WireFigures,
    verbose: bool,
) -> Vec<String> {
    let sizes = match (cfg.sizes.first(), cfg.sizes.last()) {
        (Some(a), Some(b)) => format!(
            "{}..{} ({} sizes)",
            units::bytes(*a as f64),
            units::bytes(*b as f64),
            cfg.sizes.len()
        ),
        _ => "no sizes".into(),
    };
    let mut first = format!(
        "# bench-collectives: {backend} over {wire_name}, {world} ranks, {sizes}, {} iters + {} warm-up, algo {algo}",
        cfg.iters, cfg.warmup
    );
    if let Some((r, d)) = cfg.straggler {
        first.push_str(&format!(", rank {r} +{:.1} ms", d.as_secs_f64() * 1e3));
    }
    let c = &wire.ceiling;
    let ceiling = match (c.peak_gbps(), c.floor_gbps()) {
        (Some(hi), Some(lo)) if c.rungs.len() > 1 => format!(
            "# ceiling {hi:.1} .. {lo:.1} GB/s per rank by working set ({}); alpha {:.2} us; ! = above it",
            ceiling_source(wire),
            wire.alpha_us()
        ),
        (Some(g), _) => format!(
            "# ceiling {g:.1} GB/s per rank ({}); alpha {:.2} us; ! = above it",
            ceiling_source(wire),
            wire.alpha_us()
        ),
        _ => "# ceiling: not measured (one rank)".into(),
    };
    let mut out = vec![first, ceiling];
    if let Some(n) = wire.noise.as_ref().filter(|n| n.noisy()) {
        out.push(format!(
            "# WARNING: other processes took {:.0}% of the machine while the wire was measured",
            100.0 * n.fraction
        ));
    }
    if verbose {
        let gamma = match (wire.reduce.peak_gbps(), wire.reduce.floor_gbps()) {
            (Some(hi), Some(lo)) => format!("gamma 1/({hi:.1} .. {lo:.1}) GB/s"),
            _ => "gamma folded into beta".into(),
        };
        out.push(format!(
            "# model: alpha-beta-gamma per algorithm, alpha the 8 B exchange, beta 1/ceiling at the row's working set, {gamma}; wire measured in {:.2} s",
            wire.cost_s
        ));
        out.push(placement_line(wire));
    }
    out
}

/// What the ceiling is, in a few words.
fn ceiling_source(wire: &WireFigures) -> &str {
    let method = &wire.ceiling.method;
    if method.starts_with("memory copy") {
        "memory copy, every rank at once"
    } else if wire.ceiling.rungs.len() == 1 {
        method.split(',').next().unwrap_or(method)
    } else {
        "send/recv streams"
    }
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
    let mut line = format!("# placement: {} ({})", cpus.join(", "), wire.placement_why);
    if let Some(l) = &wire.link {
        line.push_str(&format!(
            "; sockets: {} ({}), {} segments retransmitted",
            l.congestion_control.join(", "),
            l.chosen_by,
            l.retransmitted_segments
        ));
    }
    line
}

/// One placement's columns: nccl-tests' four and `%ceil` (with `verbose`,
/// p50, p99 and the model), or blanks where it was not measured.
fn block(r: Option<&CollectiveRow>, wire: &WireFigures, verbose: bool) -> String {
    let Some(r) = r else {
        return " ".repeat(block_width(verbose));
    };
    let pct = if r.ceiling_gbps > 0.0 {
        format!("{:>5.0}", 100.0 * r.busbw_gbps / r.ceiling_gbps)
    } else {
        format!("{:>5}", "-")
    };
    let mark = if above_ceiling(r, wire) { "!" } else { " " };
    let mut s = format!(
        "  {}  {}  {}  {pct}{mark}{:>7}",
        fit_float(r.time_us, 7),
        fit_float(r.algbw_gbps, 6),
        fit_float(r.busbw_gbps, 6),
        c_g(r.wrong as f64)
    );
    if verbose {
        let model = if r.model_us.is_finite() {
            fit_float(r.model_us, 7)
        } else {
            format!("{:>7}", "-")
        };
        s.push_str(&format!(
            "  {}  {}  {model}",
            fit_float(r.p50_us, 7),
            fit_float(r.p99_us, 7)
        ));
    }
    s
}

fn block_width(verbose: bool) -> usize {
    40 + if verbose { 27 } else { 0 }
}

/// The three header lines of a collective's table.
pub fn column_header(coll: Collective, world: usize, verbose: bool) -> [String; 3] {
    let e = "";
    let side = |w: [&str; 8]| {
        let mut s = format!(
            "  {:>7}  {:>6}  {:>6}  {:>5} {:>7}",
            w[0], w[1], w[2], w[3], w[4]
        );
        if verbose {
            s.push_str(&format!("  {:>7}  {:>7}  {:>7}", w[5], w[6], w[7]));
        }
        s
    };
    let names = [
        "time", "algbw", "busbw", "%ceil", "#wrong", "p50", "p99", "model",
    ];
    let unit = ["(us)", "(GB/s)", "(GB/s)", "", "", "(us)", "(us)", "(us)"];
    let algo = |w: &str| {
        if verbose {
            format!("  {w:>8}")
        } else {
            String::new()
        }
    };
    let lead = |w: [&str; 5]| {
        format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}",
            w[0], w[1], w[2], w[3], w[4]
        )
    };
    let title = format!(
        "# {coll}, busbw = algbw x {:.2}",
        model::busbw_factor(coll, world)
    );
    let width = block_width(verbose);
    let lead_width = 52 + if verbose { 10 } else { 0 };
    [
        format!(
            "{title:<lead_width$}{:^width$}{:^width$}",
            "out-of-place", "in-place"
        )
        .trim_end()
        .to_string(),
        format!(
            "{}{}{}{}",
            lead(["size", "count", "type", "redop", "root"]),
            algo("algo"),
            side(names),
            side(names)
        ),
        format!(
            "{}{}{}{}",
            lead(["(B)", "(elements)", e, e, e]),
            algo(e),
            side(unit),
            side(unit)
        )
        .trim_end()
        .to_string(),
    ]
}

/// One table line: nccl-tests' leading columns, then each placement's block.
pub fn format_row(
    coll: Collective,
    p: &Point,
    measured: &[Option<CollectiveRow>; 2],
    wire: &WireFigures,
    verbose: bool,
) -> String {
    let mut line = preamble(coll, (p.bytes, p.count), p.dtype, p.op, p.root);
    if verbose {
        line.push_str(&format!("  {:>8}", p.algo));
    }
    line.push_str(&block(measured[0].as_ref(), wire, verbose));
    line.push_str(&block(measured[1].as_ref(), wire, verbose));
    line.trim_end().to_string()
}

/// The run's noise as one WARNING line, when it was noisy.
fn noise_warning(s: &Summary) -> Option<String> {
    Some(format!("# {}", s.noise.as_ref()?.warning()?))
}

/// The footer: nccl-tests' two lines over every row printed, one headline
/// per collective, then a WARNING line for each check that fired.
pub fn footer_lines(s: &Summary, errors: u64, busbw: &[f64]) -> Vec<String> {
    let mut out = vec![
        format!(
            "# {:<20} : {} {}",
            "Out of bounds values",
            errors,
            if errors == 0 { "OK" } else { "FAILED" }
        ),
        format!("# {:<20} : {}", "Avg bus bandwidth", c_g(mean_busbw(busbw))),
    ];
    out.extend(s.headlines.iter().map(|h| format!("# {}", h.line())));
    if s.wrong > 0 {
        out.push(format!(
            "# WARNING: {} wrong elements summed over ranks and rows: the results are not exact",
            s.wrong
        ));
    }
    if let Some(v) = &s.straggler {
        out.push(format!(
            "# WARNING: straggler: rank {} arrived last, by a median {:.1} us, in {:.0}% of {} timed iterations",
            v.rank,
            v.median_late_us,
            100.0 * v.fraction,
            v.iterations
        ));
    }
    out.extend(noise_warning(s));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire() -> WireFigures {
        let copy = parbench::measure::Ladder::exact("memory copy", &[(4 << 10, 40.0)]);
        WireFigures::of_ladders(copy.clone(), copy.clone(), copy)
    }

    fn point(bytes: u64) -> Point {
        Point {
            dtype: DType::F32,
            op: Some(ReduceOp::Sum),
            root: 0,
            count: (bytes / 4) as usize,
            bytes,
            algo: "ring".into(),
        }
    }

    /// Rows fit 140 characters, their columns end under their names, and
    /// a row above its ceiling is marked where it prints.
    #[test]
    fn rows_line_up_with_their_header_and_fit_140_characters() {
        let mut r = crate::test_rows::row();
        (r.bytes, r.busbw_gbps, r.ceiling_gbps, r.time_us) = (1 << 30, 50.0, 40.0, 123456.0);
        let rows = [Some(r.clone()), Some(r)];
        for verbose in [false, true] {
            let [title, names, units] = column_header(Collective::AllReduce, 2, verbose);
            let line = format_row(
                Collective::AllReduce,
                &point(1 << 30),
                &rows,
                &wire(),
                verbose,
            );
            assert!(
                names.ends_with(if verbose { "model" } else { "#wrong" }),
                "{names}"
            );
            assert_eq!(line.len(), names.len(), "{line}\n{names}");
            assert!(units.len() <= names.len() && title.len() < names.len());
            assert_eq!(line.matches("125!").count(), 2, "{line}");
            if !verbose {
                assert!(names.len() <= 140, "{}", names.len());
            }
        }
    }

    #[test]
    fn the_header_is_at_most_three_lines_of_120_characters() {
        let cfg = crate::cli::parse_args(["bench-collectives"])
            .unwrap()
            .job()
            .unwrap()
            .sweep;
        let lines = header_lines(("local", "shm", 2), "auto", &cfg, &wire(), false);
        assert_eq!(lines.len(), 2, "no WARNING on a quiet wire: {lines:?}");
        for l in &lines {
            assert!(l.len() <= 120, "{} > 120: {l}", l.len());
        }
    }

    /// The footer: nccl-tests' two lines and a headline per collective; a
    /// WARNING line only for what fired, in either layout for the noise.
    #[test]
    fn a_warning_is_one_line_and_only_when_it_fires() {
        let mut r = crate::test_rows::row();
        r.busbw_gbps = 4.0;
        r.ceiling_gbps = 8.0;
        let noise = |fraction: f64| parbench::measure::noise::ForeignCpu {
            wall_s: 10.0,
            cpus: 2,
            host_s: 0.0,
            own_s: 0.0,
            steal_s: 0.0,
            foreign_s: 20.0 * fraction,
            fraction,
            resolution: 0.01,
            method: String::new(),
        };
        let summary = |fraction: f64| Summary {
            headlines: crate::summary::Headline::of(std::slice::from_ref(&r), None),
            fits: Vec::new(),
            above_ceiling: Vec::new(),
            straggler: None,
            wrong: 0,
            noise: Some(noise(fraction)),
            noise_per_collective: Vec::new(),
            link: None,
        };
        let quiet = footer_lines(&summary(0.02), 0, &[4.0]);
        assert_eq!(quiet.len(), 3, "{quiet:?}");
        assert!(quiet.iter().all(|l| !l.contains("WARNING")), "{quiet:?}");
        assert_eq!(
            quiet[2],
            "# all_reduce: peak busbw 4.0 GB/s at 1 KiB, out of place, 50% of the wire's ceiling"
        );
        let noisy = footer_lines(&summary(0.3), 0, &[4.0]);
        assert_eq!(noisy.len(), 4, "{noisy:?}");
        assert!(noisy[3].starts_with("# WARNING: a noisy run"), "{noisy:?}");
        assert_eq!(
            noise_warning(&summary(0.3)).as_deref(),
            Some(noisy[3].as_str())
        );
        assert_eq!(noise_warning(&summary(0.02)), None);
    }
}
