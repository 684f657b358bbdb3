//! Why a layout cannot run at all, and the grouped reasons of "why the
//! others lose" (a costed layout's own [`Loss`] is in `costs`).

use super::costed::{Costed, Loss, Memory};
use super::layouts::Layout;
use super::LayoutRanking;

/// Why a layout cannot run.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Rejection {
    /// The tensor-parallel group would leave the node.
    TpAcrossNodes { tp: u64, gpus_per_node: u64 },
    /// Megatron-LM's divisibility rules ([`Preset::check_split`]).
    InvalidSplit { rule: String },
    /// The global batch does not split over the data-parallel ranks.
    Batch { global_batch: u64, dp: u64 },
    /// It needs more memory than a device has.
    Memory { needs_bytes: f64, have_bytes: f64 },
}

impl Rejection {
    /// The group a rejection is counted in.
    pub fn group(&self) -> &'static str {
        match self {
            Rejection::TpAcrossNodes { .. } => "tensor parallel across nodes",
            Rejection::InvalidSplit { .. } => "invalid split (Megatron's rule)",
            Rejection::Batch { .. } => "global batch does not divide",
            Rejection::Memory { .. } => "does not fit in memory",
        }
    }
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rejection::TpAcrossNodes { tp, gpus_per_node } => write!(
                f,
                "tensor-parallel degree {tp} does not fit in a node of {gpus_per_node} devices (--allow-tp-across-nodes)"
            ),
            Rejection::InvalidSplit { rule } => f.write_str(rule),
            Rejection::Batch { global_batch, dp } => write!(
                f,
                "global batch {global_batch} is not divisible by the data-parallel degree {dp}"
            ),
            Rejection::Memory {
                needs_bytes,
                have_bytes,
            } => write!(
                f,
                "needs {} of {} ({:+.1}%)",
                binary_bytes(*needs_bytes),
                binary_bytes(*have_bytes),
                (needs_bytes / have_bytes - 1.0) * 100.0
            ),
        }
    }
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Bytes in GiB, or MiB below one GiB (the reasons are read by people).
fn binary_bytes(b: f64) -> String {
    if b >= GIB {
        format!("{:.2} GiB", b / GIB)
    } else {
        format!("{:.1} MiB", b / (1024.0 * 1024.0))
    }
}

/// A layout that cannot run, and why. Structural rejections (tensor
/// parallel across nodes, splits, batch) are counted once per
/// `(dp, tp, pp)` (or per interleaved `v`), with an empty schedule; memory
/// rejections once per full layout.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Rejected {
    pub layout: Layout,
    pub reason: Rejection,
    /// The memory the layout needs, when it got that far.
    pub memory: Option<Memory>,
}

/// One line of "why the others lose".
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LossGroup {
    /// The group's name (a [`Loss::describe`] or [`Rejection::group`]).
    pub group: String,
    /// How many layouts (or splits) are in it.
    pub count: usize,
    /// Its most telling member: the fastest loser, the closest to fitting,
    /// the first split rule broken.
    pub example: Layout,
    /// What the example shows (its overhead's share of the step, how far
    /// over memory it is, the rule it breaks).
    pub detail: String,
}

impl LayoutRanking {
    /// The reasons the layouts other than the best lose, grouped: the
    /// fitting ones by their largest overhead (with the fastest of each
    /// group), then the rejected ones by reason (with the one closest to
    /// fitting in memory, or the first rule broken).
    pub fn losses(&self) -> Vec<LossGroup> {
        let mut out = Vec::new();
        let mut by_loss: Vec<(Loss, Vec<&Costed>)> = Vec::new();
        for c in self.ranked.iter().skip(1) {
            let l = c.dominant_overhead();
            match by_loss.iter_mut().find(|(k, _)| *k == l) {
                Some((_, v)) => v.push(c),
                None => by_loss.push((l, vec![c])),
            }
        }
        by_loss.sort_by_key(|(l, _)| *l);
        for (loss, members) in by_loss {
            let Some(first) = members.first() else {
                continue;
            };
            let part = match loss {
                Loss::Bubble => first.bubble_s,
                Loss::TpComm => first.tp_comm_s,
                Loss::DpComm => first.dp_comm_s,
                Loss::EpComm => first.ep_comm_s,
            };
            let best = self.ranked.first().map_or(f64::NAN, |b| b.tokens_per_s);
            out.push(LossGroup {
                group: loss.describe().into(),
                count: members.len(),
                example: first.layout.clone(),
                detail: format!(
                    "{:.1}% of its step; {:.1}% of the best layout's tokens/s",
                    part / first.step_s * 100.0,
                    first.tokens_per_s / best * 100.0
                ),
            });
        }
        let mut groups: Vec<(&'static str, Vec<&Rejected>)> = Vec::new();
        for r in &self.rejected {
            let g = r.reason.group();
            match groups.iter_mut().find(|(k, _)| *k == g) {
                Some((_, v)) => v.push(r),
                None => groups.push((g, vec![r])),
            }
        }
        for (group, members) in groups {
            let example = members
                .iter()
                .min_by(|a, b| excess(a).total_cmp(&excess(b)))
                .copied();
            if let Some(e) = example {
                out.push(LossGroup {
                    group: group.into(),
                    count: members.len(),
                    example: e.layout.clone(),
                    detail: if matches!(e.reason, Rejection::Memory { .. }) {
                        format!("closest: {}", e.reason)
                    } else {
                        e.reason.to_string()
                    },
                });
            }
        }
        out
    }
}

/// How far over memory a rejected layout is (0 for other reasons, so the
/// first one stays the example).
fn excess(r: &Rejected) -> f64 {
    match r.reason {
        Rejection::Memory {
            needs_bytes,
            have_bytes,
        } => needs_bytes / have_bytes,
        _ => 0.0,
    }
}
