//! How a process reports a fault: one line on stderr, written whole.
//!
//! Several ranks of a job share one terminal (or one log file). A line
//! printed with `eprintln!` may reach the kernel as several writes (one per
//! formatted piece: stderr is unbuffered), and two ranks failing at once
//! then interleave byte by byte. [`eprint_line`] builds the whole line
//! first and hands it to the kernel in one `write(2)`: a write of up to
//! `PIPE_BUF` (4096) bytes to a pipe is never split, and a terminal or a
//! file takes it in one piece as well.

use std::time::Duration;

/// Writes `line` (a newline is added when it has none) to stderr in one
/// `write(2)`; a write the kernel cuts short (a line longer than a pipe
/// takes at once) is finished with further writes. Errors are ignored: a
/// closed stderr must not turn one fault into another.
pub fn eprint_line(line: &str) {
    crate::progress::clear();
    let line = printable(line);
    let mut bytes = Vec::with_capacity(line.len() + 1);
    bytes.extend_from_slice(line.as_bytes());
    if bytes.last() != Some(&b'\n') {
        bytes.push(b'\n');
    }
    let mut done = 0;
    while done < bytes.len() {
        let rest = &bytes[done..];
        // SAFETY: fd 2 and a valid buffer of `rest.len()` bytes.
        let n = unsafe { libc::write(2, rest.as_ptr().cast(), rest.len()) };
        if n > 0 {
            done += n as usize;
        } else if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        {
            continue;
        } else {
            return;
        }
    }
}

/// The longest word (a run without spaces) an error line echoes whole.
const MAX_WORD_CHARS: usize = 200;

/// `line` as it may reach a terminal: every control character (an escape
/// sequence, a NUL, a bell, a newline inside the line) written as an escape
/// (`\u{1b}`), so input echoed in an error can neither drive the terminal
/// nor break the one line into several; and every word longer than
/// [`MAX_WORD_CHARS`] (a 100 KB argument) cut to its start and how much
/// was left out. Every one-line error goes through it ([`eprint_line`]).
pub fn printable(line: &str) -> String {
    let line = line.strip_suffix('\n').unwrap_or(line);
    let mut out = String::with_capacity(line.len().min(4096));
    for (i, word) in line.split(' ').enumerate() {
        if i > 0 {
            out.push(' ');
        }
        let chars = word.chars().count();
        let (kept, cut) = if chars > MAX_WORD_CHARS {
            (MAX_WORD_CHARS / 2, chars - MAX_WORD_CHARS / 2)
        } else {
            (chars, 0)
        };
        for c in word.chars().take(kept) {
            if c.is_control() {
                out.extend(c.escape_default());
            } else {
                out.push(c);
            }
        }
        if cut > 0 {
            out.push_str(&format!("...[{cut} more characters]"));
        }
    }
    out
}

/// A rank's error as one line with one prefix: `rank N: ` at the front,
/// and nowhere else (the communicators' errors name their rank
/// themselves, and an error wrapped in another would say it twice:
/// `rank 2: setup failed: rank 2: ...`).
pub fn rank_line(rank: usize, msg: &str) -> String {
    let prefix = format!("rank {rank}: ");
    format!("{prefix}{}", msg.replace('\n', " ").replace(&prefix, ""))
}

/// A command-line parser's error as one line: its message before the
/// usage block and the hint after it, lines joined (clap lists missing
/// arguments on lines of their own).
pub fn first_line(text: &str) -> String {
    let msg: Vec<&str> = text
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .filter(|l| !l.is_empty())
        .collect();
    if msg.is_empty() {
        "bad command line".into()
    } else {
        msg.join(" ")
    }
}

/// The line a binary prints for a command-line parser's error (rendered
/// as `error: ...`, a usage block after it): `program: message`.
pub fn cli_error_line(program: &str, rendered: &str) -> String {
    let line = first_line(rendered);
    format!("{program}: {}", line.trim_start_matches("error: "))
}

/// A duration as people read it in an error: `850 us`, `35.2 ms`, `60.0 s`.
pub fn duration_text(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 1.0 {
        format!("{s:.1} s")
    } else if s >= 1e-3 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{:.0} us", s * 1e6)
    }
}

/// The name of a signal (`SIGKILL`), or its number when it has no common name.
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSTOP => "SIGSTOP",
        libc::SIGTSTP => "SIGTSTP",
        libc::SIGTTIN => "SIGTTIN",
        libc::SIGTTOU => "SIGTTOU",
        libc::SIGVTALRM => "SIGVTALRM",
        libc::SIGPROF => "SIGPROF",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_in_their_own_unit() {
        assert_eq!(duration_text(Duration::from_secs(60)), "60.0 s");
        assert_eq!(duration_text(Duration::from_millis(35)), "35.0 ms");
        assert_eq!(duration_text(Duration::from_nanos(2035)), "2 us");
        assert_eq!(duration_text(Duration::ZERO), "0 us");
    }

    #[test]
    fn echoed_input_cannot_drive_the_terminal_nor_flood_it() {
        let line = printable("invalid action '\u{1b}[2J\u{1b}]0;pwned\u{7}\0x\ny'\n");
        assert!(!line.chars().any(char::is_control), "{line:?}");
        assert!(line.contains("\\u{1b}[2J"), "{line}");
        let long = format!("-b '{}' at most", "9".repeat(100_000));
        let line = printable(&long);
        assert!(line.len() < 300, "{}", line.len());
        assert!(line.ends_with("more characters] at most"), "{line}");
        assert_eq!(printable("plain words: kept"), "plain words: kept");
    }

    #[test]
    fn first_lines_and_signals() {
        assert_eq!(first_line("\nerror: bad\n\nUsage: x\n"), "error: bad");
        assert_eq!(
            first_line("error: missing:\n  --a <A>\n  --b <B>\n\nUsage: x\n\nFor more information, try '--help'.\n"),
            "error: missing: --a <A> --b <B>"
        );
        assert_eq!(first_line(""), "bad command line");
        assert_eq!(signal_name(libc::SIGKILL), "SIGKILL");
        assert_eq!(signal_name(64), "signal 64");
        assert_eq!(rank_line(2, "rank 2: lost rank 1"), "rank 2: lost rank 1");
        assert_eq!(rank_line(2, "setup failed"), "rank 2: setup failed");
        assert_eq!(rank_line(1, "rank 12: x"), "rank 1: rank 12: x");
        assert_eq!(
            rank_line(0, "setup failed: rank 0: timed out"),
            "rank 0: setup failed: timed out"
        );
    }
}
