//! `-J FILE`: the run as nccl-tests' (v2.19.6, file version 3) JSON, so that
//! tools written for it (its `tools/analyze_perf_json.py`) read parbench's
//! runs: `version`, `args`, `env`, `config` with `devices`, one `results`
//! entry per size with `out_of_place` / `in_place` (`time`, `alg_bw`,
//! `bus_bw`, `nwrong`) and `*_per_iter` statistics, then `out_of_bounds`
//! and `average_bus_bandwidth`. parbench's own figures sit beside them under
//! `parbench` keys, which nccl-tests' readers ignore.

use crate::cli::SweepJob;
use crate::config::{Step, TableFormat};
use crate::nccl_tests_format::IterStats;
use crate::sweep::Outcome;
use anyhow::{Context, Result};
use parbench::launch::flags::Backend;
use parbench::results::{CollectiveRow, RunMeta};
use serde_json::{json, Map, Value};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// nccl-tests' JSON_FILE_VERSION of v2.19.6.
pub const FILE_VERSION: u32 = 3;

/// A placement's `*_per_iter` object.
pub fn per_iter(times_us: &[f64], per_rank_us: &[Vec<f64>]) -> Value {
    let Some(st) = IterStats::of(times_us) else {
        return Value::Null;
    };
    let mut v = json!({
        "skipped_iterations": 0,
        "min_us": st.min,
        "max_us": st.max,
        "avg_us": st.avg,
        "p50_us": st.p50,
        "p95_us": st.p95,
        "p99_us": st.p99,
        "stdev_us": st.stdev,
        "cv_pct": st.cv_pct,
        "times_us": times_us,
    });
    // nccl-tests writes it only with more than one process row; every
    // rank is one here.
    if per_rank_us.len() > 1 {
        v["per_process_max_times_us"] = json!(per_rank_us);
    }
    v
}

fn placement(r: &CollectiveRow, checked: bool) -> Value {
    json!({
        "time": r.time_us,
        "alg_bw": r.algbw_gbps,
        "bus_bw": r.busbw_gbps,
        "nwrong": if checked { json!(r.wrong as f64) } else { Value::Null },
    })
}

