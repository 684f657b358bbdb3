//! `report model`: the analytical tables for a model shape and two wires,
//! every figure from the model. Its defaults reproduce the worked example
//! of REFERENCES.md (TP=8, batch 32, hidden 8192, fp16, 80 layers).

use crate::predict;
use crate::table::Table;
use crate::units;
use anyhow::{anyhow, bail, Result};
use clap::Args;
use parbench::model::LinkParams;
use parbench::vocab;

/// Flags of `report model`.
#[derive(Args, Debug)]
#[command(allow_negative_numbers = true)]
pub struct ModelArgs {
    /// Sequences in the batch (microbatch size b).
    #[arg(long = vocab::microbatch_size::LONG, value_name = vocab::microbatch_size::VALUE, default_value_t = 32)]
    pub batch: u64,
    /// Which passes a step runs: decode (one new token per sequence: the
    /// worked example's "per token"), prefill (forward over --seq tokens) or
    /// train (forward and backward over --seq tokens).
    #[arg(long, default_value = "decode")]
    pub mode: String,
    /// Tokens per sequence for --mode prefill or train.
    #[arg(long)]
    pub seq: Option<u64>,
    /// Hidden size.
    #[arg(long, default_value_t = 8192)]
    pub hidden: u64,
    /// Transformer layers.
    #[arg(long, default_value_t = 80)]
    pub layers: u64,
    /// Tensor-parallel degree, one.
    #[arg(long = vocab::tp::LONG, value_name = vocab::tp::ONE, value_parser = vocab::one_count::<u64>, default_value = "8")]
    pub tp: u64,
    /// Sequence parallelism: all-gather + reduce-scatter instead of all-reduce.
    #[arg(long)]
    pub sequence_parallel: bool,
    /// Element type of the activations, nccl-tests' names (half, bfloat16, float, double, ...).
    #[arg(short = 'd', long = vocab::dtype::LONG, value_name = vocab::dtype::VALUE, default_value = "half")]
    pub dtype: String,
    /// The fast wire inside a node (NVLink) as GBPS,US; the latency is paid once per collective call.
    #[arg(long = vocab::intra::LONG, value_name = vocab::intra::VALUE, default_value_t = format!("{},0", predict::NVLINK_REFERENCE_GBPS))]
    pub intra: String,
    /// The network between nodes as GBPS,US; the latency is paid once per collective call.
    #[arg(long = vocab::inter::LONG, value_name = vocab::inter::VALUE, default_value_t = format!("{},0", predict::NETWORK_REFERENCE_GBPS))]
    pub inter: String,
    /// Pipeline stages of the bubble table (comma-separated).
    #[arg(long = vocab::stages::LONG, value_name = vocab::stages::VALUE, value_delimiter = ',', default_value = "4")]
    pub stages: Vec<usize>,
    /// Microbatch counts of the bubble table.
    #[arg(long = vocab::microbatches::LONG, value_name = vocab::microbatches::VALUE, value_delimiter = ',', default_value = "1,2,4,8,16,32,64")]
    pub microbatches: Vec<usize>,
    #[arg(long = vocab::chunks::LONG, value_name = vocab::chunks::VALUE, help = vocab::chunks::HELP, default_value_t = 2)]
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
    parbench::out!("{}", render(a)?);
    Ok(())
}

/// The two wires' bandwidths in GB/s, from their `GBPS,US`.
fn wires(a: &ModelArgs) -> Result<(f64, f64)> {
    let gbps = |flag: &str, v: &str| {
        v.parse::<LinkParams>()
            .map(|l| l.bandwidth_gbps())
            .map_err(|e| anyhow!("{flag}: {e}"))
    };
    Ok((gbps("--intra", &a.intra)?, gbps("--inter", &a.inter)?))
}

/// The validated shape: its traffic and the element size.
fn check(a: &ModelArgs) -> Result<parbench::model::TpTraffic> {
    let dtype = predict::dtype_bytes(&a.dtype).ok_or_else(|| {
        anyhow!(
            "--dtype {}: unknown type (half, bfloat16, float, double, ...)",
            a.dtype
        )
    })?;
    let mode = predict::tp_mode(&a.mode)
        .ok_or_else(|| anyhow!("--mode {}: expected decode, prefill or train", a.mode))?;
    let seq = match (mode, a.seq) {
        (parbench::model::TpMode::Decode, Some(_)) => {
            bail!("--seq applies to --mode prefill or train (decode processes one token per sequence)")
        }
        (parbench::model::TpMode::Decode, None) => 1,
        (_, Some(s)) => s,
        (_, None) => bail!("--mode {} needs --seq TOKENS", a.mode),
    };
    if a.batch == 0 || seq == 0 || a.hidden == 0 || a.layers == 0 {
        bail!("--microbatch-size, --seq, --hidden and --layers must be at least 1");
    }
    if a.tp < 2 {
        bail!("--tp {}: tensor parallelism needs at least 2 devices", a.tp);
    }
    wires(a)?;
    if a.stages.iter().chain(&a.plan_stages).any(|&s| s < 2) {
        bail!("--stages and --plan-stages: a pipeline has at least 2 stages");
    }
    if a.microbatches.contains(&0) || a.chunks == 0 {
        bail!("--microbatches and --chunks must be at least 1");
    }
    if !(a.busy > 0.0 && a.busy < 1.0) {
        bail!(
            "--busy {}: a fraction between 0 and 1",
            parbench::units::number_text(a.busy)
        );
    }
    Ok(parbench::model::TpTraffic::new(
        a.tp,
        a.batch,
        seq,
        a.hidden,
        dtype,
        mode,
        a.sequence_parallel,
    ))
}

