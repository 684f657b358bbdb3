//! Reading a file's text, the one way every loader does it: the error names
//! the file. A leaf of its own so that the loaders (`load`, `timeline`,
//! `plan_cmd`) never import one another for it.

use anyhow::{Context, Result};
use std::path::Path;

/// Reads a file's text, naming it in the error: a regular file only, of at
/// most the bytes any record reads (the library's one rule for inputs).
pub fn read_text(path: &Path) -> Result<String> {
    let bytes = parbench::results::read_regular(path, parbench::results::MAX_RECORD_BYTES)?;
    String::from_utf8(bytes)
        .map_err(|_| anyhow::anyhow!("not UTF-8 text"))
        .with_context(|| path.display().to_string())
}
