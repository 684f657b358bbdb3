//! The calibrated model on records of real runs (fixtures/README.md): its
//! time is a function of the figures the run recorded before its sweep
//! (recomputed here from run.json, nothing else), and on those records it
//! predicts the rows of 64 KiB and up within 25% at least as often as the
//! model that recorded them did (their `model_us` column) and as often as
//! stated; the fits from 1 MiB up stay within their stated error. A change
//! to `parbench::model::wire` that makes it worse fails here.

mod common;
use common::*;
use parbench::comm::Collective;
use parbench::model::wire::{ceiling_for, fit_on_wire, Ladder, WireModel};
use parbench::model::ModelAlgo;
use parbench::results::{read_rows, read_runs, CollectiveRow};

/// The fixture's wire, ceiling ladder and rows, less the rows its cores'
/// state probe found elsewhere than the wire's state or moving (the run
/// left them out of its fits; the model is not held to them).
fn wire_of(name: &str) -> (WireModel, Ladder, Vec<CollectiveRow>, bool) {
    let dir = fixture(name);
    let runs = read_runs(&dir).unwrap();
    let state = runs[0].extra.get("core_state");
    let elsewhere: Vec<&str> = ["rows_elsewhere", "rows_moved"]
        .iter()
        .filter_map(|k| state?.get(k)?.as_array())
        .flatten()
        .filter_map(|v| v.as_str())
        .collect();
    let wire = parbench::model::wire::model_of_record(&runs[0].extra["model_link"]).unwrap();
    let ceiling: Ladder =
        serde_json::from_value(runs[0].extra["ceiling"]["ladder"].clone()).unwrap();
    let rows: Vec<CollectiveRow> = read_rows(&dir.join("collectives.csv")).unwrap();
    let rows = rows
        .into_iter()
        .filter(|r| !elsewhere.contains(&r.label().as_str()))
        .collect();
    // Runs that measured each row's ceiling again at the row hold it
    // against the better of that and the pre-sweep ladder.
    let again = runs[0].extra["ceiling"]
        .get("rows_measured_again")
        .is_some();
    (wire, ceiling, rows, again)
}

/// (rows of 64 KiB and up, of which within 25% of the p50), after checking
/// that the model now does so at least as often as the recorded `model_us`.
fn check(name: &str) -> (usize, usize) {
    let (wire, ceiling, rows, again) = wire_of(name);
    let (mut n, mut within, mut within_recorded) = (0, 0, 0);
    let near = |t: f64, p50: f64| usize::from((t / p50 - 1.0).abs() <= 0.25);
    for r in &rows {
        let c: Collective = r.collective.parse().unwrap();
        let t = wire
            .predict(c, &ModelAlgo::of(&r.algo), r.world, r.bytes, r.in_place)
            .unwrap()
            * 1e6;
        assert!(t.is_finite() && t > 0.0, "{name}: {r:?}");
        let g = ceiling_for(
            &ceiling,
            c,
            &ModelAlgo::of(&r.algo),
            r.world,
            r.bytes,
            r.in_place,
        )
        .unwrap();
        let held = if again {
            r.ceiling_gbps >= g * (1.0 - 1e-9)
        } else {
            (g - r.ceiling_gbps).abs() <= 1e-9 * g
        };
        assert!(held, "{name}: ceiling {g} vs {}", r.ceiling_gbps);
        if r.bytes >= 64 << 10 {
            n += 1;
            within += near(t, r.p50_us);
            within_recorded += near(r.model_us, r.p50_us);
        }
    }
    assert!(
        within >= within_recorded,
        "{name}: {within} of {n} rows within 25%, the recorded model {within_recorded}"
    );
    (n, within)
}

/// The largest rms error of the fits from 1 MiB up, per collective, out of place.
fn fit_rms(name: &str) -> f64 {
    let (wire, _, rows, _) = wire_of(name);
    let mut worst: f64 = 0.0;
    for coll in ["all_reduce", "all_gather"] {
        let pts: Vec<(u64, f64)> = rows
            .iter()
            .filter(|r| r.collective == coll && !r.in_place && r.bytes >= 1 << 20)
            .map(|r| (r.bytes, r.p50_us * 1e-6))
            .collect();
        let c: Collective = coll.parse().unwrap();
        let f = fit_on_wire(c, &ModelAlgo::of("ring"), 2, false, &wire, &pts, true).unwrap();
        worst = worst.max(f.rms_rel_err);
    }
    worst
}

#[test]
fn local_shared_memory() {
    let (n, within) = check("real-14-local");
    assert_eq!(n, 44);
    assert!(within >= 42, "{within} of {n} rows within 25%");
    assert!(fit_rms("real-14-local") <= 0.16);
}