/// The whole document (a pure function of the run, for tests).
pub fn document(plan: &SweepJob, meta: &RunMeta, outcome: &Outcome) -> Value {
    let sw = &plan.sweep;
    let checked = sw.check > 0;
    let world = meta.world;
    let host = &meta.host;
    let devices: Vec<Value> = (0..world)
        .map(|rank| {
            json!({"rank": rank, "group": 0, "pid": if rank == 0 { std::process::id() as i64 } else { -1 },
                   "hostname": host, "device": rank, "device_hex": "0000:00:00",
                   "device_info": meta.gpus.get(rank).cloned().unwrap_or_else(|| meta.backend.clone())})
        })
        .collect();
    // nccl-tests writes its booleans as the strings "true"/"false" (its
    // jsonBool prints a string); readers written for it expect that.
    let b = |x: bool| Value::String(if x { "true" } else { "false" }.into());
    let mut config = Map::new();
    config.insert(
        "nthreads".into(),
        json!(
            if Backend::named(&meta.backend).is_some_and(Backend::in_one_process) {
                world
            } else {
                1
            }
        ),
    );
    config.insert("ngpus".into(), json!(1));
    let f = &plan.nccl_tests;
    config.insert("minimum_bytes".into(), json!(f.min_bytes));
    config.insert("maximum_bytes".into(), json!(f.max_bytes));
    match f.step {
        Step::Factor(x) => config.insert("step_factor".into(), json!(x)),
        Step::Bytes(x) => config.insert("step_bytes".into(), json!(x)),
    };
    config.insert("warmup_iters".into(), json!(sw.warmup));
    config.insert("iterations".into(), json!(sw.iters));
    config.insert(
        "aggregated_iterations".into(),
        json!(plan.nccl_tests.agg_iters),
    );
    config.insert("validation".into(), json!(sw.check));
    config.insert("graph".into(), json!(sw.graph.unwrap_or(0)));
    config.insert("blocking_collectives".into(), b(plan.nccl_tests.blocking));
    config.insert("per_iter_timing".into(), b(true));
    config.insert("per_iter_skip".into(), json!(0));
    config.insert("parallel_init".into(), b(false));
    config.insert("devices".into(), Value::Array(devices));

    // One entry per (collective, dtype, op, size): rows come out of place
    // first, then in place, as the sweep measured them.
    let mut results: Vec<Value> = Vec::new();
    let mut busbw = Vec::new();
    let mut wrong = 0u64;
    let mut i = 0;
    let rows = &outcome.rows;
    while i < rows.len() {
        let r = &rows[i];
        let pair = rows.get(i + 1).filter(|n| {
            !r.in_place
                && n.in_place
                && n.collective == r.collective
                && n.bytes == r.bytes
                && n.dtype == r.dtype
                && n.op == r.op
        });
        let times = |k: usize| {
            per_iter(
                outcome.iter_times_us.get(k).map_or(&[], Vec::as_slice),
                outcome.rank_iter_us.get(k).map_or(&[], Vec::as_slice),
            )
        };
        let mut e = Map::new();
        e.insert("size".into(), json!(r.bytes));
        e.insert("count".into(), json!(r.count));
        e.insert("type".into(), json!(r.dtype));
        e.insert("redop".into(), json!(r.op));
        // nccl-tests' root is the string it printed ("%6i").
        e.insert("root".into(), json!(format!("{:6}", r.root)));
        let (oop, ip) = if r.in_place {
            (None, Some((r, i)))
        } else {
            (Some((r, i)), pair.map(|p| (p, i + 1)))
        };
        for (key, slot) in [("out_of_place", oop), ("in_place", ip)] {
            match slot {
                Some((row, k)) => {
                    e.insert(key.into(), placement(row, checked));
                    e.insert(format!("{key}_per_iter"), times(k));
                    busbw.push(row.busbw_gbps);
                    // nccl-tests counts, per placement, the ranks that found any.
                    wrong += outcome.ranks_wrong.get(k).copied().unwrap_or(0);
                }
                None => {
                    e.insert(key.into(), Value::Null);
                }
            }
        }
        e.insert("actual_iterations".into(), json!(r.iters));
        e.insert("experiment_name".into(), json!(""));
        let extra = |row: &CollectiveRow| json!({"p50_us": row.p50_us, "p99_us": row.p99_us, "model_us": row.model_us, "ceiling_gbps": row.ceiling_gbps, "time_min_us": row.time_min_us, "time_max_us": row.time_max_us});
        e.insert(
            "parbench".into(),
            json!({
                "collective": r.collective, "algo": r.algo, "world": r.world,
                "out_of_place": oop.map(|(row, _)| extra(row)),
                "in_place": ip.map(|(row, _)| extra(row)),
            }),
        );
        results.push(Value::Object(e));
        i += if pair.is_some() { 2 } else { 1 };
    }
    let avg = if busbw.is_empty() {
        0.0
    } else {
        busbw.iter().sum::<f64>() / busbw.len() as f64
    };
    let env: Vec<String> = std::env::vars()
        .filter(|(k, _)| {
            ["NCCL_", "PARBENCH_", "CUDA_", "OMPI_COMM_WORLD_"]
                .iter()
                .any(|p| k.starts_with(p))
                && !SECRET_ENV.contains(&k.as_str())
        })
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let nccl_version = meta.versions.get("nccl").and_then(|v| nccl_version_code(v));
    json!({
        "version": FILE_VERSION,
        "start_time": nccl_tests_time(&meta.start),
        "args": std::env::args().collect::<Vec<_>>(),
        "env": env,
        "nccl_version": nccl_version.unwrap_or(0),
        "config": Value::Object(config),
        "results": results,
        "out_of_bounds": {"count": wrong, "okay": b(wrong == 0)},
        "average_bus_bandwidth": {"bandwidth": avg, "okay": "unchecked"},
        "errors": [],
        "end_time": nccl_tests_time(&meta.end),
        "parbench": {
            "run_id": meta.run_id, "backend": meta.backend, "world": world,
            "records": "collectives.csv and run.json in the --out folder",
            "env_note": "env lists only NCCL_*, PARBENCH_*, CUDA_* and OMPI_COMM_WORLD_* variables (nccl-tests writes them all), never the job's token",
            "nccl_version_note": if nccl_version.is_some() { "the NCCL library's version code" } else { "0: no NCCL ran (a CPU backend)" },
            "time_note": "start_time and end_time in nccl-tests' %Y-%m-%d %H:%M:%S, UTC (nccl-tests writes local time)",
        },
    })
}

/// Variables whose value is a secret: never written into a record.
const SECRET_ENV: &[&str] = &["PARBENCH_JOB_TOKEN"];

/// run.json's `2026-12-03T22:54:23Z` as nccl-tests' `%Y-%m-%d %H:%M:%S`.
pub fn nccl_tests_time(iso: &str) -> String {
    iso.get(..19).unwrap_or(iso).replacen('T', " ", 1)
}

