//! `report plan`'s device and `--layout`: the device description a plan
//! is costed on, the one layout a user names, its terms one by one, and
//! what it loses against the search's best.

use crate::units;
use anyhow::{anyhow, bail, Result};
use parbench::model::device::{Device, DEVICE_FILE_MAX_BYTES};
use parbench::model::plan::{Costed, LayoutQuery, LayoutRanking, Rejected, Rejection, Shard};
use parbench::model::stack::Stack;
use std::path::Path;

/// The device of `--device NAME` or `--device-file FILE`, and where it came from.
pub fn resolve_device(name: Option<&str>, file: Option<&Path>) -> Result<Option<Device>> {
    if let Some(n) = name {
        return Device::by_name(n).map(Some).ok_or_else(|| {
            anyhow!(
                "--device {n}: unknown device (known: {}; or --device-file FILE)",
                Device::names().join(", ")
            )
        });
    }
    let Some(path) = file else {
        return Ok(None);
    };
    let bytes = parbench::results::read_regular(path, DEVICE_FILE_MAX_BYTES)
        .map_err(|e| anyhow!("--device-file: {e}"))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| anyhow!("--device-file {}: not UTF-8 text", path.display()))?;
    let mut d =
        Device::from_json(&text).map_err(|e| anyhow!("--device-file {}: {e}", path.display()))?;
    if d.source.is_empty() {
        d.source = format!("{} (no source given)", path.display());
    }
    Ok(Some(d))
}

/// `dp=D,tp=T,pp=P[,cp=C][,vpp=V][,mbs=B][,schedule=S][,first=F,last=L]`.
pub fn parse_layout(spec: &str) -> Result<LayoutQuery> {
    let mut q = LayoutQuery::default();
    let (mut first, mut last) = (None, None);
    for part in spec.split(',') {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| anyhow!("--layout {spec}: '{part}' is not KEY=VALUE"))?;
        let k = k.trim();
        let v = v.trim();
        let number = || -> Result<u64> {
            match v.parse::<u64>() {
                Ok(n) if (1..=1_000_000_000).contains(&n) => Ok(n),
                _ => bail!("--layout {spec}: {k}={v}: a whole number from 1 to 1e9"),
            }
        };
        match k {
            "dp" => q.dp = number()?,
            "tp" => q.tp = number()?,
            "cp" => q.cp = number()?,
            "pp" => q.pp = number()?,
            "vpp" | "v" => q.chunks = Some(number()?),
            "mbs" | "b" => q.micro_batch = Some(number()?),
            // The first stage may hold the embedding alone (0 layers).
            "first" if v == "0" => first = Some(0),
            "first" => first = Some(number()?),
            "shard" => {
                q.shard = Some(Shard::by_name(v).ok_or_else(|| {
                    anyhow!("--layout {spec}: shard={v}: expected none, zero1, zero2 or zero3")
                })?)
            }
            "hsdp" | "shard-group" => q.shard_group = Some(number()?),
            "ep" => q.ep = Some(number()?),
            "etp" => q.etp = Some(number()?),
            // The last stage may hold the output layer alone (0 layers).
            "last" if v == "0" => last = Some(0),
            "last" => last = Some(number()?),
            "schedule" => {
                let known = parbench::schedule::SCHEDULES.iter().any(|e| e.name == v);
                if !known && v != "none" {
                    bail!(
                        "--layout {spec}: schedule {v} unknown (known: none, {})",
                        parbench::schedule::SCHEDULES
                            .iter()
                            .map(|e| e.name)
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                }
                q.schedule = Some(v.to_string());
            }
            _ => bail!(
                "--layout {spec}: unknown key {k} (dp, tp, cp, pp, ep, etp, vpp, mbs, schedule, first, last, shard, hsdp)"
            ),
        }
    }
    if q.dp == 0 || q.tp == 0 || q.pp == 0 {
        bail!("--layout {spec}: give dp=, tp= and pp=");
    }
    q.first_last = match (first, last) {
        (None, None) => None,
        (Some(f), Some(l)) => Some((f, l)),
        _ => bail!("--layout {spec}: give first= and last= together"),
    };
    Ok(q)
}

