//! PyTorch pipelining's compute-only CSV: no header, row `r` is rank `r`'s
//! actions in order, one action per cell in the text form (`0F0`, `1I3`).
//! An empty cell (what Python's csv writer makes of `None`) is an idle
//! step; a cell reading `None` is taken the same way. Rows may differ in
//! length. PyTorch's overlapped pair (`(0F3;7B0)OVERLAP_F_B`, as its
//! DualPipeV writes) is read as its two actions in order, as PyTorch's
//! runtime runs it.
//!
//! The file carries no stage-to-rank map: as PyTorch does, it is inferred
//! from which rank runs each stage's actions, and the number of stages and
//! microbatches from the largest indices seen.

use super::{Action, Schedule, ScheduleError};
use crate::limits::{MAX_ACTIONS, MAX_MICROBATCHES, MAX_PIPELINE_RANKS, MAX_STAGES};
use std::path::Path;

/// The largest schedule file read: [`MAX_ACTIONS`] cells of 16 bytes, far
/// more than the longest action (`4095I65535,`) takes.
const MAX_FILE_BYTES: u64 = (MAX_ACTIONS as u64) * 16;

/// Reads a compute-only CSV schedule from `path`.
pub fn load_csv(path: &Path) -> Result<Schedule, ScheduleError> {
    let shown = path.display().to_string();
    let io = |error| ScheduleError::Io {
        path: shown.clone(),
        error,
    };
    let bytes = crate::files::read_regular(path, MAX_FILE_BYTES).map_err(|e| match e {
        crate::files::FileError::Io { error, .. } => io(error),
        other => ScheduleError::Parse {
            path: shown.clone(),
            detail: match other {
                crate::files::FileError::Invalid { detail, .. } => detail,
                e => e.to_string(),
            },
        },
    })?;
    let text = String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let line = e.as_bytes()[..at].iter().filter(|&&b| b == b'\n').count() + 1;
        ScheduleError::Parse {
            path: shown.clone(),
            detail: format!("line {line}: not UTF-8 text"),
        }
    })?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| shown.clone());
    parse_csv(&text, &shown, &format!("csv:{name}"))
}

/// Parses compute-only CSV text; `origin` names the source in errors,
/// `name` becomes the schedule's name.
pub fn parse_csv(text: &str, origin: &str, name: &str) -> Result<Schedule, ScheduleError> {
    let parse_err = |detail: String| ScheduleError::Parse {
        path: origin.to_string(),
        detail,
    };
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let mut actions: Vec<Vec<Option<Action>>> = Vec::new();
    let mut cells = 0usize;
    for (line, rec) in reader.records().enumerate() {
        let rec = rec.map_err(|e| parse_err(format!("line {}: {e}", line + 1)))?;
        if line >= MAX_PIPELINE_RANKS {
            return Err(parse_err(format!(
                "line {}: more than {MAX_PIPELINE_RANKS} rows (one per rank; at most {MAX_PIPELINE_RANKS} stage ranks)",
                line + 1
            )));
        }
        cells += rec.len();
        if cells > MAX_ACTIONS {
            return Err(parse_err(format!(
                "line {}: more than {MAX_ACTIONS} cells in all",
                line + 1
            )));
        }
        let mut row = Vec::with_capacity(rec.len());
        for (col, cell) in rec.iter().enumerate() {
            if cell.is_empty() || cell == "None" {
                row.push(None);
                continue;
            }
            let at =
                |what: String| parse_err(format!("line {}, cell {}: {what}", line + 1, col + 1));
            for a in cell_actions(cell).map_err(at)? {
                if a.stage >= MAX_STAGES {
                    return Err(at(format!(
                        "{cell} names stage {}: at most {MAX_STAGES} stages",
                        a.stage
                    )));
                }
                if a.mb >= MAX_MICROBATCHES {
                    return Err(at(format!(
                        "{cell} names microbatch {}: at most {MAX_MICROBATCHES} microbatches",
                        a.mb
                    )));
                }
                row.push(Some(a));
            }
        }
        actions.push(row);
    }
    // A trailing all-empty row is an artefact of editors, not a rank.
    while actions
        .last()
        .is_some_and(|r| r.iter().all(Option::is_none))
    {
        actions.pop();
    }
    if actions.is_empty() {
        return Err(parse_err("no actions: expected one row per rank".into()));
    }
    let all = || actions.iter().flatten().flatten();
    let num_stages = all().map(|a| a.stage + 1).max().unwrap_or(0);
    let microbatches = all().map(|a| a.mb + 1).max().unwrap_or(0);
    let mut stage_to_rank: Vec<Option<usize>> = vec![None; num_stages];
    for (r, row) in actions.iter().enumerate() {
        for a in row.iter().flatten() {
            match stage_to_rank[a.stage] {
                None => stage_to_rank[a.stage] = Some(r),
                Some(owner) if owner != r => {
                    return Err(parse_err(format!(
                        "stage {} appears on rank {owner} and on rank {r} ({a}); a stage lives on one rank",
                        a.stage
                    )))
                }
                Some(_) => {}
            }
        }
    }
    let stage_to_rank = stage_to_rank
        .into_iter()
        .enumerate()
        .map(|(s, r)| r.ok_or_else(|| parse_err(format!("stage {s} has no actions on any rank"))))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Schedule {
        name: name.to_string(),
        num_stages,
        microbatches,
        stage_to_rank,
        actions,
    })
}

