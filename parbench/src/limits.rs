//! The limits every binary holds its flags to, stated once, and the memory
//! check each does before it allocates anything.
//!
//! A flag that asks for more than a machine can give is bad input: one
//! line naming the flag and the bytes, exit code 2, before any buffer is
//! allocated (not an allocator's abort after the table's header). The
//! estimates count the buffers the run holds at once (per rank, times the
//! ranks on this host) and are held against the memory the kernel says is
//! available now (`MemAvailable` in `/proc/meminfo`, and the cgroup's
//! `memory.max` when it is lower), or the GPU's memory with `--backend nccl`.

use std::time::Duration;

pub use crate::units::bytes_text;
use crate::units::number_text;

/// The longest `--timeout`: a day.
pub const MAX_TIMEOUT_S: f64 = 86_400.0;

/// The default deadline of every wait: a communicator's, a GPU's stream's.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Ranks as threads of one process (`--backend local`): every pair of
/// ranks shares a mailbox, so memory grows with the square of the ranks.
pub const MAX_LOCAL_RANKS: usize = 1024;
/// Ranks spawned as processes on one host (`--nprocs` with tcp).
pub const MAX_SPAWNED_RANKS: usize = 4096;
/// Stage ranks of a pipeline (`--stages`, rows of a schedule file): the
/// executor's links and the validator's grid grow with their square.
pub const MAX_PIPELINE_RANKS: usize = 256;
/// Stages of a pipeline schedule (ranks times chunks).
pub const MAX_STAGES: usize = 4096;
/// Microbatches of one pipeline step.
pub const MAX_MICROBATCHES: usize = 65_536;
/// Actions of one schedule over all ranks (idle steps included).
pub const MAX_ACTIONS: usize = 1 << 20;

/// Iterations of one measurement, every binary's count flags: timed
/// (`-n`, `--iters`, `--steps`), warm-up (`-w`, `--warmup`) and check
/// (`-c`). A timed iteration keeps an 8-byte time per rank (8 MB per rank
/// at the limit), and a million of the fastest calls (a few microseconds
/// each) already take seconds to minutes per size; nccl-tests' default is 20.
pub const MAX_ITERATIONS: usize = 1_000_000;
/// Repeats of a whole sweep (`-N`, nccl-tests' run cycles).
pub const MAX_RUN_CYCLES: usize = 1_000;

/// A count flag held to its limit: `n` itself, or one line naming the flag,
/// the value and the limit.
pub fn count(flag: &str, n: usize, max: usize) -> Result<usize, LimitError> {
    if n <= max {
        Ok(n)
    } else {
        Err(LimitError(format!(
            "{flag} {n}: at most {max} (the limit every binary holds this count to)"
        )))
    }
}

/// Open files one process of a job of `world` ranks over sockets may hold
/// at once: a data connection to every other rank and, on rank 0, the
/// store's connection from every rank (each twice over, for a duplicated
/// communicator's mesh), plus what any process holds (standard streams,
/// listeners, the results folder's files, the launcher's pipes).
pub fn open_files_needed(world: usize) -> u64 {
    4 * world as u64 + 64
}

/// Makes sure this process may open the files a job of `world` ranks over
/// sockets takes ([`open_files_needed`]): raises its soft limit (`ulimit
/// -n`) up to the hard one when that is enough (the ranks it starts inherit
/// it), and refuses in one line when the hard limit is lower. Checked
/// before any rank starts: past the limit a rank dies in its set-up with
/// "Connection reset by peer", which names no file descriptors.
pub fn check_open_files(world: usize) -> Result<(), LimitError> {
    let need = open_files_needed(world);
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid rlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 || lim.rlim_cur >= need {
        return Ok(());
    }
    if lim.rlim_max >= need {
        let raised = libc::rlimit {
            rlim_cur: need,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: a valid rlimit; raising the soft limit up to the hard one is always allowed.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return Ok(());
        }
    }
    Err(LimitError(format!(
        "a job of {world} ranks over sockets needs about {need} open files per process; this one may open {} (ulimit -n, hard limit {}): raise it, or run fewer ranks",
        lim.rlim_cur, lim.rlim_max
    )))
}

/// The range a device's or a wire's figure must lie in, as a flag or a
/// file gives it: beyond it lies no accelerator or network, only a typo
/// (a figure a million times too small makes a step of years).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Plausible {
    pub unit: &'static str,
    pub min: f64,
    pub max: f64,
}

/// Compute rates: 1 GFLOP/s to an exaFLOP/s.
pub const TFLOPS: Plausible = Plausible {
    unit: "TFLOP/s",
    min: 1e-3,
    max: 1e6,
};
/// Memory and wire bandwidths: 1 MB/s to a PB/s.
pub const GBPS: Plausible = Plausible {
    unit: "GB/s",
    min: 1e-3,
    max: 1e6,
};
/// Memory per device: 1 MiB to 100,000 GiB.
pub const GIB: Plausible = Plausible {
    unit: "GiB",
    min: 1.0 / 1024.0,
    max: 1e5,
};
/// A wire's latency: up to a second.
pub const LATENCY_US: Plausible = Plausible {
    unit: "us",
    min: 0.0,
    max: 1e6,
};

impl Plausible {
    /// Whether `v` lies in the range, both ends included.
    pub fn holds(&self, v: f64) -> bool {
        v.is_finite() && v >= self.min && v <= self.max
    }

    /// `v` itself, or one line naming `what`, the value and the range.
    pub fn check(&self, what: &str, v: f64) -> Result<f64, LimitError> {
        if self.holds(v) {
            Ok(v)
        } else {
            Err(LimitError(format!(
                "{what} {}: expected {} to {} {}",
                number_text(v),
                number_text(self.min),
                number_text(self.max),
                self.unit
            )))
        }
    }
}

