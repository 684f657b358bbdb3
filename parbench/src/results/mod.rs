//! Result records: one CSV per suite with a fixed header and a `schema`
//! column, and one run.json per results folder listing every run's metadata.
//!
//! Writers never lose data: a results file is rewritten only as its old
//! bytes followed by the new rows, through a temporary file renamed into
//! place, under an OS lock (`flock(2)`, released when its holder dies), so
//! that a second run into the same folder keeps the first and a crash
//! leaves either the old or the new file. Benches check the folder before
//! measuring ([`prepare_out`]), append rows as each measurement completes,
//! and a run stopped early is recorded in run.json as cut short
//! ([`begin_run`], [`record_cut_short`]).

mod cp_ring_row;
mod io;
mod link_row;
mod meta;
mod moe_row;
mod records;

pub use crate::files::{is_record_name, random_hex, LOCK_FILE, MAX_RECORD_BYTES};
pub use cp_ring_row::CpRingRow;
pub use io::{
    append_rows, begin_run, check_figures, columns, finish_writes, header_line, prepare_out,
    read_rows, read_runs, record_all, record_cut_short, record_run, record_seen_death,
    ResultsError, FIGURE_MAX, FIGURE_MIN, NOT_ENDED,
};
pub use link_row::{verdict, LinkRow, Verdict, SLOW_SHARE};
pub use meta::{git_revision, iso8601_utc, job_run_id, new_run_id, RunMeta, RUN_ID_VAR};
pub use moe_row::MoeRow;
pub use records::{row_label, CollectiveRow, CpRow, LayerRow, PipelineRow, Record, SCHEMA_VERSION};

use std::path::Path;

/// [`crate::files::check_output`], its refusal a results error.
pub fn check_output(path: &Path, next: Option<&[u8]>) -> Result<(), ResultsError> {
    Ok(crate::files::check_output(path, next)?)
}

/// [`crate::files::read_regular`], its refusal a results error.
pub fn read_regular(path: &Path, max: u64) -> Result<Vec<u8>, ResultsError> {
    Ok(crate::files::read_regular(path, max)?)
}

/// [`crate::files::write_atomic`], its refusal a results error.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ResultsError> {
    Ok(crate::files::write_atomic(path, bytes)?)
}
