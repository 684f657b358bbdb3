//! `report plan` on mixtures of experts: the presets' parameter counts
//! against the published ones, the published layouts of DeepSeek-V3 and
//! Qwen3-235B-A22B costed with their all-to-all, the search listing
//! expert-parallel degrees, the all-to-all against DeepEP's published
//! figures on the H800, and one-line errors for bad MoE flags.

mod common;
use common::*;
use parbench::model::Preset;

/// Total and active parameters, as the model cards and papers give them
/// (docs/report.md, "Mixtures of experts"), and how close the count
/// from the released config must come.
const PUBLISHED: [(&str, f64, f64, f64); 4] = [
    // Jiang et al. 2024, Mixtral of Experts: 46.7B, 12.9B active.
    ("mixtral-8x7b", 46.7e9, 12.9e9, 0.01),
    // Mistral AI's Mixtral 8x22B announcement: 141B, 39B active.
    ("mixtral-8x22b", 141e9, 39e9, 0.01),
    // Qwen3-235B-A22B model card: 235B, 22B activated.
    ("qwen3-235b-a22b", 235e9, 22e9, 0.01),
    // DeepSeek-V3 Technical Report: 671B, 37B activated. Its config
    // counts 37.55B active (embedding and output layer included, as the
    // report's README_WEIGHTS.md says its own 36.7B does): the two
    // published figures differ by 0.8% and the count is above both, so
    // the active count is held to 2.5%, the total to 1%.
    ("deepseek-v3", 671e9, 37e9, 0.025),
];

#[test]
fn presets_match_the_published_parameter_counts() {
    for (name, total, active, active_tol) in PUBLISHED {
        let p = Preset::by_name(name).unwrap();
        let (all, act) = p.moe_params().unwrap();
        let (e_all, e_act) = (all as f64 / total - 1.0, act as f64 / active - 1.0);
        eprintln!(
            "{name}: {:.2}B ({:+.2}%), active {:.2}B ({:+.2}%)",
            all as f64 / 1e9,
            e_all * 100.0,
            act as f64 / 1e9,
            e_act * 100.0
        );
        assert!(e_all.abs() < 0.01, "{name} total {all}");
        assert!(e_act.abs() < active_tol, "{name} active {act}");
        assert_eq!(p.params(), all, "{name}");
    }
    // DeepSeek-V3 against README_WEIGHTS.md's 36.7B too.
    let (_, act) = Preset::by_name("deepseek-v3")
        .unwrap()
        .moe_params()
        .unwrap();
    assert!((act as f64 / 36.7e9 - 1.0).abs() < 0.025);
}

/// The layout and terms of a costed `--layout` run, which must succeed.
fn costed(line: &str) -> String {
    let o = report(&words(line, &[]));
    assert_eq!(o.status.code(), Some(0), "{line}: {}", stderr(&o));
    stdout(&o)
}

/// The text's lines with each continuation (a line broken to keep it
/// short, indented deeper than a term's name) joined to the line it
/// continues.
fn logical_lines(out: &str) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for l in out.lines() {
        match lines.last_mut() {
            Some(last) if l.starts_with(&" ".repeat(10)) => {
                last.push(' ');
                last.push_str(l.trim_start());
            }
            _ => lines.push(l.to_string()),
        }
    }
    lines
}

