//! Run metadata: what ran, where, with what, and when.

use serde::{Deserialize, Serialize};
use std::time::{SystemTime, UNIX_EPOCH};

/// One run of one bench binary, as stored in a results folder's run.json.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunMeta {
    pub run_id: String,
    /// `collectives`, `layers` or `pipeline`.
    pub suite: String,
    pub command_line: Vec<String>,
    pub host: String,
    pub os: String,
    pub cpu: String,
    pub cores: usize,
    /// The CPU's vector extensions, detected at run time (they decide which
    /// kernels ran: the gemm crate's AVX-512 or AVX2 ones; see
    /// [`cpu_vector_features`]). Empty in records written before the field.
    #[serde(default)]
    pub cpu_features: Vec<String>,
    /// One entry per GPU found (name and memory), empty on CPU runs.
    pub gpus: Vec<String>,
    pub backend: String,
    pub world: usize,
    pub parbench_version: String,
    pub git_revision: String,
    /// Versions of the runtime libraries in use (CUDA driver, NCCL, MPI), name to version.
    pub versions: std::collections::BTreeMap<String, String>,
    pub start: String,
    pub end: String,
    /// Anything else the suite measured about the machine (the wire's ceiling, ...).
    #[serde(default)]
    pub extra: serde_json::Map<String, serde_json::Value>,
    /// Why the run ended before its last measurement (a signal, a fault),
    /// when it did: its rows are those it finished. Absent for a whole run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut_short: Option<String>,
    /// Every field of the entry this version does not know (a newer
    /// version's, a CI system's), kept as it was and written back.
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, serde_json::Value>,
}

impl RunMeta {
    /// Metadata for a run starting now, with host, CPU and version filled in.
    pub fn start(suite: &str, run_id: &str, backend: &str, world: usize) -> Self {
        crate::measure::noise::mark_start();
        RunMeta {
            run_id: run_id.to_string(),
            suite: suite.to_string(),
            // Arguments that are not UTF-8 (a path) are kept, lossily.
            command_line: std::env::args_os()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            host: hostname(),
            os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
            cpu: cpu_model(),
            cores: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            cpu_features: cpu_vector_features(),
            gpus: Vec::new(),
            backend: backend.to_string(),
            world,
            parbench_version: env!("CARGO_PKG_VERSION").to_string(),
            git_revision: git_revision().to_string(),
            versions: Default::default(),
            start: iso8601_utc(SystemTime::now()),
            end: String::new(),
            extra: Default::default(),
            cut_short: None,
            unknown: Default::default(),
        }
    }

    /// Records the version line of the library under the run's backend
    /// (MPI's) in `versions`, under the backend's name.
    pub fn note_library(&mut self, version: String) {
        self.versions.insert(self.backend.clone(), version);
    }

    /// Marks the run finished now.
    pub fn finish(&mut self) {
        self.end = iso8601_utc(SystemTime::now());
        self.record_noise();
    }
}

/// The noise guard's hook: `extra.noise` holds the CPU time other processes
/// took while the run measured ([`crate::measure::noise`]).
impl RunMeta {
    /// The key of the noise guard's figure in `extra`.
    pub const NOISE_KEY: &'static str = "noise";

    /// Records the foreign CPU time since the process marked its start,
    /// unless the bench already recorded a figure of its own (across ranks).
    fn record_noise(&mut self) {
        if self.extra.contains_key(Self::NOISE_KEY) {
            return;
        }
        if let Some(n) = crate::measure::noise::since_start() {
            self.set_noise(&n);
        }
    }

    /// Records `noise` as the run's figure.
    pub fn set_noise(&mut self, noise: &crate::measure::noise::ForeignCpu) {
        if let Ok(v) = serde_json::to_value(noise) {
            self.extra.insert(Self::NOISE_KEY.into(), v);
        }
    }

    /// The run's noise figure, when one was recorded.
    pub fn noise(&self) -> Option<crate::measure::noise::ForeignCpu> {
        serde_json::from_value(self.extra.get(Self::NOISE_KEY)?.clone()).ok()
    }
}

/// The git revision parbench was built from (`unknown` outside a checkout).
pub fn git_revision() -> &'static str {
    option_env!("PARBENCH_GIT_REV").unwrap_or("unknown")
}

/// A run id unique across hosts, PID namespaces and seconds: suite, UTC
/// time to the second, process id, and 64 random bits (two containers
/// both running as pid 1 in the same second still differ). A rank
/// spawned by a launcher takes the launcher's id ([`RUN_ID_VAR`]), so
/// that the launcher can complete the run's record when that rank dies.
pub fn new_run_id(suite: &str) -> String {
    if let Some(id) = inherited_run_id(suite) {
        return id;
    }
    let stamp = iso8601_utc(SystemTime::now())
        .replace(['-', ':'], "")
        .trim_end_matches('Z')
        .to_string();
    let id = format!(
        "{suite}-{stamp}Z-{}-{}",
        std::process::id(),
        crate::files::random_hex(8)
    );
    let _ = JOB_RUN_ID.set(id.clone());
    id
}

