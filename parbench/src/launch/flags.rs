//! Flag values every binary shares, parsed once through [`FromStr`]: the
//! backend, a link's `GBPS,US`, a straggler's `RANK:MS` and a byte size
//! (`64K`). Each error is one line without the flag's name; the binary
//! puts its flag in front (`--link: ...`), so that one rule reads the
//! same under every binary.

use super::UsageError;
use crate::model::LinkParams;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The communicator a run uses, as `--backend` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// `auto`: tcp under a launcher, local otherwise ([`Backend::resolve`]);
    /// never the backend a run records.
    Auto,
    /// Threads of one process over shared memory.
    Local,
    /// Processes over sockets.
    Tcp,
    /// GPUs through NCCL (feature `cuda`).
    Nccl,
    /// Under mpirun, through MPI (feature `mpi`).
    Mpi,
}

impl Backend {
    /// Every backend a run can record, in the order the help lists them.
    pub const ALL: [Backend; 4] = [Backend::Local, Backend::Tcp, Backend::Nccl, Backend::Mpi];

    /// Its name on the command line and in the records.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Auto => "auto",
            Backend::Local => "local",
            Backend::Tcp => "tcp",
            Backend::Nccl => "nccl",
            Backend::Mpi => "mpi",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Backend {
    type Err = String;
    /// Case-insensitive, `auto` among them; the error is the bare name
    /// (`unknown 'ib'`): each binary lists what it accepts.
    fn from_str(s: &str) -> Result<Self, String> {
        let lower = s.to_ascii_lowercase();
        std::iter::once(Backend::Auto)
            .chain(Backend::ALL)
            .find(|b| b.name() == lower)
            .ok_or_else(|| format!("unknown '{lower}'"))
    }
}

impl Backend {
    /// `auto` as every binary reads it: `tcp` under a launcher (`joined`:
    /// its variables set: torchrun, mpirun, srun, a spawning parent),
    /// `local` otherwise; any other backend is itself.
    pub fn resolve(self, joined: bool) -> Backend {
        match self {
            Backend::Auto if joined => Backend::Tcp,
            Backend::Auto => Backend::Local,
            b => b,
        }
    }

    /// The names `--backend` takes, as an error lists them ("local, tcp,
    /// nccl or mpi").
    pub fn expected() -> String {
        let names: Vec<&str> = Backend::ALL.iter().map(|b| b.name()).collect();
        match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => names.join(""),
        }
    }

    /// The backend a record names exactly (`auto` is never recorded).
    pub fn named(name: &str) -> Option<Backend> {
        Backend::ALL.into_iter().find(|b| b.name() == name)
    }

    /// Whether its ranks talk over sockets, where a link (not a cache) may
    /// bound a transfer.
    pub fn over_sockets(self) -> bool {
        matches!(self, Backend::Tcp)
    }

    /// Whether its ranks compute on GPUs, their buffers in device memory.
    pub fn on_gpus(self) -> bool {
        matches!(self, Backend::Nccl)
    }

    /// Whether its ranks are threads of this one process.
    pub fn in_one_process(self) -> bool {
        matches!(self, Backend::Local | Backend::Auto)
    }

    /// Whether its ranks are host processes this binary can count and
    /// start itself (`--nprocs`): threads here, or processes it spawns.
    pub fn started_here(self) -> bool {
        matches!(self, Backend::Local | Backend::Tcp | Backend::Auto)
    }

    /// The most ranks one run of it starts.
    pub fn most_ranks(self) -> usize {
        if self.in_one_process() {
            crate::limits::MAX_LOCAL_RANKS
        } else {
            crate::limits::MAX_SPAWNED_RANKS
        }
    }

    /// The one refusal of a backend this build lacks (bad input: one line,
    /// exit code 2).
    pub fn require_built(self) -> Result<(), UsageError> {
        match self {
            Backend::Nccl if !cfg!(feature = "cuda") => Err(UsageError(
                "--backend nccl: this build has no CUDA support (rebuild with --features cuda)"
                    .into(),
            )),
            Backend::Mpi if !cfg!(feature = "mpi") => Err(UsageError(
                "--backend mpi needs a build with `--features mpi` (and Open MPI or MPICH installed)"
                    .into(),
            )),
            _ => Ok(()),
        }
    }

