//! Sharded data parallel in the composed step (`DpReduce::shard`):
//! ZeRO-1, -2 and -3 and hybrid sharding give the gradients one rank
//! computes on the whole batch, ZeRO-3's gathered weights are the seeded
//! ones bit for bit, the bytes each rank holds are the ZeRO paper's split,
//! and the sharded traffic runs in sleep mode too; on local threads through
//! the library's whole run ([`run_composed`]), and on tcp processes.

mod composed_support;
mod tcp_support;

use composed_support::block;
use parbench::comm::mesh::{MeshShape, Order};
use parbench::comm::{local, tcp, Algo, Communicator, DType};
use parbench::compute::cpu::CpuCompute;
use parbench::layers::layout::ParamSpecs;
use parbench::measure::clock_sync::TimeBase;
use parbench::model::plan::Shard;
use parbench::pipeline::tp_stage::bytes_per_param;
use parbench::pipeline::{
    run_composed, ComposedConfig, ComposedRecord, DpReduce, MlpShape, PipelineConfig,
    TpStageConfig, Work,
};
use parbench::schedule::{generate, ScheduleKind};
use std::time::Duration;
use tcp_support::{job, worker};

const TIMEOUT: Duration = Duration::from_secs(60);

fn config(
    (dp, tp, pp): (usize, usize, usize),
    kind: ScheduleKind,
    shard: Shard,
    group: usize,
    work: Work,
) -> ComposedConfig {
    let block = block(false);
    let schedule = generate(kind, pp, 2, 1).unwrap();
    let stages = TpStageConfig {
        block,
        layers_per_stage: 2,
        seed: 5,
        dp,
        reduce: DpReduce {
            bucket_bytes: 1024,
            overlap: false,
            shard: Some(shard),
            shard_group: group,
            prefetch: false,
        },
    };
    ComposedConfig {
        mesh: MeshShape::new(dp, tp, pp, Order::MEGATRON).unwrap(),
        pipeline: PipelineConfig {
            stage_layers: vec![2; schedule.num_stages],
            shape: MlpShape {
                hidden: 8,
                rows: block.tokens(),
            },
            schedule,
            work,
            straggler: None,
            seed: 5,
            warmup: 1,
            steps: 2,
        },
        stages,
        check: true,
        algo: Algo::Auto,
        corrupt_grad_rank: None,
    }
}

fn run_local(cfg: &ComposedConfig) -> ComposedRecord {
    let out = local::run(cfg.mesh.world(), Algo::Auto, TIMEOUT, |w| {
        let c = CpuCompute::new(DType::F32, 1)
            .map_err(|e| parbench::comm::CommError::Device(e.to_string()))?;
        run_composed(w, &c, cfg, TimeBase::Shared).map_err(|e| e.into_comm(w.rank()))
    });
    let mut rec = None;
    for (r, o) in out.into_iter().enumerate() {
        let o = o.unwrap_or_else(|e| panic!("{} rank {r}: {e}", cfg.mesh));
        if r == 0 {
            rec = o;
        }
    }
    rec.expect("world rank 0 gathers the record")
}

/// Every replica's gradients within 1e-5 of one rank's on the whole
/// batch, and under ZeRO-3 every gathered weight the seeded one.
fn assert_checks(rec: &ComposedRecord, shard: Shard, what: &str) {
    assert_eq!(
        rec.checks.len(),
        rec.mesh.dp,
        "{what}: one check per replica"
    );
    for (d, c) in &rec.checks {
        assert!(c.values > 0, "{what}");
        assert!(c.max_rel_err <= 1e-5, "{what} replica {d}: {c:?}");
        assert_eq!(c.weights_differing, 0, "{what} replica {d}: {c:?}");
        if shard == Shard::Zero3 {
            assert!(c.weights_compared > 0, "{what}: {c:?}");
        } else {
            assert_eq!(c.weights_compared, 0, "{what}: {c:?}");
        }
    }
}

#[test]
fn every_mode_matches_one_rank_with_and_without_tensor_and_pipeline_parallel() {
    for (layout, kind, group) in [
        ((2, 1, 1), ScheduleKind::OneFOneB, 0),
        ((4, 1, 1), ScheduleKind::GPipe, 0),
        ((2, 2, 2), ScheduleKind::ZbH1, 0),
        ((4, 1, 2), ScheduleKind::OneFOneB, 0),
        // Hybrid: shards over pairs, averaged across the two pairs.
        ((4, 1, 1), ScheduleKind::OneFOneB, 2),
        ((4, 2, 1), ScheduleKind::ZbH1, 2),
    ] {
        for shard in [Shard::None, Shard::Zero1, Shard::Zero2, Shard::Zero3] {
            let cfg = config(layout, kind, shard, group, Work::Compute);
            let what = format!("{} {kind} {} group {group}", cfg.mesh, shard.name());
            let rec = run_local(&cfg);
            assert_checks(&rec, shard, &what);
            for r in &rec.ranks {
                for t in &r.times {
                    let per_layer = matches!(shard, Shard::Zero2 | Shard::Zero3);
                    assert_eq!(t.shard_calls > 0, per_layer, "{what}: {t:?}");
                    assert_eq!(t.shard_gather_us > 0.0, shard == Shard::Zero3, "{what}");
                    assert!(t.optimizer_us > 0.0, "{what}");
                }
            }
        }
    }
}

