//! The command line checked into the job every rank runs: the last step
//! of parsing, above the flags' own checks ([`crate::nccl_flags`]).

use crate::cli::{parse_list, parse_size, parse_straggler, size_steps, Args, SweepJob};
use crate::config::{NcclTestsFlags, Step, SweepConfig, TableFormat};
use crate::nccl_flags::{all_types, check_other_flags};
use anyhow::{anyhow, bail, Result};
use parbench::comm::moe::{Copies, MoeShape, Payload, Skew};
use parbench::comm::{Collective, ReduceOp};
use parbench::measure::Average;

/// The seed of every rank's inputs (the one generator, `parbench::seed`).
const SWEEP_SEED: u64 = 0x5eed;

impl Args {
    /// Checks every flag and builds the job. Checks that need the world
    /// size (root, straggler rank) are in [`SweepJob::check_world`].
    pub fn job(&self) -> Result<SweepJob> {
        let mut collectives = Vec::new();
        let links = self
            .collectives
            .iter()
            .any(|c| c.eq_ignore_ascii_case("links"));
        if links && self.collectives.len() > 1 {
            bail!("`links` runs alone: it measures every pair of ranks, not collectives");
        }
        let moe = self.moe_shape()?;
        let cp_ring = self.cp_ring_stand_in()?;
        let pattern = links || moe.is_some() || cp_ring.is_some();
        for c in self.collectives.iter().filter(|_| !pattern) {
            if c.eq_ignore_ascii_case("all") {
                collectives = Collective::ALL.to_vec();
                break;
            }
            let c: Collective = c.parse().map_err(|e: String| anyhow!(e))?;
            if !collectives.contains(&c) {
                collectives.push(c);
            }
        }
        let min = parse_size(&self.min_bytes).map_err(|e| anyhow!("-b/--min-bytes: {e}"))?;
        let max = parse_size(&self.max_bytes).map_err(|e| anyhow!("-e/--max-bytes: {e}"))?;
        let step_bytes = self
            .step_bytes
            .as_deref()
            .map(parse_size)
            .transpose()
            .map_err(|e| anyhow!("-i/--step-bytes: {e}"))?;
        let step = match (self.step_factor, step_bytes) {
            (Some(f), _) if f > 1 => Step::Factor(f),
            // nccl-tests' default -i.
            (Some(_), None) => Step::Bytes(1 << 20),
            (_, Some(b)) => Step::Bytes(b),
            (None, None) => Step::Factor(2),
        };
        let sizes = match step {
            Step::Factor(f) => size_steps(min, max, Some(f), None)?,
            Step::Bytes(b) => size_steps(min, max, None, Some(b))?,
        };
        let average = Average::from_code(self.average)
            .ok_or_else(|| anyhow!("bad -a/--average {} (expected 0, 1, 2 or 3)", self.average))?;
        let timeout = parbench::limits::timeout(self.timeout)?;
        if self.iters == 0 {
            bail!("-n/--iters 0: at least 1");
        }
        use parbench::limits::{count, MAX_ITERATIONS, MAX_RUN_CYCLES};
        count("-n/--iters", self.iters, MAX_ITERATIONS)?;
        count("-w/--warmup", self.warmup, MAX_ITERATIONS)?;
        count("-c/--check", self.check, MAX_ITERATIONS)?;
        count("-N/--run-cycles", self.run_cycles, MAX_RUN_CYCLES)?;
        if self.nprocs == Some(0) {
            bail!("--nprocs 0: at least 1");
        }
        let straggler = self.straggler.as_deref().map(parse_straggler).transpose()?;
        // A delay the others cannot wait out is a stuck rank by design: on
        // the threads of --backend local it would keep the process past
        // --timeout (a sleeping thread is not interrupted).
        check_other_flags(self)?;
        if let Some((r, d)) = straggler.filter(|(_, d)| *d >= timeout) {
            bail!(
                "--straggler {r}:{}: the delay is not less than --timeout {}",
                d.as_millis(),
                self.timeout
            );
        }
        let nccl_tests = NcclTestsFlags::from_args(self, (min, max, step))?;
        let nccl_tests_rows = nccl_tests.format == TableFormat::NcclTests;
        Ok(SweepJob {
            backend: crate::cli::parse_backend(&self.backend)?,
            nprocs: self.nprocs,
            algo: self
                .algo
                .parse()
                .map_err(|e: String| anyhow!("--algo: {e}"))?,
            out: self.out.clone(),
            nccl_tests,
            links,
            moe,
            cp_ring,
            verbose: self.verbose,
            sweep: SweepConfig {
                collectives,
                dtypes: parse_list(&self.dtype, all_types(&self.format), "dtype")?,
                dtypes_all: self
                    .dtype
                    .split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("all")),
                ops: parse_list(&self.op, &ReduceOp::ALL, "op")?,
                sizes,
                iters: self.iters,
                warmup: self.warmup,
                check: if self.no_check { 0 } else { self.check },
                root: match self.root {
                    -1 => None,
                    r => Some(
                        usize::try_from(r)
                            .map_err(|_| anyhow!("-r/--root {r}: a rank, or -1 for every rank"))?,
                    ),
                },
                average,
                out_of_place: !self.inplace_only,
                in_place: !self.outplace_only,
                timeout,
                straggler,
                // nccl-tests' -G 0: no graphs.
                graph: self.graph.filter(|&g| g > 0),
                seed: SWEEP_SEED,
                fit_from: parse_size(&self.fit_from).map_err(|e| anyhow!("--fit-from: {e}"))?,
                run_cycles: self.run_cycles,
                nccl_tests_rows,
            },
        })
    }
}