#[test]
fn tcp_loopback() {
    // Where the model is weakest (README, docs/model.md): a ring step over
    // loopback runs up to 2x slower than the same exchange in the ladder.
    // Pricing a part written within the slice half at the call's working
    // set (its destination) took this record from 29 to 31 rows within
    // 25% and its fit's rms from 9.5% to 10.9%. Pricing an in-place
    // all_reduce's all-gather wholly at the slice's working set (its
    // destination is the block the reduce-scatter has just sent) took it
    // to 30 (the 4 MiB in-place row at 0.73), and 11 recorded tcp runs
    // from 346 to 356 of 460 rows.
    let (n, within) = check("real-14-tcp");
    assert_eq!(n, 44);
    assert!(within >= 30, "{within} of {n} rows within 25%");
    assert!(fit_rms("real-14-tcp") <= 0.11);
}

#[test]
fn a_1_gbit_shaped_link() {
    let (n, within) = check("real-14-1gbit");
    assert_eq!(n, 44);
    assert!(within >= 42, "{within} of {n} rows within 25%");
    assert!(fit_rms("real-14-1gbit") <= 0.02);
}

#[test]
fn local_shared_memory_with_the_transports_reducing_receive() {
    // Recorded with the fused ladders (`reduce_into`, `reduce_from`) and
    // the cores' state: 3 rows found the cores elsewhere and are not
    // judged. Its fits' rms (22% and 19%) are the run's, not within 10%:
    // the out-of-place rows at 4-8 MiB (a 32 MiB L3 shared with the VM's
    // neighbours) moved 1.5x between runs.
    let (n, within) = check("real-14-fused-local");
    assert_eq!(n, 41);
    assert!(within >= 38, "{within} of {n} rows within 25%");
    assert!(fit_rms("real-14-fused-local") <= 0.22);
}

#[test]
fn tcp_loopback_with_the_transports_reducing_receive() {
    let (n, within) = check("real-14-fused-tcp");
    assert_eq!(n, 44);
    assert!(within >= 42, "{within} of {n} rows within 25%");
    assert!(fit_rms("real-14-fused-tcp") <= 0.13);
}

/// The same default sweeps on the Intel Xeon VM (2 vCPUs, 480 MiB L3 as
/// the guest sees it), quiet: a machine whose caches hold the whole sweep,
/// where the model must hold as it did on the EPYC.
#[test]
fn the_xeon_vm_local_tcp_and_a_1_gbit_link() {
    let (n, within) = check("real-14-xeon-local");
    assert_eq!(n, 43, "2 rows found the cores elsewhere");
    assert!(within >= 43, "{within} of {n} rows within 25%");
    assert!(fit_rms("real-14-xeon-local") <= 0.08);
    let (n, within) = check("real-14-xeon-tcp");
    assert_eq!(n, 44);
    assert!(within >= 44, "{within} of {n} rows within 25%");
    assert!(fit_rms("real-14-xeon-tcp") <= 0.06);
    // Recorded after the reducing receives were held at the ring-step
    // ladder on sockets: before, their burst-borne rungs put every
    // in-place all_reduce row from 1 MiB 30% under.
    let (n, within) = check("real-14-xeon-1gbit");
    assert_eq!(n, 44);
    assert!(within >= 44, "{within} of {n} rows within 25%");
    assert!(fit_rms("real-14-xeon-1gbit") <= 0.01);
}

