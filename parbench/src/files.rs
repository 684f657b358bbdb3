//! How every tool of the suite opens a file, the one place that decides it.
//!
//! Writing: a file is made new, under a name no one can guess, in the
//! target's own folder (`O_CREAT | O_EXCL | O_NOFOLLOW`, so a planted
//! symlink or file of that name is an error, never a way to write as this
//! user elsewhere), then renamed over the target. The target must be a
//! regular file or absent: a symlink, FIFO, device or folder given as an
//! output is refused (a rename would replace it, a write would go through
//! it), and so is one of the suite's own record files about to be replaced
//! by another kind of content (`report html --output-file results/collectives.csv`).
//!
//! Reading: only regular files (a FIFO would block, `/dev/zero` never
//! ends), opened without blocking, and at most a stated number of bytes.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A file that could not be opened, read or written as the suite opens
/// files; `results` and `schedule` turn it into their own errors.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The OS error is printed, not chained as a source: a report of
    /// the chain (`{:#}`) would print it twice.
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path}: {detail}")]
    Invalid { path: PathBuf, detail: String },
}

/// The lock file of a results folder.
pub const LOCK_FILE: &str = ".parbench.lock";

/// The most any record file (a CSV, run.json, plan.json, a timeline) is
/// read whole: far beyond a million rows, and well inside the memory of
/// any machine the suite runs on.
pub const MAX_RECORD_BYTES: u64 = 1 << 30;