/// What a stack runs where a named layout does not say: its microbatch
/// size (or a data rank's whole batch without a pipeline, where the stack
/// does that), one chunk per rank unless `vpp=` is given, and its
/// schedule for that (none on one stage).
pub fn as_stack_runs(q: &mut LayoutQuery, s: &Stack, global_batch: u64) {
    let whole = (q.pp == 1 && s.whole_batch_without_pipeline)
        .then(|| global_batch.checked_div(q.dp))
        .flatten()
        .filter(|&b| b >= 1);
    q.micro_batch.get_or_insert(whole.unwrap_or(s.micro_batch));
    let chunks = *q.chunks.get_or_insert(1);
    if q.schedule.is_none() {
        q.schedule = Some(
            if q.pp == 1 {
                "none"
            } else if chunks > 1 {
                s.schedules.interleaved
            } else {
                s.schedules.plain
            }
            .to_string(),
        );
    }
}

fn secs(s: f64) -> String {
    units::micros(s * 1e6)
}

fn pct(x: f64, of: f64) -> String {
    units::percent(x / of)
}

/// One layout's terms, one per line; `verbose`: each with its parts
/// and what it is.
pub fn render_terms(c: &Costed, gpus: u64, have_gib: Option<f64>, verbose: bool) -> String {
    let mut out = String::new();
    let step = c.step_s;
    let per_gpu = |flops: f64| flops / step / gpus.max(1) as f64 / 1e12;
    out.push_str(&format!(
        "  step          {}   {} tokens/s",
        secs(step),
        units::sig3(c.tokens_per_s)
    ));
    if verbose {
        out.push_str(&format!(
            "; TFLOP/s per device: model {}, hardware {}",
            units::sig3(per_gpu(c.model_flops)),
            units::sig3(per_gpu(c.hardware_flops))
        ));
    }
    if let (Some(m), Some(h)) = (c.mfu, c.hfu) {
        out.push_str(&format!(
            "; MFU {}, HFU {}",
            units::percent(m),
            units::percent(h)
        ));
    }
    out.push('\n');
    // A term's line: its time and its share of the step, then its note.
    let term = |name: &str, s: f64| format!("  {name:<14}{}   {}", secs(s), pct(s, step));
    let note = |out: &mut String, text: &str| {
        if verbose {
            out.push_str(text);
        }
        out.push('\n');
    };
    out.push_str(&term("compute", c.compute_s));
    out.push_str(" of the step");
    if let (Some(p), true) = (&c.compute_parts, verbose) {
        out.push_str(&format!(
            " (GEMMs {}, attention {}, memory-bound {}, embedding and logits {})",
            secs(p.gemm_s),
            secs(p.attention_s),
            secs(p.memory_s),
            secs(p.logits_s)
        ));
    }
    out.push('\n');
    out.push_str(&term("tp comm", c.tp_comm_s));
    out.push('\n');
    if c.ep_comm_s > 0.0 {
        out.push_str(&term("ep all-to-all", c.ep_comm_s));
        note(
            &mut out,
            " (dispatch and combine, forward and backward, exposed)",
        );
    }
    if let Some(d) = &c.ep_dispatch {
        out.push_str(&parbench::term::wrap_hanging(
            &format!(
                "{}   {} tokens a rank: {} over NVLink, {} over its NIC; a token reaches {:.2} nodes; bottleneck {} GB/s (balanced routing)",
                secs(d.seconds),
                units::sig3(d.tokens),
                units::bytes(d.nvlink_bytes),
                units::bytes(d.rdma_bytes),
                d.nodes_reached,
                units::sig3(d.bottleneck_gbps)
            ),
            "  one dispatch  ",
            &" ".repeat(16),
            parbench::term::WIDTH,
        ));
    }
    if c.layout.cp > 1 {
        out.push_str(&term("cp comm", c.cp_comm_s));
        note(
            &mut out,
            " (the K/V exchange of the context-parallel group the attention does not hide)",
        );
    }
    out.push_str(&term("bubble", c.bubble_s));
    note(
        &mut out,
        " (idle of the busiest pipeline rank, with the hops' waits)",
    );
    out.push_str(&term("dp comm", c.dp_comm_s));
    out.push_str(&format!(
        " exposed, of {} in all\n",
        secs(c.dp_comm_total_s.max(c.dp_comm_s))
    ));
    if c.optimizer_s > 0.0 {
        out.push_str(&term("optimizer", c.optimizer_s));
        out.push('\n');
    }
    out.push_str(&format!(
        "  memory        {} per device",
        units::bytes(c.memory.total())
    ));
    if verbose {
        out.push_str(&format!(
            " (weights, gradients, optimizer {}; activations {} of {} microbatch-chunks in flight)",
            units::bytes(c.memory.states_bytes),
            units::bytes(c.memory.activation_bytes),
            c.memory.in_flight
        ));
    }
    if c.memory.formula_bytes > 0.0 {
        out.push_str(&format!(
            "; Megatron-LM's theoretical_memory_usage {}",
            units::bytes(c.memory.formula_bytes)
        ));
    }
    out.push('\n');
    let have = have_gib.map(|g| g * 1024.0 * 1024.0 * 1024.0);
    if let Some(h) = have.filter(|&h| c.memory.tight(h)) {
        let (lo, hi) = c.memory.range();
        out.push_str(&parbench::term::wrap_hanging(
            &format!(
                "{} to {} against {}: within the memory model's uncertainty (the two counts); it may not fit",
                units::bytes(lo),
                units::bytes(hi),
                units::bytes(h)
            ),
            "  tight         ",
            &" ".repeat(16),
            parbench::term::WIDTH,
        ));
    }
    // A long line (-v's parts) continues under its figures, its term's
    // name column kept.
    out.lines()
        .map(|l| match l.char_indices().nth(16) {
            Some((at, _)) if l.chars().count() > parbench::term::WIDTH => {
                parbench::term::wrap_hanging(
                    &l[at..],
                    &l[..at],
                    &" ".repeat(16),
                    parbench::term::WIDTH,
                )
            }
            _ => format!("{l}\n"),
        })
        .collect()
}

