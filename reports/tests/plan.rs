//! `report plan`: measured wires from results folders, the ranking and the
//! reasons printed, the plan file that `report html` draws, and one-line
//! errors (exit 2) for bad flags and files. No timing of this machine is
//! asserted: the fixtures' figures are given.

mod common;
use common::*;

fn fx(name: &str) -> String {
    fixture(name).display().to_string()
}

/// The shm fixture's collectives alone (its other records belong to the
/// tests of their own sections).
fn shm_collectives(to: &str) -> String {
    let dst = scratch(to);
    for f in ["collectives.csv", "run.json"] {
        std::fs::copy(fixture("shm").join(f), dst.join(f)).unwrap();
    }
    dst.display().to_string()
}

/// The ranked rows of the plan's table: the lines under its rule.
fn ranked(out: &str) -> Vec<&str> {
    out.lines()
        .skip_while(|l| !l.starts_with("layout (dp x tp x pp)"))
        .skip(2)
        .take_while(|l| {
            !l.is_empty()
                && !["b: ", "tight: ", "every row: "]
                    .iter()
                    .any(|p| l.starts_with(p))
        })
        .collect()
}

/// The text with its lines joined (a phrase may be broken across two).
fn flat(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn plans_from_measured_wires() {
    let (shm, tcp) = (shm_collectives("plan-shm-1"), fx("tcp"));
    let o = report(&words("plan --model gpt3-1.3b --global-batch 64 --gpus 16 --gpus-per-node 8 --compute-tflops 100 --device-memory 40 --from", &[&shm, &tcp]));
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // Each wire says where it came from: the fits of the fixtures' all_reduce rows.
    assert!(
        out.contains("intra-node:") && out.contains("from fit of all_reduce local/shm"),
        "{out}"
    );
    assert!(
        flat(&out).contains("from fit of all_reduce tcp/loopback"),
        "{out}"
    );
    assert!(out.contains("from --compute-tflops 100"), "{out}");
    assert!(out.contains("Best layouts by tokens/s"), "{out}");
    assert!(out.contains("Why the others lose"), "{out}");
    // 16-way tensor parallelism cannot stay in a node of 8.
    assert!(out.contains("tensor parallel across nodes"), "{out}");
    // The first row of the ranking is layout #1, with all of its columns.
    let first = *ranked(&out).first().unwrap_or_else(|| panic!("{out}"));
    assert!(first.contains("GiB"), "{first}");
}

#[test]
fn flags_override_measurements() {
    let o = report(&words(
        "plan --layers 8 --hidden 1024 --heads 16 --ffn 4096 --seq 512 --global-batch 32 --gpus 8 --intra 400,2 --compute-tflops 50 --top 3 --from",
        &[&shm_collectives("plan-shm-2")],
    ));
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        out.contains("intra-node: 400 GB/s, alpha 2.00 us, from --intra 400,2"),
        "{out}"
    );
    // One node: no inter-node wire needed.
    assert!(out.contains("unused (one node)"), "{out}");
    assert!(out.contains("custom (8 layers, hidden 1024"), "{out}");
    assert_eq!(ranked(&out).len(), 3, "{out}");
}

