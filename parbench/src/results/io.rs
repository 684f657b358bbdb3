//! Reading and writing results folders.

use super::{Record, RunMeta};
use crate::files::{
    create_new, not_regular, not_regular_or, read_head, read_regular, write_atomic, FileError,
    LOCK_FILE, MAX_RECORD_BYTES,
};
use serde::Deserialize;
use std::fs;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What can go wrong with a results folder. Each names the file (and line).
#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    /// The OS error is printed, not chained as a source (see
    /// [`FileError::Io`]).
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path}:{line}: {detail}")]
    Parse {
        path: PathBuf,
        line: u64,
        detail: String,
    },
    #[error("{path}: {detail}")]
    Invalid { path: PathBuf, detail: String },
    #[error("{path}: another running writer has held the lock for 30 s")]
    Locked { path: PathBuf },
}

/// A file the suite could not open, read or write: the same line as a
/// results error.
impl From<FileError> for ResultsError {
    fn from(e: FileError) -> Self {
        match e {
            FileError::Io { path, error } => ResultsError::Io { path, error },
            FileError::Invalid { path, detail } => ResultsError::Invalid { path, detail },
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ResultsError + '_ {
    move |error| ResultsError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// How long a writer waits for another live writer (one holds the lock for
/// a read, an append and a rename: milliseconds).
const LOCK_WAIT: Duration = Duration::from_secs(30);

/// An exclusive `flock(2)` on the folder's lock file, held while a writer
/// reads, extends and renames a results file. The kernel releases it when
/// its holder ends, however it ends: a writer killed mid-write leaves no
/// lock behind (the file stays; it is never removed, so that two writers
/// can never lock two different files of the same name).
struct DirLock {
    _file: fs::File,
}

impl DirLock {
    fn acquire(dir: &Path) -> Result<Self, ResultsError> {
        let path = dir.join(LOCK_FILE);
        // Never through a symlink, and never blocked on a FIFO planted
        // under the lock's name: either is refused in one line.
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| not_regular_or(&path, e))?;
        let meta = file.metadata().map_err(io_err(&path))?;
        if !meta.is_file() {
            return Err(not_regular(&path, meta.file_type()).into());
        }
        let deadline = Instant::now() + LOCK_WAIT;
        loop {
            // SAFETY: a valid open descriptor for the call's duration.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(DirLock { _file: file });
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::WouldBlock {
                return Err(io_err(&path)(e));
            }
            if Instant::now() > deadline {
                return Err(ResultsError::Locked { path });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The header line this version writes for `R`, newline included.
pub fn header_line<R: Record>() -> String {
    let mut h = columns::<R>().join(",");
    h.push('\n');
    h
}

/// Checks, before anything is measured, that rows of `R` and run records
/// can be added to `dir`: creates the folder, writes and removes a probe
/// file in it, takes and releases its lock, and checks what it already
/// holds (a file of another header or a run.json that does not parse
/// would otherwise refuse the records only after the whole run).
pub fn prepare_out<R: Record>(dir: &Path) -> Result<(), ResultsError> {
    let not_a_folder = || ResultsError::Invalid {
        path: dir.to_path_buf(),
        detail: "not a folder".into(),
    };
    if dir.exists() && !dir.is_dir() {
        return Err(not_a_folder());
    }
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    if !dir.is_dir() {
        return Err(not_a_folder());
    }
    // What the run will write must be regular files (or absent): a FIFO
    // would block it forever, a symlink would send its rows elsewhere.
    for name in [LOCK_FILE, R::FILE, "run.json"] {
        let path = dir.join(name);
        match fs::symlink_metadata(&path) {
            Ok(m) if !m.is_file() => return Err(not_regular(&path, m.file_type()).into()),
            _ => {}
        }
    }
    let (probe, probe_path) = create_new(dir, "parbench-probe").map_err(io_err(dir))?;
    let written = (|| {
        let mut f = probe;
        f.write_all(b"parbench")?;
        f.sync_all()
    })();
    let _ = fs::remove_file(&probe_path);
    written.map_err(io_err(dir))?;
    drop(DirLock::acquire(dir)?);
    let path = dir.join(R::FILE);
    if let Some(first) = read_head(&path, 64 * 1024)? {
        if !first.is_empty() && !first.starts_with(header_line::<R>().as_bytes()) {
            return Err(ResultsError::Invalid {
                path,
                detail: "the file there has another header (another schema version, or not a parbench file); write to another --out".into(),
            });
        }
    }
    let runs = dir.join("run.json");
    if runs.exists() {
        read_runs_file(&runs)?;
    }
    Ok(())
}

/// Appends `rows` to `dir/R::FILE`, creating the folder and the file with its
/// header as needed. The old rows are kept; a file with another header is an
/// error rather than a mixed file. The file is replaced whole (a temporary
/// file, fsync'd, renamed over it, under the folder's lock): a reader sees
/// it before or after the append, never half a row, and a writer killed at
/// any moment leaves every row it appended before. Benches call this as
/// each size (degree, schedule) completes. A row with a figure no reader
/// would accept (see [`check_figures`]) is an error naming it, and nothing
/// is written. Returns the file's path.
pub fn append_rows<R: Record>(dir: &Path, rows: &[R]) -> Result<PathBuf, ResultsError> {
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let path = dir.join(R::FILE);
    if rows.is_empty() {
        return Ok(path);
    }
    for (i, r) in rows.iter().enumerate() {
        check_figures(r).map_err(|detail| ResultsError::Invalid {
            path: path.clone(),
            detail: format!("row {} of this append, not written: {detail}", i + 1),
        })?;
    }
    let header = header_line::<R>().into_bytes();
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

    let _writing = WRITING.lock();
    let _lock = DirLock::acquire(dir)?;
    append_in_place(&path, &header, &body)?;
    Ok(path)
}

/// Adds `body` at the end of the CSV `path` (made new, with `header`, when
/// absent), in one write, synced: the rows already there are neither read
/// nor written again, so a batch costs its own bytes whatever the file's
/// size. Called under the folder's lock and [`WRITING`], so no other
/// writer interleaves and a signal waits for the write; a writer killed
/// by SIGKILL inside the write can leave part of its last row, which the
/// next append starts a new line after (and a reader names by its line).
fn append_in_place(path: &Path, header: &[u8], body: &[u8]) -> Result<(), ResultsError> {
    let file = match fs::OpenOptions::new()
        .read(true)
        .append(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut bytes = header.to_vec();
            bytes.extend_from_slice(body);
            return Ok(write_atomic(path, &bytes)?);
        }
        Err(e) => return Err(not_regular_or(path, e).into()),
    };
    let meta = file.metadata().map_err(io_err(path))?;
    if !meta.is_file() {
        return Err(not_regular(path, meta.file_type()).into());
    }
    let len = meta.len();
    let mut bytes = Vec::with_capacity(header.len() + body.len() + 1);
    if len == 0 {
        bytes.extend_from_slice(header);
    } else {
        let mut first = vec![0u8; header.len()];
        let same = len >= header.len() as u64
            && file.read_exact_at(&mut first, 0).is_ok()
            && first == header;
        if !same {
            return Err(ResultsError::Invalid {
                path: path.to_path_buf(),
                detail: "existing file has another header (another schema version?); write to another --out".into(),
            });
        }
        let mut last = [0u8];
        file.read_exact_at(&mut last, len - 1)
            .map_err(io_err(path))?;
        if last[0] != b'\n' {
            bytes.push(b'\n');
        }
    }
    bytes.extend_from_slice(body);
    let mut f = &file;
    let written = f.write_all(&bytes).and_then(|()| file.sync_data());
    if written.is_err() {
        // A full disk took part of the batch: cut it off, so the file
        // keeps whole rows only (the old ones).
        let _ = file.set_len(len);
    }
    written.map_err(io_err(path))
}

/// Held by this process while it replaces a results file: a process that
/// ends on a signal first waits for it ([`finish_writes`]), so that a file
/// is never left half-replaced by its own writer.
static WRITING: Mutex<()> = Mutex::new(());

/// Waits for this process's write in progress, if any, and keeps any other
/// from starting: the last thing before a process ends on a signal.
pub fn finish_writes() {
    std::mem::forget(WRITING.lock());
}

/// The run a writer has begun and not yet recorded: where, and its record.
static PENDING: Mutex<Option<(PathBuf, RunMeta)>> = Mutex::new(None);

/// What run.json says of a run that has begun and not yet recorded its
/// end: what a reader finds while it runs, and what stays when the
/// process could not record its end.
pub const NOT_ENDED: &str = "not recorded as ended: still running, or killed by a signal no process can catch (SIGKILL), or its folder could not be written";

/// Notes that the run `meta` has begun writing rows to `dir`: if the
/// process is stopped (a signal, a fault) before [`record_run`] records
/// it, [`record_cut_short`] records it as cut short. Its entry is in
/// run.json from now on, as [`NOT_ENDED`], so that a process killed
/// outright (SIGKILL, a full disk at the end) still leaves it beside its
/// rows; calling this again (with what the run has learnt since) rewrites
/// that entry.
pub fn begin_run(dir: &Path, meta: &RunMeta) {
    if let Ok(mut p) = PENDING.lock() {
        *p = Some((dir.to_path_buf(), meta.clone()));
    }
    let mut early = meta.clone();
    early.cut_short = Some(NOT_ENDED.into());
    // A folder that cannot take it now fails the run's own writes later,
    // with their error.
    let _ = write_run_entry(dir, &early);
}

/// Records the begun run (see [`begin_run`]) as cut short, with `why`
/// and the time it ended; its rows are already in the folder. `None` when
/// no run is pending (none begun, or already recorded).
pub fn record_cut_short(why: &str) -> Option<Result<PathBuf, ResultsError>> {
    // Held from taking the run to writing it: a thread that ends the
    // process meanwhile ([`finish_writes`]) waits for this record, instead
    // of finding no run pending and ending before it is written.
    let _writing = WRITING.lock();
    let (dir, mut meta) = PENDING.lock().ok()?.take()?;
    meta.cut_short = Some(why.to_string());
    meta.finish();
    Some(write_run_entry_held(&dir, &meta))
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
    if let Ok(mut p) = PENDING.lock() {
        if p.as_ref().is_some_and(|(_, m)| m.run_id == meta.run_id) {
            *p = None;
        }
    }
    write_run_entry(dir, meta)
}

/// Puts `meta` in `dir/run.json`, in place of the entry of the same run
/// when there is one.
fn write_run_entry(dir: &Path, meta: &RunMeta) -> Result<PathBuf, ResultsError> {
    let _writing = WRITING.lock();
    write_run_entry_held(dir, meta)
}

/// [`write_run_entry`] by a caller that holds [`WRITING`].
fn write_run_entry_held(dir: &Path, meta: &RunMeta) -> Result<PathBuf, ResultsError> {
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    edit_runs(dir, |runs| {
        // An entry written when the run began (see [`begin_run`]) is
        // replaced, keeping what another writer added to it meanwhile.
        match runs.iter_mut().find(|r| r.run_id == meta.run_id) {
            Some(r) => {
                let mut unknown = std::mem::take(&mut r.unknown);
                unknown.extend(meta.unknown.clone());
                *r = RunMeta {
                    unknown,
                    ..meta.clone()
                };
            }
            None => runs.push(meta.clone()),
        }
        true
    })?;
    Ok(dir.join("run.json"))
}

/// Reads `dir/run.json` (none: no runs), lets `edit` change its runs,
/// and writes it back when `edit` says it changed them, all under the
/// folder's lock. Every entry keeps the fields this version does not know
/// ([`RunMeta::unknown`]). Returns whether it wrote.
fn edit_runs(
    dir: &Path,
    edit: impl FnOnce(&mut Vec<RunMeta>) -> bool,
) -> Result<bool, ResultsError> {
    let path = dir.join("run.json");
    let _lock = DirLock::acquire(dir)?;
    let mut runs = match fs::symlink_metadata(&path) {
        Ok(_) => read_runs_file(&path)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io_err(&path)(e)),
    };
    if !edit(&mut runs) {
        return Ok(false);
    }
    let json = serde_json::to_vec_pretty(&runs).map_err(|e| ResultsError::Invalid {
        path: path.clone(),
        detail: e.to_string(),
    })?;
    write_atomic(&path, &json)?;
    Ok(true)
}

/// Completes the entry of `run_id` in `dir/run.json` when it still says
/// [`NOT_ENDED`]: the process that writes it was seen to die by its
/// launcher (SIGKILL leaves it no moment to write), and `why` is the
/// launcher's line. An entry that recorded its own end is left as it is.
/// Returns whether it completed one.
pub fn record_seen_death(dir: &Path, run_id: &str, why: &str) -> Result<bool, ResultsError> {
    let _writing = WRITING.lock();
    if fs::symlink_metadata(dir.join("run.json")).is_err() {
        return Ok(false);
    }
    edit_runs(dir, |runs| {
        let Some(r) = runs
            .iter_mut()
            .find(|r| r.run_id == run_id && r.cut_short.as_deref() == Some(NOT_ENDED))
        else {
            return false;
        };
        r.cut_short = Some(format!("{why} (recorded by its launcher)"));
        r.end = super::iso8601_utc(std::time::SystemTime::now());
        true
    })
}

fn read_runs_file(path: &Path) -> Result<Vec<RunMeta>, ResultsError> {
    let bytes = read_regular(path, MAX_RECORD_BYTES)?;
    serde_json::from_slice(&bytes).map_err(|e| ResultsError::Parse {
        path: path.to_path_buf(),
        line: e.line() as u64,
        detail: e.to_string(),
    })
}

/// Every run recorded in `dir/run.json` (empty if the folder has none).
pub fn read_runs(dir: &Path) -> Result<Vec<RunMeta>, ResultsError> {
    let path = dir.join("run.json");
    if fs::symlink_metadata(&path).is_err() {
        return Ok(Vec::new());
    }
    read_runs_file(&path)
}

/// Beyond these no figure of a record is a measurement (30 years in
/// microseconds, a petabyte a second in GB/s; below, far under any
/// clock's tick): a broken record, refused with its line rather than
/// printed as hundreds of digits. A check's error (`*_err` columns) may be
/// whatever a broken kernel makes, and is exempt.
pub const FIGURE_MAX: f64 = 1e15;
pub const FIGURE_MIN: f64 = 1e-30;

/// The rule every figure (each `f64` column) of a row keeps: a finite
/// number, not below zero, 0 or within [`FIGURE_MIN`]..[`FIGURE_MAX`];
/// NaN only in the columns the record type says may be not measured
/// ([`Record::MAY_BE_NAN`]). The error names the column.
pub fn check_figures<R: Record>(row: &R) -> Result<(), String> {
    // The row as CSV says what its figures read.
    let mut w = csv::WriterBuilder::new()
        .has_headers(false)
        .from_writer(Vec::new());
    w.serialize(row).map_err(|e| e.to_string())?;
    let bytes = w.into_inner().map_err(|e| e.to_string())?;
    let text = csv::ReaderBuilder::new()
        .has_headers(false)
        .from_reader(bytes.as_slice())
        .records()
        .next()
        .and_then(Result::ok)
        .unwrap_or_default();
    check_cells::<R>(&figure_columns(row)?, |i| text.get(i).unwrap_or(""))
}

/// The indices of a record type's figures (its `f64` columns), read off
/// one row: its JSON gives each as a float, or null where not finite
/// (rows hold no options, so null is only ever a figure).
fn figure_columns<R: Record>(row: &R) -> Result<Vec<usize>, String> {
    let serde_json::Value::Object(fields) = serde_json::to_value(row).map_err(|e| e.to_string())?
    else {
        return Ok(Vec::new());
    };
    Ok(columns::<R>()
        .iter()
        .enumerate()
        .filter(|(_, name)| match fields.get(**name) {
            Some(serde_json::Value::Null) => true,
            Some(serde_json::Value::Number(n)) => n.is_f64(),
            _ => false,
        })
        .map(|(i, _)| i)
        .collect())
}

/// [`check_figures`]' rule over a row's cells as text (`cell(i)` is column
/// i's): a reader checks the cells it has just read, without writing the
/// row out again.
fn check_cells<'a, R: Record>(
    figures: &[usize],
    cell: impl Fn(usize) -> &'a str,
) -> Result<(), String> {
    let names = columns::<R>();
    for &i in figures {
        let (name, text) = (names[i], cell(i));
        let x: f64 = text.trim().parse().unwrap_or(f64::NAN);
        let not_measured =
            x.is_nan() && text.trim().eq_ignore_ascii_case("nan") && R::MAY_BE_NAN.contains(&name);
        if !x.is_finite() && !not_measured {
            return Err(format!(
                "column {name} is {text}: a figure must be a finite number (NaN only where it was not measured)"
            ));
        }
        if x < -1e-9 {
            return Err(format!(
                "column {name} is {text}: a figure cannot be negative"
            ));
        }
        let beyond = x.is_finite() && x > 0.0 && !(FIGURE_MIN..=FIGURE_MAX).contains(&x);
        if beyond && !name.ends_with("_err") {
            return Err(format!(
                "column {name} is {}: no measurement is above {FIGURE_MAX:e} or, but 0, below {FIGURE_MIN:e}",
                crate::units::number_text(x)
            ));
        }
    }
    Ok(())
}

/// The column names of a record type, in order: the fields its
/// `Deserialize` asks for (one list, the type's own).
pub fn columns<R: for<'de> Deserialize<'de>>() -> &'static [&'static str] {
    use serde::de::{Error as _, Visitor};
    struct Probe<'a>(&'a mut &'static [&'static str]);
    impl<'de> serde::Deserializer<'de> for Probe<'_> {
        type Error = serde::de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(Self::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(Self::Error::custom("fields taken"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map enum identifier ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = R::deserialize(Probe(&mut fields));
    fields
}

/// Every row of `path`, or an error naming the file and the line at fault:
/// a first line that is not this record's header (a prefix of its columns:
/// files written before a column was added still read), a header with no
/// rows, text that is not UTF-8, a value that does not parse, or a figure
/// that breaks [`check_figures`].
pub fn read_rows<R: Record>(path: &Path) -> Result<Vec<R>, ResultsError> {
    let bytes = read_regular(path, MAX_RECORD_BYTES)?;
    let parse = |line: u64, detail: String| ResultsError::Parse {
        path: path.to_path_buf(),
        line,
        detail,
    };
    if bytes.is_empty() {
        return Err(parse(
            1,
            "empty file, not even a header (truncated?)".into(),
        ));
    }
    let mut reader = csv::ReaderBuilder::new()
        .flexible(false)
        .from_reader(bytes.as_slice());
    let header = reader
        .byte_headers()
        .map_err(|e| parse(1, csv_detail(&e)))?
        .clone();
    let cols = columns::<R>();
    let names: Vec<&str> = header
        .iter()
        .map(std::str::from_utf8)
        .collect::<Result<_, _>>()
        .map_err(|_| parse(1, "the header is not UTF-8 text".into()))?;
    if names.len() > cols.len() || names.iter().zip(cols).any(|(a, b)| a != b) {
        let start: String = names.join(",").chars().take(40).collect();
        return Err(parse(
            1,
            format!(
                "not a {} header (expected {},...; found {start:?})",
                R::FILE,
                cols.iter().take(3).copied().collect::<Vec<_>>().join(",")
            ),
        ));
    }
    let str_header = csv::StringRecord::from(names.clone());
    let mut rows = Vec::new();
    let mut rec = csv::ByteRecord::new();
    let mut lines = LineCounter::default();
    let mut figures: Option<Vec<usize>> = None;
    loop {
        match reader.read_byte_record(&mut rec) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => {
                let line = e
                    .position()
                    .map_or(rows.len() as u64 + 2, |p| lines.line_at(&bytes, p));
                return Err(parse(line, csv_detail(&e)));
            }
        }
        let line = rec
            .position()
            .map_or(rows.len() as u64 + 2, |p| lines.line_at(&bytes, p));
        let text = match csv::StringRecord::from_byte_record(rec.clone()) {
            Ok(t) => t,
            Err(e) => {
                let col = names.get(e.utf8_error().field()).copied().unwrap_or("?");
                return Err(parse(line, format!("column {col}: not UTF-8 text")));
            }
        };
        let row: R = text.deserialize(Some(&str_header)).map_err(|e| {
            let detail = match e.kind() {
                csv::ErrorKind::Deserialize { err, .. } => {
                    let col = err.field().and_then(|i| names.get(i as usize)).copied();
                    match col {
                        Some(c) => format!("column {c}: {}", err.kind()),
                        None => err.to_string(),
                    }
                }
                _ => csv_detail(&e),
            };
            parse(line, detail)
        })?;
        // The figures are checked on the cells just read (a file written
        // before a column was added lacks some: its rows are written out).
        let figures = match &figures {
            Some(f) => f,
            None => figures.insert(figure_columns(&row).map_err(|d| parse(line, d))?),
        };
        if text.len() == cols.len() {
            check_cells::<R>(figures, |i| text.get(i).unwrap_or(""))
        } else {
            check_figures(&row)
        }
        .map_err(|d| parse(line, d))?;
        rows.push(row);
    }
    if rows.is_empty() {
        return Err(parse(
            2,
            "a header but no rows (a bench never writes one: truncated?)".into(),
        ));
    }
    Ok(rows)
}

/// The line of the file a record starts on, counted from its byte offset:
/// the reader's own line count misses the blank lines it skips and counts
/// a CRLF file's second row as line 1 (its offset can point at the line
/// endings before the record, so those are passed first). The records come
/// in file order, so each count starts where the last one stopped: one
/// pass over the file in all, not one per record.
#[derive(Default)]
struct LineCounter {
    /// Bytes counted so far, and the newlines among them.
    at: usize,
    newlines: u64,
}

impl LineCounter {
    fn line_at(&mut self, bytes: &[u8], at: &csv::Position) -> u64 {
        let mut start = (at.byte() as usize).min(bytes.len());
        while matches!(bytes.get(start), Some(b'\r' | b'\n')) {
            start += 1;
        }
        if start < self.at {
            // Not in order (never, from one reader): count from the start.
            *self = LineCounter::default();
        }
        self.newlines += bytes[self.at..start]
            .iter()
            .filter(|&&b| b == b'\n')
            .count() as u64;
        self.at = start;
        self.newlines + 1
    }
}

/// A CSV reader's error in words (no debug dump).
fn csv_detail(e: &csv::Error) -> String {
    match e.kind() {
        csv::ErrorKind::UnequalLengths {
            expected_len, len, ..
        } => format!("row has {len} fields, the header has {expected_len} (truncated?)"),
        csv::ErrorKind::Utf8 { err, .. } => {
            format!("field {} is not UTF-8 text", err.field() + 1)
        }
        csv::ErrorKind::Io(io) => io.to_string(),
        csv::ErrorKind::Deserialize { err, .. } => err.to_string(),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::CollectiveRow;

    fn row(run: &str, bytes: u64) -> CollectiveRow {
        CollectiveRow {
            iters: 20,
            time_us: 1.5,
            time_min_us: 1.0,
            time_max_us: 2.0,
            p50_us: 1.4,
            p99_us: 1.9,
            algbw_gbps: 0.1,
            busbw_gbps: 0.1,
            model_us: 1.2,
            ceiling_gbps: 10.0,
            ..CollectiveRow::for_tests(run, bytes)
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
    fn an_append_adds_its_rows_without_rewriting_the_file() {
        // Was: each batch rewrote and synced the whole file (13.8 s for
        // batches onto 100k rows): the file was replaced, a new inode each time.
        use std::os::unix::fs::MetadataExt;
        let dir = tempdir("inplace");
        let path = append_rows(&dir, &[row("a", 8)]).unwrap();
        let inode = fs::metadata(&path).unwrap().ino();
        append_rows(&dir, &[row("b", 8), row("b", 16)]).unwrap();
        assert_eq!(
            fs::metadata(&path).unwrap().ino(),
            inode,
            "appended in place"
        );
        let rows: Vec<CollectiveRow> = read_rows(&path).unwrap();
        assert_eq!(rows.len(), 3);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_begun_run_is_in_run_json_until_it_records_its_end() {
        // Was: a launcher killed by SIGKILL, or a folder full at the end,
        // left rows and no run.json.
        let dir = tempdir("begun");
        let mut m = RunMeta::start("collectives", "begun-1", "local", 2);
        begin_run(&dir, &m);
        let runs = read_runs(&dir).unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].cut_short.as_deref(), Some(NOT_ENDED));
        m.finish();
        record_run(&dir, &m).unwrap();
        let runs = read_runs(&dir).unwrap();
        assert_eq!(runs, vec![m], "the same entry, now whole");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn appending_a_run_keeps_fields_this_version_does_not_know() {
        // Was: run.json rewritten from the parsed structs, so a newer
        // version's or a CI system's fields vanished at the next run.
        let dir = tempdir("unknown");
        let mut a = RunMeta::start("collectives", "a", "local", 2);
        a.finish();
        record_run(&dir, &a).unwrap();
        let path = dir.join("run.json");
        let mut v: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        v[0]["future_field"] = serde_json::json!({"nested": [1, 2]});
        v[0]["extra"]["ci_job"] = serde_json::json!("nightly-7");
        fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
        let b = RunMeta::start("collectives", "b", "local", 2);
        begin_run(&dir, &b);
        record_run(&dir, &b).unwrap();
        let back: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        assert_eq!(back[0]["future_field"], v[0]["future_field"]);
        assert_eq!(back[0]["extra"]["ci_job"], "nightly-7");
        assert_eq!(back.as_array().unwrap().len(), 2);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_launcher_completes_the_entry_of_a_rank_it_saw_die() {
        // Was: rank 0 killed by SIGKILL left "not recorded as ended",
        // though its launcher had named the cause.
        let dir = tempdir("seen");
        let mut m = RunMeta::start("collectives", "seen-1", "tcp", 2);
        m.cut_short = Some(NOT_ENDED.into());
        write_run_entry(&dir, &m).unwrap();
        let why = "rank 0 was killed by signal 9 (SIGKILL) 1.0 s after launch";
        assert!(record_seen_death(&dir, "seen-1", why).unwrap());
        let runs = read_runs(&dir).unwrap();
        assert!(runs[0].cut_short.as_deref().unwrap().starts_with(why));
        assert!(!runs[0].end.is_empty());
        // A run that recorded its own end keeps it.
        assert!(!record_seen_death(&dir, "seen-1", "again").unwrap());
        assert!(!record_seen_death(&dir, "other", why).unwrap());
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
    fn the_line_named_is_the_file_s_line_whatever_its_endings() {
        // Was: a bad row on line 2 of a CRLF file named line 1, and one
        // after a blank line named the line before it.
        let dir = tempdir("lines");
        let path = append_rows(&dir, &[row("a", 8)]).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        let header = text.lines().next().unwrap();
        let bad = text.lines().nth(1).unwrap().replace(",1.5,", ",NaN,");
        for (body, line) in [
            (format!("{header}\r\n{bad}\r\n"), 2),
            (format!("{header}\n\n{bad}\n"), 3),
            (
                format!("{header}\n{}\n{bad}", text.lines().nth(1).unwrap()),
                3,
            ),
        ] {
            fs::write(&path, body).unwrap();
            let err = read_rows::<CollectiveRow>(&path).unwrap_err().to_string();
            assert!(
                err.contains(&format!("collectives.csv:{line}: column time_us")),
                "{err}"
            );
        }
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
