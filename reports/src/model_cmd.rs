//! `report model`: the analytical tables for a model shape and two wires,
//! every figure from the model. Its defaults reproduce the worked example
//! of REFERENCES.md (TP=8, batch 32, hidden 8192, fp16, 80 layers).

use crate::predict;
use crate::table::Table;
use crate::units;
use anyhow::{anyhow, bail, Result};
use clap::Args;

/// Flags of `report model`.
#[derive(Args, Debug)]
pub struct ModelArgs {
    /// Sequences in the batch.
    #[arg(long, default_value_t = 32)]
    pub batch: u64,
    /// Tokens per sequence in one pass (1: one decode step, each sequence adds a token).
    #[arg(long, default_value_t = 1)]
    pub seq: u64,
    /// Hidden size.
    #[arg(long, default_value_t = 8192)]
    pub hidden: u64,
    /// Transformer layers.
    #[arg(long, default_value_t = 80)]
    pub layers: u64,
    /// Tensor-parallel degree.
    #[arg(long, default_value_t = 8)]
    pub tp: usize,
    /// Element type of the activations (fp16, bf16, fp32, ...).
    #[arg(long, default_value = "fp16")]
    pub dtype: String,
    /// Bandwidth of the fast wire inside a node (NVLink), GB/s.
    #[arg(long, default_value_t = 400.0)]
    pub intra: f64,
    /// Bandwidth of the network between nodes, GB/s.
    #[arg(long, default_value_t = 25.0)]
    pub inter: f64,
    /// Pipeline stages of the bubble table (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "4")]
    pub stages: Vec<usize>,
    /// Microbatch counts of the bubble table.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64")]
    pub microbatches: Vec<usize>,
    /// Chunks per rank for the interleaved 1F1B column.
    #[arg(long, default_value_t = 2)]
    pub chunks: usize,
    /// Target busy fraction for the microbatches-needed table.
    #[arg(long, default_value_t = 0.9)]
    pub busy: f64,
    /// Stage counts of the microbatches-needed table.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8,16")]
    pub plan_stages: Vec<usize>,
}

/// Prints the tables.
pub fn run(a: &ModelArgs) -> Result<()> {
    print!("{}", render(a)?);
    Ok(())
}

fn check(a: &ModelArgs) -> Result<u64> {
    let dtype = predict::dtype_bytes(&a.dtype).ok_or_else(|| {
        anyhow!(
            "--dtype {}: unknown type (fp16, bf16, fp32, fp64, ...)",
            a.dtype
        )
    })?;
    if a.batch == 0 || a.seq == 0 || a.hidden == 0 || a.layers == 0 {
        bail!("--batch, --seq, --hidden and --layers must be at least 1");
    }
    if a.tp < 2 {
        bail!("--tp {}: tensor parallelism needs at least 2 devices", a.tp);
    }
    for (name, v) in [("--intra", a.intra), ("--inter", a.inter)] {
        if !(v.is_finite() && v > 0.0) {
            bail!("{name} {v}: a bandwidth in GB/s above zero");
        }
    }
    if a.stages.iter().chain(&a.plan_stages).any(|&s| s < 2) {
        bail!("--stages and --plan-stages: a pipeline has at least 2 stages");
    }
    if a.microbatches.contains(&0) || a.chunks == 0 {
        bail!("--microbatches and --chunks must be at least 1");
    }
    if !(a.busy > 0.0 && a.busy < 1.0) {
        bail!("--busy {}: a fraction between 0 and 1", a.busy);
    }
    Ok(dtype)
}

