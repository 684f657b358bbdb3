//! The checked sweep as plain types, below everything that measures,
//! prints or records it: what every rank runs ([`SweepConfig`]) and
//! nccl-tests' flags beyond it ([`NcclTestsFlags`]).

use anyhow::{anyhow, bail, Result};
use parbench::comm::{Collective, DType, ReduceOp};
use parbench::launch::flags;
use parbench::measure::wire::SweepRows;
use parbench::measure::Average;
use std::path::PathBuf;
use std::time::Duration;

/// Everything the sweep needs, checked: what every rank runs.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepConfig {
    pub collectives: Vec<Collective>,
    pub dtypes: Vec<DType>,
    /// `-d all`: a type the backend cannot run is left out, as nccl-tests
    /// leaves the 8-bit floats out below compute capability 9.0; a type
    /// named is refused instead.
    pub dtypes_all: bool,
    pub ops: Vec<ReduceOp>,
    /// Sizes in bytes, nccl-tests' meaning (see each op), ascending.
    pub sizes: Vec<u64>,
    pub iters: usize,
    pub warmup: usize,
    pub check: usize,
    /// `None`: every rank in turn (`-r -1`).
    pub root: Option<usize>,
    pub average: Average,
    pub out_of_place: bool,
    pub in_place: bool,
    pub timeout: Duration,
    /// `(rank, delay)` injected before each timed iteration.
    pub straggler: Option<(usize, Duration)>,
    /// `--graph N`: calls captured per CUDA graph (device backends only).
    pub graph: Option<usize>,
    /// Seed of the inputs (with rank and index).
    pub seed: u64,
    /// Smallest size (nccl-tests' bytes) of the fits' window.
    pub fit_from: u64,
    /// `-N`: times each table's sizes run (0: until interrupted).
    pub run_cycles: usize,
    /// `--format nccl-tests`: the rows nccl-tests would print (every size,
    /// even one that rounds to the count of the size before; sendrecv once
    /// per operator).
    pub nccl_tests_rows: bool,
}

impl SweepConfig {
    /// Checks what needs the world size: the root and the straggler rank.
    pub fn check_world(&self, world: usize) -> Result<()> {
        if let Some(root) = self.root.filter(|&r| r >= world) {
            bail!("-r/--root {root} is not a rank of a world of {world}");
        }
        if let Some((rank, delay)) = self.straggler {
            flags::Straggler { rank, delay }
                .check_world(world)
                .map_err(|e| anyhow!("--straggler {e}"))?;
        }
        Ok(())
    }

    /// The rows the wire's ladders must reach.
    pub fn rows(&self) -> SweepRows<'_> {
        SweepRows {
            collectives: &self.collectives,
            dtypes: &self.dtypes,
            sizes: &self.sizes,
        }
    }
}

/// How the sizes step, as nccl-tests' nThread line and JSON name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// `-f N` (N > 1): multiply.
    Factor(u64),
    /// `-i N` (or `-f 1`): add.
    Bytes(u64),
}

/// Which table rank 0 prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableFormat {
    /// parbench's table: nccl-tests' columns plus `%ceil` (`-v`: p50, p99, model, algo).
    Parbench,
    /// Exactly nccl-tests' columns, units row and footers.
    NcclTests,
}

/// The flags, parsed; [`crate::nccl_flags::check_backend`] says whether
/// the backend honours them.
#[derive(Clone, Debug, PartialEq)]
pub struct NcclTestsFlags {
    /// `-m`: operations per timed iteration (only 1 is measured).
    pub agg_iters: usize,
    /// `-z`: other than 0, wait for each operation before the next.
    pub blocking: bool,
    /// `-z` as given (nccl-tests' modes 0-3), for its header line.
    pub blocking_mode: u8,
    /// `-b`, `-e` and the step as given, which nccl-tests' header and JSON
    /// name (not the sizes swept).
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub step: Step,
    /// `-g`: GPUs this process drives (nccl only).
    pub ngpus: Option<usize>,
    pub format: TableFormat,
    /// `-J FILE`: nccl-tests' JSON.
    pub json_file: Option<PathBuf>,
    /// `-I 1`: nccl-tests' per-iteration columns in its layout.
    pub per_iter: bool,
}
