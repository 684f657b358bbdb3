//! Reading results folders. Every error names the file and, where the file
//! has lines, the line: a report built on a half-read folder would mislead.

use anyhow::{anyhow, bail, Result};
use parbench::results::{
    read_rows, read_runs, CollectiveRow, CpRingRow, CpRow, LayerRow, LinkRow, MoeRow, PipelineRow,
    Record, RunMeta, SCHEMA_VERSION,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::timeline::{read_timeline, Timeline};

/// One results folder: its rows, its runs, and (when asked) its timelines.
#[derive(Debug)]
pub struct Source {
    /// The folder as given on the command line.
    pub dir: PathBuf,
    /// A short name for the folder, unique among the folders of one report.
    pub label: String,
    pub collectives: Vec<CollectiveRow>,
    pub layers: Vec<LayerRow>,
    pub pipeline: Vec<PipelineRow>,
    pub runs: Vec<RunMeta>,
    /// `bench-collectives links` pairs (links.csv).
    pub links: Vec<LinkRow>,
    /// `bench-collectives moe` phases (moe.csv).
    pub moe: Vec<MoeRow>,
    /// bench-layers `--cp` attention rows (layers_cp.csv).
    pub cp: Vec<CpRow>,
    /// `bench-collectives cp-ring` sizes (cp-ring.csv).
    pub cp_ring: Vec<CpRingRow>,
    /// Timeline file name (as a pipeline row names it) to its trace.
    pub timelines: BTreeMap<String, Timeline>,
}

/// Rows of `dir/R::FILE`, empty when the file does not exist; a row of another
/// schema version is an error naming its line.
fn rows_of<R: Record>(dir: &Path, schema: impl Fn(&R) -> u32) -> Result<Vec<R>> {
    let path = dir.join(R::FILE);
    if !is_there(&path) {
        return Ok(Vec::new());
    }
    let rows: Vec<R> = read_rows(&path)?;
    for (i, r) in rows.iter().enumerate() {
        let v = schema(r);
        if v != SCHEMA_VERSION {
            bail!(
                "{}:{}: schema version {v}, this report reads version {SCHEMA_VERSION}",
                path.display(),
                i + 2
            );
        }
    }
    Ok(rows)
}

/// Loads the CSV records and run.json of `dir`. A folder that does not exist
/// or holds no record file is an error; `with_timelines` also reads every
/// timeline the pipeline rows name (a named but missing file is an error that
/// names the row's line).
pub fn load_source(dir: &Path, with_timelines: bool) -> Result<Source> {
    if !dir.is_dir() {
        bail!("{}: no such results folder", dir.display());
    }
    let collectives = rows_of::<CollectiveRow>(dir, |r| r.schema)?;
    let layers = rows_of::<LayerRow>(dir, |r| r.schema)?;
    let pipeline = rows_of::<PipelineRow>(dir, |r| r.schema)?;
    let runs = read_runs(dir)?;
    let links = rows_of::<LinkRow>(dir, |r| r.schema)?;
    let moe = rows_of::<MoeRow>(dir, |r| r.schema)?;
    let cp = rows_of::<CpRow>(dir, |r| r.schema)?;
    let cp_ring = rows_of::<CpRingRow>(dir, |r| r.schema)?;
    let any_file = [
        CollectiveRow::FILE,
        LayerRow::FILE,
        PipelineRow::FILE,
        LinkRow::FILE,
        MoeRow::FILE,
        CpRow::FILE,
        CpRingRow::FILE,
    ]
    .iter()
    .any(|f| is_there(&dir.join(f)))
        // An MoE block run records its layouts in run.json alone.
        || runs.iter().any(|r| r.extra.contains_key("moe_rows"));
    if !any_file {
        bail!(
            "{}: no records (expected collectives.csv, layers.csv, layers_cp.csv, pipeline.csv, \
             links.csv, moe.csv or cp-ring.csv)",
            dir.display()
        );
    }
    let mut timelines = BTreeMap::new();
    if with_timelines {
        for (i, row) in pipeline.iter().enumerate() {
            let name = row.timeline.trim();
            if name.is_empty() || timelines.contains_key(name) {
                continue;
            }
            let path = timeline_path(dir, name).map_err(|why| {
                anyhow!(
                    "{}:{}: timeline {name:?} {why}",
                    dir.join(PipelineRow::FILE).display(),
                    i + 2
                )
            })?;
            if !is_there(&path) {
                bail!(
                    "{}:{}: names timeline {}, which does not exist",
                    dir.join(PipelineRow::FILE).display(),
                    i + 2,
                    path.display()
                );
            }
            // What is there but no regular file (a FIFO, a folder, a link
            // to nothing) is named by the reader, as every record is.
            let timeline = read_timeline(&path).map_err(|e| {
                anyhow!(
                    "{}:{}: timeline: {e:#}",
                    dir.join(PipelineRow::FILE).display(),
                    i + 2
                )
            })?;
            timelines.insert(name.to_string(), timeline);
        }
    }
    Ok(Source {
        dir: dir.to_path_buf(),
        label: String::new(),
        collectives,
        layers,
        pipeline,
        runs,
        links,
        moe,
        cp,
        cp_ring,
        timelines,
    })
}

/// Whether anything is at `path`: a file of any kind, or a symlink even
/// when it leads nowhere (a record that is a dangling link is an error
/// the reader names, never a file silently skipped).
fn is_there(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// Where a row's timeline file is: a plain file name inside `dir`, never
/// a path out of it (no `..`, no folder, not absolute), and not a link
/// that leads out of it. A report opens only what the folder holds.
fn timeline_path(dir: &Path, name: &str) -> std::result::Result<PathBuf, &'static str> {
    let plain = Path::new(name)
        .file_name()
        .is_some_and(|f| f == std::ffi::OsStr::new(name));
    if !plain || name == ".." || name.contains(['/', '\\']) {
        return Err("is not a file name in the results folder (a path, `..` or absolute)");
    }
    let path = dir.join(name);
    // A link is followed only when it stays inside the folder.
    if let (Ok(real), Ok(root)) = (path.canonicalize(), dir.canonicalize()) {
        if !real.starts_with(&root) {
            return Err("is a link that leads out of the results folder");
        }
    }
    Ok(path)
}

impl Source {
    /// The run.json entry of a run id.
    pub fn run(&self, run_id: &str) -> Option<&RunMeta> {
        self.runs.iter().find(|r| r.run_id == run_id)
    }
}

/// A collective's headline as a bench-collectives run recorded it
/// (`extra.headlines`: its peak against the wire's ceiling, as its footer
/// printed it).
#[derive(Clone, Debug, PartialEq)]
pub struct Headline {
    pub collective: String,
    /// The row of the peak.
    pub bytes: u64,
    pub in_place: bool,
    pub line: String,
}

/// The headlines a bench-collectives run recorded, in its order.
pub fn headlines(meta: &RunMeta) -> Vec<Headline> {
    meta.extra
        .get("headlines")
        .and_then(serde_json::Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|h| {
                    Some(Headline {
                        collective: h.get("collective")?.as_str()?.to_string(),
                        bytes: h.get("bytes")?.as_u64()?,
                        in_place: h.get("in_place")?.as_bool()?,
                        line: h.get("line")?.as_str()?.to_string(),
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The folders of one side of a comparison as one source: their rows and
/// runs pooled (each run a round), named by the first folder.
pub fn load_pooled(dirs: &[PathBuf]) -> Result<Source> {
    let (first, rest) = dirs
        .split_first()
        .ok_or_else(|| anyhow!("no results folder given"))?;
    let mut pooled = load_source(first, false)?;
    for dir in rest {
        let s = load_source(dir, false)?;
        pooled.collectives.extend(s.collectives);
        pooled.layers.extend(s.layers);
        pooled.pipeline.extend(s.pipeline);
        pooled.runs.extend(s.runs);
        pooled.links.extend(s.links);
        pooled.moe.extend(s.moe);
        pooled.cp.extend(s.cp);
        pooled.cp_ring.extend(s.cp_ring);
    }
    Ok(pooled)
}

/// Loads every folder and gives each a short label: its last path component,
/// made unique by adding parents where two folders share a name.
pub fn load_sources(dirs: &[PathBuf], with_timelines: bool) -> Result<Vec<Source>> {
    if dirs.is_empty() {
        return Err(anyhow!("no results folder given"));
    }
    let mut sources = dirs
        .iter()
        .map(|d| load_source(d, with_timelines))
        .collect::<Result<Vec<_>>>()?;
    let labels = unique_labels(dirs);
    for (s, l) in sources.iter_mut().zip(labels) {
        s.label = l;
    }
    Ok(sources)
}

fn unique_labels(dirs: &[PathBuf]) -> Vec<String> {
    let tail = |d: &Path, n: usize| -> String {
        let parts: Vec<String> = d
            .components()
            .filter(|c| !matches!(c, std::path::Component::CurDir))
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let start = parts.len().saturating_sub(n);
        let joined = parts[start..].join("/");
        if joined.is_empty() {
            d.display().to_string()
        } else {
            joined
        }
    };
    for depth in 1..=8 {
        let labels: Vec<String> = dirs.iter().map(|d| tail(d, depth)).collect();
        let mut seen = std::collections::BTreeSet::new();
        if labels.iter().all(|l| seen.insert(l.clone())) {
            return labels;
        }
    }
    dirs.iter()
        .enumerate()
        .map(|(i, d)| format!("{} #{}", d.display(), i + 1))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timelines_stay_inside_the_folder() {
        let dir = std::env::temp_dir().join(format!("parbench-tl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("timeline-a.json"), "[]").unwrap();
        assert!(timeline_path(&dir, "timeline-a.json").is_ok());
        for bad in [
            "../../../../etc/hostname",
            "/etc/hostname",
            "..",
            "sub/x.json",
            "a\\b",
        ] {
            assert!(timeline_path(&dir, bad).is_err(), "{bad}");
        }
        std::os::unix::fs::symlink("/etc/hostname", dir.join("out.json")).unwrap();
        assert!(timeline_path(&dir, "out.json").is_err());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn labels_are_unique() {
        let dirs = [
            PathBuf::from("a/x/shm"),
            PathBuf::from("b/x/shm"),
            PathBuf::from("tcp"),
        ];
        assert_eq!(unique_labels(&dirs), ["a/x/shm", "b/x/shm", "tcp"]);
        let dirs = [PathBuf::from("r/shm"), PathBuf::from("r/tcp")];
        assert_eq!(unique_labels(&dirs), ["shm", "tcp"]);
    }
}