/// A flag that asks for more than the limits or the machine allow.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct LimitError(pub String);

/// The shortest `--timeout`: a millisecond, below which no rank can even
/// answer its peer.
pub const MIN_TIMEOUT_S: f64 = 0.001;

/// `-T/--timeout SECONDS` as every binary takes it: a millisecond to a
/// day; 0 is nccl-tests' "no timeout", which parbench, keeping a deadline
/// on every wait, reads as the longest it takes.
pub fn timeout(secs: f64) -> Result<Duration, LimitError> {
    if secs == 0.0 {
        return Ok(Duration::from_secs_f64(MAX_TIMEOUT_S));
    }
    if secs.is_finite() && (MIN_TIMEOUT_S..=MAX_TIMEOUT_S).contains(&secs) {
        Ok(Duration::from_secs_f64(secs))
    } else {
        Err(LimitError(format!(
            "--timeout {}: a number of seconds from {MIN_TIMEOUT_S} to {MAX_TIMEOUT_S} (0: the longest)",
            number_text(secs)
        )))
    }
}

/// Memory this process may still take, in bytes, and where the figure
/// comes from: `MemAvailable`, or the cgroup's limit less its use when
/// that is lower. `None` where neither can be read.
pub fn available_memory() -> Option<(u64, &'static str)> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok().and_then(|t| {
        t.lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb.saturating_mul(1024))
    });
    let cgroup = (|| {
        let max = std::fs::read_to_string("/sys/fs/cgroup/memory.max").ok()?;
        let max: u64 = max.trim().parse().ok()?; // "max" means no limit
        let cur: u64 = std::fs::read_to_string("/sys/fs/cgroup/memory.current")
            .ok()?
            .trim()
            .parse()
            .ok()?;
        Some(max.saturating_sub(cur))
    })();
    let found = match (meminfo, cgroup) {
        (Some(m), Some(c)) if c < m => Some((c, "the cgroup's memory.max less its use")),
        (Some(m), _) => Some((m, "MemAvailable")),
        (None, Some(c)) => Some((c, "the cgroup's memory.max less its use")),
        (None, None) => None,
    };
    // An address-space cap (ulimit -v) ends an allocation past it with an
    // abort, whatever the machine has free.
    match (found, address_space_left()) {
        (Some((m, _)), Some(a)) if a < m => Some((
            a,
            "the address-space limit (ulimit -v) less this process's size",
        )),
        (None, Some(a)) => Some((
            a,
            "the address-space limit (ulimit -v) less this process's size",
        )),
        (f, _) => f,
    }
}

/// What `RLIMIT_AS` leaves this process, when it sets one: the limit less
/// its virtual size now.
fn address_space_left() -> Option<u64> {
    // SAFETY: rlimit is plain data that getrlimit fills.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: a valid resource and a valid struct to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) } != 0
        || lim.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let size_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(lim.rlim_cur.saturating_sub(size_kb.saturating_mul(1024)))
}

/// Refuses a run whose flags imply `need` bytes on this host when the
/// machine has less available. `flag` names what to change; `what` says
/// how the figure is made up. Passes when the memory cannot be read.
pub fn check_host_memory(need: u128, flag: &str, what: &str) -> Result<(), LimitError> {
    match available_memory() {
        Some((have, source)) => check_memory(need, have as u128, flag, what, source),
        None => Ok(()),
    }
}

/// [`check_host_memory`] against a given figure (`have` bytes, `source`
/// says what it is: `MemAvailable`, `GPU 0's memory`).
pub fn check_memory(
    need: u128,
    have: u128,
    flag: &str,
    what: &str,
    source: &str,
) -> Result<(), LimitError> {
    if need <= have {
        return Ok(());
    }
    Err(LimitError(format!(
        "{flag}: the run needs about {} ({what}) but this machine has {} ({source})",
        bytes_text(need),
        bytes_text(have)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_from_a_millisecond_up_to_a_day() {
        assert_eq!(timeout(2.5).unwrap(), Duration::from_millis(2500));
        assert_eq!(timeout(0.001).unwrap(), Duration::from_millis(1));
        assert_eq!(timeout(0.0).unwrap(), Duration::from_secs(86_400));
        for bad in [-1.0, f64::NAN, f64::INFINITY, 86_401.0, 1e-300] {
            let e = timeout(bad).unwrap_err().0;
            assert!(e.starts_with("--timeout") && e.len() < 100, "{e}");
        }
    }

    #[test]
    fn a_figure_outside_its_range_is_one_short_line() {
        assert_eq!(TFLOPS.check("x", 989.0), Ok(989.0));
        assert_eq!(
            GIB.check("--device-memory", 1e300).unwrap_err().0,
            "--device-memory 1e300: expected 0.0009765625 to 100000 GiB"
        );
        assert!(!LATENCY_US.holds(f64::NAN) && LATENCY_US.holds(0.0));
    }

    #[test]
    fn memory_is_read_and_checked() {
        let (have, source) = available_memory().expect("/proc/meminfo on Linux");
        assert!(have > 0, "{source}");
        assert_eq!(bytes_text(512), "512 B");
        assert_eq!(bytes_text(64 << 30), "64.0 GiB");
        let e = check_memory(64 << 30, 1 << 30, "-e/--max-bytes 64G", "x", "MemAvailable")
            .unwrap_err()
            .0;
        assert_eq!(
            e,
            "-e/--max-bytes 64G: the run needs about 64.0 GiB (x) but this machine has 1.0 GiB (MemAvailable)"
        );
        assert!(check_memory(1, 1, "f", "x", "s").is_ok());
        assert!(check_host_memory(u128::MAX, "f", "x").is_err());
    }
}
