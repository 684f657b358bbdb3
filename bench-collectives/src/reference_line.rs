//! "Is my busbw normal?": the reference a run's busbw is held against. On
//! GPUs it is the published figure for the detected system (GPU model and
//! count, NVLink or PCIe, NIC speeds), or the words "no match"; on CPU wires
//! no published figure applies, and the ceiling measured in the same run is
//! the reference. Rank 0 prints it in the header, and after the sweep the
//! measured peak beside it as a share; run.json keeps both for the report.

use parbench::launch::flags::Backend;
use parbench::measure::wire::WireFigures;
use parbench::published::{self, System};
use parbench::results::{CollectiveRow, RunMeta};

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

/// The largest busbw of the run and the row it came from.
fn peak<'a>(rows: &'a [CollectiveRow], collective: Option<&str>) -> Option<&'a CollectiveRow> {
    rows.iter()
        .filter(|r| collective.is_none_or(|c| r.collective == c))
        .max_by(|a, b| a.busbw_gbps.total_cmp(&b.busbw_gbps))
}

/// The line after the sweep: the measured peak beside the reference, as a share.
pub fn peak_line(reference: &Reference, rows: &[CollectiveRow]) -> String {
    match reference.kind {
        "published" => match (peak(rows, Some("all_reduce")), reference.published_gbps) {
            (Some(r), Some(p)) => format!(
                "# Reference: peak all_reduce busbw {:.2} GB/s at {} B = {:.0}% of the published {p:.0} GB/s",
                r.busbw_gbps,
                r.bytes,
                100.0 * r.busbw_gbps / p
            ),
            _ => "# Reference: no all_reduce row to hold against the published figure".into(),
        },
        "ceiling" => match peak(rows, None) {
            Some(r) if r.ceiling_gbps > 0.0 => format!(
                "# Reference: peak busbw {:.2} GB/s ({} at {} B) = {:.0}% of the ceiling measured at its working set, {:.2} GB/s",
                r.busbw_gbps,
                r.collective,
                r.bytes,
                100.0 * r.busbw_gbps / r.ceiling_gbps,
                r.ceiling_gbps
            ),
            _ => "# Reference: no row with a measured ceiling".into(),
        },
        _ => "# Reference: none matches this system; no share is claimed".into(),
    }
}

/// Prints the peak line and keeps reference and share in run.json.
pub fn record(meta: &mut RunMeta, reference: &Reference, rows: &[CollectiveRow]) {
    let line = peak_line(reference, rows);
    parbench::outln!("{line}");
    meta.extra.insert(
        "reference".into(),
        serde_json::json!({
            "kind": reference.kind,
            "line": reference.line,
            "published_gbps": reference.published_gbps,
            "peak": line.trim_start_matches("# Reference: "),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(coll: &str, busbw: f64, ceiling: f64) -> CollectiveRow {
        CollectiveRow {
            collective: coll.into(),
            algbw_gbps: busbw,
            busbw_gbps: busbw,
            ceiling_gbps: ceiling,
            ..crate::test_rows::row()
        }
    }

    #[test]
    fn the_share_is_of_the_reference_the_run_has() {
        let rows = [row("all_reduce", 4.0, 8.0), row("all_gather", 6.0, 12.0)];
        let ceiling = Reference {
            kind: "ceiling",
            line: String::new(),
            published_gbps: None,
        };
        let l = peak_line(&ceiling, &rows);
        assert!(
            l.contains("peak busbw 6.00 GB/s (all_gather") && l.contains("= 50% of the ceiling"),
            "{l}"
        );
        let published = Reference {
            kind: "published",
            line: String::new(),
            published_gbps: Some(480.0),
        };
        let l = peak_line(&published, &[row("all_reduce", 240.0, 0.0)]);
        assert!(l.contains("= 50% of the published 480 GB/s"), "{l}");
        let none = Reference {
            kind: "none",
            line: String::new(),
            published_gbps: None,
        };
        assert!(peak_line(&none, &rows).contains("none matches"));
    }
}