#[test]
fn a_plan_file_becomes_an_html_section() {
    let dir = copy_fixture("tcp", "plan-html");
    let d = dir.display().to_string();
    let json = dir.join("plan.json");
    let o = report(&words(
        "plan --model tiny --global-batch 16 --gpus 16 --gpus-per-node 4 --intra 100,1 --compute-tflops 1 --from",
        &[&d, "--output-file", json.to_str().unwrap()],
    ));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = std::fs::read_to_string(&json).unwrap();
    assert!(text.contains("\"schema\": 1"), "{text}");
    let out = dir.join("r.html");
    let o = report(&["html", &d, "--output-file", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let html = std::fs::read_to_string(&out).unwrap();
    assert!(html.contains("<section id=\"plan\">"));
    assert!(html.contains("step time of the best layouts"));
    assert!(html.contains("Why the others lose"));
    // The first screen answers with the plan's best layout.
    let summary = &html[..html.find("<section id=\"collectives\">").unwrap()];
    assert!(
        summary.contains("<td class=\"text\">best layout</td>"),
        "{summary}"
    );
    // busbw + latency of all_reduce, capacity, and the plan's chart.
    assert_eq!(html.matches("<svg").count(), 4);

    // A plan file that does not parse stops the report, naming it.
    std::fs::write(&json, "{ not json").unwrap();
    let o = report(&["html", &d, "--output-file", out.to_str().unwrap()]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("plan.json"), "{err}");
}

#[test]
fn no_plan_file_leaves_the_tensor_parallel_part_alone() {
    let out = scratch("plan-none").join("r.html");
    let o = report(&["html", &fx("tcp"), "--output-file", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let html = std::fs::read_to_string(&out).unwrap();
    assert_eq!(html.matches("<section id=\"plan\">").count(), 1);
    assert!(!html.contains("step time of the best layouts"));
    assert!(html.contains("id=\"capacity-chart\""));
}

/// Each case's flags after `base`: exit 2, one line on stderr holding its text.
fn each_one_line_exit_2(base: &[&str], cases: Vec<(Vec<&str>, &str)>) {
    for (extra, want) in cases {
        let mut args: Vec<&str> = base.to_vec();
        args.extend(&extra);
        let o = report(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: {want:?} not in {err}");
    }
}

#[test]
fn bad_flags_and_files_are_one_line_and_exit_2() {
    let shape = words(
        "plan --global-batch 8 --gpus 8 --compute-tflops 1 --intra 100,1",
        &[],
    );
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--model", "gpt5"], "unknown preset"),
        (vec!["--layers", "4"], "--heads is missing"),
        (vec!["--model", "tiny", "--hidden", "64"], "not both"),
        (
            vec!["--model", "tiny", "--from", "/no/such/dir"],
            "no such results folder",
        ),
        (
            vec!["--model", "tiny", "--inter", "fast"],
            "expected GBPS,US",
        ),
        (
            vec!["--model", "tiny", "--device-memory", "0"],
            "--device-memory",
        ),
        (
            vec!["--model", "tiny", "--device-memory=-3"],
            "--device-memory",
        ),
        (
            vec!["--model", "tiny", "--recompute", "some"],
            "--recompute",
        ),
        (
            vec!["--model", "tiny", "--gpus-per-node", "3"],
            "whole number",
        ),
        (vec!["--model", "tiny", "--gpus-per-node", "4"], "--inter"),
        (
            vec!["--model", "tiny", "--stack", "deepspeed"],
            "unknown stack",
        ),
        (
            vec!["--model", "tiny", "--search-open"],
            "--search-open: give --stack",
        ),
    ];
    each_one_line_exit_2(&shape, cases);
    // Figures no device comes near, either way: one short line, not a plan
    // of a step that takes years.
    let bare = words("plan --model tiny --global-batch 8 --gpus 8", &[]);
    let figures: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--compute-tflops", "1e-300", "--intra", "100,1"],
            "--compute-tflops 1e-300: expected 0.001 to 1000000 TFLOP/s",
        ),
        (
            vec!["--compute-tflops", "1", "--intra", "100,1e30"],
            "latency 1e30: expected 0 to 1000000 us",
        ),
        (
            vec![
                "--compute-tflops",
                "1",
                "--intra",
                "100,1",
                "--device-memory",
                "1e300",
            ],
            "--device-memory 1e300: expected",
        ),
        (
            vec![
                "--compute-tflops",
                "1",
                "--intra",
                "100,1",
                "--gpus-per-node",
                "4",
                "--inter",
                "1e-300,1",
            ],
            "--inter 1e-300,1: bandwidth 1e-300: expected 0.001",
        ),
    ];
    each_one_line_exit_2(&bare, figures);
    // No compute figure at all.
    let o = report(&words(
        "plan --model tiny --global-batch 8 --gpus 8 --intra 100,1",
        &[],
    ));
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--compute-tflops"));
}

#[test]
fn a_thousand_devices_plan() {
    // The enumeration stays bounded: 1024 devices plan (and print) without
    // running out of anything; how fast is shown by the binary, not asserted.
    let o = report(&words("plan --model gpt3-175b --global-batch 1536 --gpus 1024 --gpus-per-node 8 --intra 400,3 --inter 25,8 --compute-tflops 400 --device-memory 80 --sequence-parallel --recompute selective", &[]));
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let first = *ranked(&out).first().unwrap_or_else(|| panic!("{out}"));
    // Tensor parallelism inside the node: tp (of dp x tp x pp) is at most 8.
    let tp: u64 = first.split('x').nth(1).unwrap().parse().unwrap();
    assert!(tp <= 8, "{first}");
}

/// With a device: compute by operation, the datasheet wires and memory,
/// MFU in the table; Llama 3 405B counted as 405.85B, from the preset and
/// from a custom llama shape alike.
#[test]
fn a_described_device_plans_and_counts_gated_mlps() {
    let o = report(&words("plan --model llama3-405b --global-batch 2048 --gpus 16384 --device h100-sxm5-80gb --distributed-optimizer --sequence-parallel --top 3", &[]));
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(out.contains("406B parameters"), "{out}");
    assert!(out.contains("device:     h100-sxm5-80gb"), "{out}");
    assert!(out.contains("from h100-sxm5-80gb: NVLink"), "{out}");
    assert!(out.contains("MFU"), "{out}");
    let custom = report(&words("plan --layers 126 --hidden 16384 --heads 128 --kv-heads 8 --ffn 53248 --seq 8192 --vocab 128256 --arch llama --global-batch 2048 --gpus 16384 --device h100-sxm5-80gb --device-memory 100 --distributed-optimizer --sequence-parallel --layout dp=128,tp=8,pp=16,mbs=1", &[]));
    let out = stdout(&custom);
    assert_eq!(custom.status.code(), Some(0), "{}", stderr(&custom));
    assert!(out.contains("406B parameters"), "{out}");
    // The published layout, 126 layers unevenly on 16 stages, costed term by term.
    assert!(
        out.contains("Layout dp=128,tp=8,pp=16,mbs=1: dp=128 tp=8 pp=16"),
        "{out}"
    );
    for term in [
        "  step ",
        "  compute ",
        "  tp comm ",
        "  bubble ",
        "  dp comm ",
        "MFU",
        "HFU",
    ] {
        assert!(out.contains(term), "{term}: {out}");
    }
    assert!(
        out.contains("search's best"),
        "the comparison with the search: {out}"
    );
}

/// A layout that does not fit is one line saying by how much; device and
/// layout flags that make no sense are one line and exit 2; absurd shapes
/// and node sizes are refused before anything is costed.
#[test]
fn device_and_layout_errors_are_one_line() {
    let base = words("plan --model gpt3-175b --global-batch 64 --gpus 64", &[]);
    let dir = scratch("plan-device-files");
    let bad_json = dir.join("bad.json");
    std::fs::write(&bad_json, "{\"name\": \"x\"}").unwrap();
    let big = dir.join("big.json");
    std::fs::write(&big, vec![b' '; 70 * 1024]).unwrap();
    let (bad_json, big, folder) = (
        bad_json.display().to_string(),
        big.display().to_string(),
        dir.display().to_string(),
    );
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--device", "tpu-v9"], "unknown device"),
        (vec!["--device-file", &bad_json], "--device-file"),
        (vec!["--device-file", &big], "larger than"),
        (vec!["--device-file", &folder], "not a regular file"),
        (
            vec!["--device", "a100-sxm4-80gb", "--layout", "dp=8,tp=8,pp=1"],
            "does not fit",
        ),
        (
            vec!["--device", "a100-sxm4-80gb", "--layout", "dp=2,tp=8,pp=8"],
            "is not the 64 devices",
        ),
        (
            vec!["--device", "a100-sxm4-80gb", "--layout", "dp=1,tp=8"],
            "give dp=, tp= and pp=",
        ),
        (
            vec!["--device", "a100-sxm4-80gb", "--attention", "sparse"],
            "--attention",
        ),
        (
            vec!["--device", "a100-sxm4-80gb", "--schedule", "gpipe,bogus"],
            "--schedule bogus",
        ),
    ];
    each_one_line_exit_2(&base, cases);
    // 8 layers of gpt3-175b need 2 TiB on one device: by how much is said.
    let o = report(&words("plan --model gpt3-175b --global-batch 8 --gpus 8 --device a100-sxm4-80gb --layout dp=1,tp=8,pp=1", &[]));
    assert!(stderr(&o).contains("GiB of 80.00 GiB (+"), "{}", stderr(&o));
    // Absurd shapes and clusters (issue 33, item 7).
    let huge = words("plan --layers 4294967295 --hidden 4294967295 --heads 1 --ffn 1 --seq 1 --global-batch 1 --gpus 1 --compute-tflops 1 --intra 1,1", &[]);
    let o = report(&huge);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--layers 4294967295: above"));
    let o = report(&words("plan --model tiny --global-batch 8 --gpus 4 --gpus-per-node 100000 --compute-tflops 1 --intra 1,1", &[]));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--gpus-per-node 100000: above"),
        "{}",
        stderr(&o)
    );
}

