//! Context parallelism and FP8 in `report plan` (docs/report.md, "Context
//! parallelism" and "FP8"): `cp=` layouts costed and refused by
//! Megatron-Core's rules, `--precision fp8` refused by name where the
//! device has no FP8, and FP8 layouts costed faster than bf16 with their
//! own band.

use std::process::Command;

fn report(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_report"))
        .args(args)
        .output()
        .expect("report runs")
}

fn ok(args: &[&str]) -> String {
    let out = report(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Exit 2 and one line on stderr, containing `want`.
fn refused(args: &[&str], want: &str) {
    let out = report(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains(want), "{err}");
}

/// The step's tokens/s of a plan's named layout.
fn tokens_per_s(text: &str) -> f64 {
    let line = text
        .lines()
        .find(|l| l.starts_with("  step "))
        .unwrap_or_else(|| panic!("{text}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "tokens/s;").unwrap();
    words[at - 1].parse().unwrap()
}

const LONG: [&str; 12] = [
    "plan",
    "--model",
    "llama3-405b",
    "--seq",
    "131072",
    "--device",
    "h100-sxm5-80gb",
    "--gpus",
    "16384",
    "--global-batch",
    "128",
    "--stack",
];

/// Llama 3 405B's long-context layout (tp 8, cp 16, pp 16) fits 80 GB
/// and prints its exchange; without cp its 128K-token activations do not
/// fit; the ring beats the all-gather of K/V across nodes.
#[test]
fn the_long_context_layout_is_costed_with_its_exchange() {
    let mut args = LONG.to_vec();
    args.extend(["megatron-core", "--layout", "dp=8,tp=8,cp=16,pp=16"]);
    let text = ok(&args);
    assert!(text.contains("dp=8 tp=8 cp=16 pp=16"), "{text}");
    assert!(text.contains("  cp comm "), "{text}");
    let ring = tokens_per_s(&text);
    let mut gathered = args.clone();
    gathered.extend(["--cp-comm-type", "all_gather"]);
    let gather = tokens_per_s(&ok(&gathered));
    assert!(gather < ring, "{gather} {ring}");
    // The same devices without context parallelism: 16x the activations.
    let mut flat = LONG.to_vec();
    flat.extend(["megatron-core", "--layout", "dp=128,tp=8,pp=16"]);
    refused(&flat, "needs more memory");
}

#[test]
fn cp_layouts_are_refused_by_megatrons_rules() {
    let mut wrong_world = LONG.to_vec();
    wrong_world.extend(["megatron-core", "--layout", "dp=16,tp=8,cp=16,pp=16"]);
    refused(&wrong_world, "x cp=16");
    // 2 x cp chunks must divide the sequence.
    let base = [
        "plan",
        "--model",
        "llama3-8b",
        "--seq",
        "8000",
        "--device",
        "h100-sxm5-80gb",
        "--gpus",
        "64",
        "--global-batch",
        "64",
    ];
    let mut odd = base.to_vec();
    odd.extend([
        "--stack",
        "megatron-core",
        "--layout",
        "dp=1,tp=1,cp=64,pp=1",
    ]);
    refused(&odd, "balanced chunks");
    // Megatron-LM of 2021 has no context parallelism.
    let mut old = base.to_vec();
    old[4] = "8192";
    old.extend([
        "--stack",
        "megatron-2021",
        "--layout",
        "dp=8,tp=1,cp=8,pp=1",
    ]);
    refused(&old, "no context parallelism");
    // The search tries cp up to --max-cp, and only then.
    let mut search = base.to_vec();
    search[4] = "8192";
    search.extend(["--stack", "megatron-core", "--max-cp", "8", "--top", "50"]);
    assert!(ok(&search).contains(" cp="));
    refused(&[&base[..], &["--max-cp", "0"]].concat(), "--max-cp 0");
}

/// FP8 needs a device with FP8 tensor cores and Transformer Engine's
/// recipe; an A100 is refused by name.
#[test]
fn fp8_is_refused_where_it_cannot_run() {
    let base = [
        "plan",
        "--model",
        "llama3-8b",
        "--gpus",
        "8",
        "--global-batch",
        "64",
        "--precision",
        "fp8",
    ];
    refused(
        &[&base[..], &["--device", "a100-sxm4-80gb"]].concat(),
        "a100-sxm4-80gb has no FP8 tensor cores",
    );
    refused(
        &[&base[..], &["--compute-tflops", "500", "--intra", "300,1"]].concat(),
        "give --device",
    );
    refused(
        &[
            &base[..],
            &["--device", "h100-sxm5-80gb", "--stack", "torchtitan"],
        ]
        .concat(),
        "not torchtitan's",
    );
    refused(
        &[
            "plan",
            "--model",
            "tiny",
            "--gpus",
            "1",
            "--global-batch",
            "1",
            "--device",
            "h100-sxm5-80gb",
            "--precision",
            "fp4",
        ],
        "expected bf16 or fp8",
    );
}

/// The same layout in FP8 is faster than in bf16 but not twice (attention,
/// the output layer, norms and the optimizer stay bf16; casts are added),
/// holds the FP8 weight copies, and prints the FP8 band.
#[test]
fn fp8_layouts_are_costed_with_their_band() {
    let args = [
        "plan",
        "--model",
        "gpt3-175b",
        "--device",
        "h100-sxm5-80gb",
        "--gpus",
        "128",
        "--global-batch",
        "256",
        "--stack",
        "nemo-24",
        "--layout",
        "dp=4,tp=4,pp=8,vpp=6",
    ];
    let bf16 = ok(&args);
    let fp8 = ok(&[&args[..], &["--precision", "fp8"]].concat());
    let (slow, fast) = (tokens_per_s(&bf16), tokens_per_s(&fp8));
    assert!(fast > 1.1 * slow && fast < 2.0 * slow, "{slow} {fast}");
    assert!(
        fp8.contains("band:       nemo-24 fp8 on h100-sxm5-80gb"),
        "{fp8}"
    );
    assert!(fp8.contains("linear layers in FP8 at"), "{fp8}");
    // A band with no published run is named, not mistaken for the stack's.
    let mcore: Vec<&str> = args
        .iter()
        .map(|a| if *a == "nemo-24" { "megatron-core" } else { a })
        .collect();
    let mcore_fp8 = ok(&[&mcore[..], &["--precision", "fp8"]].concat());
    assert!(
        mcore_fp8.contains("band          none (no published megatron-core fp8 run yet)"),
        "{mcore_fp8}"
    );
    for model in ["llama3-8b", "llama3-70b", "llama3-405b"] {
        let text = ok(&[
            "plan",
            "--model",
            model,
            "--device",
            "h100-sxm5-80gb",
            "--gpus",
            "1024",
            "--global-batch",
            "1024",
            "--stack",
            "megatron-core",
            "--precision",
            "fp8",
            "--top",
            "1",
        ]);
        assert!(text.contains("Best layouts"), "{model}: {text}");
    }
}

/// Context parallelism and FP8 are costed for dense models only: an MoE
/// model with `--max-cp` above 1, a `cp=` layout or `--precision fp8` is
/// one line and exit 2, not a figure costed without its experts' share.
#[test]
fn an_moe_model_refuses_context_parallelism_and_fp8() {
    let base = [
        "plan",
        "--model",
        "mixtral-8x7b",
        "--device",
        "h100-sxm5-80gb",
        "--gpus",
        "64",
        "--global-batch",
        "256",
        "--stack",
        "megatron-core",
    ];
    refused(
        &[&base[..], &["--max-cp", "2"]].concat(),
        "--max-cp 2: context parallelism of an MoE model is not modelled",
    );
    refused(
        &[&base[..], &["--layout", "dp=4,tp=4,cp=2,pp=2,ep=8"]].concat(),
        "cp=2: context parallelism of an MoE model is not modelled",
    );
    refused(
        &[&base[..], &["--precision", "fp8"]].concat(),
        "--precision fp8: FP8 expert layers are not modelled",
    );
    // The same layout without cp, in bf16, is costed.
    assert!(ok(&[&base[..], &["--layout", "dp=8,tp=4,pp=2,ep=8"]].concat()).contains("ep=8"));
}

/// The memory of a plan's named layout (its JSON record): the states,
/// the activations and Megatron-LM's formula, bytes.
fn layout_memory(args: &[&str], name: &str) -> (f64, f64, f64) {
    let dir = std::env::temp_dir().join(format!("parbench-fp8-mem-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join(format!("{name}.json"));
    ok(&[args, &["--output-file", json.to_str().unwrap()]].concat());
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let m = &v["top"][0]["memory"];
    let f = |k: &str| m[k].as_f64().unwrap_or_else(|| panic!("{k}: {m}"));
    (f("states_bytes"), f("activation_bytes"), f("formula_bytes"))
}

/// FP8's memory by the bytes Transformer Engine 1.10 holds, on DGX Cloud
/// Benchmarking's Llama 3.1 8B layout (tp 1, cp 2: 4096 tokens a rank,
/// one microbatch in flight, 32 layers): the FP8 weight and its
/// transpose beside the bf16 weight, 2 bytes a linear-layer parameter,
/// or nothing added with FP8 primary weights (`--fp8-params`); the norms'
/// outputs and the activation's kept in FP8 (a byte an element less),
/// the projection's FP8 input beside the attention's bf16 output (a byte
/// more). Megatron-LM's count adds the same weight bytes. The layout
/// NVIDIA ran at 80 GB fits with FP8 weights and not without.
#[test]
fn fp8_memory_is_the_bytes_te_holds() {
    let base = [
        "plan",
        "--model",
        "llama3-8b",
        "--device",
        "h100-sxm5-80gb",
        "--gpus",
        "8",
        "--global-batch",
        "128",
        "--stack",
        "megatron-core",
        "--layout",
        "dp=4,tp=1,cp=2,pp=1",
    ];
    let roomy = [&base[..], &["--device-memory", "100"]].concat();
    let bf16 = layout_memory(&roomy, "bf16");
    let fp8 = layout_memory(&[&roomy[..], &["--precision", "fp8"]].concat(), "fp8");
    let fp8_params = [&base[..], &["--precision", "fp8", "--fp8-params"]].concat();
    let primary = layout_memory(&fp8_params, "fp8-params");
    let (h, kv, ffn, layers, tokens) = (4096.0, 1024.0, 14336.0, 32.0, 8192.0 / 2.0);
    let linear = layers * (h * (h + 2.0 * kv) + h * h + 3.0 * h * ffn);
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
    assert!(close(fp8.0 - bf16.0, 2.0 * linear), "{fp8:?} {bf16:?}");
    assert!(close(primary.0, bf16.0), "{primary:?} {bf16:?}");
    let saved = layers * tokens * (2.0 * h + ffn - h);
    assert!(close(bf16.1 - fp8.1, saved), "{fp8:?} {bf16:?}");
    assert!(close(primary.1, fp8.1), "{primary:?} {fp8:?}");
    assert!(close(fp8.2 - bf16.2, 2.0 * linear), "{fp8:?} {bf16:?}");
    assert!(close(primary.2, bf16.2), "{primary:?} {bf16:?}");
    let gib = 1024f64.powi(3);
    assert!(
        (primary.0 + primary.1).max(primary.2) < 80.0 * gib,
        "{primary:?}"
    );
    refused(
        &[&base[..], &["--precision", "fp8"]].concat(),
        "needs more memory",
    );
    refused(
        &[&base[..], &["--fp8-params"]].concat(),
        "--fp8-params: FP8 weights need --precision fp8",
    );
}

/// The number before `unit` in `line`.
fn before(line: &str, unit: &str) -> f64 {
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words
        .iter()
        .position(|w| w.starts_with(unit))
        .unwrap_or_else(|| panic!("{unit}: {line}"));
    words[at - 1].parse().unwrap()
}

/// The FP8 GEMM rate a plan uses is the sourced one: the device's 16-bit
/// rate in the step times tilelang's FP8-over-FP16 ratio at 8192^3 on
/// one H800 (1507 / 758), not FP8's share of the peak assumed.
#[test]
fn the_fp8_rate_is_the_measured_fp8_over_16bit_ratio() {
    let text = ok(&[
        "plan",
        "--model",
        "llama3-70b",
        "--device",
        "h100-sxm5-80gb",
        "--gpus",
        "64",
        "--global-batch",
        "128",
        "--precision",
        "fp8",
        "--stack",
        "megatron-core",
        "--layout",
        "dp=2,tp=4,cp=2,pp=4,vpp=5",
    ]);
    // The compute line with its continuations (indented under its text).
    let mut lines = text.lines().skip_while(|l| !l.starts_with("  compute:"));
    let first = lines.next().unwrap_or_else(|| panic!("{text}"));
    let cont = lines.take_while(|l| l.starts_with(&" ".repeat(14)));
    let line = std::iter::once(first)
        .chain(cont)
        .collect::<Vec<_>>()
        .join(" ");
    let line = line.split_whitespace().collect::<Vec<_>>().join(" ");
    let line = line.as_str();
    let bf16 = before(line, "TFLOP/s");
    let fp8_at = line.find("linear layers in FP8 at").unwrap();
    let fp8 = before(&line[fp8_at..], "TFLOP/s");
    let want = bf16 * 1507.0 / 758.0;
    // Both printed to 3 significant figures.
    assert!(
        (fp8 - want).abs() <= 0.005 * want,
        "{fp8} vs {want}: {line}"
    );
    assert!(line.contains("1.99x the 16-bit rate"), "{line}");
}

/// Every FP8 row of `--validation` recomputes from its own command line,
/// lies within its band's worst, and the rows kept aside are marked; the
/// FP8 twin of each of DGX Cloud Benchmarking's layouts is faster than
/// its bf16 twin, by less than the GEMMs' 1.99x.
#[test]
fn fp8_rows_recompute_within_their_band() {
    let dir = std::env::temp_dir().join(format!("parbench-fp8-band-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("v.json");
    let text = ok(&[
        "plan",
        "--validation",
        "--output-file",
        json.to_str().unwrap(),
    ]);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let bands = v.as_array().unwrap();
    let band = |name: &str| {
        bands
            .iter()
            .find(|b| b["stack"] == name)
            .unwrap_or_else(|| panic!("{name}"))
    };
    let fp8 = band("nemo-24 fp8");
    let worst = fp8["worst"].as_f64().unwrap();
    let mut kept = 0;
    for r in fp8["rows"].as_array().unwrap() {
        let name = r["name"].as_str().unwrap();
        assert!(r["error"].as_f64().unwrap().abs() <= worst + 1e-12, "{r}");
        if r["kept_aside"].as_bool().unwrap() {
            kept += 1;
            assert!(text.contains(&format!("{name} (kept aside)")), "{text}");
        }
    }
    assert_eq!(kept, 6);
    // A row is its command: the DGXC 70B FP8 row's plan gives its figure.
    let row = fp8["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "Llama 3.1 70B, 64 H100, FP8")
        .unwrap();
    let command = row["command"].as_str().unwrap();
    let words: Vec<&str> = command.split_whitespace().skip(1).collect();
    let per_gpu = tokens_per_s(&ok(&words)) / 64.0;
    let predicted = row["predicted"].as_f64().unwrap();
    assert!(
        (per_gpu - predicted).abs() <= 1e-3 * predicted,
        "{per_gpu} {predicted}"
    );
    // Each bf16 twin against its FP8 twin, same layout.
    let bf16 = band("nemo-24");
    let predicted_of = |b: &serde_json::Value, name: &str| {
        b["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{name}"))["predicted"]
            .as_f64()
            .unwrap()
    };
    for twin in [
        "Llama 3.1 70B, 64 H100",
        "Llama 3.1 8B, 8 H100",
        "Llama 3.1 405B, 576 H100",
        "Nemotron-4 15B, 16 H100",
        "Nemotron-4 340B, 128 H100",
    ] {
        let slow = predicted_of(bf16, &format!("{twin}, BF16"));
        let fast = predicted_of(fp8, &format!("{twin}, FP8"));
        assert!(
            fast > 1.1 * slow && fast < 1.99 * slow,
            "{twin}: {slow} {fast}"
        );
    }
}
