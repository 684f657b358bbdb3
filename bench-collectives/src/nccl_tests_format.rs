//! `--format nccl-tests`: nccl-tests' (v2.19.6) table, column for column, so
//! that a script written for `all_reduce_perf`'s output reads parbench's
//! unchanged: its header lines, its five leading columns, `time algbw busbw
//! #wrong` out of place then in place, its units row, and its two footers.
//! One block per collective, each opened and closed as one nccl-tests binary
//! would; rows are 118 characters wide.

use crate::config::Step;
use parbench::comm::{Collective, ReduceOp};
use parbench::launch::flags::Backend;
use parbench::results::CollectiveRow;

/// The nccl-tests binary whose output a collective's block stands for.
pub fn program_name(coll: Collective) -> &'static str {
    coll.spec().nccl_tests_binary()
}

/// C's `%g` (six significant digits, trailing zeros dropped, an exponent
/// of at least two digits): the footer's and `#wrong`'s number format.
pub fn c_g(x: f64) -> String {
    if !x.is_finite() {
        return if x.is_nan() {
            "nan".into()
        } else if x > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        };
    }
    if x == 0.0 {
        return "0".into();
    }
    const P: i32 = 6;
    let sci = format!("{:.*e}", (P - 1) as usize, x);
    let exp: i32 = sci
        .rsplit('e')
        .next()
        .and_then(|e| e.parse().ok())
        .unwrap_or(0);
    if !(-4..P).contains(&exp) {
        let (mant, _) = sci.split_once('e').unwrap_or((&sci, ""));
        format!(
            "{}e{}{:02}",
            trim_zeros(mant),
            if exp < 0 { '-' } else { '+' },
            exp.abs()
        )
    } else {
        trim_zeros(&format!("{:.*}", (P - 1 - exp) as usize, x)).to_string()
    }
}

fn trim_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

/// C's `%*.*e` (`1.5e+07`), right-aligned in `width`.
fn c_e(x: f64, prec: usize, width: usize) -> String {
    let sci = format!("{x:.prec$e}");
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let s = format!("{mant}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    format!("{s:>width$}")
}

/// A figure in `width` characters the way nccl-tests fits it: two
/// decimals, else one, else none, else an exponent.
pub fn fit_float(x: f64, width: usize) -> String {
    for prec in [2usize, 1, 0] {
        let s = format!("{x:>width$.prec$}");
        if s.len() <= width {
            return s;
        }
    }
    c_e(x, if width >= 7 { 1 } else { 0 }, width)
}

/// Per-iteration statistics as nccl-tests computes them (population
/// stdev; p95/p99 at index min(n-1, ceil(n p / 100) - 1) of the sorted
/// times): what `-J` writes and `-I 1`'s columns print.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IterStats {
    pub min: f64,
    pub max: f64,
    pub avg: f64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub stdev: f64,
    /// stdev / avg x 100 (0 for a zero average).
    pub cv_pct: f64,
}

impl IterStats {
    /// `None` for no iterations.
    pub fn of(times_us: &[f64]) -> Option<IterStats> {
        let mut s = times_us.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let last = n.checked_sub(1)?;
        let pct = |p: usize| s[last.min((n * p).div_ceil(100).saturating_sub(1))];
        let avg = s.iter().sum::<f64>() / n as f64;
        let stdev = (s.iter().map(|t| (t - avg).powi(2)).sum::<f64>() / n as f64).sqrt();
        Some(IterStats {
            min: s[0],
            max: s[last],
            avg,
            p50: s[n / 2],
            p95: pct(95),
            p99: pct(99),
            stdev,
            cv_pct: if avg > 0.0 { stdev / avg * 100.0 } else { 0.0 },
        })
    }
}

/// What the run header says about the job.
pub struct JobInfo<'a> {
    pub backend: &'a str,
    pub wire: &'a str,
    pub world: usize,
    /// Ranks this process runs (threads of the local backend, GPUs of nccl).
    pub in_process: usize,
    /// `-b` and `-e` as given (nccl-tests prints the flags, not the sizes swept).
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub step: Step,
    pub warmup: usize,
    pub iters: usize,
    pub check: usize,
    pub graph: usize,
    /// `-z` as given: nccl-tests names a blocking mode in its header.
    pub blocking: u8,
    /// NCCL's version code where NCCL ran, else 0.
    pub nccl_version: u64,
    /// `-I 1`: nccl-tests' per-iteration columns.
    pub per_iter: bool,
}