/// The actions of one cell: one action, or PyTorch's overlapped pair
/// (`(0F3;7B0)OVERLAP_F_B`, DualPipeV's), which PyTorch's runtime runs as
/// its sub-actions in order and so is read as those actions in turn.
fn cell_actions(cell: &str) -> Result<Vec<Action>, String> {
    let Some(inner) = cell
        .strip_prefix('(')
        .and_then(|c| c.strip_suffix(")OVERLAP_F_B"))
    else {
        return Ok(vec![cell.parse()?]);
    };
    let subs = inner
        .split(';')
        .map(str::parse)
        .collect::<Result<Vec<Action>, String>>()?;
    if subs.is_empty() || subs.len() > 2 {
        return Err(format!(
            "invalid overlapped pair '{cell}': expected (F;B)OVERLAP_F_B"
        ));
    }
    Ok(subs)
}

/// The compute-only CSV text of a schedule (idle steps as empty cells).
pub fn to_csv(s: &Schedule) -> String {
    let mut out = String::new();
    for row in &s.actions {
        let cells: Vec<String> = row
            .iter()
            .map(|a| a.map(|a| a.to_string()).unwrap_or_default())
            .collect();
        out.push_str(&cells.join(","));
        out.push_str("\r\n");
    }
    out
}

/// Writes the schedule to `path` as compute-only CSV, atomically.
pub fn save_csv(s: &Schedule, path: &Path) -> Result<(), ScheduleError> {
    crate::files::write_atomic(path, to_csv(s).as_bytes()).map_err(|e| match e {
        crate::files::FileError::Io { error, .. } => ScheduleError::Io {
            path: path.display().to_string(),
            error,
        },
        crate::files::FileError::Invalid { detail, .. } => ScheduleError::Parse {
            path: path.display().to_string(),
            detail,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::super::{generate, validate, ScheduleKind};
    use super::*;

    #[test]
    fn generated_schedules_round_trip() {
        for kind in ScheduleKind::ALL {
            let v = if kind.chunked() { 2 } else { 1 };
            let s = generate(kind, 3, 6, v).unwrap();
            let back = parse_csv(&to_csv(&s), "mem", &s.name).unwrap();
            assert_eq!(back, s, "{kind}");
        }
    }

    #[test]
    fn reads_torch_files_with_empty_cells_and_none() {
        // As Python's csv.writer leaves it: CRLF, empty cells for None.
        let text = "0F0,0F1,,0B0,0B1\r\n1F0,None,1F1,1B0,1B1\r\n";
        let s = parse_csv(text, "mem", "t").unwrap();
        assert_eq!(s.num_stages, 2);
        assert_eq!(s.microbatches, 2);
        assert_eq!(s.stage_to_rank, vec![0, 1]);
        assert_eq!(s.actions[0][2], None);
        assert_eq!(s.actions[1][1], None);
        validate(&s).unwrap();
    }

    #[test]
    fn overlapped_pairs_are_their_actions_in_order() {
        // Both stages on one rank: the pair is a forward of stage 0 and a backward of stage 1.
        let text = "0F0,1F0,(0F1;1B0)OVERLAP_F_B,0B0,1F1,1B1,0B1\r\n";
        let s = parse_csv(text, "mem", "t").unwrap();
        let row: Vec<String> = s.actions[0]
            .iter()
            .flatten()
            .map(|a| a.to_string())
            .collect();
        assert_eq!(
            row,
            ["0F0", "1F0", "0F1", "1B0", "0B0", "1F1", "1B1", "0B1"]
        );
        validate(&s).unwrap();
        for bad in [
            "()OVERLAP_F_B",
            "(0F0;1B0;2B0)OVERLAP_F_B",
            "(0F0;x)OVERLAP_F_B",
            "(0F0)OVERLAP",
        ] {
            let e = parse_csv(bad, "f.csv", "t").unwrap_err().to_string();
            assert!(
                e.starts_with("f.csv: line 1, cell 1: invalid"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn save_and_load_through_a_file() {
        let dir = std::env::temp_dir().join(format!("parbench-sched-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("zb.csv");
        let s = generate(ScheduleKind::ZbH1, 2, 4, 1).unwrap();
        save_csv(&s, &path).unwrap();
        let back = load_csv(&path).unwrap();
        assert_eq!(back.actions, s.actions);
        assert_eq!(back.name, "csv:zb.csv");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn bad_cells_name_line_and_cell() {
        let e = parse_csv("0F0,0B0\n1F0,1X0\n", "f.csv", "t")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("f.csv: line 2, cell 2: invalid action '1X0'"),
            "{e}"
        );
        let e = parse_csv("0F0,0B0\n0F1,0B1\n", "f.csv", "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("stage 0 appears on rank 0 and on rank 1"), "{e}");
        let e = parse_csv("1F0,1B0\n", "f.csv", "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("stage 0 has no actions"), "{e}");
        assert!(parse_csv("\n", "f.csv", "t").is_err());
    }

    #[test]
    fn indices_past_the_limits_name_line_and_cell() {
        // Once a panic (stage + 1 wrapped to 0: index out of bounds), a 64 GB
        // stage table, and "no stages or no microbatches".
        for (text, want) in [
            (
                "18446744073709551615F0\n",
                "line 1, cell 1: 18446744073709551615F0 names stage",
            ),
            (
                "0F0\n4000000000F0,4000000000B0\n",
                "line 2, cell 1: 4000000000F0 names stage",
            ),
            (
                "0F18446744073709551615\n",
                "line 1, cell 1: 0F18446744073709551615 names microbatch",
            ),
        ] {
            let e = parse_csv(text, "f.csv", "t").unwrap_err().to_string();
            assert!(e.starts_with("f.csv: ") && e.contains(want), "{e}");
        }
        // A chain of more ranks than the limit: refused at the first row past it.
        let chain: String = (0..10_000).map(|r| format!("{r}F0,{r}B0\n")).collect();
        let e = parse_csv(&chain, "f.csv", "t").unwrap_err().to_string();
        assert!(e.contains("line 257: more than 256 rows"), "{e}");
        let dir = std::env::temp_dir().join(format!("parbench-sched-utf8-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bad.csv");
        std::fs::write(&path, b"0F0,0B0\n1F0,\xff\n").unwrap();
        let e = load_csv(&path).unwrap_err().to_string();
        assert!(e.ends_with("bad.csv: line 2: not UTF-8 text"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
