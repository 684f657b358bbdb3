//! Every generated schedule against the action lists PyTorch's own classes
//! build (`torch.distributed.pipelining`), written by
//! `scripts/pytorch_schedules.py` into `tests/fixtures/pytorch_schedules/`
//! with the torch version in its `manifest.json`: the same actions per rank
//! in the same order (idle steps aside), the same stage-to-rank map, and
//! the same sizes refused.

use parbench::schedule::{
    generate, load_csv, validate, Action, ActionKind, Schedule, ScheduleKind,
};
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pytorch_schedules")
}

struct Case {
    kind: ScheduleKind,
    ranks: usize,
    micro: usize,
    per_rank: usize,
    /// The CSV and PyTorch's stage-to-rank map, or PyTorch's refusal.
    written: Result<(String, Vec<usize>), String>,
}

fn cases() -> (String, Vec<Case>) {
    let text = std::fs::read_to_string(fixtures().join("manifest.json")).unwrap();
    let manifest: serde_json::Value = serde_json::from_str(&text).unwrap();
    let torch = manifest["torch"].as_str().unwrap().to_string();
    let n = |v: &serde_json::Value| v.as_u64().unwrap() as usize;
    let cases = manifest["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| Case {
            kind: f["schedule"].as_str().unwrap().parse().unwrap(),
            ranks: n(&f["ranks"]),
            micro: n(&f["microbatches"]),
            per_rank: f.get("stages_per_rank").map_or(1, n),
            written: match f.get("refused") {
                Some(why) => Err(why.as_str().unwrap().to_string()),
                None => Ok((
                    f["file"].as_str().unwrap().to_string(),
                    f["stage_to_rank"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(n)
                        .collect(),
                )),
            },
        })
        .collect();
    (torch, cases)
}

fn rows(s: &Schedule) -> Vec<Vec<Action>> {
    (0..s.ranks()).map(|r| s.compute_actions(r)).collect()
}

fn text(row: &[Action]) -> String {
    row.iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// What PyTorch's `Schedule1F1B._get_pipeline_order` writes for the last
/// rank: its forwards numbered from 1 (`3F1 .. 3F4` at M = 4; the counter
/// is bumped before the first forward when the rank has no warm-up). Its
/// runtime (`_step_microbatches`) runs microbatches 0 .. M-1; the order is
/// otherwise ours.
fn torch_1f1b_last_rank(ours: &[Action]) -> Vec<Action> {
    ours.iter()
        .map(|&a| match a.kind {
            ActionKind::F => Action::new(a.stage, a.kind, a.mb + 1),
            _ => a,
        })
        .collect()
}

#[test]
fn every_generator_builds_pytorchs_actions() {
    let (torch, cases) = cases();
    let mut compared = 0;
    for c in &cases {
        let at = format!("{} R={} M={} (torch {torch})", c.kind, c.ranks, c.micro);
        let ours = generate(c.kind, c.ranks, c.micro, c.per_rank);
        let (file, torch_map) = match &c.written {
            Err(why) => {
                let e = ours.expect_err(&format!("{at}: PyTorch refuses it ({why}), we did not"));
                assert!(!e.to_string().contains('\n'), "{at}: {e}");
                continue;
            }
            Ok(w) => w,
        };
        let ours = ours.unwrap_or_else(|e| panic!("{at}: {e}"));
        validate(&ours).unwrap_or_else(|e| panic!("{at}: {e}"));
        let theirs = load_csv(&fixtures().join(file)).unwrap();
        assert_eq!(&ours.stage_to_rank, torch_map, "{at}: stage-to-rank map");
        let (ours_rows, theirs_rows) = (rows(&ours), rows(&theirs));
        assert_eq!(ours_rows.len(), theirs_rows.len(), "{at}: ranks");
        for (r, (o, t)) in ours_rows.iter().zip(&theirs_rows).enumerate() {
            let want = match c.kind {
                ScheduleKind::OneFOneB if r + 1 == c.ranks => torch_1f1b_last_rank(o),
                _ => o.clone(),
            };
            if c.kind == ScheduleKind::Interleaved && c.micro == c.ranks {
                // Megatron runs every forward first when M equals R (its
                // `num_microbatches == pipeline_parallel_size`); PyTorch keeps its
                // warm-up count. Same actions, another order.
                let (mut a, mut b) = (want.clone(), t.clone());
                a.sort();
                b.sort();
                assert_eq!(a, b, "{at}: rank {r}'s actions");
                continue;
            }
            assert_eq!(text(&want), text(t), "{at}: rank {r}");
        }
        if c.kind != ScheduleKind::OneFOneB {
            validate(&theirs).unwrap_or_else(|e| panic!("{at}: PyTorch's: {e}"));
        }
        compared += 1;
    }
    assert!(compared >= 7 * 4, "only {compared} fixtures compared");
}

#[test]
fn every_schedule_has_pytorchs_fixtures_at_r_2_4_and_m_4_8() {
    let (_, cases) = cases();
    for kind in ScheduleKind::ALL {
        if kind == ScheduleKind::ZbH1 {
            // Qi et al.'s handcrafted ZB-H1 on one stage per rank: PyTorch ships
            // no class for it (its zero-bubble classes are interleaved-zb and zb-v).
            continue;
        }
        for ranks in [2, 4] {
            for micro in [4, 8] {
                assert!(
                    cases
                        .iter()
                        .any(|c| c.kind == kind && c.ranks == ranks && c.micro == micro),
                    "{kind} R={ranks} M={micro}: no fixture (run scripts/pytorch_schedules.py)"
                );
            }
        }
    }
}