/// nccl-tests' first line. Without NCCL there are no headers or library to
/// name: 0, and the parbench line after the closing lines says why.
pub fn version_line(nccl_version: u64) -> String {
    format!("# nccl-tests version 2.19.6 nccl-headers={nccl_version} nccl-library={nccl_version}")
}

/// parbench's own line, kept after nccl-tests' closing lines so that a
/// reader of nccl-tests' header finds its lines where it expects them.
pub fn parbench_line(j: &JobInfo<'_>) -> String {
    let nccl = if j.nccl_version == 0 {
        "no NCCL ran, so nccl-headers and nccl-library read 0".to_string()
    } else {
        format!("NCCL {}", j.nccl_version)
    };
    format!(
        "# parbench bench-collectives {} wrote the blocks above in nccl-tests 2.19.6's layout (backend {}, wire {}; {nccl})",
        env!("CARGO_PKG_VERSION"),
        j.backend,
        j.wire
    )
}

/// nccl-tests' header from its nThread line to its `# Using devices` list
/// (one line per rank), as each block repeats it after its starting line.
pub fn device_report(j: &JobInfo<'_>) -> Vec<String> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into());
    let pid = std::process::id();
    let (step, unit) = match j.step {
        Step::Factor(f) => (f, "factor"),
        Step::Bytes(b) => (b, "bytes"),
    };
    let mut out = vec![format!(
        "# nThread {} nGpus 1 minBytes {} maxBytes {} step: {step}({unit}) warmup iters: {} iters: {} agg iters: 1 validation: {} graph: {} unalign: 0",
        j.in_process, j.min_bytes, j.max_bytes, j.warmup, j.iters, j.check, j.graph
    )];
    // nccl-tests' own words for each -z mode, trailing space included.
    match j.blocking {
        1 => out.push("# Blocking Enabled: wait and barrier after each inner iteration (-m) ".into()),
        2 => out.push("# Blocking Enabled: wait after each inner iteration (-m), no barrier ".into()),
        3 => out.push("# Blocking Enabled: wait and barrier after each outer iteration (-n); time excludes barrier ".into()),
        _ => {}
    }
    if j.per_iter {
        // nccl-tests times iterations with CUDA events; parbench's CPU
        // backends with the host's clock, and the line says which.
        let clock = if Backend::named(j.backend).is_some_and(Backend::on_gpus) {
            "CUDA event"
        } else {
            "host clock"
        };
        out.push(format!(
            "# Per-Iteration Report: {clock} timing; i_* uses max over process rows "
        ));
    }
    out.push("#".into());
    out.push("# Using devices".into());
    for rank in 0..j.world {
        // Ranks in other processes: their pid is not known to rank 0 (-1).
        let pid = if j.in_process == j.world || rank == 0 {
            pid as i64
        } else {
            -1
        };
        out.push(format!(
            "#  Rank {rank:2} Group  0 Pid {pid:6} on {host:>10} device {rank:2} [0000:00:00] {}",
            j.wire
        ));
    }
    out
}

/// nccl-tests' three column-header lines (with `-I 1`'s columns when `per_iter`).
pub fn column_header(per_iter: bool) -> [String; 3] {
    let e = "";
    if per_iter {
        let side = |w: [&str; 8]| {
            format!(
                "  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>7}  {:>7}  {:>7}",
                w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]
            )
        };
        let names = [
            "time", "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%",
        ];
        let units = [
            "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(%)",
        ];
        return [
            format!("#\n# {e:>10}  {e:>12}  {e:>8}  {e:>6}  {e:>6}              out-of-place (+ per-iteration)                                in-place (+ per-iteration)"),
            format!(
                "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}{}{} ",
                "size", "count", "type", "redop", "root", side(names), side(names)
            ),
            format!(
                "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}{}{} ",
                "(B)", "(elements)", e, e, e, side(units), side(units)
            ),
        ];
    }
    [
        format!("#\n# {e:>10}  {e:>12}  {e:>8}  {e:>6}  {e:>6}           out-of-place                       in-place          "),
        format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} ",
            "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"
        ),
        format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} ",
            "(B)", "(elements)", e, e, e, "(us)", "(GB/s)", "(GB/s)", e, "(us)", "(GB/s)", "(GB/s)", e
        ),
    ]
}