/// A wire fitted from a run its noise guard marked noisy says so; a fit
/// of a socket backend says it stands in for the network between nodes.
#[test]
fn a_fit_from_a_noisy_run_says_so() {
    let quiet = copy_fixture("real-14-xeon-tcp", "plan-quiet-tcp");
    let noisy = copy_fixture("real-14-xeon-tcp", "plan-noisy-tcp");
    let path = noisy.join("run.json");
    let mut runs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    runs[0]["extra"]["noise"]["fraction"] = serde_json::json!(0.3);
    std::fs::write(&path, serde_json::to_string(&runs).unwrap()).unwrap();
    let plan = |dir: &std::path::Path| {
        let d = dir.display().to_string();
        let o = report(&words("plan --model tiny --global-batch 8 --gpus 16 --gpus-per-node 8 --compute-tflops 1 --intra 100,1 --from", &[&d]));
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        stdout(&o)
    };
    let q = plan(&quiet);
    assert!(!q.contains("NOISY"), "{q}");
    assert!(
        flat(&q).contains("stand in for the network between nodes"),
        "{q}"
    );
    let n = plan(&noisy);
    assert!(
        flat(&n).contains("NOISY: the run's noise guard marked it"),
        "{n}"
    );
}

/// A bench-layers folder whose block ran on a GPU (no CPU threads), its
/// compute time `compute_us`: the shm fixture's layers rewritten.
fn gpu_block(to: &str, compute_us: f64) -> String {
    let dst = scratch(to);
    std::fs::copy(fixture("shm").join("run.json"), dst.join("run.json")).unwrap();
    let text = std::fs::read_to_string(fixture("shm").join("layers.csv")).unwrap();
    let mut lines = text.lines();
    let header = lines.next().unwrap();
    let cols: Vec<&str> = header.split(',').collect();
    let at = |name: &str| cols.iter().position(|c| *c == name).unwrap();
    let (threads, compute, mode) = (at("threads"), at("compute_us"), at("mode"));
    let mut out = vec![header.to_string()];
    for l in lines {
        let mut f: Vec<String> = l.split(',').map(String::from).collect();
        f[threads] = "0".into();
        f[compute] = compute_us.to_string();
        f[mode] = "train".into();
        out.push(f.join(","));
    }
    std::fs::write(dst.join("layers.csv"), out.join("\n") + "\n").unwrap();
    dst.display().to_string()
}

