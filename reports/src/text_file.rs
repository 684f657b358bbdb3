//! Reading a file's text, the one way every loader does it: the error names
//! the file. A leaf of its own so that the loaders (`load`, `timeline`,
//! `plan`) never import one another for it.

use anyhow::{Context, Result};
use std::path::Path;

/// Reads a file's text, naming it in the error.
pub fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| path.display().to_string())
}