/// One placement's four columns, and with `-I 1` its per-iteration
/// statistics' four; `None` (not measured) is blank, as nccl-tests leaves
/// a placement it did not run.
fn placement(r: Option<&CollectiveRow>, checked: bool, per_iter: Option<&[f64]>) -> String {
    match r {
        Some(r) => {
            let iters = match per_iter.map(IterStats::of) {
                Some(Some(st)) => format!(
                    "  {}  {}  {}  {}",
                    fit_float(st.min, 7),
                    fit_float(st.max, 7),
                    fit_float(st.p99, 7),
                    fit_float(st.cv_pct, 7)
                ),
                _ => String::new(),
            };
            // nccl-tests: "  %6g" when checked, "    N/A" (one column
            // narrower) when not.
            let wrong = if checked {
                format!("  {:>6}", c_g(r.wrong as f64))
            } else {
                "    N/A".to_string()
            };
            format!(
                "  {}  {}  {}{wrong}{iters}",
                fit_float(r.time_us, 7),
                fit_float(r.algbw_gbps, 6),
                fit_float(r.busbw_gbps, 6)
            )
        }
        None => " ".repeat(32),
    }
}

/// nccl-tests' five leading columns of a row: size, count, type, redop,
/// root (-1 for a collective without one); parbench's table starts its rows
/// with them too.
pub fn preamble(
    coll: Collective,
    (bytes, count): (u64, usize),
    dtype: parbench::comm::DType,
    op: Option<ReduceOp>,
    root: usize,
) -> String {
    let root = if coll.rooted() { root as i64 } else { -1 };
    let op = op.map_or("none", ReduceOp::name);
    format!(
        "{bytes:>12}  {count:>12}  {:>8}  {op:>6}  {root:>6}",
        dtype.name()
    )
}

/// One size's line: the leading columns, out of place, in place. `count`
/// is per rank, as nccl-tests prints it (and the records hold it);
/// `per_iter`, with `-I 1`, each placement's per-iteration times.
// A row's line has as many parts as nccl-tests' preamble and bodies.
#[allow(clippy::too_many_arguments)]
pub fn row_line(
    coll: Collective,
    (bytes, count): (u64, usize),
    dtype: parbench::comm::DType,
    op: Option<ReduceOp>,
    root: usize,
    measured: &[Option<CollectiveRow>; 2],
    checked: bool,
    per_iter: Option<[&[f64]; 2]>,
) -> String {
    let mut line = preamble(coll, (bytes, count), dtype, op, root);
    let times = |k: usize| per_iter.map(|t| t[k]);
    line.push_str(&placement(measured[0].as_ref(), checked, times(0)));
    if measured[1].is_some() {
        line.push_str(&placement(measured[1].as_ref(), checked, times(1)));
    }
    line
}

/// nccl-tests' average bus bandwidth: the plain mean of every busbw printed
/// (both placements). NaN for none, as nccl-tests' 0/0.
pub fn mean_busbw(busbw: &[f64]) -> f64 {
    busbw.iter().sum::<f64>() / busbw.len() as f64
}

/// `NCCL_TESTS_MIN_BW`, read as nccl-tests reads it (`atof`: a value that
/// is not a number is 0). nccl-tests fails a run whose average is below
/// 90% of it.
pub fn min_bw_from_env() -> Option<f64> {
    let v = std::env::var("NCCL_TESTS_MIN_BW").ok()?;
    Some(atof(&v))
}

/// C's `atof`: the longest leading number, 0 when there is none.
fn atof(s: &str) -> f64 {
    let s = s.trim_start();
    (1..=s.len())
        .rev()
        .filter(|&i| s.is_char_boundary(i))
        .find_map(|i| s[..i].parse::<f64>().ok().filter(|x| !x.is_nan()))
        .unwrap_or(0.0)
}

