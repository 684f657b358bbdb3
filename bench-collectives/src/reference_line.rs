//! "Is my busbw normal?": the reference a run's busbw is held against. On
//! GPUs it is the published figure for the detected system (GPU model and
//! count, NVLink or PCIe, NIC speeds), or the words "no match"; on CPU wires
//! no published figure applies, and the ceiling measured in the same run is
//! the reference. The footer's headline holds the peak against it; run.json
//! keeps both for the report.

use crate::summary::Headline;
use parbench::launch::flags::Backend;
use parbench::measure::wire::WireFigures;
use parbench::published::{self, System};
use parbench::results::RunMeta;

/// The reference of one run.
#[derive(Clone, Debug, PartialEq)]
pub struct Reference {
    /// `published`, `ceiling` or `none`.
    pub kind: &'static str,
    /// The words the header prints.
    pub line: String,
    /// The published all_reduce busbw, GB/s (the upper figure of its row).
    pub published_gbps: Option<f64>,
}

/// The reference for a run on `backend` over `wire_name` with `world` ranks.
pub fn describe(backend: &str, wire_name: &str, world: usize, wire: &WireFigures) -> Reference {
    if !Backend::named(backend).is_some_and(Backend::on_gpus) {
        let line = match (wire.ceiling.peak_gbps(), wire.ceiling.rungs.last()) {
            (Some(hi), Some(lo)) => format!(
                "CPU wire ({wire_name}): the ceiling measured in this run, {hi:.2} GB/s in cache .. {:.2} GB/s out of cache, each row against its own working set (%ceil); published GPU figures do not apply",
                lo.gbps
            ),
            _ => format!("CPU wire ({wire_name}): no ceiling measured (one rank), so no reference"),
        };
        let kind = if wire.ceiling.rungs.is_empty() {
            "none"
        } else {
            "ceiling"
        };
        return Reference {
            kind,
            line,
            published_gbps: None,
        };
    }
    let sys = System {
        gpus: gpu_names(),
        fabric: fabric(),
        nic_gbit: published::nic_speeds_gbit(),
    };
    let table = published::table();
    let rows = published::matches(&table, &sys, "all_reduce", world);
    let mut line = published::describe(&table, &sys, "all_reduce", world);
    let nics = published::nic_rows(&table, &sys, "all_reduce");
    if let Some(n) = nics.first() {
        line.push_str(&format!(
            "; per NIC ({} Gbit/s): {:.0}-{:.0} GB/s ({})",
            n.nic_gbit, n.busbw_lo_gbps, n.busbw_hi_gbps, n.source
        ));
    }
    Reference {
        kind: if rows.is_empty() { "none" } else { "published" },
        line,
        published_gbps: rows.iter().map(|p| p.busbw_hi_gbps).reduce(f64::max),
    }
}

/// Keeps the reference in run.json, with the run's headline against it
/// (all_reduce's where it ran, else the first collective's), the same
/// line the footer printed.
pub fn record(meta: &mut RunMeta, reference: &Reference, headlines: &[Headline]) {
    let peak = headlines
        .iter()
        .find(|h| h.collective == parbench::comm::Collective::AllReduce)
        .or(headlines.first())
        .map(Headline::line);
    meta.extra.insert(
        "reference".into(),
        serde_json::json!({
            "kind": reference.kind,
            "line": reference.line,
            "published_gbps": reference.published_gbps,
            "peak": peak,
            "table": "parbench/data/published_busbw.csv (every row names its source)",
        }),
    );
}

pub(crate) fn gpu_names() -> Vec<String> {
    parbench::launch::ranks::gpu_facts().names
}

/// `nvlink` when `nvidia-smi nvlink --status` lists links with a speed,
/// `pcie` when it answers with none, `None` when it cannot be asked (5 s deadline).
fn fabric() -> Option<String> {
    let out = std::process::Command::new("timeout")
        .args(["5", "nvidia-smi", "nvlink", "--status"])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let text = String::from_utf8_lossy(&out.stdout);
    Some(
        if text.contains("GB/s") {
            "nvlink"
        } else {
            "pcie"
        }
        .to_string(),
    )
}
