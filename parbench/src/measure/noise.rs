//! How much of the machine other processes took while a run measured: the
//! noise guard behind every figure.
//!
//! A benchmark on a shared machine measures the machine's leftovers. The
//! guard reads the host's CPU time (`/proc/stat`: user, nice, system, irq,
//! softirq, and steal, the time the hypervisor gave this machine's CPUs to
//! someone else) at the start and end of a window, and subtracts what the
//! run itself used (`/proc/self/stat`: this process, its threads and its
//! reaped children; ranks in other processes on the same host are
//! subtracted by [`ForeignCpu::across_ranks`]). What is left is CPU time
//! other processes took, as a fraction of the window's wall time times the
//! CPUs: 0.25 on 2 CPUs is half a core taken from the run.
//!
//! Resolution: the kernel counts in clock ticks (`USER_HZ`, 100 a second),
//! so a window shorter than a few hundred milliseconds reads as 0 or a
//! multiple of 10 ms per CPU; [`ForeignCpu::resolution_s`] says how coarse.
//! Off Linux nothing can be read and the functions return `None`.

use crate::comm::{CommResult, Communicator};
use std::sync::OnceLock;
use std::time::Instant;

/// Above this fraction of the machine taken by other processes a run is
/// noisy: its figures are printed, recorded and drawn, but not judged.
pub const NOISY_FRACTION: f64 = 0.10;

/// The host's and this process's CPU counters at one moment.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpuSnapshot {
    at: Instant,
    /// Host CPU time busy (user, nice, system, irq, softirq), seconds.
    host_busy_s: f64,
    /// Host CPU time stolen by the hypervisor, seconds.
    host_steal_s: f64,
    /// This process (every thread) plus its reaped children, seconds.
    own_s: f64,
    /// CPUs the host counts.
    cpus: usize,
}

/// The kernel's clock ticks per second for /proc (`USER_HZ`): 100 on every
/// Linux architecture parbench builds for.
const USER_HZ: f64 = 100.0;

impl CpuSnapshot {
    /// The counters now, or `None` where /proc cannot be read.
    pub fn now() -> Option<CpuSnapshot> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let own = std::fs::read_to_string("/proc/self/stat").ok()?;
        let (host_busy_s, host_steal_s, cpus) = parse_proc_stat(&stat)?;
        Some(CpuSnapshot {
            at: Instant::now(),
            host_busy_s,
            host_steal_s,
            own_s: parse_own_stat(&own)?,
            cpus,
        })
    }
}

/// Busy and stolen seconds summed over the host's CPUs, and how many CPUs,
/// from the text of /proc/stat.
fn parse_proc_stat(text: &str) -> Option<(f64, f64, usize)> {
    let total = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<f64> = total
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse::<f64>())
        .collect::<Result<_, _>>()
        .ok()?;
    // user nice system idle iowait irq softirq steal guest guest_nice;
    // guest time is already inside user.
    let get = |i: usize| v.get(i).copied().unwrap_or(0.0);
    let busy = get(0) + get(1) + get(2) + get(5) + get(6);
    let cpus = text
        .lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count()
        .max(1);
    Some((busy / USER_HZ, get(7) / USER_HZ, cpus))
}

/// utime + stime + cutime + cstime of /proc/self/stat, seconds. The command
/// name (field 2) may hold spaces and parentheses: fields count from the last `)`.
fn parse_own_stat(text: &str) -> Option<f64> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, so utime (14) is index 11.
    let tick = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok());
    Some((tick(11)? + tick(12)? + tick(13)? + tick(14)?) / USER_HZ)
}

/// CPU time other processes took during a window, on one host.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ForeignCpu {
    /// The window's wall time, seconds.
    pub wall_s: f64,
    /// CPUs of the host.
    pub cpus: usize,
    /// CPU time the host spent busy (all processes), plus stolen, seconds.
    pub host_s: f64,
    /// Of which the run's own processes, seconds.
    pub own_s: f64,
    /// Of which stolen by the hypervisor, seconds (counted as foreign).
    pub steal_s: f64,
    /// `host_s - own_s`, at least 0, seconds.
    pub foreign_s: f64,
    /// `foreign_s / (wall_s x cpus)`: the share of the machine others took.
    pub fraction: f64,
    /// Counting resolution of the fraction (two ticks per CPU over the window).
    pub resolution: f64,
    /// How it was measured, in words.
    pub method: String,
}