/// Whether an average passes `NCCL_TESTS_MIN_BW` (`None`: not checked).
pub fn min_bw_ok(avg: f64, min_bw: Option<f64>) -> Option<bool> {
    // nccl-tests fails only `bw < 0.9 min` (a NaN average passes).
    min_bw.map(|m| avg.partial_cmp(&(m * 0.9)) != Some(std::cmp::Ordering::Less))
}

/// The closing lines of a collective's block: the placements that found
/// wrong elements, the mean busbw over every figure printed (checked
/// against `NCCL_TESTS_MIN_BW`), the concluding line, and nccl-tests'
/// final `#` and blank line.
pub fn footer(errors: u64, busbw: &[f64], program: &str, min_bw: Option<f64>) -> Vec<String> {
    let avg = mean_busbw(busbw);
    let verdict = match min_bw_ok(avg, min_bw) {
        None => "",
        Some(true) => "OK",
        Some(false) => "FAILED",
    };
    vec![
        format!(
            "# {:<20} : {} {}",
            "Out of bounds values",
            errors,
            if errors == 0 { "OK" } else { "FAILED" }
        ),
        format!("# {:<20} : {} {verdict}", "Avg bus bandwidth", c_g(avg)),
        "#".to_string(),
        format!("# Collective test concluded: {program}"),
        "#".to_string(),
        String::new(),
    ]
}

/// The running state of one collective's block between its header and footers.
#[derive(Debug)]
pub struct Block {
    program: &'static str,
    /// Ranks that found a wrong element, summed over placements (nccl-tests'
    /// "out of bounds": each rank counts each failing placement).
    errors: u64,
    busbw: Vec<f64>,
}

/// Prints nccl-tests' layout as rows come, closing each collective's block.
#[derive(Debug, Default)]
pub struct Table {
    open: Option<Block>,
    /// The version line and the device report, repeated by every block as
    /// one `*_perf` binary would print them.
    version: String,
    devices: Vec<String>,
    min_bw: Option<f64>,
    /// `-I 1`: the per-iteration columns.
    pub per_iter: bool,
}

impl Table {
    /// Keeps the header every block repeats.
    pub fn set_job(&mut self, j: &JobInfo<'_>) {
        self.version = version_line(j.nccl_version);
        self.devices = device_report(j);
        self.min_bw = min_bw_from_env();
        self.per_iter = j.per_iter;
    }

    /// The lines that open a collective's block (closing the previous one).
    pub fn start(&mut self, coll: Collective) -> Vec<String> {
        let mut out = self.close();
        out.push(self.version.clone());
        out.push(format!(
            "# Collective test starting: {}",
            program_name(coll)
        ));
        out.extend(self.devices.iter().cloned());
        out.extend(
            column_header(self.per_iter)
                .iter()
                .flat_map(|l| l.lines().map(str::to_string).collect::<Vec<_>>()),
        );
        self.open = Some(Block {
            program: program_name(coll),
            errors: 0,
            busbw: Vec::new(),
        });
        out
    }

    /// Takes a printed row's figures into the footers' sums: busbw, and
    /// for nccl-tests' out-of-bounds count the ranks that found a wrong
    /// element in each placement.
    pub fn add(&mut self, measured: &[Option<CollectiveRow>; 2], ranks_wrong: [u64; 2]) {
        if let Some(b) = &mut self.open {
            for (r, ranks) in measured.iter().zip(ranks_wrong) {
                if let Some(r) = r {
                    b.errors += ranks;
                    b.busbw.push(r.busbw_gbps);
                }
            }
        }
    }

    /// The footers of the open block, if one is open.
    pub fn close(&mut self) -> Vec<String> {
        match self.open.take() {
            Some(b) => footer(b.errors, &b.busbw, b.program, self.min_bw),
            None => Vec::new(),
        }
    }
}

/// Why the run fails `NCCL_TESTS_MIN_BW`, if it does: the collectives
/// whose average busbw is below 90% of it, each with its average.
pub fn min_bw_failure(rows: &[CollectiveRow]) -> Option<String> {
    let min_bw = min_bw_from_env()?;
    let below = below_min_bw(rows, Some(min_bw));
    if below.is_empty() {
        return None;
    }
    let each: Vec<String> = below
        .iter()
        .map(|(c, bw)| format!("{c} {}", c_g(*bw)))
        .collect();
    Some(format!(
        "average bus bandwidth below 90% of NCCL_TESTS_MIN_BW={} GB/s (nccl-tests' rule): {}",
        c_g(min_bw),
        each.join(", ")
    ))
}

