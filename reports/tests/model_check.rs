//! `report model-check`: the collective model judged over several recorded
//! runs of one wire, noisy runs left out and named.

mod common;
use common::*;

#[test]
fn runs_of_one_wire_are_judged_together_and_noisy_ones_left_out() {
    let a = fixture("real-14-local");
    let b = fixture("real-14-xeon-local");
    let noisy = copy_fixture("real-14-fused-local", "model-check-noisy");
    let path = noisy.join("run.json");
    let mut runs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    for r in runs.as_array_mut().unwrap() {
        r["extra"]["noise"]["fraction"] = serde_json::json!(0.4);
    }
    std::fs::write(&path, serde_json::to_string(&runs).unwrap()).unwrap();
    let o = report(&[
        "model-check",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        noisy.to_str().unwrap(),
    ]);
    let out = stdout(&o);
    assert!(
        matches!(o.status.code(), Some(0) | Some(1)),
        "{out}{}",
        stderr(&o)
    );
    assert!(
        out.contains("local/shm: 2 runs judged, 1 noisy (not judged)"),
        "{out}"
    );
    assert!(out.contains("noisy, not judged: collectives-"), "{out}");
    assert!(out.contains("median share within 25%:"), "{out}");
    assert!(out.contains("rows that missed in every run:"), "{out}");
    // Two runs: no row can miss in most but not every one of them.
    assert!(out.contains("; in most runs: none;"), "{out}");
    // Each fit names the row of its window furthest from the model.
    assert!(out.contains(" rms (furthest row "), "{out}");
    assert!(out.contains("MET"), "{out}");
    // Only noisy runs: nothing judged, exit 3.
    let o = report(&["model-check", noisy.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(3), "{}", stdout(&o));
}
