//! NCCL's own choice of algorithm, protocol and channels per call, read
//! from its tuning log (`NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING`, one line
//! per call on rank 0). The line's format by release (NCCL's
//! `src/enqueue.cc` at each tag):
//!
//! - 2.18, 2.19: at TRACE only, so absent from a release build's log;
//! - 2.20 - 2.22: `... NCCL INFO 262144 Bytes -> Algo 0 proto 1 time 54.707825`
//!   (indices into NCCL's algorithm and protocol lists, no function);
//! - 2.23: `... NCCL INFO AllReduce: 262144 Bytes -> Algo 0 proto 1 time 54.7`
//!   (the same, after the function's name);
//! - 2.24 and later: `... NCCL INFO AllReduce: 4194304 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..15}`.
//!
//! The bytes are NCCL's: its count times the type's size (all_gather's and
//! reduce_scatter's per-rank count). A size the log says nothing about is
//! `unknown`, never a guess. `tests/fixtures/nccl_real_lines.log` holds
//! lines from public reports, each with its source.

use super::Collective;
use std::path::{Path, PathBuf};

/// Environment variable naming the tuning log parbench set up for this process.
pub const LOG_ENV: &str = "PARBENCH_NCCL_TUNING_LOG";

/// One line of the log: what NCCL ran for one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// NCCL's name of the function (`AllReduce`, `AllGather`, ...).
    pub func: String,
    /// NCCL's bytes (count x type size).
    pub bytes: u64,
    pub algo: String,
    pub proto: String,
    /// Channels used: Hi - Lo + 1.
    pub channels: u32,
}

impl Choice {
    /// The algo column's words: `RING/SIMPLE/16ch` (`RING/SIMPLE` when the
    /// line gave no channels).
    pub fn label(&self) -> String {
        match self.channels {
            0 => format!("{}/{}", self.algo, self.proto),
            n => format!("{}/{}/{n}ch", self.algo, self.proto),
        }
    }
}

/// NCCL's algorithm and protocol names by index (the order of its
/// `nccl_common.h`, later `plugin/nccl_tuner.h`: the same from 2.20 to
/// 2.29), for the numeric lines of NCCL 2.20 to 2.23.
const ALGOS: [&str; 7] = [
    "TREE",
    "RING",
    "COLLNET_DIRECT",
    "COLLNET_CHAIN",
    "NVLS",
    "NVLS_TREE",
    "PAT",
];
const PROTOS: [&str; 3] = ["LL", "LL128", "SIMPLE"];

/// Parses one line; `None` for any other line of NCCL's log.
pub fn parse_line(line: &str) -> Option<Choice> {
    let (_, rest) = line.split_once("NCCL INFO ")?;
    // 2.20 - 2.22 name no function: the line starts with the bytes.
    let (func, rest) = if rest.starts_with(|c: char| c.is_ascii_digit()) {
        ("", rest)
    } else {
        let (func, rest) = rest.split_once(": ")?;
        if func.is_empty() || !func.chars().all(|c| c.is_ascii_alphanumeric()) {
            return None;
        }
        (func, rest)
    };
    let (bytes, rest) = rest.split_once(" Bytes -> Algo ")?;
    let bytes: u64 = bytes.trim().parse().ok()?;
    let mut words = rest.split_whitespace();
    let algo = words.next()?;
    if words.next()? != "proto" {
        return None;
    }
    let proto = words.next()?;
    let next = words.next()?;
    let (algo, proto, channels) = if next == "time" {
        // The numeric line (2.20 - 2.23): indices, then NCCL's time estimate.
        words.next()?.parse::<f64>().ok()?;
        let algo = ALGOS.get(algo.parse::<usize>().ok()?)?;
        let proto = PROTOS.get(proto.parse::<usize>().ok()?)?;
        (algo.to_string(), proto.to_string(), 0)
    } else {
        let chan = next.strip_prefix("channel{Lo..Hi}={")?.strip_suffix('}')?;
        let (lo, hi) = chan.split_once("..")?;
        let (lo, hi): (u32, u32) = (lo.parse().ok()?, hi.parse().ok()?);
        let named = |w: &str| {
            !w.is_empty()
                && w.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        };
        if !named(algo) || !named(proto) {
            return None;
        }
        (algo.to_string(), proto.to_string(), hi.checked_sub(lo)? + 1)
    };
    Some(Choice {
        func: func.to_string(),
        bytes,
        algo,
        proto,
        channels,
    })
}

