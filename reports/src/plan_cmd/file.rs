//! `plan.json`: the plan `report plan --output-file` writes and
//! `report html` reads back, with where each figure came from.

use anyhow::{bail, Context, Result};
use parbench::model::plan::{Costed, LossGroup};
use parbench::model::LinkParams;
use std::path::Path;

/// The file `report html` looks for in each results folder.
pub const PLAN_FILE: &str = "plan.json";

/// Version of the plan file's layout.
pub const PLAN_SCHEMA: u32 = 1;

/// Where a figure came from, in words.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Sourced<T> {
    pub value: T,
    pub from: String,
}

/// What `--output-file` writes and `report html` reads.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct PlanFile {
    pub schema: u32,
    /// The command line that made it.
    pub command: String,
    /// The model in words.
    pub model: String,
    pub global_batch: u64,
    pub gpus: u64,
    pub gpus_per_node: u64,
    pub memory_gib: Option<f64>,
    pub compute: Sourced<f64>,
    pub intra: Sourced<LinkParams>,
    pub inter: Sourced<LinkParams>,
    /// The device the plan is costed on, with its sources; `None`: a flat GEMM rate.
    #[serde(default)]
    pub device: Option<Sourced<String>>,
    /// How the step runs, in words (attention, accumulation, overlap).
    #[serde(default)]
    pub software: String,
    /// The stack of `--stack`, and what it implies.
    #[serde(default)]
    pub stack: Option<Sourced<String>>,
    /// What the stack's predictions are worth: its error over the
    /// published runs of the validation table.
    #[serde(default)]
    pub band: Option<super::validation::Band>,
    /// The band the plan is held to by its stack, model and precision
    /// (e.g. `megatron-core fp8`), whether or not it has runs.
    #[serde(default)]
    pub band_name: Option<String>,
    /// With --layout: the layout asked for, its best costing (first in `top`), and the search's best.
    #[serde(default)]
    pub layout_query: Option<String>,
    #[serde(default)]
    pub search_best: Option<Costed>,
    /// The ways to split (data, sharded data, tensor, pipeline parallel):
    /// each one's best layout or why none fits.
    #[serde(default)]
    pub families: Vec<super::layout::Family>,
    /// Layouts enumerated, fitting and rejected.
    pub enumerated: usize,
    pub fitting: usize,
    /// The best layouts (up to --top), fastest first.
    pub top: Vec<Costed>,
    /// When the best layout is tight (its two memory counts straddle the
    /// device): the best that fits by both counts, if any does.
    #[serde(default)]
    pub best_sure: Option<Costed>,
    /// Why the others lose.
    pub losses: Vec<LossGroup>,
}

impl PlanFile {
    /// Whether a layout is tight on this plan's devices: its two memory
    /// counts straddle the device's memory (it may not fit).
    pub fn tight(&self, c: &Costed) -> bool {
        self.memory_gib
            .is_some_and(|g| c.memory.tight(g * 1024.0 * 1024.0 * 1024.0))
    }

    /// A layout's memory as the tables show it: its count, and `tight`
    /// where [`PlanFile::tight`] holds.
    pub fn memory_cell(&self, c: &Costed) -> String {
        let total = crate::units::bytes(c.memory.total());
        if self.tight(c) {
            format!("{total} tight")
        } else {
            total
        }
    }
}

/// Reads `dir/plan.json` when it exists (for `report html`); a file that
/// exists but does not parse is an error naming it.
pub fn read_plan(dir: &Path) -> Result<Option<PlanFile>> {
    let path = dir.join(PLAN_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let text = crate::text_file::read_text(&path)?;
    let f: PlanFile = serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: not a plan written by report plan --output-file",
            path.display()
        )
    })?;
    if f.schema != PLAN_SCHEMA {
        bail!(
            "{}: plan schema {}, this report reads {PLAN_SCHEMA}",
            path.display(),
            f.schema
        );
    }
    Ok(Some(f))
}