/// NCCL's version code (2.28.3 is 22803), the integer nccl-tests writes.
pub fn nccl_version_code(v: &str) -> Option<u64> {
    let mut parts = v
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .filter(|p| !p.is_empty());
    let (a, b, c) = (
        parts.next()?.parse::<u64>().ok()?,
        parts.next()?.parse::<u64>().ok()?,
        parts.next()?.parse::<u64>().ok()?,
    );
    Some(a * 10_000 + b * 100 + c)
}

/// The `-J` file this process reserved, and its name.
static RESERVED: Mutex<Option<(PathBuf, File)>> = Mutex::new(None);

/// nccl-tests' rule for `-J`: a name whose extension is `json` (any case)
/// gets JSON; any other name gets nothing.
pub fn is_json_name(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
}

/// Creates the `-J` file as nccl-tests does before it measures: FILE, or
/// where that exists FILE.0, FILE.1, ... (created exclusively, so nothing
/// is overwritten and no link is followed). Returns the line that names
/// it, or `None` for a name nccl-tests writes nothing to.
pub fn reserve(path: &Path) -> Option<String> {
    let mut kept = RESERVED.lock().ok()?;
    if let Some((p, _)) = kept.as_ref() {
        return Some(format!("# Writing JSON output to {}", p.display()));
    }
    if !is_json_name(path) {
        return None;
    }
    let mut name = path.to_path_buf();
    for n in 0..=MAX_SUFFIX {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&name)
        {
            Ok(f) => {
                let line = format!("# Writing JSON output to {}", name.display());
                *kept = Some((name, f));
                return Some(line);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let mut s = path.as_os_str().to_owned();
                s.push(format!(".{n}"));
                name = PathBuf::from(s);
            }
            Err(_) => break,
        }
    }
    Some(format!(
        "# skipping json output; {} not accessible",
        name.display()
    ))
}

/// Most `.N` names tried before giving up (nccl-tests tries without end).
const MAX_SUFFIX: u32 = 9999;

/// Writes the document into the file [`reserve`] created.
pub fn write(path: &Path, plan: &SweepJob, meta: &RunMeta, outcome: &Outcome) -> Result<()> {
    if !is_json_name(path) {
        eprintln!(
            "-J {}: nccl-tests writes JSON only to a name ending in .json; nothing written",
            path.display()
        );
        return Ok(());
    }
    let late = reserve(path);
    let doc = document(plan, meta, outcome);
    let text = serde_json::to_vec_pretty(&doc).context("encoding the -J JSON")?;
    let mut kept = RESERVED
        .lock()
        .map_err(|_| anyhow::anyhow!("-J: poisoned by a panic"))?;
    let Some((name, file)) = kept.as_mut() else {
        // Not creatable (nccl-tests' "# skipping json output; ... not
        // accessible"): the run's records stand without it.
        if let Some(line) = late {
            parbench::outln!("{line}");
        }
        return Ok(());
    };
    file.write_all(&text)
        .and_then(|_| file.sync_all())
        .with_context(|| format!("writing -J {}", name.display()))?;
    // parbench's layout names the file at the end, beside its records.
    if let Some(line) = late.filter(|_| !plan_prints_early(plan)) {
        parbench::outln!("{line}");
    }
    Ok(())
}

/// Whether the `-J` line was printed before the header (nccl-tests' layout).
fn plan_prints_early(plan: &SweepJob) -> bool {
    plan.nccl_tests.format == TableFormat::NcclTests
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_iteration_statistics_follow_nccl_tests() {
        let v = per_iter(
            &[4.0, 1.0, 3.0, 2.0],
            &[vec![4.0, 1.0, 3.0, 2.0], vec![1.0; 4]],
        );
        assert_eq!(v["min_us"], 1.0);
        assert_eq!(v["max_us"], 4.0);
        assert_eq!(v["avg_us"], 2.5);
        assert_eq!(v["p50_us"], 3.0);
        assert_eq!(v["p95_us"], 4.0);
        let sd = (1.25f64).sqrt();
        assert!((v["stdev_us"].as_f64().unwrap() - sd).abs() < 1e-12);
        assert_eq!(v["times_us"].as_array().unwrap().len(), 4);
        assert_eq!(v["per_process_max_times_us"][1][0], 1.0);
        assert_eq!(per_iter(&[], &[]), Value::Null);
        assert!(per_iter(&[1.0], &[vec![1.0]])
            .get("per_process_max_times_us")
            .is_none());
        assert_eq!(
            nccl_tests_time("2026-12-03T22:54:23Z"),
            "2026-12-03 22:54:23"
        );
        assert!(is_json_name(Path::new("a/b.JSON")) && !is_json_name(Path::new("a.json/b")));
    }
}