/// The variable a launcher hands its spawned ranks its run id in.
pub const RUN_ID_VAR: &str = "PARBENCH_RUN_ID";

/// The first run id this process made: the one its spawned ranks take.
static JOB_RUN_ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// The run id this process's spawned ranks should take, if it made one.
pub fn job_run_id() -> Option<&'static str> {
    JOB_RUN_ID.get().map(String::as_str)
}

/// The launcher's run id, when this process is a rank it spawned for the
/// same suite (anything else in the variable is ignored: a fresh id).
fn inherited_run_id(suite: &str) -> Option<String> {
    std::env::var_os("PARBENCH_SPAWNED")?;
    let id = std::env::var(RUN_ID_VAR).ok()?;
    let plain = id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    (plain && id.strip_prefix(suite)?.starts_with('-')).then_some(id)
}

/// `YYYY-MM-DDTHH:MM:SSZ` for a time after the epoch.
pub fn iso8601_utc(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "unknown".into())
}

/// The vector extensions of this CPU that parbench's kernels or the gemm
/// crate's can use, as `is_x86_feature_detected!` (or its aarch64 twin)
/// spells them; AMX, whose detection std has not stabilised, from the
/// kernel's /proc/cpuinfo flags where it lists them.
pub fn cpu_vector_features() -> Vec<String> {
    // (name, detected) for each name, with the arch's detection macro.
    #[allow(unused_macros)]
    macro_rules! detect {
        ($has:ident: $($name:tt),*) => {
            [$(($name, $has!($name))),*]
        };
    }
    #[cfg(target_arch = "x86_64")]
    let (named, amx) = {
        use std::arch::is_x86_feature_detected as has;
        let named = detect!(has: "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw",
            "avx512cd", "avx512dq", "avx512vl", "avx512vnni", "avx512bf16", "avx512fp16");
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let flags = cpuinfo
            .lines()
            .find(|l| l.starts_with("flags"))
            .unwrap_or("");
        let amx: Vec<String> = flags
            .split_whitespace()
            .filter(|f| f.starts_with("amx_"))
            .map(|f| f.replace('_', "-"))
            .collect();
        (named.to_vec(), amx)
    };
    #[cfg(target_arch = "aarch64")]
    let (named, amx) = {
        use std::arch::is_aarch64_feature_detected as has;
        let named = detect!(has: "neon", "fp16", "bf16", "sve");
        (named.to_vec(), Vec::<String>::new())
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let (named, amx): (Vec<(&str, bool)>, Vec<String>) = (Vec::new(), Vec::new());
    let mut found: Vec<String> = named
        .iter()
        .filter(|f| f.1)
        .map(|f| f.0.to_string())
        .collect();
    found.extend(amx);
    found
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_utc_dates() {
        assert_eq!(iso8601_utc(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_795_956_313); // 2026-11-29T12:45:13Z
        assert_eq!(iso8601_utc(t), "2026-11-29T12:45:13Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(iso8601_utc(leap), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn vector_features_agree_with_the_cpus_own_detection() {
        let f = cpu_vector_features();
        #[cfg(target_arch = "x86_64")]
        {
            let has = |n: &str| f.iter().any(|x| x == n);
            assert_eq!(has("avx2"), std::arch::is_x86_feature_detected!("avx2"));
            assert_eq!(
                has("avx512f"),
                std::arch::is_x86_feature_detected!("avx512f")
            );
            // AVX-512 implies AVX2 on every CPU that has it.
            assert!(!has("avx512f") || has("avx2"), "{f:?}");
        }
        let mut sorted = f.clone();
        sorted.dedup();
        assert_eq!(sorted.len(), f.len(), "no name twice: {f:?}");
    }

    #[test]
    fn records_without_cpu_features_still_read() {
        let mut v = serde_json::to_value(RunMeta::start("layers", "a", "local", 1)).unwrap();
        v.as_object_mut().unwrap().remove("cpu_features");
        let back: RunMeta = serde_json::from_value(v).unwrap();
        assert!(back.cpu_features.is_empty());
    }

    #[test]
    fn run_ids_name_the_suite() {
        let id = new_run_id("collectives");
        assert!(id.starts_with("collectives-") && id.contains('T'), "{id}");
    }

    #[test]
    fn run_ids_differ_within_one_second_and_one_pid() {
        // Was: suite, second and pid only; two containers, each pid 1,
        // started in one second wrote one id.
        let a = new_run_id("collectives");
        let b = new_run_id("collectives");
        assert_ne!(a, b);
        let random = a.rsplit('-').next().unwrap();
        assert_eq!(random.len(), 16, "{a}");
    }
}