/// The Xeon VM's default local sweep once the far-destination ladders
/// (`both_far`, `pull_far`) priced the all-gather steps of sliced rings:
/// the rows from 4 MiB, 4-28% fast before them (in place 12-23% at the
/// median), are held within 25% with the rest, and nearer their p50 with
/// the ladders than without, in place and out of place.
#[test]
fn the_xeon_vm_local_with_the_far_destination_ladders() {
    let (n, within) = check("real-14-xeon-far-local");
    assert_eq!(n, 42, "2 rows from 64 KiB found the cores elsewhere");
    assert!(within >= 42, "{within} of {n} rows within 25%");
    assert!(fit_rms("real-14-xeon-far-local") <= 0.06);
    let (wire, _, rows, _) = wire_of("real-14-xeon-far-local");
    assert!(!wire.both_far.rungs.is_empty() && !wire.pull_far.rungs.is_empty());
    let without = WireModel {
        both_far: Ladder::default(),
        pull_far: Ladder::default(),
        ..wire.clone()
    };
    let miss = |w: &WireModel, r: &CollectiveRow| {
        let c: Collective = r.collective.parse().unwrap();
        let t = w
            .predict(c, &ModelAlgo::of(&r.algo), r.world, r.bytes, r.in_place)
            .unwrap();
        (t * 1e6 / r.p50_us - 1.0).abs()
    };
    for in_place in [true, false] {
        let big: Vec<&CollectiveRow> = rows
            .iter()
            .filter(|r| r.in_place == in_place && r.bytes >= 4 << 20)
            .collect();
        assert!(big.len() >= 8, "{} rows", big.len());
        let median = |w: &WireModel| {
            let mut v: Vec<f64> = big.iter().map(|r| miss(w, r)).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (with, old) = (median(&wire), median(&without));
        assert!(
            with < old && big.iter().all(|r| miss(&wire, r) <= 0.25),
            "in place {in_place}: median miss {with:.3} with the ladders, {old:.3} without"
        );
    }
}

/// A default sweep whose rows from 64 KiB were priced with the rungs
/// measured just before each row (`extra.model_at_row`): every such row's
/// `model_us` is the pre-sweep model with the row's rungs put in, and
/// nothing else; the fits the run printed are the fits of those per-row
/// models. A record that cannot give back its own model column fails here.
/// Returns the rows priced at the row and, of the rows from 64 KiB, those
/// within 25% of their p50.
fn gives_back_its_model_column(name: &str) -> (usize, usize) {
    use parbench::model::wire::{fit_on_rows, rungs_of_record, RowRungs};
    let (wire, _, rows, _) = wire_of(name);
    let runs = read_runs(&fixture(name)).unwrap();
    let extra = &runs[0].extra;
    let at_rows = extra["model_at_row"]["rows"].as_array().unwrap();
    let rungs_of = |label: &str| -> Option<RowRungs> {
        let row = at_rows.iter().find(|x| x["row"] == label)?;
        Some(rungs_of_record(row))
    };
    let (mut priced_at_row, mut within) = (0, 0);
    let mut models = Vec::new();
    for r in &rows {
        let c: Collective = r.collective.parse().unwrap();
        let model = match rungs_of(&r.label()) {
            Some(rungs) => {
                priced_at_row += 1;
                wire.with_rungs(&rungs)
            }
            None => wire.clone(),
        };
        assert_eq!(
            rungs_of(&r.label()).is_some(),
            r.bytes >= 64 << 10,
            "{}",
            r.label()
        );
        let t = model
            .predict(c, &ModelAlgo::of(&r.algo), r.world, r.bytes, r.in_place)
            .unwrap()
            * 1e6;
        assert!(
            (t - r.model_us).abs() <= 1e-9 * r.model_us,
            "{}: recorded {} us, recomputed {t} us",
            r.label(),
            r.model_us
        );
        if r.bytes >= 64 << 10 {
            within += usize::from((t / r.p50_us - 1.0).abs() <= 0.25);
        }
        models.push(model);
    }
    for fit in extra["fits"].as_array().unwrap() {
        let coll = fit["collective"].as_str().unwrap();
        let pts: Vec<(u64, f64, &WireModel)> = rows
            .iter()
            .zip(&models)
            .filter(|(r, _)| r.collective == coll && !r.in_place && r.bytes >= 1 << 20)
            .map(|(r, m)| (r.bytes, r.p50_us * 1e-6, m))
            .collect();
        let c: Collective = coll.parse().unwrap();
        let f = fit_on_rows(c, &ModelAlgo::of("ring"), 2, false, &pts, true).unwrap();
        let recorded = fit["rms_rel_err"].as_f64().unwrap();
        assert!(
            (f.rms_rel_err - recorded).abs() <= 1e-9,
            "{coll}: fit {} recomputed, {recorded} recorded",
            f.rms_rel_err
        );
    }
    (priced_at_row, within)
}

#[test]
fn a_local_run_priced_with_rungs_measured_at_each_row_gives_back_its_model_column() {
    // 44 rows from 64 KiB, 5 of them timed with the cores elsewhere (left out).
    let (priced, _) = gives_back_its_model_column("real-15-at-row-local");
    assert_eq!(priced, 39, "rows priced at the row");
}

/// On sockets: the ring's steps priced by the far-destination ladders
/// (`pull_far`, `both_far`) measured at each sliced row, its reducing
/// receives held at the ring step, the copies at the copy ladder.
#[test]
fn a_tcp_run_priced_with_rungs_measured_at_each_row_gives_back_its_model_column() {
    // 44 rows from 64 KiB, 2 of them timed with the wire elsewhere (left out).
    let name = "real-16-at-row-tcp";
    let (priced, within) = gives_back_its_model_column(name);
    assert_eq!(priced, 42, "rows priced at the row");
    assert!(within >= 41, "{within} of {priced} rows within 25%");
    let runs = read_runs(&fixture(name)).unwrap();
    let at_rows = runs[0].extra["model_at_row"]["rows"].as_array().unwrap();
    let read = |ladder: &str| {
        at_rows.iter().any(|r| {
            r["rungs"]
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x["ladder"] == ladder)
        })
    };
    for ladder in [
        "pull_far",
        "both_far",
        "duplex",
        "reduce_from",
        "reduce_into",
        "copy",
    ] {
        assert!(read(ladder), "no row read {ladder}");
    }
}
