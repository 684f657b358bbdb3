//! Shared by the integration tests that read a folder's run.json
//! (bench-pipeline's composed runs, reports' `plan --check`), which include
//! this file with `#[path = "../../test-support/run_json.rs"] mod run_json;`.
//!
//! Included, not a crate: it is test code only and needs nothing but
//! serde_json, which every including crate has.
#![allow(dead_code)]

use serde_json::Value;
use std::path::Path;

/// Every composed section (`extra.composed`) of `dir`'s run.json, run by
/// run, in order; a run without one adds none.
pub fn composed_sections(dir: &Path) -> Vec<Value> {
    let runs: Value =
        serde_json::from_slice(&std::fs::read(dir.join("run.json")).unwrap()).unwrap();
    runs.as_array()
        .unwrap()
        .iter()
        .flat_map(|r| {
            r["extra"]["composed"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect()
}