    /// The line that refuses it in a build that lacks it.
    #[cfg(not(all(feature = "cuda", feature = "mpi")))]
    pub(crate) fn not_built(self) -> UsageError {
        self.require_built()
            .err()
            .unwrap_or_else(|| UsageError(format!("--backend {self}: not in this build")))
    }
}

/// `--backend auto` as every binary reads it ([`Backend::resolve`]) on the
/// flag's text. Any other name is left as it is, for the binary's own parse.
pub fn resolve_auto(name: &mut String) -> Result<(), super::LaunchError> {
    if name.eq_ignore_ascii_case("auto") {
        let joined = super::RankInfo::from_env()?.is_some();
        *name = Backend::Auto.resolve(joined).name().to_string();
    }
    Ok(())
}

/// `GBPS,US`: a link's bandwidth in GB/s and latency in microseconds,
/// each within what a wire can be ([`crate::limits::GBPS`],
/// [`crate::limits::LATENCY_US`]).
impl FromStr for LinkParams {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(',').map(str::trim).collect();
        let [gbps, us] = parts.as_slice() else {
            return Err(format!(
                "expected GBPS,US (bandwidth in GB/s, latency in us), got '{s}'"
            ));
        };
        let num = |v: &str, what: &str, range: crate::limits::Plausible| match v.parse::<f64>() {
            Ok(x) => range.check(what, x).map_err(|e| e.to_string()),
            Err(_) => Err(format!("{what} '{v}' is not a number")),
        };
        let g = num(gbps, "bandwidth", crate::limits::GBPS)?;
        let u = num(us, "latency", crate::limits::LATENCY_US)?;
        Ok(LinkParams::from_gbps_us(g, u))
    }
}

/// The longest delay a straggler may be given: a minute, far beyond any
/// useful injection and far below any overflow.
pub const MAX_STRAGGLER_MS: f64 = 60_000.0;

/// `RANK:MS`: the rank that waits `delay` before each timed step. Whether
/// the rank exists is the world's to say ([`Straggler::check_world`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Straggler {
    pub rank: usize,
    pub delay: Duration,
}

impl Straggler {
    /// The rank must be one of `world`'s.
    pub fn check_world(&self, world: usize) -> Result<(), String> {
        if self.rank >= world {
            return Err(format!(
                "rank {} is not a rank of a world of {world}",
                self.rank
            ));
        }
        Ok(())
    }
}

impl FromStr for Straggler {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (rank, ms) = s
            .split_once(':')
            .ok_or_else(|| format!("'{s}': expected RANK:MS, e.g. 1:5"))?;
        let rank: usize = rank
            .trim()
            .parse()
            .map_err(|_| format!("'{s}': bad rank '{rank}'"))?;
        let ms: f64 = ms
            .trim()
            .parse()
            .map_err(|_| format!("'{s}': bad milliseconds '{ms}'"))?;
        if !(ms.is_finite() && (0.0..=MAX_STRAGGLER_MS).contains(&ms)) {
            return Err(format!(
                "milliseconds must be between 0 and {MAX_STRAGGLER_MS}, got {}",
                crate::units::number_text(ms)
            ));
        }
        Ok(Straggler {
            rank,
            delay: Duration::from_secs_f64(ms / 1e3),
        })
    }
}

/// The largest byte size a flag takes: 1 TiB (the memory check refuses
/// what the machine cannot hold; this keeps buffer arithmetic far from
/// overflow).
pub const MAX_BYTES: u64 = 1 << 40;