/// With a device and a block measured on the GPU, the in-step share of
/// the GEMM rate is the measured block's (its costed time over its
/// measured time): twice the time, half the rate; the header says so.
#[test]
fn a_block_measured_on_the_gpu_sets_the_in_step_share() {
    let line = "plan --model gpt3-1.3b --global-batch 64 --gpus 8 --device h100-sxm5-80gb --stack megatron-core --top 1 --from";
    let rate = |compute_us: f64, to: &str| {
        let dir = gpu_block(to, compute_us);
        let o = report(&words(line, &[&dir]));
        let out = stdout(&o);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert!(
            out.contains("the in-step share measured: bench-layers in"),
            "{out}"
        );
        let c = out
            .lines()
            .find(|l| l.contains("  compute:"))
            .unwrap()
            .to_string();
        let tflops: f64 = c.split_whitespace().nth(1).unwrap().parse().unwrap();
        tflops
    };
    let (one, two) = (rate(1e6, "plan-gpu-block-1"), rate(2e6, "plan-gpu-block-2"));
    assert!((one / two - 2.0).abs() < 0.02, "{one} {two}");
    // Without the measured block: the datasheet's sustained clock.
    let o = report(&words(
        "plan --model gpt3-1.3b --global-batch 64 --gpus 8 --device h100-sxm5-80gb --stack megatron-core --top 1",
        &[],
    ));
    assert!(stdout(&o).contains("the datasheet's clock held at the power limit"));
}

