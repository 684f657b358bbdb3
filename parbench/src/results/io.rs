//! Reading and writing results folders.

use super::{Record, RunMeta};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// What can go wrong with a results folder. Each names the file (and line).
#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {detail}")]
    Parse {
        path: PathBuf,
        line: u64,
        detail: String,
    },
    #[error("{path}: {detail}")]
    Invalid { path: PathBuf, detail: String },
    #[error("{path}: another writer holds the lock (remove it if no run is writing here)")]
    Locked { path: PathBuf },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ResultsError + '_ {
    move |source| ResultsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A lock file held while a writer reads, extends and renames a results file.
struct DirLock {
    path: PathBuf,
}

impl DirLock {
    fn acquire(dir: &Path) -> Result<Self, ResultsError> {
        let path = dir.join(".parbench.lock");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut f) => {
                    let _ = writeln!(f, "{}", std::process::id());
                    return Ok(DirLock { path });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    // A lock older than a minute was left by a writer that died.
                    let stale = fs::metadata(&path)
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| SystemTime::now().duration_since(t).ok())
                        .is_some_and(|age| age > Duration::from_secs(60));
                    if stale {
                        let _ = fs::remove_file(&path);
                        continue;
                    }
                    if Instant::now() > deadline {
                        return Err(ResultsError::Locked { path });
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(io_err(&path)(e)),
            }
        }
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// Writes `bytes` to `path` through a temporary file in the same folder and a
/// rename, so that a reader sees the old file or the new one, never a part.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ResultsError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "results".into());
    let tmp = path.with_file_name(format!(".{name}.tmp.{}", std::process::id()));
    let result = (|| {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(io_err(path))
}

fn header_of<R: Record>(rows: &[R]) -> Result<Vec<u8>, String> {
    let mut w = csv::WriterBuilder::new().from_writer(Vec::new());
    match rows.first() {
        Some(r) => w.serialize(r).map_err(|e| e.to_string())?,
        None => return Ok(Vec::new()),
    }
    let bytes = w.into_inner().map_err(|e| e.to_string())?;
    let end = bytes
        .iter()
        .position(|&b| b == b'\n')
        .map_or(bytes.len(), |i| i + 1);
    Ok(bytes[..end].to_vec())
}

/// Appends `rows` to `dir/R::FILE`, creating the folder and the file with its
/// header as needed. The old rows are kept; a file with another header is an
/// error rather than a mixed file. Returns the file's path.
pub fn append_rows<R: Record>(dir: &Path, rows: &[R]) -> Result<PathBuf, ResultsError> {
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let path = dir.join(R::FILE);
    if rows.is_empty() {
        return Ok(path);
    }
    let header = header_of(rows).map_err(|detail| ResultsError::Invalid {
        path: path.clone(),
        detail,
    })?;
    let mut body = csv::WriterBuilder::new()
        .has_headers(false)
        .from_writer(Vec::new());
    for r in rows {
        body.serialize(r).map_err(|e| ResultsError::Invalid {
            path: path.clone(),
            detail: e.to_string(),
        })?;
    }
    let body = body.into_inner().map_err(|e| ResultsError::Invalid {
        path: path.clone(),
        detail: e.to_string(),
    })?;

    let _lock = DirLock::acquire(dir)?;
    let mut bytes = match fs::read(&path) {
        Ok(old) if !old.is_empty() => {
            if !old.starts_with(&header) {
                return Err(ResultsError::Invalid {
                    path,
                    detail: "existing file has another header (another schema version?); write to another --out".into(),
                });
            }
            let mut old = old;
            if old.last() != Some(&b'\n') {
                old.push(b'\n');
            }
            old
        }
        Ok(_) => header.clone(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => header.clone(),
        Err(e) => return Err(io_err(&path)(e)),
    };
    bytes.extend_from_slice(&body);
    write_atomic(&path, &bytes)?;
    Ok(path)
}

/// Appends `rows` to their CSV and `meta` to run.json, and says where in
/// the line every bench prints (`# Records: CSV (+N rows), run.json (run ID)`).
pub fn record_all<R: Record>(
    dir: &Path,
    rows: &[R],
    meta: &RunMeta,
) -> Result<String, ResultsError> {
    let csv = append_rows(dir, rows)?;
    let json = record_run(dir, meta)?;
    Ok(format!(
        "# Records: {} (+{} rows), {} (run {})",
        csv.display(),
        rows.len(),
        json.display(),
        meta.run_id
    ))
}

/// Adds `meta` to `dir/run.json` (a JSON array of every run written to the folder).
pub fn record_run(dir: &Path, meta: &RunMeta) -> Result<PathBuf, ResultsError> {
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let path = dir.join("run.json");
    let _lock = DirLock::acquire(dir)?;
    let mut runs = match fs::read(&path) {
        Ok(_) => read_runs_file(&path)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io_err(&path)(e)),
    };
    runs.push(meta.clone());
    let json = serde_json::to_vec_pretty(&runs).map_err(|e| ResultsError::Invalid {
        path: path.clone(),
        detail: e.to_string(),
    })?;
    write_atomic(&path, &json)?;
    Ok(path)
}

fn read_runs_file(path: &Path) -> Result<Vec<RunMeta>, ResultsError> {
    let text = fs::read_to_string(path).map_err(io_err(path))?;
    serde_json::from_str(&text).map_err(|e| ResultsError::Parse {
        path: path.to_path_buf(),
        line: e.line() as u64,
        detail: e.to_string(),
    })
}

/// Every run recorded in `dir/run.json` (empty if the folder has none).
pub fn read_runs(dir: &Path) -> Result<Vec<RunMeta>, ResultsError> {
    let path = dir.join("run.json");
    if !path.exists() {
        return Ok(Vec::new());
    }
    read_runs_file(&path)
}

/// Every row of `path`, or an error naming the file and the line at fault.
pub fn read_rows<R: Record>(path: &Path) -> Result<Vec<R>, ResultsError> {
    let file = fs::File::open(path).map_err(io_err(path))?;
    let mut reader = csv::ReaderBuilder::new().flexible(false).from_reader(file);
    let mut rows = Vec::new();
    for (i, rec) in reader.deserialize::<R>().enumerate() {
        match rec {
            Ok(r) => rows.push(r),
            Err(e) => {
                let line = e.position().map(|p| p.line()).unwrap_or(i as u64 + 2);
                let detail = match e.kind() {
                    csv::ErrorKind::Deserialize { err, .. } => err.to_string(),
                    csv::ErrorKind::UnequalLengths {
                        expected_len, len, ..
                    } => {
                        format!("row has {len} fields, the header has {expected_len} (truncated?)")
                    }
                    other => format!("{other:?}"),
                };
                return Err(ResultsError::Parse {
                    path: path.to_path_buf(),
                    line,
                    detail,
                });
            }
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::{CollectiveRow, SCHEMA_VERSION};

    fn row(run: &str, bytes: u64) -> CollectiveRow {
        CollectiveRow {
            schema: SCHEMA_VERSION,
            run_id: run.into(),
            backend: "local".into(),
            wire: "shm".into(),
            algo: "ring".into(),
            collective: "all_reduce".into(),
            dtype: "float".into(),
            op: "sum".into(),
            root: -1,
            world: 2,
            bytes,
            count: bytes / 4,
            in_place: false,
            iters: 20,
            time_us: 1.5,
            time_min_us: 1.0,
            time_max_us: 2.0,
            p50_us: 1.4,
            p99_us: 1.9,
            algbw_gbps: 0.1,
            busbw_gbps: 0.1,
            wrong: 0,
            model_us: 1.2,
            ceiling_gbps: 10.0,
        }
    }

    fn tempdir(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("parbench-results-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_second_run_keeps_the_first() {
        let dir = tempdir("append");
        append_rows(&dir, &[row("a", 8), row("a", 16)]).unwrap();
        let path = append_rows(&dir, &[row("b", 8)]).unwrap();
        let rows: Vec<CollectiveRow> = read_rows(&path).unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0], row("a", 8));
        assert_eq!(rows[2].run_id, "b");
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(text.matches("schema,run_id").count(), 1, "one header");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn run_json_lists_every_run() {
        let dir = tempdir("runs");
        let mut a = RunMeta::start("collectives", "a", "local", 2);
        a.finish();
        record_run(&dir, &a).unwrap();
        record_run(&dir, &RunMeta::start("layers", "b", "local", 2)).unwrap();
        let runs = read_runs(&dir).unwrap();
        assert_eq!(runs.len(), 2);
        assert_eq!(runs[0], a);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn malformed_rows_name_file_and_line() {
        let dir = tempdir("bad");
        let path = append_rows(&dir, &[row("a", 8), row("a", 16)]).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        let mut lines: Vec<&str> = text.lines().collect();
        let cut = &lines[2][..lines[2].len() / 2];
        lines[2] = cut;
        fs::write(&path, lines.join("\n")).unwrap();
        let err = read_rows::<CollectiveRow>(&path).unwrap_err().to_string();
        assert!(err.contains("collectives.csv:3"), "{err}");

        fs::write(
            &path,
            format!("{}\n1,a,local,shm,ring,x,float,sum,-1,two", lines[0]),
        )
        .unwrap();
        let err = read_rows::<CollectiveRow>(&path).unwrap_err().to_string();
        assert!(err.contains(":2"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refuses_to_mix_headers() {
        let dir = tempdir("mix");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("collectives.csv"), "schema,other\n0,x\n").unwrap();
        assert!(append_rows(&dir, &[row("a", 8)]).is_err());
        assert_eq!(
            fs::read_to_string(dir.join("collectives.csv")).unwrap(),
            "schema,other\n0,x\n",
            "nothing lost"
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
