//! `report plan`'s mixture-of-experts flags: a custom MoE shape, the
//! routing's imbalance and node limit, the token dispatcher; checked and
//! applied to the model and the plan's input.

use crate::load::Source;
use crate::units;
use anyhow::{anyhow, bail, Result};
use clap::Args;
use parbench::model::footprint::Recompute;
use parbench::model::moe::{Dispatcher, Moe, MoeRecompute};
use parbench::model::plan::PlanInput;
use parbench::model::Preset;
use parbench::results::MoeRow;
use parbench::vocab;

/// The MoE flags of `report plan`.
#[derive(Args, Debug, Default)]
pub struct MoeArgs {
    /// Routed experts per MoE layer (a custom MoE shape, with --topk and --expert-ffn; SwiGLU experts, so --arch llama).
    #[arg(help_heading = "Model", long = vocab::experts::LONG, value_name = vocab::experts::VALUE)]
    pub experts: Option<u64>,
    /// Experts each token is routed to (custom MoE shape).
    #[arg(help_heading = "Model", long = vocab::topk::LONG, value_name = vocab::topk::VALUE)]
    pub topk: Option<u64>,
    /// Inner size of one expert's MLP (custom MoE shape).
    #[arg(help_heading = "Model", long = vocab::expert_ffn::LONG, value_name = vocab::expert_ffn::VALUE)]
    pub expert_ffn: Option<u64>,
    /// Shared experts every token passes, each of --expert-ffn (custom MoE shape; default 0).
    #[arg(help_heading = "Model", long = vocab::shared_experts::LONG, value_name = vocab::shared_experts::VALUE)]
    pub shared_experts: Option<u64>,
    /// The first D layers have a dense MLP of --ffn, as DeepSeek-V3's first 3 (custom MoE shape; default 0).
    #[arg(help_heading = "Model", long)]
    pub dense_layers: Option<u64>,
    /// Node-limited routing: a token's experts lie on at most M nodes (DeepSeek-V3: 4); 0: any.
    #[arg(help_heading = "Model", long, value_name = "M")]
    pub moe_node_limit: Option<u64>,
    /// The busiest rank's routed tokens over the mean, 1 or more (default 1: balanced routing): its expert GEMMs and all-to-all take this much longer.
    #[arg(help_heading = "Stack and search", long, value_name = "X")]
    pub moe_imbalance: Option<f64>,
    /// The token dispatcher: alltoall (Megatron-Core's: a copy per routed expert, one NCCL all-to-all) or deepep (DeepEP's normal kernels: a copy per destination rank, across nodes one per node forwarded over NVLink). Default: the stack's, else alltoall.
    #[arg(help_heading = "Stack and search", long, value_name = "NAME")]
    pub moe_dispatcher: Option<String>,
    /// MoE models: the modules recomputed in the backward, as Megatron-Core's --recompute-modules names them (with --recompute-granularity selective): layernorm, moe_act, moe (comma-separated).
    #[arg(help_heading = "Stack and search", long, value_name = "LIST")]
    pub recompute_modules: Option<String>,
}

/// Most experts a plan takes (DeepSeek-V3 has 256; beyond this, a typo).
const MAX_EXPERTS: u64 = 1 << 16;

impl MoeArgs {
    /// Whether a custom MoE shape flag is given.
    pub fn shape_given(&self) -> bool {
        [
            self.experts,
            self.topk,
            self.expert_ffn,
            self.shared_experts,
            self.dense_layers,
        ]
        .iter()
        .any(Option::is_some)
    }

    /// `p` with the MoE shape of the flags (a custom shape) or its
    /// preset's, and the node limit of `--moe-node-limit`.
    pub fn apply_to(&self, mut p: Preset, custom: bool) -> Result<Preset> {
        if self.shape_given() {
            if !custom {
                bail!("--model {}: give a preset or the MoE shape flags (--experts, --topk, --expert-ffn, --shared-experts, --dense-layers), not both", p.name);
            }
            let need = |v: Option<u64>, flag: &str| {
                v.ok_or_else(|| anyhow!("a custom MoE shape needs --experts, --topk and --expert-ffn: {flag} is missing"))
            };
            let experts = need(self.experts, "--experts")?;
            let topk = need(self.topk, "--topk")?;
            let ffn = need(self.expert_ffn, "--expert-ffn")?;
            if !(1..=MAX_EXPERTS).contains(&experts) || topk == 0 || topk > experts {
                bail!("--experts {experts} --topk {topk}: 1 to {MAX_EXPERTS} experts, and 1 to --experts of them per token");
            }
            if ffn == 0 || ffn > 10_000_000 {
                bail!("--expert-ffn {ffn}: 1 to 1e7");
            }
            let dense = self.dense_layers.unwrap_or(0);
            if dense > p.layers {
                bail!("--dense-layers {dense}: more than --layers {}", p.layers);
            }
            if p.arch != parbench::model::presets::Arch::Llama {
                bail!("--experts: the experts are SwiGLU MLPs (untied output layer, no biases): add --arch llama");
            }
            p.moe = Some(Moe {
                shared_experts: self.shared_experts.unwrap_or(0).min(MAX_EXPERTS),
                dense_layers: dense,
                ..Moe::new(experts, topk, ffn)
            });
        }
        if let Some(limit) = self.moe_node_limit {
            let Some(moe) = p.moe.as_mut() else {
                bail!("--moe-node-limit {limit}: the model has no experts");
            };
            moe.node_limit = limit;
        }
        Ok(p)
    }

