//! "Is my busbw normal?": published nccl-tests figures (each with the
//! address it was published at, `data/published_busbw.csv`) and the match
//! for the system a run detects. A system no row describes gets "no match",
//! never the nearest row; CPU wires have no published figure: there the
//! ceiling measured in the same run is the reference.

/// One published figure.
#[derive(Clone, Debug, PartialEq)]
pub struct Published {
    pub gpu: String,
    pub gpus: usize,
    pub fabric: String,
    pub nic_gbit: u64,
    pub collective: String,
    pub algo: String,
    pub min_bytes: u64,
    pub busbw_lo_gbps: f64,
    pub busbw_hi_gbps: f64,
    pub source: String,
}

/// The table, read from the data file built into the library.
pub fn table() -> Vec<Published> {
    parse(include_str!("../data/published_busbw.csv")).unwrap_or_default()
}

/// Parses the data file; a row without a source is an error.
pub fn parse(text: &str) -> Result<Vec<Published>, String> {
    let mut out = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.starts_with('#') && !l.trim().is_empty())
        .skip(1)
    {
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let bad = || format!("published_busbw.csv line {}: {line}", n + 1);
        if f.len() != 10 || !f[9].starts_with("https://") {
            return Err(bad());
        }
        out.push(Published {
            gpu: f[0].into(),
            gpus: f[1].parse().map_err(|_| bad())?,
            fabric: f[2].into(),
            nic_gbit: f[3].parse().map_err(|_| bad())?,
            collective: f[4].into(),
            algo: f[5].into(),
            min_bytes: f[6].parse().map_err(|_| bad())?,
            busbw_lo_gbps: f[7].parse().map_err(|_| bad())?,
            busbw_hi_gbps: f[8].parse().map_err(|_| bad())?,
            source: f[9].into(),
        });
    }
    Ok(out)
}

/// What a run knows about its system.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct System {
    /// GPU names, one per GPU of the node (empty on CPU runs).
    pub gpus: Vec<String>,
    /// `nvlink` or `pcie` when known; `None` when nothing said which.
    pub fabric: Option<String>,
    /// Line rates of the physical NICs, Gbit/s (from /sys/class/net/*/speed).
    pub nic_gbit: Vec<u64>,
}

/// The NICs' speeds in Gbit/s: every interface with a device behind it
/// (virtual ones, loopback and veth, have none) that reports a speed.
pub fn nic_speeds_gbit() -> Vec<u64> {
    let Ok(dir) = std::fs::read_dir("/sys/class/net") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in dir.flatten() {
        if !e.path().join("device").exists() {
            continue;
        }
        let speed = std::fs::read_to_string(e.path().join("speed")).ok();
        if let Some(mbit) = speed
            .and_then(|s| s.trim().parse::<i64>().ok())
            .filter(|&m| m > 0)
        {
            out.push(mbit as u64 / 1000);
        }
    }
    out.sort_unstable();
    out
}

/// The rows that describe this system for `collective` with `world` ranks.
pub fn matches<'a>(
    table: &'a [Published],
    sys: &System,
    collective: &str,
    world: usize,
) -> Vec<&'a Published> {
    let model = sys.gpus.first().map(|g| g.to_ascii_lowercase());
    let same_gpus = !sys.gpus.is_empty()
        && sys
            .gpus
            .iter()
            .all(|g| Some(g.to_ascii_lowercase()) == model);
    table
        .iter()
        .filter(|p| p.collective == collective)
        .filter(|p| match p.fabric.as_str() {
            "nic" => false, // per-NIC rows need a multi-node run over that NIC; see `nic_rows`
            fabric => {
                same_gpus
                    && p.gpus == world
                    && p.gpus == sys.gpus.len()
                    && sys.fabric.as_deref() == Some(fabric)
                    && model
                        .as_ref()
                        .is_some_and(|m| m.contains(&p.gpu.to_ascii_lowercase()))
            }
        })
        .collect()
}

/// Per-NIC rows for the NICs this system has.
pub fn nic_rows<'a>(table: &'a [Published], sys: &System, collective: &str) -> Vec<&'a Published> {
    table
        .iter()
        .filter(|p| {
            p.fabric == "nic" && p.collective == collective && sys.nic_gbit.contains(&p.nic_gbit)
        })
        .collect()
}

/// One line naming the reference, or saying there is none.
pub fn describe(table: &[Published], sys: &System, collective: &str, world: usize) -> String {
    let rows = matches(table, sys, collective, world);
    if rows.is_empty() {
        let what = match sys.gpus.first() {
            Some(g) => format!(
                "{} x {g}, fabric {}",
                sys.gpus.len(),
                sys.fabric.as_deref().unwrap_or("not detected")
            ),
            None => "no GPU".to_string(),
        };
        return format!("no match in the published table for {collective} on {what} ({world} ranks): no published figure is claimed");
    }
    rows.iter()
        .map(|p| {
            format!(
                "{} x {} {} {collective} {}: busbw {} GB/s from {} B ({})",
                p.gpus,
                p.gpu,
                p.fabric,
                p.algo,
                if p.busbw_lo_gbps == p.busbw_hi_gbps {
                    format!("{:.0}", p.busbw_lo_gbps)
                } else {
                    format!("{:.0}-{:.0}", p.busbw_lo_gbps, p.busbw_hi_gbps)
                },
                p.min_bytes,
                p.source
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_has_a_source_and_parses() {
        let t = table();
        assert!(t.len() >= 5);
        assert!(t.iter().all(|p| p.source.starts_with("https://")));
        assert!(parse("h\nH100,8,nvlink,0,all_reduce,Ring,1,2,3,nowhere").is_err());
    }

    #[test]
    fn only_the_system_a_row_describes_matches() {
        let t = table();
        let h100 = System {
            gpus: vec!["NVIDIA H100 80GB HBM3".into(); 8],
            fabric: Some("nvlink".into()),
            nic_gbit: vec![400],
        };
        let d = describe(&t, &h100, "all_reduce", 8);
        assert!(d.contains("480") && d.contains("issues/212"), "{d}");
        assert_eq!(nic_rows(&t, &h100, "all_reduce").len(), 1);
        for other in [
            System {
                fabric: None,
                ..h100.clone()
            },
            System {
                gpus: vec!["NVIDIA H100 80GB HBM3".into(); 4],
                ..h100.clone()
            },
            System {
                gpus: vec!["NVIDIA A100-SXM4-80GB".into(); 8],
                ..h100.clone()
            },
            System::default(),
        ] {
            let d = describe(&t, &other, "all_reduce", other.gpus.len().max(2));
            assert!(d.starts_with("no match"), "{other:?}: {d}");
        }
    }
}
