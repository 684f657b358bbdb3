//! `report compare`'s output: the changes as a text or Markdown table,
//! regressions first. Judging lives in the parent module; this only prints.

use super::{Change, CompareArgs, Comparison, Verdict, Worse};
use crate::table::Table;
use crate::units;
use std::collections::BTreeSet;

fn change_text(c: &Change, relative: f64) -> String {
    match c.worse {
        Worse::HigherFraction | Worse::LowerFraction => format!("{:+.1} pt", relative * 100.0),
        _ => units::signed_percent(relative),
    }
}

/// The changes, one row a figure: `full` adds how much worse, the rounds
/// on each side and the time change against the floor (`-v`, Markdown).
fn changes_table(changes: &[&Change], full: bool) -> Table {
    let mut header = vec![
        "suite / key",
        "figure",
        "baseline",
        "current",
        "change",
        "noise",
    ];
    if full {
        header.extend(["worse by", "rounds", "time change / floor"]);
    }
    let mut t = Table::new(header);
    for c in changes {
        let value = |v: f64| match c.worse {
            Worse::HigherFraction | Worse::LowerFraction => units::percent(v),
            _ => units::sig3(v),
        };
        let raw = match c.worse {
            Worse::HigherFraction | Worse::LowerFraction => c.current - c.baseline,
            _ => c.current / c.baseline - 1.0,
        };
        let mut row = vec![
            format!("{} {}", c.suite, c.key),
            c.figure.to_string(),
            value(c.baseline),
            value(c.current),
            change_text(c, raw),
            match c.worse {
                Worse::HigherFraction | Worse::LowerFraction => {
                    format!("{:.1} pt", c.noise * 100.0)
                }
                _ => units::percent(c.noise),
            },
        ];
        if full {
            row.extend([
                change_text(c, c.worse_by),
                format!("{} / {}", c.rounds.0, c.rounds.1),
                match c.time_change_us {
                    Some(d) => format!("{d:+.3} / {:.3} us", c.floor_us),
                    None => "-".into(),
                },
            ]);
        }
        t.row(row);
    }
    t
}

/// Longest line of the text output, in characters (a table may be wider
/// only when a key from the records is).
pub const WIDTH: usize = 120;

/// What a comparison of single rounds can and cannot tell, for `n` figures.
pub fn one_round_note(n: usize, verbose: bool) -> String {
    let mut s =
        format!("One round on a side for {n} figures: their run-to-run noise was not measured");
    if verbose {
        s.push_str(" (the row's own spread below its median stands in for it, and two runs of one build on a shared host can differ beyond it); for a gate, compare several rounds a side (scripts/nightly.sh --rounds, default 7)");
    } else {
        s.push_str(" (-v: what that means)");
    }
    s.push('.');
    s
}

/// The rule in one line, with the noise limit it was judged at.
fn rule_short(noise_limit: f64) -> String {
    format!(
        "Rule: quiet runs only (others took at most {}); worse beyond threshold, noise, every round and floor;",
        units::percent(noise_limit)
    )
}

/// The rule, in one paragraph, with the noise limit it was judged at.
pub fn rule(noise_limit: f64) -> String {
    format!(
        "A regression: rows of quiet runs only (other processes took at most {} of the machine during the run and the row's table; --noise-limit); the median over the rounds worse by more than the threshold and by more than the noise (the rounds' spread, max - min over the median, with 2+ rounds, else the row's spread below its median); with 2+ rounds on both sides, every current round worse than every baseline round; and a time change above the floor (clock resolution or latency jitter, the larger, from run.json).",
        units::percent(noise_limit)
    )
}

/// `text` broken at spaces into lines of at most [`WIDTH`] characters.
pub fn wrap(text: &str) -> String {
    parbench::term::wrap(text, "", WIDTH)
}