/// Why `named` loses to `best`, term by term, largest loss first.
pub fn why_loses(named: &Costed, best: &Costed) -> String {
    if named.layout == best.layout {
        return "It is the search's best layout.\n".into();
    }
    let behind = 1.0 - named.tokens_per_s / best.tokens_per_s;
    let terms = [
        ("compute", named.compute_s - best.compute_s),
        ("tp comm", named.tp_comm_s - best.tp_comm_s),
        ("ep all-to-all", named.ep_comm_s - best.ep_comm_s),
        ("cp comm", named.cp_comm_s - best.cp_comm_s),
        ("bubble", named.bubble_s - best.bubble_s),
        ("dp comm", named.dp_comm_s - best.dp_comm_s),
        ("optimizer", named.optimizer_s - best.optimizer_s),
    ];
    // A difference below a ten-thousandth of the step is rounding, not a reason.
    let least = 1e-4 * named.step_s;
    let mut worse: Vec<_> = terms.iter().filter(|t| t.1 > least).collect();
    worse.sort_by(|a, b| b.1.total_cmp(&a.1));
    let mut better: Vec<_> = terms.iter().filter(|t| t.1 < -least).collect();
    better.sort_by(|a, b| a.1.total_cmp(&b.1));
    let list = |v: &[&(&str, f64)]| {
        v.iter()
            .map(|(n, d)| format!("{n} {}{}", if *d > 0.0 { "+" } else { "-" }, secs(d.abs())))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = if behind >= 0.0 {
        format!(
            "Against the search's best, {} ({} tokens/s), this layout gives {} fewer tokens/s.",
            best.layout,
            units::sig3(best.tokens_per_s),
            units::percent(behind)
        )
    } else {
        format!(
            "This layout gives {} more tokens/s than the search's best, {} (the search does not try it).",
            units::percent(-behind),
            best.layout
        )
    };
    if !worse.is_empty() {
        out.push_str(&format!(" Its step is longer in {}", list(&worse)));
        if !better.is_empty() {
            out.push_str(&format!("; shorter in {}", list(&better)));
        }
        out.push('.');
    }
    out.push('\n');
    out
}

/// The rejection of those `keep` picks that comes closest to fitting in
/// memory (the smallest overshoot).
fn closest_memory(plan: &LayoutRanking, keep: impl Fn(&Rejected) -> bool) -> Option<&Rejected> {
    plan.rejected
        .iter()
        .filter(|r| keep(r))
        .filter_map(|r| match r.reason {
            Rejection::Memory {
                needs_bytes,
                have_bytes,
            } => Some((needs_bytes / have_bytes, r)),
            _ => None,
        })
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, r)| r)
}

/// Why nothing of `plan` (of those `keep` picks) runs: the closest memory
/// miss, else the first rule broken.
pub fn closest_rejection(plan: &LayoutRanking, keep: impl Fn(&Rejected) -> bool) -> Option<String> {
    match closest_memory(plan, &keep) {
        Some(r) => Some(format!("{} needs more memory: {}", r.layout, r.reason)),
        None => plan
            .rejected
            .iter()
            .find(|r| keep(r))
            .map(|r| r.reason.to_string()),
    }
}

/// One way to split training, as the seeds' rule names them: its best
/// layout, or why none of it runs.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Family {
    pub name: String,
    /// The best layout of the family and its tokens/s.
    pub best: Option<(String, f64)>,
    /// Why none runs (the closest memory miss), when none does.
    pub why_not: Option<String>,
}