/// The tables as text.
pub fn render(a: &ModelArgs) -> Result<String> {
    let dtype = check(a)?;
    let tr = predict::tp_traffic(a.batch, a.seq, a.hidden, a.layers, a.tp, dtype);
    let mut out = String::new();
    out.push_str(&format!(
        "Tensor-parallel traffic, forward pass: batch {} x seq {} x hidden {}, {} ({} B), {} layers, TP={}\n\n",
        a.batch, a.seq, a.hidden, a.dtype, dtype, a.layers, a.tp
    ));
    let mut t = Table::new([
        "figure",
        "rule of thumb (2x)",
        &format!("exact ring 2(t-1)/t = {}", units::sig3(tr.ring_factor)),
    ]);
    // MiB, as the worked example counts (0.5 MB = 2^19 B), with the exact bytes.
    let size = |b: f64| format!("{:.3} MiB ({:.0} B)", b / 1048576.0, b);
    t.row([
        "bytes per all-reduce (b s h x dtype)".to_string(),
        size(tr.bytes_per_call),
        size(tr.bytes_per_call),
    ]);
    t.row([
        "bytes sent per device per call".to_string(),
        size(tr.bytes_per_call * tr.approx_factor),
        size(tr.moved_per_call()),
    ]);
    t.row([
        format!("all-reduces per pass (2 x {} layers)", a.layers),
        tr.calls.to_string(),
        tr.calls.to_string(),
    ]);
    t.row([
        "bytes sent per device per token step".to_string(),
        size(tr.approx_total()),
        size(tr.exact_total()),
    ]);
    let at = |bytes: f64, gbps: f64| format!("{:.3} ms", bytes / (gbps * 1e9) * 1e3);
    t.row([
        format!(
            "time per token step at {} GB/s (intra)",
            units::sig3(a.intra)
        ),
        at(tr.approx_total(), a.intra),
        at(tr.exact_total(), a.intra),
    ]);
    t.row([
        format!(
            "time per token step at {} GB/s (inter)",
            units::sig3(a.inter)
        ),
        at(tr.approx_total(), a.inter),
        at(tr.exact_total(), a.inter),
    ]);
    let ratio = format!("{}x", units::sig3(a.intra / a.inter));
    t.row([
        "network over intra-node time".to_string(),
        ratio.clone(),
        ratio,
    ]);
    out.push_str(&t.text());
    out.push_str(
        "Bandwidth terms only (alpha = 0); training adds 2 all-reduces per layer backward.\n\n",
    );

    for &s in &a.stages {
        out.push_str(&format!(
            "Pipeline bubble, {s} stages (equal stages, free communication)\n\n"
        ));
        let mut t = Table::new([
            "microbatches".to_string(),
            "idle of step (S-1)/(S+M-1)".to_string(),
            "busy".to_string(),
            "bubble / ideal (S-1)/M".to_string(),
            format!("interleaved v={} idle of step", a.chunks),
        ]);
        for &m in &a.microbatches {
            let idle = predict::bubble_of_step(s, m);
            t.row([
                m.to_string(),
                units::percent(idle),
                units::percent(1.0 - idle),
                units::percent(predict::bubble_of_ideal(s, m)),
                units::percent(predict::bubble_of_step_interleaved(s, m, a.chunks)),
            ]);
        }
        out.push_str(&t.text());
        out.push('\n');
    }
    out.push_str(&format!(
        "Microbatches needed for {} busy (GPipe / 1F1B)\n\n",
        units::percent(a.busy)
    ));
    let mut t = Table::new(["stages", "microbatches", "idle at that M"]);
    for &s in &a.plan_stages {
        let m = predict::microbatches_for_busy(s, a.busy)
            .ok_or_else(|| anyhow!("--busy {}: no microbatch count reaches it", a.busy))?;
        t.row([
            s.to_string(),
            m.to_string(),
            units::percent(predict::bubble_of_step(s, m)),
        ]);
    }
    out.push_str(&t.text());
    for &s in &a.plan_stages {
        if let Some(m) = predict::microbatches_for_busy(s, a.busy) {
            out.push_str(&format!(
                "{s} stages need {m} microbatches for {:.0}% busy\n",
                a.busy * 100.0
            ));
        }
    }
    Ok(out)
}