/// A byte size: `8`, `64K`, `1M`, `2G` (binary suffixes, case-insensitive,
/// an optional `B` or `iB`), at most [`MAX_BYTES`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let lower = s.trim().to_ascii_lowercase();
        let stripped = lower
            .strip_suffix("ib")
            .or_else(|| lower.strip_suffix('b'))
            .unwrap_or(&lower);
        let (num, shift) = match stripped.chars().last() {
            Some('k') => (&stripped[..stripped.len() - 1], 10),
            Some('m') => (&stripped[..stripped.len() - 1], 20),
            Some('g') => (&stripped[..stripped.len() - 1], 30),
            _ => (stripped, 0),
        };
        let n: u64 = num.trim().parse().map_err(|_| {
            format!("bad size '{s}' (expected a number with an optional K, M or G suffix)")
        })?;
        n.checked_mul(1u64 << shift)
            .filter(|&b| b <= MAX_BYTES)
            .map(ByteSize)
            .ok_or_else(|| format!("size '{s}' is larger than the largest, 1T (1024G)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_properties_answer_what_binaries_ask() {
        assert_eq!(Backend::expected(), "local, tcp, nccl or mpi");
        for b in Backend::ALL {
            assert_eq!(Backend::named(b.name()), Some(b));
        }
        assert_eq!(Backend::named("auto"), None);
        assert_eq!(Backend::named("TCP"), None, "records name it exactly");
        assert!(Backend::Tcp.over_sockets() && !Backend::Local.over_sockets());
        let on_gpus: Vec<_> = Backend::ALL.into_iter().filter(|b| b.on_gpus()).collect();
        assert_eq!(on_gpus, [Backend::Nccl]);
        let started: Vec<_> = Backend::ALL
            .into_iter()
            .filter(|b| b.started_here())
            .collect();
        assert_eq!(started, [Backend::Local, Backend::Tcp]);
        assert_eq!(Backend::Local.most_ranks(), crate::limits::MAX_LOCAL_RANKS);
        assert_eq!(Backend::Tcp.most_ranks(), crate::limits::MAX_SPAWNED_RANKS);
    }

    #[test]
    fn backends_by_name_any_case() {
        assert_eq!("TCP".parse::<Backend>(), Ok(Backend::Tcp));
        for b in Backend::ALL {
            assert_eq!(b.name().parse::<Backend>(), Ok(b));
        }
        assert_eq!("ib".parse::<Backend>().unwrap_err(), "unknown 'ib'");
    }

    #[test]
    fn links_hold_a_wire_s_bandwidth_and_latency() {
        let l: LinkParams = " 400 , 2.5 ".parse().unwrap();
        assert!((l.bandwidth_gbps() - 400.0).abs() < 1e-9);
        for bad in [
            "100", "0,5", "x,1", "1,-2", "inf,1", "1,2,3", "1e-300,1", "1e300,1", "1,1e30",
        ] {
            let e = bad.parse::<LinkParams>().unwrap_err();
            assert!(!e.contains('\n') && e.len() < 80, "{e}");
        }
        assert_eq!(
            "1e-300,1".parse::<LinkParams>().unwrap_err(),
            "bandwidth 1e-300: expected 0.001 to 1000000 GB/s"
        );
        assert!("fast"
            .parse::<LinkParams>()
            .unwrap_err()
            .contains("expected GBPS,US"));
    }

    #[test]
    fn stragglers_have_one_set_of_bounds() {
        let s: Straggler = "1:2.5".parse().unwrap();
        assert_eq!(s.rank, 1);
        assert_eq!(s.delay, Duration::from_micros(2500));
        assert!("1".parse::<Straggler>().unwrap_err().contains("RANK:MS"));
        assert!("x:3".parse::<Straggler>().unwrap_err().contains("bad rank"));
        assert!("1:-1".parse::<Straggler>().is_err());
        assert!("1:60001".parse::<Straggler>().is_err());
        assert!("1:60000".parse::<Straggler>().is_ok());
        assert!(s.check_world(2).is_ok());
        assert!(s.check_world(1).unwrap_err().contains("rank 1"));
    }

    #[test]
    fn byte_sizes_with_binary_suffixes() {
        for (s, b) in [
            ("8", 8),
            ("64K", 65_536),
            ("1m", 1 << 20),
            ("2G", 2 << 30),
            ("4KiB", 4096),
            ("16b", 16),
        ] {
            assert_eq!(s.parse::<ByteSize>(), Ok(ByteSize(b)), "{s}");
        }
        assert!("1Q".parse::<ByteSize>().unwrap_err().contains("bad size"));
        assert!("2048G".parse::<ByteSize>().unwrap_err().contains("largest"));
    }
}
