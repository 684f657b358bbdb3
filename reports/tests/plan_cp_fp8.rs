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
        "megatron-core",
        "--layout",
        "dp=4,tp=4,pp=8,vpp=6",
    ];
    let bf16 = ok(&args);
    let fp8 = ok(&[&args[..], &["--precision", "fp8"]].concat());
    let (slow, fast) = (tokens_per_s(&bf16), tokens_per_s(&fp8));
    assert!(fast > 1.1 * slow && fast < 2.0 * slow, "{slow} {fast}");
    assert!(
        fp8.contains("band:       megatron-core fp8 on h100-sxm5-80gb"),
        "{fp8}"
    );
    assert!(fp8.contains("linear layers in FP8 at"), "{fp8}");
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