/// The `moe` pattern's defaults: DeepSeek-V3's hidden size and top-8 of
/// 64 experts (which divide over 1 to 64 ranks), 1024 tokens per rank.
const MOE_DEFAULTS: (usize, usize, usize, usize) = (1024, 7168, 64, 8);

impl Args {
    /// The MoE shape of `bench-collectives moe` (alone), or `None` for a
    /// sweep, whose command line may not carry the MoE flags.
    fn moe_shape(&self) -> Result<Option<MoeShape>> {
        let moe = self
            .collectives
            .iter()
            .any(|c| c.eq_ignore_ascii_case("moe"));
        let given = [
            ("--tokens", self.tokens.is_some()),
            ("--hidden", self.hidden.is_some()),
            ("--experts", self.experts.is_some()),
            ("--topk", self.topk.is_some()),
            ("--routing", self.routing.is_some()),
            ("--node-limit", self.node_limit.is_some()),
            ("--capacity-factor", self.capacity_factor.is_some()),
            ("--payload", self.payload.is_some()),
            ("--copies", self.copies.is_some()),
        ];
        if !moe {
            if let Some((flag, _)) = given.iter().find(|(_, g)| *g) {
                bail!("{flag} is a flag of the `moe` pattern (bench-collectives moe {flag} ...)");
            }
            return Ok(None);
        }
        if self.collectives.len() > 1 {
            bail!("`moe` runs alone: it measures one MoE layer's exchange, not collectives");
        }
        let (tokens, hidden, experts, topk) = MOE_DEFAULTS;
        let text = |v: &Option<String>, default: &str| v.as_deref().unwrap_or(default).to_string();
        let skew: Skew = text(&self.routing, "uniform")
            .parse()
            .map_err(|e: String| anyhow!("--routing {e}"))?;
        let payload: Payload = text(&self.payload, "bf16")
            .parse()
            .map_err(|e: String| anyhow!("--payload {e}"))?;
        let copies: Copies = text(&self.copies, "dedup")
            .parse()
            .map_err(|e: String| anyhow!("--copies {e}"))?;
        Ok(Some(MoeShape {
            tokens: self.tokens.unwrap_or(tokens),
            hidden: self.hidden.unwrap_or(hidden),
            experts: self.experts.unwrap_or(experts),
            topk: self.topk.unwrap_or(topk),
            skew,
            node_limit: self.node_limit,
            capacity_factor: self.capacity_factor,
            payload,
            copies,
            seed: SWEEP_SEED,
        }))
    }
}

impl Args {
    /// The compute stand-in of `bench-collectives cp-ring` (alone), or
    /// `None` for a sweep, whose command line may not carry `--compute-us`.
    fn cp_ring_stand_in(&self) -> Result<Option<crate::cp_ring::StandIn>> {
        let ring = self
            .collectives
            .iter()
            .any(|c| c.eq_ignore_ascii_case(crate::cp_ring::NAME));
        if !ring {
            if self.compute_us.is_some() {
                bail!("--compute-us is a flag of the `cp-ring` pattern (bench-collectives cp-ring --compute-us ...)");
            }
            return Ok(None);
        }
        if self.collectives.len() > 1 {
            bail!("`cp-ring` runs alone: it measures the CP ring's steps beside compute, not collectives");
        }
        let stand_in = match self.compute_us.as_deref() {
            None => crate::cp_ring::StandIn::Exchange,
            Some(v) => v.parse().map_err(|e: String| anyhow!("--compute-us {e}"))?,
        };
        Ok(Some(stand_in))
    }
}