/// The tables as text.
pub fn render(a: &ModelArgs) -> Result<String> {
    let tr = check(a)?;
    let (intra, inter) = wires(a)?;
    let mut out = String::new();
    out.push_str(&format!(
        "Tensor-parallel traffic, {}: b {} x seq {} x hidden {}, {} ({} B), {} layers, TP={}{}\n\n",
        a.mode,
        tr.batch,
        tr.tokens_per_step() / tr.batch.max(1),
        tr.hidden,
        a.dtype,
        tr.dtype_bytes,
        a.layers,
        tr.tp,
        if tr.sequence_parallel {
            ", sequence parallel"
        } else {
            ""
        }
    ));
    let exact = predict::ring_factor(&tr, true);
    let mut t = Table::new([
        "figure".to_string(),
        format!(
            "rule of thumb ({}x)",
            units::short(predict::ring_factor(&tr, false))
        ),
        format!("exact ring 2(t-1)/t = {}", units::sig3(exact)),
    ]);
    // MiB, as the worked example counts (0.5 MB = 2^19 B), with the exact bytes.
    let size = |b: f64| format!("{:.3} MiB ({:.0} B)", b / 1048576.0, b);
    let per_call = tr.bytes_per_call() as f64;
    t.row([
        "bytes per collective call (b s h x dtype)".to_string(),
        size(per_call),
        size(per_call),
    ]);
    t.row([
        "bytes sent per device per call".to_string(),
        size(per_call * predict::ring_factor(&tr, false)),
        size(per_call * exact),
    ]);
    let calls = tr.calls_per_step(a.layers);
    t.row([
        format!(
            "collective calls per step ({} x {} layers)",
            tr.calls_per_block(),
            a.layers
        ),
        calls.to_string(),
        calls.to_string(),
    ]);
    let step = if a.mode == "decode" {
        "token step"
    } else {
        "step"
    };
    let (approx, exact_bytes) = (
        predict::wire_bytes_per_step(&tr, a.layers, false),
        predict::wire_bytes_per_step(&tr, a.layers, true),
    );
    t.row([
        format!("bytes sent per device per {step}"),
        size(approx),
        size(exact_bytes),
    ]);
    let ms = |us: f64| format!("{:.3} ms", us / 1e3);
    let (intra_a, intra_e) = (
        predict::transfer_us(approx, intra),
        predict::transfer_us(exact_bytes, intra),
    );
    let (inter_a, inter_e) = (
        predict::transfer_us(approx, inter),
        predict::transfer_us(exact_bytes, inter),
    );
    t.row([
        format!(
            "time per {step} at {} GB/s (intra-node)",
            units::short(intra)
        ),
        ms(intra_a),
        ms(intra_e),
    ]);
    t.row([
        format!("time per {step} at {} GB/s (network)", units::short(inter)),
        ms(inter_a),
        ms(inter_e),
    ]);
    t.row([
        "network time over intra-node time".to_string(),
        format!("{}x", units::sig3(inter_a / intra_a)),
        format!("{}x", units::sig3(inter_e / intra_e)),
    ]);
    out.push_str(&t.text());
    out.push_str("Bandwidth terms only (alpha = 0: the latency US of --intra/--inter is not in these times). A decode step adds one token to each sequence: its time is the latency each generated token pays.\n\n");

    let pct = |f: Option<f64>| units::percent(f.unwrap_or(f64::NAN));
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
                pct(idle),
                pct(idle.map(|i| 1.0 - i)),
                pct(predict::bubble_of_ideal(s, m)),
                pct(predict::bubble_of_step_interleaved(s, m, a.chunks)),
            ]);
        }
        out.push_str(&t.text());
        out.push('\n');
    }
    out.push_str(&format!(
        "Microbatches needed for {} busy\n\n",
        units::percent(a.busy)
    ));
    let mut t = Table::new([
        "stages".to_string(),
        "GPipe / 1F1B".to_string(),
        format!("interleaved v={}", a.chunks),
    ]);
    let need = |s: usize, v: usize| {
        predict::microbatches_for_busy(s, v, a.busy).map_or("-".to_string(), |m| m.to_string())
    };
    for &s in &a.plan_stages {
        t.row([s.to_string(), need(s, 1), need(s, a.chunks)]);
    }
    out.push_str(&t.text());
    for &s in &a.plan_stages {
        if let Some(m) = predict::microbatches_for_busy(s, 1, a.busy) {
            out.push_str(&format!(
                "{s} stages need {m} microbatches for {}% busy\n",
                units::short(a.busy * 100.0)
            ));
        }
    }
    Ok(out)
}
