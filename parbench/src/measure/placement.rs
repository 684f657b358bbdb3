//! Where a rank runs: one CPU of its own when there are enough of them.
//!
//! Ranks that wait for each other (spin, then sleep until the peer's bytes
//! arrive) are woken by the peer, and the scheduler likes to wake a task on
//! its waker's CPU. Left to itself it stacks both ranks of a two-rank job on
//! one core of two for long stretches: measured on this project's 2-core
//! machine over tcp loopback, a 128 KiB all_reduce then took 82 us per call
//! instead of 32 us, the same run to run, with the other core idle. The
//! figure a user reads then depends on where the scheduler happened to put
//! the ranks. MPI launchers bind each rank to a core for the same reason
//! (Open MPI's default binding for two ranks is one core each).
//!
//! [`bind_slot`] binds the calling thread (and the threads it starts later)
//! to the `slot`-th CPU this process may run on. [`BindRequest`] is the
//! policy: `PARBENCH_BIND=off` never binds, `PARBENCH_BIND=<n>` binds to
//! slot n (scripts/netns.sh gives each emulated host its own), otherwise
//! ranks bind to slot = rank when every rank of the job runs on this machine
//! and there is a CPU for each.

use std::fmt;

/// Name of the environment variable that sets [`BindRequest`].
pub const BIND_ENV: &str = "PARBENCH_BIND";

/// What the user asked for, from [`BIND_ENV`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindRequest {
    /// Bind when every rank runs here and each can have a CPU (the default).
    Auto,
    /// Never bind: the scheduler places the ranks.
    Off,
    /// Bind to this slot of the allowed CPUs, whatever the rank.
    Slot(usize),
}

impl BindRequest {
    /// Parses [`BIND_ENV`]'s value (unset or empty: `Auto`).
    pub fn parse(v: Option<&str>) -> Result<BindRequest, String> {
        match v.map(str::trim) {
            None | Some("") | Some("auto") => Ok(BindRequest::Auto),
            Some("off") | Some("none") => Ok(BindRequest::Off),
            Some(s) => s
                .parse::<usize>()
                .map(BindRequest::Slot)
                .map_err(|_| format!("{BIND_ENV}={s:?}: expected auto, off or a CPU slot number")),
        }
    }

    /// [`Self::parse`] of this process's environment, a slot held to the
    /// CPUs this process may run on (its ranks inherit them).
    pub fn from_env() -> Result<BindRequest, String> {
        Self::parse(std::env::var(BIND_ENV).ok().as_deref())?.within(allowed_cpus().len())
    }

    /// This request, or why a slot is past the `allowed` CPUs (0: the
    /// system would not say, so any slot passes).
    pub fn within(self, allowed: usize) -> Result<BindRequest, String> {
        match self {
            BindRequest::Slot(s) if allowed > 0 && s >= allowed => Err(format!(
                "{BIND_ENV}={s}: this process may run on {allowed} CPU(s), slots 0 to {}",
                allowed - 1
            )),
            req => Ok(req),
        }
    }
}

/// Where one rank ended up.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Placement {
    /// The CPU it is bound to, or `None` (the scheduler places it).
    pub cpu: Option<usize>,
    /// Why, in a few words.
    pub why: String,
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.cpu {
            Some(c) => write!(f, "CPU {c} ({})", self.why),
            None => write!(f, "unbound ({})", self.why),
        }
    }
}

/// The CPUs this thread may run on, in increasing order (empty when the
/// system will not say).
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity
    // fills at most its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Binds the calling thread to the `slot`-th of `allowed` (threads it starts
/// later inherit the binding), or says why not.
pub fn bind_slot(slot: usize, allowed: &[usize], why: &str) -> Placement {
    let Some(&cpu) = allowed.get(slot) else {
        return Placement {
            cpu: None,
            why: format!("slot {slot}, but only {} CPU(s) allowed", allowed.len()),
        };
    };
    // SAFETY: a zeroed cpu_set_t is a valid empty set; `cpu` < CPU_SETSIZE
    // (it came from one).
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Placement {
            cpu: None,
            why: format!(
                "binding to CPU {cpu} failed: {}",
                std::io::Error::last_os_error()
            ),
        };
    }
    Placement {
        cpu: Some(cpu),
        why: why.to_string(),
    }
}

/// Applies `req` for rank `slot` of `ranks_here` ranks that share this
/// machine (`None`: not known to share it, as across hosts): binds the
/// calling thread or leaves it, and says which.
pub fn place(req: BindRequest, slot: usize, ranks_here: Option<usize>) -> Placement {
    let allowed = allowed_cpus();
    match req {
        BindRequest::Off => Placement {
            cpu: None,
            why: format!("{BIND_ENV}=off"),
        },
        BindRequest::Slot(s) => bind_slot(s, &allowed, &format!("{BIND_ENV}={s}")),
        BindRequest::Auto => match ranks_here {
            None => Placement {
                cpu: None,
                why: format!("ranks on other hosts: set {BIND_ENV} or the launcher's binding"),
            },
            Some(n) if n > allowed.len() || allowed.len() < 2 => Placement {
                cpu: None,
                why: format!("{n} ranks on {} allowed CPU(s)", allowed.len()),
            },
            Some(n) => bind_slot(slot, &allowed, &format!("one CPU per rank, {n} ranks here")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_bad_ones_say_why() {
        assert_eq!(BindRequest::parse(None), Ok(BindRequest::Auto));
        assert_eq!(BindRequest::parse(Some(" auto ")), Ok(BindRequest::Auto));
        assert_eq!(BindRequest::parse(Some("off")), Ok(BindRequest::Off));
        assert_eq!(BindRequest::parse(Some("3")), Ok(BindRequest::Slot(3)));
        let e = BindRequest::parse(Some("fast")).unwrap_err();
        assert!(e.contains("PARBENCH_BIND") && e.contains("fast"), "{e}");
        // Was: a slot past the CPUs ran unbound, exit 0.
        let e = BindRequest::Slot(99).within(2).unwrap_err();
        assert!(e.contains("PARBENCH_BIND=99") && e.contains("2 CPU"), "{e}");
        assert_eq!(BindRequest::Slot(1).within(2), Ok(BindRequest::Slot(1)));
        assert_eq!(BindRequest::Slot(9).within(0), Ok(BindRequest::Slot(9)));
    }

    /// Binding a thread of its own (the test harness's other threads keep
    /// theirs): it runs on the CPU it was bound to, and a slot past the
    /// allowed CPUs binds nothing.
    #[test]
    fn a_bound_thread_runs_on_its_cpu() {
        std::thread::spawn(|| {
            let allowed = allowed_cpus();
            assert!(!allowed.is_empty());
            let last = allowed.len() - 1;
            let p = bind_slot(last, &allowed, "test");
            assert_eq!(p.cpu, Some(allowed[last]), "{p}");
            assert_eq!(allowed_cpus(), vec![allowed[last]]);
            // SAFETY: sched_getcpu has no preconditions.
            let on = unsafe { libc::sched_getcpu() };
            assert_eq!(on as usize, allowed[last]);
            let none = bind_slot(allowed.len(), &allowed, "test");
            assert_eq!(none.cpu, None);
            assert!(none.why.contains("only"), "{none}");
            let off = place(BindRequest::Off, 0, Some(1));
            assert_eq!(off.cpu, None);
            let far = place(BindRequest::Auto, 0, None);
            assert_eq!(far.cpu, None, "{far}");
        })
        .join()
        .unwrap();
    }
}
