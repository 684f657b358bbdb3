//! A live line on a terminal: what a binary measures now and how far it
//! is, on stderr, so that a long measurement is not a silent one. Quiet
//! when stderr is not a terminal (CI logs, pipes, files) or `TERM=dumb`:
//! nothing is written there, so records and logs stay as they were.
//!
//! The line is redrawn in place (`\r`, erase line) and erased before any
//! other output: [`crate::term::write_out`] and
//! [`crate::error_line::eprint_line`] call [`clear`] first, so a table row or
//! an error never lands in the middle of it. A small own line rather than
//! indicatif: the binaries need one line that the one stdout writer can
//! erase, not bars, styles or a drawing thread of their own.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Whether a live line is on the terminal now.
static SHOWN: AtomicBool = AtomicBool::new(false);

/// Most characters of a live line: one row of an 80-column terminal
/// (a wrapped line could not be erased with one `\r`).
const WIDTH: usize = 79;

/// Whether progress is drawn at all: stderr is a terminal that can erase
/// a line.
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        std::io::stderr().is_terminal() && std::env::var("TERM").map_or(true, |t| t != "dumb")
    })
}

fn write_err(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes());
    let _ = err.flush();
}

/// Draws `text` as the live line, in place of the one before.
pub fn show(text: &str) {
    if !enabled() {
        return;
    }
    let line: String = text.chars().take(WIDTH).collect();
    write_err(&format!("\r\x1b[2K{line}"));
    SHOWN.store(true, Ordering::SeqCst);
}

/// Erases the live line, if one is drawn.
pub fn clear() {
    if SHOWN.swap(false, Ordering::SeqCst) {
        write_err("\r\x1b[2K");
    }
}

/// A line that stays (what is about to take a while), on a terminal only.
pub fn note(text: &str) {
    if enabled() {
        clear();
        write_err(&format!("{text}\n"));
    }
}

/// `label: N s` redrawn every second while a measurement that reports no
/// steps of its own runs; dropped, it stops (within a tenth of a second)
/// and erases its line.
pub struct Ticker {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Ticker {
    /// Starts the counter; on a terminal only (elsewhere no thread starts).
    pub fn start(label: &str) -> Ticker {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = enabled().then(|| {
            let (stop, label) = (Arc::clone(&stop), label.to_string());
            std::thread::spawn(move || {
                let start = Instant::now();
                let mut shown_s = u64::MAX;
                while !stop.load(Ordering::SeqCst) {
                    let s = start.elapsed().as_secs();
                    if s != shown_s {
                        show(&format!("{label}: {s} s"));
                        shown_s = s;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        });
        Ticker { stop, thread }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quiet_off_a_terminal() {
        // cargo test captures stderr through a pipe or a file: not a terminal.
        if std::io::stderr().is_terminal() {
            return;
        }
        assert!(!enabled());
        show("x");
        assert!(
            !SHOWN.load(Ordering::SeqCst),
            "nothing drawn off a terminal"
        );
        let t = Ticker::start("y");
        assert!(t.thread.is_none(), "no thread off a terminal");
    }
}