/// Every choice in a log, in order.
pub fn parse_log(text: &str) -> Vec<Choice> {
    text.lines().filter_map(parse_line).collect()
}

/// NCCL's name of a collective; `None` for those NCCL builds from send/recv
/// (all_to_all, sendrecv), which its tuning log does not report.
pub fn nccl_func(coll: Collective) -> Option<&'static str> {
    coll.spec().nccl_func()
}

/// NCCL's bytes for a call that sends `send_bytes` per rank.
pub fn nccl_bytes(coll: Collective, send_bytes: u64, world: usize) -> u64 {
    coll.spec().nccl_bytes(send_bytes, world)
}

/// The label of the last call of `coll` at `send_bytes` in `choices`, or
/// `unknown` when the log has none. A line that names no function (2.20 -
/// 2.22) counts when it is the log's last line of those bytes: parbench
/// asks right after measuring a size, so the latest line of a size is its
/// own.
pub fn label_for(choices: &[Choice], coll: Collective, send_bytes: u64, world: usize) -> String {
    let want = nccl_bytes(coll, send_bytes, world);
    nccl_func(coll)
        .and_then(|f| {
            choices
                .iter()
                .rev()
                .find(|c| c.bytes == want && (c.func == f || c.func.is_empty()))
        })
        .map_or_else(|| "unknown".to_string(), Choice::label)
}

/// The tuning log of this process: the one parbench set up, or the user's
/// `NCCL_DEBUG_FILE` when it names one file (no `%h`/`%p` patterns).
pub fn log_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(LOG_ENV) {
        return Some(PathBuf::from(p));
    }
    let user = std::env::var("NCCL_DEBUG_FILE").ok()?;
    (!user.contains('%')).then(|| PathBuf::from(user))
}

/// Before NCCL's first call: points NCCL's tuning log at
/// `<dir>/nccl-tuning-<run_id>-<pid>.log` (NCCL_DEBUG=INFO,
/// NCCL_DEBUG_SUBSYS gains TUNING, NCCL_DEBUG_FILE), unless the user set
/// NCCL_DEBUG_FILE already (then theirs is read). Returns the log's path.
/// Call it while this process has one thread: it sets the environment.
pub fn set_up_log(dir: &Path, run_id: &str) -> Option<PathBuf> {
    if std::env::var_os("NCCL_DEBUG_FILE").is_some() {
        return log_path();
    }
    std::fs::create_dir_all(dir).ok()?;
    let path = dir.join(format!("nccl-tuning-{run_id}-{}.log", std::process::id()));
    let subsys = match std::env::var("NCCL_DEBUG_SUBSYS") {
        Ok(s) if s.to_ascii_uppercase().contains("TUNING") || s.eq_ignore_ascii_case("ALL") => s,
        Ok(s) if !s.trim().is_empty() => format!("{s},TUNING"),
        _ => "TUNING".to_string(),
    };
    std::env::set_var("NCCL_DEBUG", "INFO");
    std::env::set_var("NCCL_DEBUG_SUBSYS", subsys);
    std::env::set_var("NCCL_DEBUG_FILE", &path);
    std::env::set_var(LOG_ENV, &path);
    Some(path)
}