/// The text with its lines joined (a phrase may be broken across two).
fn flat(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A figure after `key` on the line that starts with `line_start`.
fn figure(out: &str, line_start: &str, key: &str) -> f64 {
    let lines = logical_lines(out);
    let line = lines
        .iter()
        .find(|l| l.trim_start().starts_with(line_start))
        .unwrap_or_else(|| panic!("no {line_start} in {out}"));
    let rest = &line[line.find(key).unwrap_or_else(|| panic!("{key} in {line}")) + key.len()..];
    rest.split_whitespace()
        .next()
        .and_then(|w| w.trim_end_matches([',', ';', '%']).parse().ok())
        .unwrap_or_else(|| panic!("{key} in {line}"))
}

/// DeepSeek-V3 on 1024 H100 as Megatron-MoE-ModelZoo runs it (tp2 pp8
/// vpp4 ep64, the first stage one layer and the last none, GBS 8192) and
/// Qwen3-235B-A22B on 256 (tp2 pp8 vpp4 ep32): both fit 80 GB, both
/// print their all-to-all, and crossing nodes costs more than staying in one.
#[test]
fn published_moe_layouts_are_costed() {
    let ds = costed("plan --model deepseek-v3 --device h100-sxm5-80gb --gpus 1024 --global-batch 8192 --stack megatron-core --layout dp=64,tp=2,pp=8,vpp=4,ep=64,etp=1,first=1,last=0");
    assert!(
        ds.contains("ep=64 etp=1") && ds.contains("layers first=1 last=0"),
        "{ds}"
    );
    assert!(ds.contains("256 experts top-8"), "{ds}");
    // 128 ranks of experts on 16 nodes: the dispatch crosses the NICs.
    let nodes = figure(&ds, "one dispatch", "reaches");
    assert!(nodes > 1.0 && nodes <= 16.0, "{ds}");
    assert!(figure(&ds, "ep all-to-all", "all-to-all") > 0.0, "{ds}");
    let mfu = figure(&ds, "step", "MFU");
    assert!(mfu > 5.0 && mfu < 60.0, "{ds}");

    let qwen = costed("plan --model qwen3-235b-a22b --device h100-sxm5-80gb --gpus 256 --global-batch 2048 --stack megatron-core --layout dp=16,tp=2,pp=8,vpp=4,ep=32,etp=1");
    assert!(qwen.contains("ep=32 etp=1"), "{qwen}");
    // EP 8 (etp 1) stays in a node: no byte over a NIC, a shorter all-to-all.
    let inside = costed("plan --model qwen3-235b-a22b --device h100-sxm5-80gb --gpus 256 --global-batch 2048 --stack megatron-core --layout dp=16,tp=2,pp=8,vpp=4,ep=8,etp=1");
    assert!(inside.contains("0 B over its NIC"), "{inside}");
    let a2a = |out: &str| {
        let s = figure(out, "ep all-to-all", "all-to-all");
        let unit = out
            .lines()
            .find(|l| l.trim_start().starts_with("ep all-to-all"))
            .unwrap();
        if unit.contains(" ms ") {
            s / 1e3
        } else {
            s
        }
    };
    assert!(a2a(&inside) < a2a(&qwen), "{inside}\n{qwen}");
    // An imbalance of 2 doubles each layer's all-to-all (and the busiest
    // rank's activations); the busiest rank may become one with 12 layers
    // instead of 11 and the logits.
    let skewed = costed("plan --model qwen3-235b-a22b --device h100-sxm5-80gb --gpus 256 --global-batch 2048 --stack megatron-core --moe-imbalance 2 --device-memory 200 --layout dp=16,tp=2,pp=8,vpp=4,ep=32,etp=1");
    let r = a2a(&skewed) / a2a(&qwen);
    assert!((2.0..=2.0 * 12.0 / 11.0 + 1e-3).contains(&r), "{r}");
}

/// Without --layout the search lists expert-parallel degrees.
#[test]
fn the_search_lists_ep() {
    let out = costed("plan --model mixtral-8x7b --device h100-sxm5-80gb --gpus 64 --global-batch 256 --stack megatron-core --top 20");
    assert!(out.contains(" ep=8"), "{out}");
    assert!(out.contains("experts' all-to-all (ep)"), "{out}");
    let eps: std::collections::BTreeSet<&str> = out
        .split_whitespace()
        .filter(|w| w.starts_with("ep="))
        .collect();
    assert!(eps.len() >= 2, "{eps:?}\n{out}");
}

/// DeepEP's normal kernels on the H800 (its README: 4096 tokens a rank,
/// hidden 7168, top-8, 4 node groups; bottleneck bandwidth, dispatch and
/// combine): the model's busier link and its rate, held to 30% of each
/// published figure (docs/report.md lists the errors), but EP16, the
/// one the model finds NVLink-bound, which is a known miss: beyond 30%
/// and within 60% (no sourced rate for DeepEP's NVLink forwarding).
#[test]
fn all_to_all_against_deepep_on_h800() {
    let published = [
        (8, "NVLink", 153.0, 158.0, false),
        (16, "RDMA", 43.0, 43.0, true),
        (32, "RDMA", 58.0, 57.0, false),
        (64, "RDMA", 51.0, 50.0, false),
    ];
    for (ep, link, dispatch, combine, known_miss) in published {
        let line = format!("plan --model deepseek-v3 --device h800 --moe-dispatcher deepep --gpus {ep} --global-batch {ep} --device-memory 10000 --layout dp={ep},tp=1,pp=1,ep={ep}");
        let out = costed(&line);
        let gbps = figure(&out, "one dispatch", "bottleneck");
        eprintln!(
            "EP{ep} {link}: predicted {gbps} GB/s, published {dispatch}/{combine} ({:+.0}%/{:+.0}%)",
            (gbps / dispatch - 1.0) * 100.0,
            (gbps / combine - 1.0) * 100.0
        );
        for p in [dispatch, combine] {
            let error = (gbps / p - 1.0).abs();
            if known_miss {
                assert!(error > 0.3 && error < 0.6, "EP{ep}: {gbps} against {p}");
            } else {
                assert!(error < 0.3, "EP{ep}: {gbps} against {p}");
            }
        }
        let nic_bytes = flat(&out).contains("0 B over its NIC");
        assert_eq!(nic_bytes, ep == 8, "{out}");
    }
}

#[test]
fn bad_moe_flags_are_one_line_errors() {
    for (line, says) in [
        ("plan --model deepseek-v3 --experts 8 --gpus 8 --global-batch 8 --device h100-sxm5-80gb", "not both"),
        ("plan --layers 4 --hidden 512 --heads 8 --ffn 2048 --seq 128 --arch llama --experts 8 --gpus 8 --global-batch 8 --device h100-sxm5-80gb", "--topk is missing"),
        ("plan --layers 4 --hidden 512 --heads 8 --ffn 2048 --seq 128 --experts 8 --topk 2 --expert-ffn 512 --gpus 8 --global-batch 8 --device h100-sxm5-80gb", "--arch llama"),
        ("plan --model llama3-8b --moe-imbalance 2 --gpus 8 --global-batch 8 --device h100-sxm5-80gb", "no experts"),
        ("plan --model mixtral-8x7b --moe-imbalance 0.5 --gpus 8 --global-batch 8 --device h100-sxm5-80gb", "1 to 1000"),
        ("plan --model mixtral-8x7b --moe-dispatcher nccl --gpus 8 --global-batch 8 --device h100-sxm5-80gb", "alltoall or deepep"),
        ("plan --model mixtral-8x7b --gpus 8 --global-batch 8 --device h100-sxm5-80gb --layout dp=8,tp=1,pp=1,ep=3", "ep=3"),
        ("plan --model llama3-8b --gpus 8 --global-batch 8 --device h100-sxm5-80gb --layout dp=8,tp=1,pp=1,ep=2", "no experts"),
        ("plan --model deepseek-v3 --device h100-sxm5-80gb --gpus 1024 --global-batch 8192 --layout dp=64,tp=2,pp=8,vpp=4,ep=64", "give first=F,last=L"),
        ("plan --model llama3-8b --recompute-modules layernorm --gpus 8 --global-batch 8 --device h100-sxm5-80gb", "has none"),
        ("plan --model mixtral-8x7b --recompute full --recompute-modules moe --gpus 8 --global-batch 8 --device h100-sxm5-80gb", "--recompute full"),
        ("plan --model mixtral-8x7b --recompute-modules layernorm,mlp --gpus 8 --global-batch 8 --device h100-sxm5-80gb", "mlp: the modules costed are layernorm, moe_act, moe"),
    ] {
        let o = report(&words(line, &[]));
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{line}: {err}");
        assert!(err.contains(says), "{line}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}

/// A custom MoE shape counts its experts: 8 experts of 1024 on 4 layers.
#[test]
fn a_custom_moe_shape_is_planned() {
    let out = costed("plan --layers 4 --hidden 512 --heads 8 --ffn 2048 --seq 128 --vocab 1000 --arch llama --experts 8 --topk 2 --expert-ffn 1024 --shared-experts 1 --dense-layers 1 --gpus 8 --global-batch 8 --device h100-sxm5-80gb");
    assert!(
        flat(&out).contains("8 experts top-2 (MLP 1024 each; 1 shared, first 1 layers dense)"),
        "{out}"
    );
}

/// A `bench-collectives moe` dispatch of `experts` top-`topk` with the
/// given imbalance, as moe.csv holds it.
fn dispatch(experts: usize, topk: usize, imbalance: f64, phase: &str) -> parbench::results::MoeRow {
    parbench::results::MoeRow {
        schema: parbench::results::SCHEMA_VERSION,
        run_id: "moe-run".into(),
        backend: "local".into(),
        wire: "shm".into(),
        world: 4,
        phase: phase.into(),
        tokens: 1024,
        hidden: 4096,
        experts,
        topk,
        routing: "zipf:1.2".into(),
        node_limit: 0,
        capacity_factor: f64::NAN,
        payload: "bf16".into(),
        copies: "dedup".into(),
        dropped: 0,
        bytes: 1 << 20,
        imbalance,
        iters: 10,
        time_us: 100.0,
        p50_us: 100.0,
        p99_us: 110.0,
        algbw_gbps: 10.0,
        busbw_gbps: 7.5,
        tokens_per_s: 1e6,
        wrong: 0,
        model_us: 90.0,
        ceiling_gbps: 20.0,
    }
}

/// `--from` a folder of `bench-collectives moe` dispatches gives the
/// routing's imbalance: the largest of the model's shape, said in the
/// header, scaling the all-to-all as `--moe-imbalance` would; a folder
/// that measured another shape is one line and exit 2.
#[test]
fn the_imbalance_comes_from_a_measured_dispatch() {
    let dir = scratch("moe-imbalance");
    let rows = [
        dispatch(8, 2, 1.4, "dispatch"),
        dispatch(8, 2, 1.2, "dispatch"),
        dispatch(8, 2, 3.0, "combine"),
        dispatch(64, 8, 2.5, "dispatch"),
    ];
    write_folder(&dir, &rows, &[]);
    let plan = "plan --model mixtral-8x7b --device h100-sxm5-80gb --gpus 64 --global-batch 256 --stack megatron-core --device-memory 200 --layout dp=16,tp=1,pp=4,vpp=8,ep=8";
    let from = format!("{plan} --from {}", dir.display());
    let measured = costed(&from);
    // How the step runs, the imbalance with it, is -v's.
    assert!(
        flat(&costed(&format!("{from} -v")))
            .contains("routing imbalance 1.40 (bench-collectives moe dispatch in"),
        "{measured}"
    );
    let given = costed(&format!("{plan} --moe-imbalance 1.4"));
    let a2a = |out: &str| figure(out, "ep all-to-all", "all-to-all");
    assert_eq!(a2a(&measured), a2a(&given), "{measured}\n{given}");
    assert!(a2a(&measured) > a2a(&costed(plan)), "{measured}");

    let other = scratch("moe-imbalance-other");
    write_folder(&other, &[dispatch(64, 8, 2.5, "dispatch")], &[]);
    let o = report(&words(&format!("{plan} --from {}", other.display()), &[]));
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    let err = stderr(&o);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("64 experts top-8, the model 8 experts top-2"),
        "{err}"
    );
}

/// `--recompute-modules` on the recipe's layout: the step grows by the
/// recomputed forward, the activations shrink by what is not kept, and
/// recomputing the MoE layer dispatches and combines once more (its
/// exposed all-to-all 3/2 of the one without).
#[test]
fn recompute_modules_trade_memory_for_time() {
    let line = "plan --model qwen3-235b-a22b --device h100-sxm5-80gb --moe-dispatcher deepep --gpus 256 --global-batch 2048 --stack megatron-core --layout dp=16,tp=2,pp=8,vpp=4,ep=32,etp=1";
    let at = |modules: &str| {
        let out = costed(&format!("{line} {modules}"));
        let names = modules
            .trim_start_matches("--recompute-modules ")
            .replace(',', ", ");
        // How the step runs, the recomputed modules with it, is -v's.
        let full = flat(&costed(&format!("{line} {modules} -v")));
        assert_eq!(
            full.contains(&format!("; recomputed modules: {names}")),
            !modules.is_empty(),
            "{full}"
        );
        (
            figure(&out, "step", "step"),
            figure(&out, "ep all-to-all", "ep all-to-all"),
            figure(&out, "memory", "memory"),
        )
    };
    let (step, a2a, mem) = at("");
    let (step_na, a2a_na, mem_na) = at("--recompute-modules layernorm,moe_act");
    assert!(step_na > step && step_na < step * 1.02, "{step} {step_na}");
    assert_eq!(a2a_na, a2a);
    assert!(mem_na < mem, "{mem} {mem_na}");
    let (_, a2a_moe, mem_moe) = at("--recompute-modules layernorm,moe");
    assert!((a2a_moe / a2a - 1.5).abs() < 0.01, "{a2a} {a2a_moe}");
    assert!(mem_moe < mem_na, "{mem_na} {mem_moe}");
}

/// The MoE rows kept aside are marked so in the validation table's
/// records, and only they of the MoE band; MoE rows hold a band of their
/// own.
#[test]
fn kept_aside_moe_rows_are_marked() {
    let mut held = Vec::new();
    for b in &validation_bands("plan-moe-held-out") {
        let moe = b["stack"] == "megatron-core moe";
        for r in b["rows"].as_array().unwrap() {
            let name = r["name"].as_str().unwrap();
            assert_eq!(
                moe,
                name.starts_with("Qwen3") || name.starts_with("Mixtral"),
                "{name}"
            );
            if moe && r["kept_aside"].as_bool().unwrap() {
                held.push(r["name"].as_str().unwrap().to_string());
            }
        }
    }
    assert_eq!(
        held,
        [
            "Qwen3-235B-A22B tp4 ep8, 256 H100",
            "Qwen3-235B-A22B FSDP ep8, 256 H100",
            "Qwen3-235B-A22B, seq 16384, 256 H100",
            "Mixtral 8x22B, 128 H100"
        ]
    );
}

/// A long layout (experts, interleaving, uneven ends) still opens the plan
/// in lines of at most 100 columns: the answer wraps, it does not run off.
#[test]
fn a_long_moe_layout_wraps_its_answer() {
    let out = costed("plan --model qwen3-235b-a22b --device h100-sxm5-80gb --moe-dispatcher deepep --recompute-modules layernorm,moe_act --gpus 256 --global-batch 2048 --stack megatron-core --layout dp=16,tp=2,pp=8,vpp=4,ep=32,etp=1");
    let answer: Vec<&str> = out
        .lines()
        .take_while(|l| !l.starts_with("Which way to split"))
        .collect();
    assert!(
        answer.iter().any(|l| l.starts_with("Layout dp=16,tp=2")),
        "{out}"
    );
    for l in answer {
        assert!(
            l.chars().count() <= 100,
            "{} columns: {l}",
            l.chars().count()
        );
    }
}