/// `n` bytes from the OS's generator, as hex: names no one can predict
/// and job tokens. Falls back on the time and pid where the OS gives none
/// (a bare chroot): names then stay distinct, and `O_EXCL` still refuses
/// any file planted under one.
pub fn random_hex(n: usize) -> String {
    let mut bytes = vec![0u8; n];
    // SAFETY: the buffer is valid for `n` bytes for the call's duration.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), n, 0) };
    if usize::try_from(got).ok() != Some(n) {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let mix = (t ^ ((std::process::id() as u128) << 64)).to_le_bytes();
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = mix[i % mix.len()];
        }
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What a file that is not a regular one is, in words.
fn kind_words(ft: fs::FileType) -> &'static str {
    if ft.is_symlink() {
        "a symlink"
    } else if ft.is_dir() {
        "a folder"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_char_device() || ft.is_block_device() {
        "a device"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// A file that is not a regular one, refused: what it is, in one line.
pub(crate) fn not_regular(path: &Path, ft: fs::FileType) -> FileError {
    invalid(
        path,
        format!(
            "{}, not a regular file: parbench keeps its records only as regular files (remove it, or write to another --out)",
            kind_words(ft)
        ),
    )
}

/// An error opening `path` without following a symlink or blocking on a
/// FIFO, named by what is there when that is why it failed.
pub(crate) fn not_regular_or(path: &Path, e: std::io::Error) -> FileError {
    match fs::symlink_metadata(path) {
        Ok(m) if !m.is_file() => not_regular(path, m.file_type()),
        _ => io_err(path, e),
    }
}

fn invalid(path: &Path, detail: String) -> FileError {
    FileError::Invalid {
        path: path.to_path_buf(),
        detail,
    }
}

fn io_err(path: &Path, error: std::io::Error) -> FileError {
    FileError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// Opens `path` for reading when it is a regular file (a symlink to one
/// is followed: the reader chose it), without blocking on a FIFO. `None`
/// when there is no such file.
fn open_regular(path: &Path) -> Result<Option<(fs::File, u64)>, FileError> {
    let file = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(path, e)),
    };
    let meta = file.metadata().map_err(|e| io_err(path, e))?;
    if !meta.is_file() {
        return Err(invalid(
            path,
            format!(
                "{}, not a regular file: parbench reads only regular files",
                kind_words(meta.file_type())
            ),
        ));
    }
    Ok(Some((file, meta.len())))
}

/// The whole of the regular file `path`, at most `max` bytes (a larger
/// file is refused before it is read, one that grows while read when it
/// passes `max`). A FIFO, device or folder is refused without waiting.
pub fn read_regular(path: &Path, max: u64) -> Result<Vec<u8>, FileError> {
    let (file, len) = open_regular(path)?.ok_or_else(|| match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => invalid(
            path,
            "a symlink that leads nowhere (its target does not exist)".into(),
        ),
        _ => io_err(
            path,
            std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory"),
        ),
    })?;
    let too_big = |size: String| {
        invalid(
            path,
            format!(
                "{size}: larger than the {} parbench reads of one file",
                crate::units::bytes_text(u128::from(max))
            ),
        )
    };
    if len > max {
        return Err(too_big(format!("{len} bytes")));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io_err(path, e))?;
    if bytes.len() as u64 > max {
        return Err(too_big(format!("more than {max} bytes")));
    }
    Ok(bytes)
}

/// The first `n` bytes (or fewer) of the regular file `path`, `None` when
/// there is none.
pub fn read_head(path: &Path, n: u64) -> Result<Option<Vec<u8>>, FileError> {
    let Some((file, _)) = open_regular(path)? else {
        return Ok(None);
    };
    let mut head = Vec::new();
    file.take(n)
        .read_to_end(&mut head)
        .map_err(|e| io_err(path, e))?;
    Ok(Some(head))
}

/// Whether `name` is one of the files the suite keeps in a results folder
/// ([records.md](../../docs/records.md)).
pub fn is_record_name(name: &str) -> bool {
    const NAMES: [&str; 10] = [
        "collectives.csv",
        "links.csv",
        "moe.csv",
        "cp-ring.csv",
        "layers.csv",
        "pipeline.csv",
        "run.json",
        "plan.json",
        "plan-check.csv",
        LOCK_FILE,
    ];
    NAMES.contains(&name)
        || (name.starts_with("timeline-") && name.ends_with(".json"))
        || (name.starts_with("nccl-tuning-") && name.ends_with(".log"))
}

/// The kind [`content_kind`] gives every html page.
const HTML_KIND: &[u8] = b"<!doctype html>";
/// The kind [`content_kind`] gives every PyTorch compute-only schedule.
const SCHEDULE_KIND: &[u8] = b"schedule csv";

/// What kind of content `bytes` begin with, enough to tell one record from
/// another: a JSON document's opening brackets and first key, an html
/// page, a PyTorch schedule (cells such as `0F1`, or empty), otherwise the
/// first line (a CSV's header).
fn content_kind(bytes: &[u8]) -> Vec<u8> {
    let head = &bytes[..bytes.len().min(4096)];
    let t = head.trim_ascii_start();
    if !matches!(t.first(), Some(b'{' | b'[')) {
        let line = t.split(|&b| b == b'\n').next().unwrap_or_default();
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.len() >= HTML_KIND.len() && line[..HTML_KIND.len()].eq_ignore_ascii_case(HTML_KIND)
        {
            return HTML_KIND.to_vec();
        }
        if !line.is_empty() && line.split(|&b| b == b',').all(is_schedule_cell) {
            return SCHEDULE_KIND.to_vec();
        }
        return line.to_vec();
    }
    let mut kind = Vec::new();
    let mut rest = t;
    while let Some((&b, tail)) = rest.split_first() {
        match b {
            b'{' | b'[' => kind.push(b),
            b if b.is_ascii_whitespace() => {}
            b'"' => {
                let end = tail.iter().position(|&c| c == b'"').unwrap_or(tail.len());
                kind.extend_from_slice(&tail[..end]);
                break;
            }
            _ => break,
        }
        rest = tail;
    }
    kind
}

/// Whether `new` may replace `old`: the same [`content_kind`], or for
/// JSON the same opening brackets with the key `new` begins with among
/// `old`'s keys (a run.json another tool rewrote with its keys sorted,
/// `jq -S`, is still run.json).
fn same_kind(old: &[u8], new: &[u8]) -> bool {
    let (ko, kn) = (content_kind(old), content_kind(new));
    if ko == kn {
        return true;
    }
    let brackets = |k: &[u8]| k.iter().take_while(|b| matches!(b, b'{' | b'[')).count();
    let (bo, bn) = (brackets(&ko), brackets(&kn));
    if bn == 0 || ko[..bo] != kn[..bn] {
        return false;
    }
    let key = [b"\"", &kn[bn..], b"\""].concat();
    let head = &old[..old.len().min(4096)];
    head.windows(key.len()).enumerate().any(|(i, w)| {
        w == key.as_slice()
            && head[i + key.len()..]
                .iter()
                .find(|b| !b.is_ascii_whitespace())
                == Some(&b':')
    })
}

/// A cell of a PyTorch compute-only schedule: empty (idle), or a stage,
/// an action letter and a microbatch (`0F1`, `2B0`, `1W3`, `0I2`).
fn is_schedule_cell(cell: &[u8]) -> bool {
    let cell = cell.trim_ascii();
    if cell.is_empty() {
        return true;
    }
    let Some(at) = cell.iter().position(|b| !b.is_ascii_digit()) else {
        return false;
    };
    at > 0
        && cell[at].is_ascii_alphabetic()
        && cell.len() > at + 1
        && cell[at + 1..].iter().all(u8::is_ascii_digit)
}

/// Checks that `path` may be written as an output before anything is
/// measured: absent, empty, or a regular file holding content of the kind
/// about to replace it (`next`, its start: the same record's header, JSON
/// document, html page or schedule, see [`content_kind`]), in a folder
/// this process can create files in. `next` is `None` for a writer that
/// never replaces a file (it makes a new one beside it): then only one of
/// the suite's records is refused. A symlink, FIFO, device or folder is
/// refused: parbench neither writes through one nor replaces it.
pub fn check_output(path: &Path, next: Option<&[u8]>) -> Result<(), FileError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| invalid(path, "names a folder, not a file".into()))?;
    match fs::symlink_metadata(path) {
        Ok(meta) if !meta.is_file() => {
            return Err(invalid(
                path,
                format!(
                    "{}: parbench writes its outputs only as regular files (name a new file)",
                    kind_words(meta.file_type())
                ),
            ));
        }
        Ok(meta) if meta.len() > 0 => {
            let old = read_head(path, 4096)?.unwrap_or_default();
            let same = next.is_some_and(|n| same_kind(&old, n));
            if is_record_name(&name) && !same {
                return Err(invalid(
                    path,
                    "one of parbench's records: not replaced by other content (name another file)"
                        .into(),
                ));
            }
            if next.is_some() && !same {
                return Err(invalid(
                    path,
                    format!(
                        "holds other content ({}), not replaced by {} (name another file, or remove it)",
                        kind_name(&old),
                        kind_name(next.unwrap_or_default())
                    ),
                ));
            }
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(path, e)),
    }
    let dir = parent_of(path);
    match fs::metadata(&dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(invalid(path, format!("{} is not a folder", dir.display()))),
        Err(e) => return Err(invalid(path, format!("its folder {}: {e}", dir.display()))),
    }
    let (file, tmp) = create_new(&dir, &name).map_err(|e| io_err(path, e))?;
    drop(file);
    let _ = fs::remove_file(&tmp);
    Ok(())
}