/// The four ways the rule "fits on one GPU: data parallel; doesn't: FSDP,
/// tensor or pipeline parallel" chooses between, each with its best
/// layout of the plan or the reason none of it fits.
pub fn families(plan: &LayoutRanking) -> Vec<Family> {
    type Member = fn(u64, u64, Shard) -> bool;
    let defs: [(&str, Member); 4] = [
        ("data parallel (replicated)", |tp, pp, s| {
            tp == 1 && pp == 1 && s == Shard::None
        }),
        ("sharded data parallel (ZeRO / FSDP)", |tp, pp, s| {
            tp == 1 && pp == 1 && s != Shard::None
        }),
        ("with tensor parallel", |tp, pp, _| tp > 1 && pp == 1),
        ("with pipeline parallel", |_, pp, _| pp > 1),
    ];
    defs.iter()
        .map(|(name, member)| {
            let best = plan
                .ranked
                .iter()
                .find(|c| member(c.layout.tp, c.layout.pp, c.layout.shard))
                .map(|c| (c.layout.to_string(), c.tokens_per_s));
            let why_not = if best.is_some() {
                None
            } else {
                // A split that breaks a rule is rejected once, for every
                // sharding mode: its reason stands for the family.
                let rule = || {
                    plan.rejected
                        .iter()
                        .find(|r| {
                            member(r.layout.tp, r.layout.pp, Shard::Zero1)
                                || member(r.layout.tp, r.layout.pp, Shard::None)
                        })
                        .filter(|r| !matches!(r.reason, Rejection::Memory { .. }))
                        .map(|r| format!("none runs: {} ({})", r.reason, r.layout))
                };
                let member_of = |r: &Rejected| member(r.layout.tp, r.layout.pp, r.layout.shard);
                Some(match closest_memory(plan, member_of) {
                    Some(r) => format!("does not fit: {} {}", r.layout, r.reason),
                    None => rule().unwrap_or_else(|| {
                        "not searched (add its modes with --shard none,zero1,zero2,zero3)".into()
                    }),
                })
            };
            Family {
                name: (*name).into(),
                best,
                why_not,
            }
        })
        .collect()
}

/// The families in words, the winner last.
pub fn render_families(fams: &[Family]) -> String {
    let mut out = String::from(
        "Which way to split (fits on one device: data parallel; else sharded data, tensor or pipeline)\n",
    );
    for f in fams {
        let text = match (&f.best, &f.why_not) {
            (Some((layout, tps)), _) => {
                format!("fits: best {} tokens/s, {layout}", units::sig3(*tps))
            }
            (None, Some(why)) => why.clone(),
            (None, None) => continue,
        };
        out.push_str(&parbench::term::wrap_hanging(
            &text,
            &format!("  {:<36} ", f.name),
            &" ".repeat(39),
            parbench::term::WIDTH,
        ));
    }
    if let Some(w) = fams
        .iter()
        .filter_map(|f| f.best.as_ref().map(|b| (f, b.1)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
    {
        out.push_str(&format!("  wins: {}\n", w.0.name));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layout_spec_is_read_and_bad_ones_refused() {
        let q = parse_layout("dp=6,tp=8,pp=64,vpp=2,mbs=1").unwrap();
        assert_eq!(
            (q.dp, q.tp, q.pp, q.chunks, q.micro_batch),
            (6, 8, 64, Some(2), Some(1))
        );
        let q = parse_layout("dp=64, tp=8, pp=16, first=7, last=7").unwrap();
        assert_eq!(q.first_last, Some((7, 7)));
        let q = parse_layout("dp=64,tp=8,pp=16,vpp=8,first=0,last=0").unwrap();
        assert_eq!((q.chunks, q.first_last), (Some(8), Some((0, 0))));
        let q = parse_layout("dp=8,tp=8,cp=16,pp=16").unwrap();
        assert_eq!((q.dp, q.tp, q.cp, q.pp), (8, 8, 16, 16));
        for bad in [
            "dp=1,tp=1",
            "dp=0,tp=1,pp=1",
            "dp=1,tp=1,pp=1,zz=2",
            "dp=x,tp=1,pp=1",
            "dp=1,tp=1,pp=2,first=1",
            "dp=1,tp=1,pp=2,schedule=nope",
            "dp=1,tp=1,pp=1,cp=0",
        ] {
            assert!(parse_layout(bad).is_err(), "{bad}");
        }
    }
}