/// The collectives whose average busbw falls below `NCCL_TESTS_MIN_BW`
/// (by nccl-tests' rule), with that average: what fails the run.
pub fn below_min_bw(rows: &[CollectiveRow], min_bw: Option<f64>) -> Vec<(String, f64)> {
    let mut names: Vec<&str> = Vec::new();
    for r in rows {
        if !names.contains(&r.collective.as_str()) {
            names.push(&r.collective);
        }
    }
    names
        .into_iter()
        .filter_map(|c| {
            let bw: Vec<f64> = rows
                .iter()
                .filter(|r| r.collective == c)
                .map(|r| r.busbw_gbps)
                .collect();
            let avg = mean_busbw(&bw);
            (min_bw_ok(avg, min_bw) == Some(false)).then(|| (c.to_string(), avg))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_formatted_as_c_formats_them() {
        assert_eq!(c_g(0.0), "0");
        assert_eq!(c_g(12.0), "12");
        assert_eq!(c_g(0.123456789), "0.123457");
        assert_eq!(c_g(123456.7), "123457");
        assert_eq!(c_g(1234567.0), "1.23457e+06");
        assert_eq!(c_g(0.00001234), "1.234e-05");
        assert_eq!(fit_float(4.126, 7), "   4.13");
        assert_eq!(fit_float(12345.678, 7), "12345.7");
        assert_eq!(fit_float(1234567.8, 7), "1234568");
        assert_eq!(fit_float(12345678.0, 7), "1.2e+07");
        assert_eq!(fit_float(123456.0, 6), "123456");
        assert_eq!(fit_float(1234567.0, 6), " 1e+06");
    }

    #[test]
    fn the_header_lines_up_with_the_rows() {
        let [_, names, units] = column_header(false);
        let row = format!(
            "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}",
            8, 2, "float", "sum", -1
        );
        // Each header name ends where its column ends.
        assert_eq!(names.find("root").map(|i| i + 4), Some(row.len()));
        assert_eq!(units.len(), names.len());
        assert_eq!(
            footer(0, &[1.0, 2.0], "x", None)[..2],
            [
                "# Out of bounds values : 0 OK".to_string(),
                "# Avg bus bandwidth    : 1.5 ".to_string()
            ]
        );
        assert_eq!(
            footer(3, &[1.0], "x", None)[0],
            "# Out of bounds values : 3 FAILED"
        );
        // NCCL_TESTS_MIN_BW: FAILED below 90% of it, OK from there.
        assert_eq!(
            footer(0, &[8.9], "x", Some(10.0))[1],
            "# Avg bus bandwidth    : 8.9 FAILED"
        );
        assert_eq!(
            footer(0, &[9.0], "x", Some(10.0))[1],
            "# Avg bus bandwidth    : 9 OK"
        );
        assert_eq!(
            footer(0, &[1.0], "x", None)[4..],
            ["#".to_string(), String::new()]
        );
    }

    #[test]
    fn per_iteration_columns_line_up_with_their_header() {
        let [_, names, units] = column_header(true);
        assert_eq!(names.len(), units.len());
        // nccl-tests' names, each ending where its column ends.
        assert!(
            names.ends_with("  i_min    i_max    i_p99    i_cv% "),
            "{names:?}"
        );
        let row = crate::test_rows::row();
        let line = row_line(
            Collective::AllReduce,
            (8, 2),
            parbench::comm::DType::F32,
            Some(ReduceOp::Sum),
            0,
            &[Some(row.clone()), Some(row)],
            true,
            Some([&[1.0, 3.0], &[2.0, 2.0]]),
        );
        assert_eq!(line.len() + 1, names.len(), "{line:?}\n{names:?}");
        assert!(
            line.ends_with("     2.00     2.00     2.00     0.00"),
            "{line:?}"
        );
    }

    #[test]
    fn min_bw_reads_as_atof_does() {
        assert_eq!(atof("12.5"), 12.5);
        assert_eq!(atof(" 7GB"), 7.0);
        assert_eq!(atof("abc"), 0.0);
        assert_eq!(atof(""), 0.0);
    }
}