impl ForeignCpu {
    fn from_parts(wall_s: f64, cpus: usize, host_s: f64, own_s: f64, steal_s: f64) -> Self {
        let foreign_s = (host_s - own_s).max(0.0);
        let capacity = wall_s * cpus.max(1) as f64;
        let frac = |x: f64| if capacity > 0.0 { x / capacity } else { 0.0 };
        ForeignCpu {
            wall_s,
            cpus,
            host_s,
            own_s,
            steal_s,
            foreign_s,
            fraction: frac(foreign_s),
            resolution: frac(2.0 * cpus.max(1) as f64 / USER_HZ),
            method: "/proc/stat busy + steal less the run's own processes (/proc/self/stat with reaped children; ranks in other processes on the host subtracted)".into(),
        }
    }

    /// Between two snapshots of this process (its threads and reaped
    /// children are the run; everything else is foreign).
    pub fn between(start: &CpuSnapshot, end: &CpuSnapshot) -> ForeignCpu {
        let wall = end.at.saturating_duration_since(start.at).as_secs_f64();
        let steal = (end.host_steal_s - start.host_steal_s).max(0.0);
        ForeignCpu::from_parts(
            wall,
            end.cpus,
            (end.host_busy_s - start.host_busy_s).max(0.0) + steal,
            (end.own_s - start.own_s).max(0.0),
            steal,
        )
    }

    /// Whether others took more than [`NOISY_FRACTION`] of the machine.
    pub fn noisy(&self) -> bool {
        self.fraction > NOISY_FRACTION
    }

    /// One WARNING line when the run was noisy, none otherwise: said once,
    /// in place of warnings about figures that measure what others left.
    pub fn warning(&self) -> Option<String> {
        self.noisy().then(|| {
            format!(
                "WARNING: a noisy run: other processes took {:.0}% of the machine; report compare will not judge it",
                100.0 * self.fraction
            )
        })
    }

    /// Counting resolution in seconds of CPU time.
    pub fn resolution_s(&self) -> f64 {
        2.0 * self.cpus.max(1) as f64 / USER_HZ
    }

    /// One line for a table's header or footer.
    pub fn describe(&self) -> String {
        format!(
            "other processes took {:.1}% of the machine ({:.2} s of CPU in {:.2} s on {} CPUs{}; +-{:.1}%){}",
            100.0 * self.fraction,
            self.foreign_s,
            self.wall_s,
            self.cpus,
            if self.steal_s > 0.0 {
                format!(", {:.2} s stolen by the hypervisor", self.steal_s)
            } else {
                String::new()
            },
            100.0 * self.resolution,
            if self.noisy() {
                format!(
                    ": NOISY (above {:.0}%): its figures are not judged by report compare",
                    100.0 * NOISY_FRACTION
                )
            } else {
                String::new()
            }
        )
    }

    /// The window since `start` across every rank of `comm`: each rank's own
    /// CPU time is the run's, on whichever host it runs, and each host's
    /// foreign time is read by the first rank on it; the noisiest host is
    /// returned. Every rank must call it (it gathers); `None` on every rank
    /// when a rank could not read its counters.
    pub fn across_ranks<C: Communicator>(
        comm: &mut C,
        start: Option<&CpuSnapshot>,
    ) -> CommResult<Option<ForeignCpu>> {
        let end = CpuSnapshot::now();
        let mine: [f64; 8] = match (start, &end) {
            (Some(s), Some(e)) => [
                1.0,
                std::process::id() as f64,
                host_key(),
                e.at.saturating_duration_since(s.at).as_secs_f64(),
                (e.host_busy_s - s.host_busy_s).max(0.0),
                (e.host_steal_s - s.host_steal_s).max(0.0),
                (e.own_s - s.own_s).max(0.0),
                e.cpus as f64,
            ],
            _ => [0.0; 8],
        };
        let all = super::combine::gather_f64(comm, &mine)?;
        if all.iter().any(|v| v.first() != Some(&1.0)) {
            return Ok(None);
        }
        // [ok, pid, host, wall, busy, steal, own, cpus]. A process's own
        // time counts once however many of its threads are ranks (`local`).
        let mut hosts: Vec<(f64, &Vec<f64>, f64)> = Vec::new();
        let mut seen: Vec<(u64, u64)> = Vec::new();
        for v in &all {
            let id = (v[2].to_bits(), v[1].to_bits());
            if seen.contains(&id) {
                continue;
            }
            seen.push(id);
            match hosts.iter_mut().find(|h| h.0 == v[2]) {
                Some(h) => h.2 += v[6],
                None => hosts.push((v[2], v, v[6])),
            }
        }
        Ok(hosts
            .into_iter()
            .map(|(_, v, own)| ForeignCpu::from_parts(v[3], v[7] as usize, v[4] + v[5], own, v[5]))
            .max_by(|a, b| a.fraction.total_cmp(&b.fraction)))
    }
}