/// A file's kind in words, for the refusal: `an html page`, `JSON`, or
/// its first line (cut short).
fn kind_name(bytes: &[u8]) -> String {
    let kind = content_kind(bytes);
    if kind == HTML_KIND {
        return "an html page".into();
    }
    if kind == SCHEDULE_KIND {
        return "a schedule".into();
    }
    if matches!(kind.first(), Some(b'{' | b'[')) {
        return "JSON".into();
    }
    let line: String = String::from_utf8_lossy(&kind).chars().take(40).collect();
    format!("a file beginning {line:?}")
}

/// The folder `path` lies in (`.` for a bare name).
fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// A new file in `dir` for `name`'s content, under a name no one can
/// predict, created here and nowhere else (`O_EXCL | O_NOFOLLOW`).
pub(crate) fn create_new(dir: &Path, name: &str) -> std::io::Result<(fs::File, PathBuf)> {
    // Long names stay within NAME_MAX with the suffix added.
    let stem: String = name.chars().take(120).collect();
    let tmp = dir.join(format!(
        ".{stem}.{}.{}.tmp",
        std::process::id(),
        random_hex(8)
    ));
    let file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    Ok((file, tmp))
}

/// Writes `bytes` to `path` through a new file in the same folder and a
/// rename, so that a reader sees the old file or the new one, never a
/// part; what [`check_output`] refuses is refused here too.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    check_output(path, Some(bytes))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dir = parent_of(path);
    // The file replaced keeps its permissions (a run.json at 0600 holds
    // command lines and host names): the new one takes its mode.
    let old_mode = fs::symlink_metadata(path)
        .ok()
        .filter(fs::Metadata::is_file)
        .map(|m| m.permissions().mode() & 0o7777);
    let (mut f, tmp) = create_new(&dir, &name).map_err(|e| io_err(path, e))?;
    let result = (|| {
        if let Some(mode) = old_mode {
            f.set_permissions(fs::Permissions::from_mode(mode))?;
        }
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        sync_dir(&dir);
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(|e| io_err(path, e))
}

/// Makes a rename or a new entry in `dir` reach the disk.
pub(crate) fn sync_dir(dir: &Path) {
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tempdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("parbench-file-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn kinds_tell_records_apart() {
        assert_eq!(content_kind(b"schema,run_id\n1,a\n"), b"schema,run_id");
        assert_eq!(content_kind(b"[\n  {\n    \"run_id\": 1"), b"[{run_id");
        assert_eq!(content_kind(b"{\n  \"schema\": 1"), b"{schema");
        assert!(same_kind(
            b"[{\"command_line\": [], \"run_id\" : \"a\"}]",
            b"[\n  {\n    \"run_id\": \"b\""
        ));
        assert!(!same_kind(b"{\"other\": 1}", b"{\n  \"schema\": 1"));
        assert!(!same_kind(b"[\"run_id\"]", b"[{\"run_id\": 1}"));
        assert_ne!(
            content_kind(b"<!DOCTYPE html>"),
            content_kind(b"schema,run_id\n")
        );
    }

    #[test]
    fn never_writes_through_a_planted_symlink_or_fifo() {
        let dir = tempdir("planted");
        let victim = dir.join("victim.txt");
        fs::write(&victim, "keep").unwrap();
        std::os::unix::fs::symlink(&victim, dir.join("out.json")).unwrap();
        let err = write_atomic(&dir.join("out.json"), b"{}").unwrap_err();
        assert!(err.to_string().contains("a symlink"), "{err}");
        assert_eq!(fs::read_to_string(&victim).unwrap(), "keep");
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let err = write_atomic(&fifo, b"x").unwrap_err();
        assert!(err.to_string().contains("a FIFO"), "{err}");
        let err = read_regular(&fifo, 10).unwrap_err();
        assert!(err.to_string().contains("a FIFO"), "{err}");
        let err = read_regular(Path::new("/dev/zero"), 10).unwrap_err();
        assert!(err.to_string().contains("a device"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn temp_names_are_new_each_time() {
        let dir = tempdir("names");
        let (_, a) = create_new(&dir, "x").unwrap();
        let (_, b) = create_new(&dir, "x").unwrap();
        assert_ne!(a, b);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_record_keeps_its_kind() {
        let dir = tempdir("kind");
        let csv = dir.join("collectives.csv");
        fs::write(&csv, "schema,run_id\n1,a\n").unwrap();
        let err = write_atomic(&csv, b"<!DOCTYPE html>\n").unwrap_err();
        assert!(err.to_string().contains("records"), "{err}");
        write_atomic(&csv, b"schema,run_id\n1,a\n1,b\n").unwrap();
        let other = dir.join("report.html");
        fs::write(&other, "<!DOCTYPE html>\nold").unwrap();
        write_atomic(&other, b"<!DOCTYPE html>").unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_output_replaces_only_a_file_of_its_own_kind() {
        // Was: any regular file that was not a record was replaced
        // (`report html --output-file notes.txt`).
        let dir = tempdir("own-kind");
        let notes = dir.join("notes.txt");
        fs::write(&notes, "notes\n").unwrap();
        let err = write_atomic(&notes, b"<!DOCTYPE html>\n<p>x").unwrap_err();
        assert!(err.to_string().contains("holds other content"), "{err}");
        assert_eq!(fs::read_to_string(&notes).unwrap(), "notes\n");
        let page = dir.join("report.html");
        fs::write(&page, "<!doctype HTML>\n<p>old").unwrap();
        write_atomic(&page, b"<!DOCTYPE html>\n<p>new").unwrap();
        let plan = dir.join("my.json");
        fs::write(&plan, "{\"other\": 1}").unwrap();
        assert!(write_atomic(&plan, b"{\n  \"schema\": 1}").is_err());
        let sched = dir.join("s.csv");
        fs::write(&sched, "0F0,0F1,,0B0\r\n").unwrap();
        write_atomic(&sched, b"0F0,1F0\r\n").unwrap();
        let empty = dir.join("empty.html");
        fs::write(&empty, "").unwrap();
        write_atomic(&empty, b"<!DOCTYPE html>").unwrap();
        // A writer that never replaces (nccl-tests' -J) checks only the rest.
        check_output(&notes, None).unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_replaced_file_keeps_its_mode() {
        // Was: a run.json at 0600 came back 0644 after the next run.
        let dir = tempdir("mode");
        let f = dir.join("run.json");
        fs::write(&f, "[]").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
        write_atomic(&f, b"[\n]").unwrap();
        assert_eq!(
            fs::metadata(&f).unwrap().permissions().mode() & 0o777,
            0o600
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reads_are_bounded() {
        let dir = tempdir("bound");
        let f = dir.join("big");
        fs::write(&f, vec![b'x'; 100]).unwrap();
        assert!(read_regular(&f, 99).is_err());
        assert_eq!(read_regular(&f, 100).unwrap().len(), 100);
        fs::remove_dir_all(&dir).unwrap();
    }
}