/// What a rank holds once its step is done, counted from its buffers, is
/// the ZeRO paper's split of its parameters over the shard group (within
/// the padding of the last share: 10%); the peak is at least that.
#[test]
fn each_rank_holds_the_zero_papers_split() {
    for (dp, group) in [(2, 0), (4, 0), (4, 2)] {
        for shard in [Shard::None, Shard::Zero1, Shard::Zero2, Shard::Zero3] {
            let cfg = config(
                (dp, 1, 2),
                ScheduleKind::OneFOneB,
                shard,
                group,
                Work::Compute,
            );
            let rec = run_local(&cfg);
            let params: usize = ParamSpecs::new(&cfg.stages.block)
                .all()
                .iter()
                .map(|p| p.local_len(1))
                .sum::<usize>()
                * cfg.stages.layers_per_stage;
            let g = cfg.stages.reduce.group_of(dp);
            let want = bytes_per_param(shard, 4, g) * params as f64;
            for r in &rec.ranks {
                for t in &r.times {
                    let h = t.held_end;
                    let got = h.params + h.grads + h.optimizer + h.buffers;
                    let what = format!("dp {dp} group {g} {}: {h:?}", shard.name());
                    assert!(
                        (got - want).abs() <= 0.1 * want,
                        "{what}: held {got} B, formula {want} B"
                    );
                    assert!(t.held_peak_total >= got, "{what}");
                }
            }
        }
    }
}

/// Under `--work sleep` the sharded collectives still run: the per-layer
/// gathers and scatters move the same bytes as in compute mode.
#[test]
fn sleep_mode_keeps_the_sharded_traffic() {
    for shard in [Shard::Zero2, Shard::Zero3] {
        let cfg = config(
            (2, 1, 2),
            ScheduleKind::OneFOneB,
            shard,
            0,
            Work::Sleep(Duration::from_micros(200)),
        );
        let compute = run_local(&config(
            (2, 1, 2),
            ScheduleKind::OneFOneB,
            shard,
            0,
            Work::Compute,
        ));
        let rec = run_local(&cfg);
        for (a, b) in rec.ranks.iter().zip(&compute.ranks) {
            for (s, c) in a.times.iter().zip(&b.times) {
                assert_eq!(s.shard_calls, c.shard_calls, "{}", shard.name());
                assert!(s.shard_calls > 0);
            }
        }
    }
}

/// ZeRO-3 with each layer's gather handed to the data group's thread
/// ahead of its use (prefetch): the same gradients and gathered weights,
/// every gather timed on the thread, and the bytes in flight counted.
#[test]
fn zero3_prefetch_keeps_the_gradients() {
    for (layout, kind, group) in [
        ((2, 1, 1), ScheduleKind::OneFOneB, 0),
        ((4, 1, 1), ScheduleKind::GPipe, 2),
        ((2, 2, 2), ScheduleKind::ZbH1, 0),
    ] {
        let mut cfg = config(layout, kind, Shard::Zero3, group, Work::Compute);
        cfg.stages.reduce.prefetch = true;
        let what = format!("{} {kind} prefetch group {group}", cfg.mesh);
        let rec = run_local(&cfg);
        assert_checks(&rec, Shard::Zero3, &what);
        for r in &rec.ranks {
            for t in &r.times {
                assert!(
                    t.shard_gather_us > 0.0 && t.shard_calls > 0,
                    "{what}: {t:?}"
                );
                assert!(t.held_peak.buffers > 0.0, "{what}: {t:?}");
            }
        }
    }
}

/// A shard group that does not divide the data group is one line, and
/// prefetch without ZeRO-3 too.
#[test]
fn a_shard_group_that_does_not_divide_is_refused() {
    let mut cfg = config(
        (4, 1, 1),
        ScheduleKind::OneFOneB,
        Shard::Zero3,
        3,
        Work::Compute,
    );
    cfg.stages.reduce.shard_group = 3;
    let e = cfg.stages.validate(1).unwrap_err().to_string();
    assert!(e.contains("does not divide"), "{e}");
    let mut cfg = config(
        (2, 1, 1),
        ScheduleKind::OneFOneB,
        Shard::Zero2,
        0,
        Work::Compute,
    );
    cfg.stages.reduce.prefetch = true;
    let e = cfg.stages.validate(1).unwrap_err().to_string();
    assert!(e.contains("--shard zero3"), "{e}");
}

/// ZeRO-3, hybrid ZeRO-2 and hybrid ZeRO-3 with prefetch, as tcp
/// processes: the same check.
#[test]
fn tcp_sharded_modes_match_one_rank() {
    let name = "tcp_sharded_modes_match_one_rank";
    let cases = [
        ((2, 2, 1), Shard::Zero3, 0, false),
        ((4, 1, 1), Shard::Zero2, 2, false),
        ((4, 1, 1), Shard::Zero3, 2, true),
    ];
    if let Some(info) = worker(name) {
        let mut comm = tcp::comm(&info, Algo::Auto, TIMEOUT).unwrap();
        let c = CpuCompute::new(DType::F32, 1).unwrap();
        for (layout, shard, group, prefetch) in cases {
            let mut cfg = config(layout, ScheduleKind::OneFOneB, shard, group, Work::Compute);
            cfg.stages.reduce.prefetch = prefetch;
            let rec = run_composed(&mut comm, &c, &cfg, TimeBase::Estimated).unwrap();
            if let Some(rec) = rec {
                assert_checks(&rec, shard, &format!("tcp {} {}", cfg.mesh, shard.name()));
            }
        }
        return;
    }
    let status = job(name, 4).run();
    assert!(
        status.is_ok_and(|s| s.success()),
        "a tcp rank failed the sharded check"
    );
}