    /// The routing and dispatcher flags applied to `input`, the imbalance
    /// from `--moe-imbalance` or else from a `--from` folder's
    /// `bench-collectives moe` dispatch ([`measured_imbalance`]); returns
    /// where a routing imbalance came from, in words.
    pub fn apply_to_input(
        &self,
        input: &mut PlanInput,
        sources: &[Source],
    ) -> Result<Option<String>> {
        let moe = input.model.moe;
        let mut imbalance_from = None;
        if let Some(x) = self.moe_imbalance {
            if !(x.is_finite() && (1.0..=1000.0).contains(&x)) {
                bail!(
                    "--moe-imbalance {}: the busiest rank's tokens over the mean, 1 to 1000",
                    parbench::units::number_text(x)
                );
            }
            if moe.is_none() {
                bail!("--moe-imbalance {x}: the model has no experts");
            }
            input.moe_imbalance = x;
            imbalance_from = Some(format!("routing imbalance {x} (--moe-imbalance)"));
        } else if let Some(m) = &moe {
            if let Some((x, from)) = measured_imbalance(m, sources)? {
                input.moe_imbalance = x;
                imbalance_from = Some(from);
            }
        }
        if let Some(d) = &self.moe_dispatcher {
            input.step.moe.dispatcher = match d.as_str() {
                "alltoall" => Dispatcher::AllToAll,
                "deepep" => Dispatcher::DeepEp,
                other => bail!("--moe-dispatcher {other}: expected alltoall or deepep"),
            };
        }
        if let Some(list) = &self.recompute_modules {
            if moe.is_none() {
                bail!("--recompute-modules {list}: costed for the layers of a model with experts; this one has none");
            }
            if input.recompute == Recompute::Full {
                bail!("--recompute-modules {list}: --recompute full already recomputes every layer whole");
            }
            input.moe_recompute =
                MoeRecompute::parse(list).map_err(|e| anyhow!("--recompute-modules {e}"))?;
        }
        Ok(imbalance_from)
    }
}

/// The largest imbalance (the busiest rank's bytes received over the
/// mean) of the exact `bench-collectives moe` dispatches in `sources`
/// that route the model's experts and top-k, and where it was measured;
/// `None` when the folders hold no dispatch. Dispatches of another shape
/// are refused: their imbalance is not this model's.
fn measured_imbalance(m: &Moe, sources: &[Source]) -> Result<Option<(f64, String)>> {
    let dispatches: Vec<(&Source, &MoeRow)> = sources
        .iter()
        .flat_map(|s| s.moe.iter().map(move |r| (s, r)))
        .filter(|(_, r)| r.phase == "dispatch" && r.wrong == 0 && r.imbalance.is_finite())
        .collect();
    if dispatches.is_empty() {
        return Ok(None);
    }
    let same_shape = |r: &MoeRow| r.experts as u64 == m.experts && r.topk as u64 == m.topk;
    let Some((s, r)) = dispatches
        .iter()
        .filter(|(_, r)| same_shape(r))
        .max_by(|a, b| a.1.imbalance.total_cmp(&b.1.imbalance))
    else {
        let measured: std::collections::BTreeSet<String> = dispatches
            .iter()
            .map(|(_, r)| format!("{} experts top-{}", r.experts, r.topk))
            .collect();
        bail!(
            "--from: its bench-collectives moe dispatches route {}, the model {} experts top-{}: measure the model's (bench-collectives moe --experts {} --topk {}) or give --moe-imbalance",
            measured.into_iter().collect::<Vec<_>>().join(", "),
            m.experts,
            m.topk,
            m.experts,
            m.topk
        );
    };
    let x = r.imbalance.max(1.0);
    Ok(Some((
        x,
        format!(
            "routing imbalance {x:.2} (bench-collectives moe dispatch in {}: {} routing over {} ranks, run {})",
            s.label, r.routing, r.world, r.run_id
        ),
    )))
}

/// The MoE part of the model's line: "256 experts top-8 (2048 each, 1
/// shared; 3 dense layers): 671B parameters, 37.6B active".
pub fn words(p: &Preset) -> Option<String> {
    let m = p.moe?;
    let (all, active) = p.moe_params()?;
    let mut extra = Vec::new();
    if m.shared_experts > 0 {
        extra.push(format!("{} shared", m.shared_experts));
    }
    if m.dense_layers > 0 {
        extra.push(format!("first {} layers dense", m.dense_layers));
    }
    if m.node_limit > 0 {
        extra.push(format!("a token on at most {} nodes", m.node_limit));
    }
    let extra = if extra.is_empty() {
        String::new()
    } else {
        format!("; {}", extra.join(", "))
    };
    Some(format!(
        "{} experts top-{} (MLP {} each{extra}): {}B parameters, {}B active",
        m.experts,
        m.topk,
        m.expert_ffn,
        units::sig3(all as f64 / 1e9),
        units::sig3(active as f64 / 1e9)
    ))
}
