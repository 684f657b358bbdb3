//! What every binary's command line shares: standard output that a closed
//! pipe cannot crash, nccl-tests' `-np N` spelling, and prose broken into
//! short lines.
//!
//! The library still parses no flags of its own; these helpers live here
//! only so that the four binaries do not each carry a copy.

use std::ffi::OsString;
use std::io::Write;

/// Writes to standard output and ignores a failed write: after
/// `| head -1` closes the pipe the run goes on, quietly, so that what it
/// measured still reaches its records (`println!` would panic, exit 101).
pub fn write_out(args: std::fmt::Arguments<'_>) {
    // A live progress line on the same terminal goes first.
    crate::progress::clear();
    let mut out = std::io::stdout().lock();
    let _ = out.write_fmt(args);
    let _ = out.flush();
}

/// `println!` that a closed standard output cannot turn into a panic.
#[macro_export]
macro_rules! outln {
    () => {
        $crate::term::write_out(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::term::write_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` that a closed standard output cannot turn into a panic.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::term::write_out(format_args!($($arg)*))
    };
}

/// Rewrites nccl-tests' and mpirun's `-np N` (and `-np=N`) as `--nprocs N`:
/// clap has no two-letter short flags, and `-np` would otherwise read as
/// `-n p` (iterations).
pub fn rewrite_np<I, S>(argv: I) -> Vec<OsString>
where
    I: IntoIterator<Item = S>,
    S: Into<OsString>,
{
    argv.into_iter()
        .map(|a| {
            let a: OsString = a.into();
            match a.to_str() {
                Some("-np") => "--nprocs".into(),
                Some(s) if s.starts_with("-np=") => format!("--nprocs={}", &s[4..]).into(),
                _ => a,
            }
        })
        .collect()
}

/// Runs `cmd` with its standard output a pipe whose read end is already
/// closed: every write fails, as after `| head -1` has read its line, but
/// from the first write on, whatever the timing. The binaries' tests check
/// that the run then ends quietly (no panic, no exit 101).
pub fn run_with_closed_stdout(
    mut cmd: std::process::Command,
) -> std::io::Result<std::process::Output> {
    let (reader, writer) = std::io::pipe()?;
    drop(reader);
    cmd.stdout(writer).stderr(std::process::Stdio::piped());
    cmd.output()
}

/// Whether a run ended quietly: exit 0, no panic (exit code 101, or
/// "panicked" on standard error). The error says what it did instead.
pub fn ended_quietly(out: &std::process::Output) -> Result<(), String> {
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.success() && !err.contains("panicked") {
        Ok(())
    } else {
        Err(format!("{:?}: {err}", out.status))
    }
}

/// The longest line of prose a first screen prints, in characters (a
/// table may be wider, as nccl-tests' is).
pub const WIDTH: usize = 100;

/// `text` broken at spaces into lines of at most `width` characters (a
/// word longer than that stays whole), the first begun with `first`, the
/// others with `rest`; each ends in a newline.
pub fn wrap_hanging(text: &str, first: &str, rest: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = first.to_string();
    let mut empty = true;
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        if !empty && line.chars().count() + 1 + word.chars().count() > width {
            out.push_str(&line);
            out.push('\n');
            line = rest.to_string();
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    out.push_str(&line);
    out.push('\n');
    out
}

/// `text` broken into lines of at most `width` characters, each begun
/// with `indent`.
pub fn wrap(text: &str, indent: &str, width: usize) -> String {
    wrap_hanging(text, indent, indent, width)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn np_becomes_nprocs_and_nothing_else_changes() {
        let v = rewrite_np(["bin", "-np", "4", "-n", "3", "-np=2", "-npx"]);
        let v: Vec<&str> = v.iter().map(|s| s.to_str().unwrap()).collect();
        assert_eq!(v, ["bin", "--nprocs", "4", "-n", "3", "--nprocs=2", "-npx"]);
    }

    fn longest(text: &str) -> usize {
        text.lines().map(|l| l.chars().count()).max().unwrap_or(0)
    }

    #[test]
    fn prose_breaks_at_spaces_within_the_width() {
        let text = "one two three four five six seven eight nine ten";
        let out = wrap_hanging(text, "  ", "    ", 16);
        assert!(longest(&out) <= 16, "{out}");
        assert!(out.starts_with("  one two three\n    four"), "{out}");
        assert_eq!(out.split_whitespace().collect::<Vec<_>>().join(" "), text);
        // A word longer than the width stays whole, on its own line.
        assert_eq!(wrap("a abcdefghij b", "", 5), "a\nabcdefghij\nb\n");
        assert_eq!(wrap("short", "  ", 100), "  short\n");
    }
}