/// The first screen is for a person: the answer before what it was
/// costed on, and no line over 100 columns; -v adds the sources in full.
#[test]
fn the_default_plan_leads_with_the_answer_in_short_lines() {
    let cases = [
        "plan --layers 24 --hidden 2048 --heads 16 --ffn 8192 --seq 4096 --vocab 131072 --untie-embeddings --global-batch 192 --gpus 48 --device h100-sxm5-80gb --stack megatron-core --layout dp=48,tp=1,pp=1",
        "plan --model llama3-70b --gpus 64 --global-batch 512 --device h100-sxm5-80gb --stack megatron-core",
        "plan --model mixtral-8x7b --device h100-sxm5-80gb --gpus 64 --global-batch 256 --stack megatron-core --device-memory 200 --layout dp=16,tp=1,pp=4,vpp=8,ep=8",
    ];
    for line in cases {
        let o = report(&words(line, &[]));
        let out = stdout(&o);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        for l in out.lines() {
            assert!(
                l.chars().count() <= 100,
                "{} columns: {l}",
                l.chars().count()
            );
        }
        let at = |what: &str| out.find(what).unwrap_or_else(|| panic!("{what}: {out}"));
        let answer = out
            .find("Layout dp=")
            .or_else(|| out.find("Best layout:"))
            .unwrap_or_else(|| panic!("no answer: {out}"));
        assert!(answer < at("Best layouts by tokens/s"), "{out}");
        assert!(answer < at("Costed on"), "{out}");
        // The step beside the stack's band, on the next line.
        if let Some(i) = out.lines().position(|l| l.starts_with("  step ")) {
            let next = out.lines().nth(i + 1).unwrap_or("");
            assert!(next.starts_with("  band          +"), "{out}");
        } else {
            assert!(out.contains("MFU") && out.contains("; band: +"), "{out}");
        }
        assert!(!out.contains("the step:"), "{out}");
        let v = report(&words(line, &["-v"]));
        let full = flat(&stdout(&v));
        assert!(full.contains("the step: flash attention"), "{full}");
        assert!(full.contains("Hopper whitepaper: 132 SMs"), "{full}");
        assert!(full.contains("token lat"), "{full}");
    }
}

/// A layout whose two memory counts straddle the device is ranked, but
/// marked `tight` in the table, and when it is the best the answer names
/// the best layout that fits by both counts.
#[test]
fn a_tight_best_layout_is_marked_and_a_sure_one_named() {
    let o = report(&words("plan --model llama3-70b --gpus 64 --global-batch 512 --device h100-sxm5-80gb --stack megatron-core", &[]));
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let rows = ranked(&out);
    let tight: Vec<&&str> = rows.iter().filter(|r| r.contains(" tight ")).collect();
    assert!(!tight.is_empty(), "{out}");
    // No row over the device's 80 GiB by the planner's count goes unmarked.
    for r in &rows {
        let gib: f64 = r
            .split(" GiB")
            .next()
            .and_then(|x| x.split_whitespace().last())
            .and_then(|x| x.parse().ok())
            .unwrap_or_else(|| panic!("{r}"));
        assert!(gib <= 80.0 || r.contains(" tight "), "{r}");
    }
    let answer = flat(&out);
    assert!(answer.contains("tight: the device lies between"), "{out}");
    if rows[0].contains(" tight ") {
        assert!(answer.contains("memory tight:"), "{out}");
        assert!(
            answer.contains("the best that fits by both counts:"),
            "{out}"
        );
    }
}

/// Why a named layout loses names only the terms that differ by more than
/// rounding: no "-0.00 us" reasons (the 1.7B layout's bubble is zero in
/// both it and the search's best).
#[test]
fn why_a_layout_loses_names_no_rounding() {
    let o = report(&words("plan --layers 24 --hidden 2048 --heads 16 --ffn 8192 --seq 4096 --vocab 131072 --untie-embeddings --global-batch 192 --gpus 48 --device h100-sxm5-80gb --stack megatron-core --layout dp=48,tp=1,pp=1", &[]));
    let out = flat(&stdout(&o));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(out.contains("Against the search's best"), "{out}");
    assert!(out.contains("longer in compute"), "{out}");
    assert!(
        !out.contains("-0.00 us") && !out.contains("+0.00 us"),
        "{out}"
    );
}