/// A number that names this host among a job's ranks (a hash of its name,
/// exact in an f64).
fn host_key() -> f64 {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.trim().bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    (h >> 12) as f64
}

/// The start of this process's run window: taken by the first call (from
/// [`crate::results::RunMeta::start`], or a binary's first line), read by
/// [`since_start`].
static START: OnceLock<Option<CpuSnapshot>> = OnceLock::new();

/// Marks the start of the run window (once; later calls do nothing).
pub fn mark_start() {
    START.get_or_init(CpuSnapshot::now);
}

/// Foreign CPU time since [`mark_start`], counting this process (threads
/// and reaped children) as the run; `None` before a mark or off Linux.
pub fn since_start() -> Option<ForeignCpu> {
    let start = START.get()?.as_ref()?;
    Some(ForeignCpu::between(start, &CpuSnapshot::now()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  1000 50 200 9000 10 5 5 40 0 0\ncpu0 500 25 100 4500 5 2 3 20 0 0\ncpu1 500 25 100 4500 5 3 2 20 0 0\nintr 1 2 3\n";

    #[test]
    fn parses_host_and_own_counters() {
        let (busy, steal, cpus) = parse_proc_stat(STAT).unwrap();
        assert!((busy - 12.6).abs() < 1e-9, "{busy}");
        assert!((steal - 0.4).abs() < 1e-9);
        assert_eq!(cpus, 2);
        // A command name with spaces and a parenthesis.
        let own = "4242 (my (bench) x) S 1 2 3 4 5 6 7 8 9 10 300 200 40 60 20 0 1 0";
        assert!((parse_own_stat(own).unwrap() - 6.0).abs() < 1e-9);
        assert_eq!(parse_own_stat("garbage"), None);
        assert_eq!(parse_proc_stat("intr 1"), None);
    }

    #[test]
    fn foreign_is_host_less_own_over_the_machine() {
        // 2 CPUs for 10 s: 20 CPU-s. Host busy 8 s + 1 s stolen, own 4 s: 5 s foreign, 25%.
        let f = ForeignCpu::from_parts(10.0, 2, 9.0, 4.0, 1.0);
        assert!((f.foreign_s - 5.0).abs() < 1e-12);
        assert!((f.fraction - 0.25).abs() < 1e-12);
        assert!(f.noisy());
        assert!(f.describe().contains("NOISY"), "{}", f.describe());
        let quiet = ForeignCpu::from_parts(10.0, 2, 4.5, 4.0, 0.0);
        assert!(!quiet.noisy() && !quiet.describe().contains("NOISY"));
        // Own time above the host's (tick rounding) is no negative foreign time.
        assert_eq!(ForeignCpu::from_parts(1.0, 2, 1.0, 1.2, 0.0).foreign_s, 0.0);
    }

    #[test]
    fn a_busy_loop_of_this_process_is_not_foreign() {
        let Some(start) = CpuSnapshot::now() else {
            eprintln!("SKIP: /proc not readable");
            return;
        };
        // Burn 0.3 s of this process's own CPU, however long a busy machine
        // takes to give it (the process's CPU clock, not the wall clock,
        // decides), with a deadline.
        let own_cpu_s = || {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: clock_gettime writes the timespec it is given.
            unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
            ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
        };
        let (t, cpu0) = (Instant::now(), own_cpu_s());
        let mut x = 0u64;
        while own_cpu_s() - cpu0 < 0.3 {
            assert!(t.elapsed().as_secs() < 60, "0.3 s of CPU not given in 60 s");
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let f = ForeignCpu::between(&start, &CpuSnapshot::now().unwrap());
        // /proc/stat counts in clock ticks (10 ms): 0.3 s is at least 0.25.
        assert!(f.own_s >= 0.25, "{f:?}");
        // The process clock counts every thread (other tests run beside this
        // one), so the wall time may be shorter than 0.3 s.
        assert!(f.wall_s > 0.0 && f.cpus >= 1, "{f:?}");
        assert!(f.fraction >= 0.0 && f.fraction <= 1.0, "{f:?}");
    }
}