/// Reads the log at `path` (a missing or unreadable log says nothing),
/// as every file is read: a regular file, bounded (a FIFO planted under
/// its name must not hang the run).
pub fn read_log(path: &Path) -> Vec<Choice> {
    crate::files::read_regular(path, crate::files::MAX_RECORD_BYTES)
        .map(|b| parse_log(&String::from_utf8_lossy(&b)))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tuning line in each of NCCL's formats, written from its format
    /// strings (the fixture's header says which), among real INIT and COLL
    /// lines.
    const FIXTURE: &str = include_str!("../../tests/fixtures/nccl_tuning.log");

    #[test]
    fn the_fixture_log_gives_each_size_its_choice() {
        let c = parse_log(FIXTURE);
        assert_eq!(c.len(), 9, "{c:?}");
        assert_eq!(label_for(&c, Collective::AllReduce, 8, 8), "RING/LL/1ch");
        assert_eq!(
            label_for(&c, Collective::AllReduce, 268435456, 8),
            "NVLS/SIMPLE/16ch"
        );
        assert_eq!(
            label_for(&c, Collective::AllGather, 131072, 8),
            "RING/LL128/8ch"
        );
        assert_eq!(
            label_for(&c, Collective::AllGather, 16777216, 8),
            "PAT/SIMPLE/24ch"
        );
        // reduce_scatter: NCCL logs the per-rank receive count's bytes.
        assert_eq!(
            label_for(&c, Collective::ReduceScatter, 8 * 1048576, 8),
            "RING/SIMPLE/24ch"
        );
        assert_eq!(label_for(&c, Collective::AllReduce, 12345, 8), "unknown");
        assert_eq!(label_for(&c, Collective::AllToAll, 8, 8), "unknown");
        // 2.23's numeric line names its function (so it is no all_gather's
        // of the same bytes): algorithm 5 is NVLS_TREE.
        assert_eq!(
            label_for(&c, Collective::AllReduce, 4194304, 8),
            "NVLS_TREE/SIMPLE"
        );
        assert_eq!(label_for(&c, Collective::AllGather, 4194304, 8), "unknown");
        // 2.20 - 2.22's names none: algorithm 0 is TREE, protocol 1 LL128.
        assert_eq!(
            label_for(&c, Collective::AllReduce, 262144, 8),
            "TREE/LL128"
        );
    }

    #[test]
    fn other_lines_are_not_choices() {
        for l in [
            "vm:1:2 [0] NCCL INFO Channel 00/24 : 0 1 2 3 4 5 6 7",
            "vm:1:2 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x1 recvbuff 0x2 count 2 datatype 7 op 0 root 0 comm 0x3 [nranks=8] stream 0x4",
            // Hi below Lo, an index past NCCL's lists, a name in lower case,
            // a time that is not a number, a line cut short.
            "vm:1:2 [0] NCCL INFO AllReduce: 8 Bytes -> Algo RING proto LL channel{Lo..Hi}={3..1}",
            "vm:1:2 [0] NCCL INFO 8 Bytes -> Algo 7 proto 0 time 1.0",
            "vm:1:2 [0] NCCL INFO 8 Bytes -> Algo 0 proto 3 time 1.0",
            "vm:1:2 [0] NCCL INFO AllReduce: 8 Bytes -> Algo ring proto LL channel{Lo..Hi}={0..1}",
            "vm:1:2 [0] NCCL INFO AllReduce: 8 Bytes -> Algo 1 proto 2 time x",
            "vm:1:2 [0] NCCL INFO AllReduce: 8 Bytes -> Algo 1 proto 2",
            "vm:1:2 [0] NCCL INFO AllReduce: 18446744073709551616 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}",
            "",
        ] {
            assert_eq!(parse_line(l), None, "{l}");
        }
        // Words after the channels (none in NCCL 2.24 - 2.29) are ignored.
        let c = parse_line("h:9:9 [3] NCCL INFO Broadcast: 64 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1} more").unwrap();
        assert_eq!((c.func.as_str(), c.bytes, c.channels), ("Broadcast", 64, 2));
    }
}