/// The comparison as text or Markdown.
pub fn render(cmp: &Comparison, args: &CompareArgs) -> String {
    let regs = cmp.with(Verdict::Regression);
    let imps = cmp.with(Verdict::Improvement);
    let not_judged = cmp.with(Verdict::NotJudged);
    let cannot = cmp.with(Verdict::CannotJudge);
    let same = cmp.changes.len() - regs.len() - imps.len() - not_judged.len() - cannot.len();
    let md = args.markdown;
    // Strings from the command line or the records, escaped for the format.
    let user = |s: &str| {
        if md {
            crate::table::markdown_text(s)
        } else {
            crate::table::terminal_text(s)
        }
    };
    let mut out = String::new();
    let heading = |s: &str| {
        if md {
            format!("\n### {s}\n\n")
        } else {
            format!("\n{s}\n")
        }
    };
    if md {
        out.push_str("## parbench: current run against the baseline\n\n");
    }
    let rounds = |side: usize| {
        let mut r: Vec<usize> = cmp
            .changes
            .iter()
            .map(|c| if side == 0 { c.rounds.0 } else { c.rounds.1 })
            .filter(|&n| n > 0)
            .collect();
        r.sort_unstable();
        r.dedup();
        if r.is_empty() {
            return "0".to_string();
        }
        r.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("/")
    };
    // Markdown renders a paragraph whole; text is read in a terminal.
    let para = |s: String| if md { format!("{s}\n\n") } else { wrap(&s) };
    // The verdict first, then what it was judged on.
    out.push_str(&para(format!(
        "{} figures compared: {} regressions, {} improvements, {} unchanged, {} noisy: not judged, {} cannot be judged.",
        cmp.changes.len(),
        regs.len(),
        imps.len(),
        same,
        not_judged.len(),
        cannot.len(),
    )));
    out.push_str(&para(format!(
        "Threshold {:.1}%, noise limit {}, quiet rounds {} against {}: {} against {}.",
        args.threshold * 100.0,
        units::percent(args.noise_limit),
        rounds(1),
        rounds(0),
        user(&args.current().display().to_string()),
        user(&args.baseline_label()),
    )));
    if !(cmp.only_baseline.is_empty() && cmp.only_current.is_empty()) {
        out.push_str(&para(format!(
            "{} keys only in the baseline, {} only in the current run.",
            cmp.only_baseline.len(),
            cmp.only_current.len()
        )));
    }
    if !cmp.noisy_runs.is_empty() {
        out.push_str(&para(format!(
            "{} noisy runs' rounds left out, every figure judged on the other rounds where enough remain.",
            cmp.noisy_runs.len()
        )));
    }
    if md || args.verbose {
        out.push_str(&para(format!("Rule: {}", rule(args.noise_limit))));
    } else {
        out.push_str(&para(format!(
            "{} -v: in full.",
            rule_short(args.noise_limit)
        )));
    }
    if let Some(basis) = &cmp.compute_basis {
        out.push_str(&para(basis.describe()));
    }
    let single = cmp
        .changes
        .iter()
        .filter(|c| c.rounds.0 == 1 || c.rounds.1 == 1)
        .count();
    if single > 0 {
        out.push_str(&para(one_round_note(single, md || args.verbose)));
    }
    if !cmp.noisy_runs.is_empty() {
        out.push_str(&heading(
            "Noisy runs left out (their rounds; a figure is 'noisy: not judged' only when too few quiet rounds remain)",
        ));
        let mut t = Table::new(["folder", "run", "machine taken by other processes"]);
        for (side, id, f) in &cmp.noisy_runs {
            t.row([side.to_string(), id.clone(), units::percent(*f)]);
        }
        out.push_str(&if md { t.markdown() } else { t.text() });
    }
    let table = |t: Table| if md { t.markdown() } else { t.text() };
    if !regs.is_empty() {
        out.push_str(&heading("Regressions"));
        out.push_str(&table(changes_table(&regs, md || args.verbose)));
    }
    if !imps.is_empty() {
        out.push_str(&heading("Improvements"));
        out.push_str(&table(changes_table(&imps, md || args.verbose)));
    }
    if !not_judged.is_empty() {
        out.push('\n');
        out.push_str(&para(format!(
            "noisy: not judged: {} figures of {} keys (every row on one side, or all but one of the rounds it ran, came from a run noisier than the limit: --noise-limit to judge them).",
            not_judged.len(),
            not_judged
                .iter()
                .map(|c| (&c.suite, &c.key))
                .collect::<BTreeSet<_>>()
                .len()
        )));
    }
    for (title, keys) in [
        (
            "Only in the baseline (not measured now)",
            &cmp.only_baseline,
        ),
        ("Only in the current run (new)", &cmp.only_current),
    ] {
        if !keys.is_empty() {
            out.push_str(&heading(title));
            let mut t = Table::new(["suite", "key"]);
            for (s, k) in keys {
                t.row([s.to_string(), k.clone()]);
            }
            out.push_str(&table(t));
        }
    }
    out
}
