//! The composed dp x tp x pp step ([`parbench::pipeline::tp_stage`]): its
//! weight gradients, gathered across tensor shards and pipeline stages
//! after the data-parallel reduction, against one rank running the whole
//! model on the whole global batch; for D, T, P in {1, 2} and every
//! generated schedule, on local threads, and dp 2 x tp 2 x pp 2 on tcp
//! processes.

mod composed_support;
mod mpi_support;
mod tcp_support;

use composed_support::block;
use parbench::comm::mesh::{with_mesh, MeshShape, Order};
use parbench::comm::{local, tcp, Algo, CommError, Communicator, DType};
use parbench::compute::cpu::CpuCompute;
use parbench::measure::clock_sync::TimeBase;
use parbench::model::plan::Shard;
use parbench::pipeline::{
    check_composed, overlap_comm, run_stages, with_overlap, CommSpan, DpReduce, GradCheck,
    MlpShape, PipelineConfig, SpanGroup, StageStepTimes, TpStageConfig, TpStages, Work,
};
use parbench::schedule::{generate, Schedule, ScheduleKind};
use std::time::Duration;
use tcp_support::{job, worker};

const TIMEOUT: Duration = Duration::from_secs(60);

/// What one rank of a composed run gives back.
struct RankOut {
    check: Option<GradCheck>,
    /// The timed steps' times and communication spans.
    times: Vec<StageStepTimes>,
    spans: Vec<Vec<CommSpan>>,
    /// Pipeline rank 0 of a replica: the executor's record was made.
    recorded: bool,
}

/// One composed run on this rank of `world`; `early`: hand each bucket to
/// the overlapped reduction that many layers before its gradients are
/// final (a deliberate bug, 0 in every correct run).
fn run_rank<C: Communicator<Buffer = parbench::comm::HostBuffer>>(
    world: &mut C,
    shape: MeshShape,
    schedule: &Schedule,
    cfg: &TpStageConfig,
    (work, early): (Work, usize),
    base: TimeBase,
) -> Result<RankOut, CommError> {
    let rank = world.rank();
    let mut dup =
        overlap_comm(world, &shape, cfg.reduce.thread_flag()).map_err(|e| e.into_comm(rank))?;
    with_mesh(world, &shape, Algo::Auto, |mesh| {
        let c = CpuCompute::new(DType::F32, 1).map_err(|e| CommError::Device(e.to_string()))?;
        let pcfg = PipelineConfig {
            schedule: schedule.clone(),
            stage_layers: vec![cfg.layers_per_stage; schedule.num_stages],
            shape: MlpShape {
                hidden: cfg.block.shape.hidden,
                rows: cfg.block.tokens(),
            },
            work,
            straggler: None,
            seed: cfg.seed,
            warmup: 1,
            steps: 2,
        };
        let pp_rank = mesh.pp.rank();
        let out = with_overlap(dup.take(), &shape, Algo::Auto, 0, |reducer| {
            let mut stages =
                TpStages::new(&c, cfg, schedule, pp_rank, work, &mut mesh.tp, &mut mesh.dp)?;
            if let Some(r) = reducer {
                stages.overlap_on(r);
            }
            stages.launch_buckets_early_for_test(early);
            let rec = run_stages(&mut mesh.pp, &c, &pcfg, base, &mut stages)?;
            let check = if work == Work::Compute {
                check_composed(&c, &mut stages, &mut mesh.pp, schedule, cfg)?
            } else {
                None
            };
            let times = stages.times[pcfg.warmup..].to_vec();
            let spans = stages.spans[pcfg.warmup..].to_vec();
            Ok(RankOut {
                check,
                times,
                spans,
                recorded: rec.is_some(),
            })
        });
        out.map_err(|e: parbench::pipeline::PipelineError| e.into_comm(rank))
    })
}

/// Every schedule at P ranks and M microbatches; DualPipeV, which needs
/// `M >= 2P`, at `2P` when M is fewer.
fn schedules(p: usize, m: usize) -> Vec<Schedule> {
    let mut out = Vec::new();
    for kind in ScheduleKind::ALL {
        let v = if kind.chunked() { 2 } else { 1 };
        let m = if kind == ScheduleKind::DualPipeV {
            m.max(2 * p)
        } else {
            m
        };
        match generate(kind, p, m, v) {
            Ok(s) => out.push(s),
            // Interleaving needs M a multiple of the ranks; it does not apply otherwise.
            Err(e) if kind == ScheduleKind::Interleaved => eprintln!("{kind} at P {p}: {e}"),
            Err(e) => panic!("{kind} P {p} M {m}: {e}"),
        }
    }
    out
}

fn config(dp: usize, seq_parallel: bool, reduce: DpReduce) -> TpStageConfig {
    TpStageConfig {
        block: block(seq_parallel),
        layers_per_stage: 2,
        seed: 9,
        dp,
        reduce,
    }
}

/// Runs on local threads; every rank's result.
fn run_local(shape: MeshShape, s: &Schedule, cfg: &TpStageConfig, work: Work) -> Vec<RankOut> {
    run_local_early(shape, s, cfg, work, 0)
}

/// [`run_local`], each bucket handed over `early` layers early.
fn run_local_early(
    shape: MeshShape,
    s: &Schedule,
    cfg: &TpStageConfig,
    work: Work,
    early: usize,
) -> Vec<RankOut> {
    local::run(shape.world(), Algo::Auto, TIMEOUT, |c| {
        run_rank(c, shape, s, cfg, (work, early), TimeBase::Shared)
    })
    .into_iter()
    .enumerate()
    .map(|(r, o)| o.unwrap_or_else(|e| panic!("{shape} {} rank {r}: {e}", s.name)))
    .collect()
}

/// One rank of a multi-process world runs the composed step; where it
/// holds a replica's check (pipeline rank 0 of the replica), the check
/// compared values and holds 1e-5.
fn assert_rank_matches<C: Communicator<Buffer = parbench::comm::HostBuffer>>(
    comm: &mut C,
    shape: MeshShape,
    s: &Schedule,
    cfg: &TpStageConfig,
) {
    let out = run_rank(comm, shape, s, cfg, (Work::Compute, 0), TimeBase::Estimated).unwrap();
    if let Some(c) = out.check {
        assert!(c.max_rel_err <= 1e-5, "{c:?}");
        assert!(c.values > 0);
    }
}

/// The checks of every replica (one per data rank) hold `tol`.
fn assert_matches(out: &[RankOut], shape: MeshShape, what: &str, tol: f64) -> Vec<GradCheck> {
    let checks: Vec<GradCheck> = out.iter().filter_map(|o| o.check).collect();
    assert_eq!(checks.len(), shape.dp, "{what}: one check per replica");
    for c in &checks {
        assert!(c.values > 0, "{what}");
        assert!(c.max_rel_err <= tol, "{what}: {c:?}");
    }
    assert_eq!(
        out.iter().filter(|o| o.recorded).count(),
        shape.dp * shape.tp,
        "{what}: one record per pipeline"
    );
    checks
}

#[test]
fn every_layout_and_schedule_matches_one_rank_on_the_whole_batch() {
    for (d, t, p) in [
        (1, 1, 1),
        (2, 1, 1),
        (1, 2, 1),
        (1, 1, 2),
        (2, 2, 1),
        (2, 1, 2),
        (1, 2, 2),
        (2, 2, 2),
    ] {
        let shape = MeshShape::new(d, t, p, Order::MEGATRON).unwrap();
        // With data parallelism, also overlapped (the reduction's thread).
        let overlaps: &[bool] = if d > 1 { &[false, true] } else { &[false] };
        let mut without_overlap = None;
        for (s, &overlap) in schedules(p, 2)
            .iter()
            .flat_map(|s| overlaps.iter().map(move |o| (s, o)))
        {
            let reduce = DpReduce {
                overlap,
                ..DpReduce::default()
            };
            let cfg = config(d, false, reduce);
            let out = run_local(shape, s, &cfg, Work::Compute);
            let what = format!("{shape} {} overlap {overlap}", s.name);
            let checks = assert_matches(&out, shape, &what, 1e-5);
            for c in &checks {
                eprintln!(
                    "{what}: max rel err {:.2e}, {} of {} values differ",
                    c.max_rel_err, c.differing, c.values
                );
            }
            // The same buckets reduced the same way on another thread: the
            // same gradients to the last bit as without overlap.
            if overlap {
                assert_eq!(Some(&checks), without_overlap.as_ref(), "{what}");
            }
            without_overlap = Some(checks);
            for o in &out {
                for st in &o.times {
                    assert!(st.compute_us > 0.0, "{what}");
                    assert_eq!(st.tp_comm_us > 0.0, t > 1, "{what}: {st:?}");
                    assert_eq!(st.dp_comm_us > 0.0, d > 1, "{what}: {st:?}");
                    // One bucket of 25 MiB holds a stage's tensors.
                    let stages = s.num_stages / p;
                    assert_eq!(st.buckets, if d > 1 { stages } else { 0 }, "{what}");
                }
            }
        }
    }
}

/// Data parallel alone, one microbatch per rank: the reduction is a + b,
/// the reference adds the same two microbatches in the same order, and
/// the 1/2 of the mean is exact, so every value matches to the last bit.
#[test]
fn data_parallel_alone_matches_to_the_last_bit() {
    let shape = MeshShape::new(2, 1, 1, Order::MEGATRON).unwrap();
    // DualPipeV needs two microbatches even on one rank: not one per replica.
    for s in schedules(1, 1).into_iter().filter(|s| s.microbatches == 1) {
        for reduce in [
            DpReduce::default(),
            DpReduce {
                bucket_bytes: 1024,
                overlap: true,
                shard: Some(Shard::Zero1),
                shard_group: 0,
                prefetch: false,
            },
        ] {
            let out = run_local(shape, &s, &config(2, false, reduce), Work::Compute);
            for c in assert_matches(&out, shape, &s.name, 0.0) {
                assert_eq!(c.differing, 0, "{}: {c:?}", s.name);
            }
        }
    }
}

/// Small buckets, the distributed optimizer's reduce-scatter, overlap and
/// sequence parallelism change how the gradients travel, not what they are.
#[test]
fn buckets_overlap_and_the_distributed_optimizer_keep_the_gradients() {
    let shape = MeshShape::new(2, 2, 2, Order::MEGATRON).unwrap();
    for kind in [ScheduleKind::OneFOneB, ScheduleKind::ZbH1] {
        let s = generate(kind, 2, 4, 1).unwrap();
        for (overlap, dist_opt, sp) in [
            (true, false, false),
            (false, true, true),
            (true, true, false),
        ] {
            let reduce = DpReduce {
                bucket_bytes: 2048,
                overlap,
                shard: dist_opt.then_some(Shard::Zero1),
                shard_group: 0,
                prefetch: false,
            };
            let out = run_local(shape, &s, &config(2, sp, reduce), Work::Compute);
            let what = format!("{kind} overlap {overlap} dist-opt {dist_opt} sp {sp}");
            assert_matches(&out, shape, &what, 1e-5);
            for o in &out {
                for (st, spans) in o.times.iter().zip(&o.spans) {
                    assert!(st.buckets > 1, "{what}: {st:?}");
                    assert!(st.dp_exposed_us <= st.dp_comm_us + 1e-9, "{what}");
                    if !overlap {
                        assert_eq!(st.dp_exposed_us, st.dp_comm_us, "{what}");
                    }
                    // Overlapped buckets ran on the reduction thread, the
                    // others on the rank's own: one span each.
                    let on = |g: SpanGroup| spans.iter().filter(|s| s.group == g).count();
                    let (mine, thread) = (on(SpanGroup::Dp), on(SpanGroup::DpThread));
                    assert_eq!(
                        (mine, thread),
                        if overlap {
                            (0, st.buckets)
                        } else {
                            (st.buckets, 0)
                        },
                        "{what}"
                    );
                }
            }
        }
    }
}

/// A bucket handed to the overlapped reduction one layer before its
/// gradients are final (a deliberate bug, through the test-only path)
/// reduces gradients that miss the last microbatch's contribution: the
/// check must catch it, while the same runs started on time pass. So the
/// check above holds the overlap to starting each bucket only once every
/// gradient in it is final.
#[test]
fn a_bucket_reduced_before_its_gradients_are_final_fails_the_check() {
    let shape = MeshShape::new(2, 1, 2, Order::MEGATRON).unwrap();
    for kind in [ScheduleKind::OneFOneB, ScheduleKind::ZbH1] {
        let s = generate(kind, 2, 2, 1).unwrap();
        let reduce = DpReduce {
            bucket_bytes: 1024,
            overlap: true,
            shard: None,
            shard_group: 0,
            prefetch: false,
        };
        let cfg = config(2, false, reduce);
        let on_time = run_local_early(shape, &s, &cfg, Work::Compute, 0);
        assert_matches(&on_time, shape, &format!("{kind} on time"), 1e-5);
        let early = run_local_early(shape, &s, &cfg, Work::Compute, 1);
        let checks: Vec<GradCheck> = early.iter().filter_map(|o| o.check).collect();
        assert_eq!(checks.len(), shape.dp, "{kind}");
        for c in checks {
            assert!(c.max_rel_err > 1e-3, "{kind}: started early, yet {c:?}");
        }
    }
}

/// Under `--work sleep` the blocks' compute is a sleep and their
/// tensor-parallel collectives and the data-parallel reduction still run.
#[test]
fn sleep_work_keeps_tensor_and_data_parallel_traffic() {
    let shape = MeshShape::new(2, 2, 2, Order::MEGATRON).unwrap();
    let s = generate(ScheduleKind::OneFOneB, 2, 2, 1).unwrap();
    let out = run_local(
        shape,
        &s,
        &config(2, false, DpReduce::default()),
        Work::Sleep(Duration::from_micros(200)),
    );
    for o in &out {
        assert!(o.check.is_none());
        for st in &o.times {
            eprintln!("sleep 2x2x2 1f1b: {st:?}");
            assert!(st.tp_comm_us > 0.0 && st.dp_comm_us > 0.0, "{st:?}");
            // 2 F and 2 B of 200 and 400 us each.
            assert!(st.compute_us >= 1200.0, "{st:?}");
        }
    }
}

/// Another rank order (pipeline inside, data outside) and a schedule read
/// from PyTorch's compute-only CSV, with split I and W passes, run the
/// same step.
#[test]
fn another_order_and_a_csv_schedule_run_the_same_step() {
    let csv = "0F0,0F1,0I0,0I1,0W0,0W1\n1F0,1I0,1F1,1I1,1W1,1W0\n";
    let s = parbench::schedule::parse_csv(csv, "test", "split").unwrap();
    parbench::schedule::validate(&s).unwrap();
    for order in ["tp-pp-dp", "pp-dp-tp"] {
        let shape = MeshShape::new(2, 2, 2, order.parse().unwrap()).unwrap();
        let out = run_local(
            shape,
            &s,
            &config(2, false, DpReduce::default()),
            Work::Compute,
        );
        assert_matches(&out, shape, &format!("{order} csv"), 1e-5);
    }
}

#[test]
fn a_data_group_of_another_size_is_refused() {
    let shape = MeshShape::new(2, 1, 1, Order::MEGATRON).unwrap();
    let s = generate(ScheduleKind::GPipe, 1, 1, 1).unwrap();
    let out = local::run(2, Algo::Auto, TIMEOUT, |c| {
        run_rank(
            c,
            shape,
            &s,
            &config(3, false, DpReduce::default()),
            (Work::Compute, 0),
            TimeBase::Shared,
        )
    });
    for o in out {
        let e = o.err().expect("refused").to_string();
        assert!(e.contains("3 data ranks configured"), "{e}");
    }
}

#[test]
fn tcp_dp2_tp2_pp2_matches_one_rank() {
    let name = "tcp_dp2_tp2_pp2_matches_one_rank";
    let shape = MeshShape::new(2, 2, 2, Order::MEGATRON).unwrap();
    let s = generate(ScheduleKind::OneFOneB, 2, 2, 1).unwrap();
    let cfg = config(
        2,
        false,
        DpReduce {
            bucket_bytes: 4096,
            overlap: true,
            shard: None,
            shard_group: 0,
            prefetch: false,
        },
    );
    if let Some(info) = worker(name) {
        let mut comm = tcp::comm(&info, Algo::Auto, TIMEOUT).unwrap();
        assert_rank_matches(&mut comm, shape, &s, &cfg);
        return;
    }
    let status = job(name, shape.world()).run();
    assert!(
        status.is_ok_and(|s| s.success()),
        "a tcp rank failed the composed check"
    );
}

/// dp 2 x tp 2 x pp 2 as 8 MPI ranks (`mpirun`; skips without it), and
/// `--overlap` refused there.
#[cfg(feature = "mpi")]
#[test]
fn mpi_dp2_tp2_pp2_matches_one_rank() {
    let name = "mpi_dp2_tp2_pp2_matches_one_rank";
    let shape = MeshShape::new(2, 2, 2, Order::MEGATRON).unwrap();
    let s = generate(ScheduleKind::ZbH1, 2, 2, 1).unwrap();
    // MPI runs funneled (one thread calls it), so the overlapped
    // reduction's thread is refused in one line; the rest runs.
    let reduce = DpReduce {
        bucket_bytes: 4096,
        overlap: false,
        shard: Some(Shard::Zero1),
        shard_group: 0,
        prefetch: false,
    };
    if mpi_support::is_rank(name) {
        let mut comm = parbench::comm::mpi::MpiComm::init(TIMEOUT).expect("MPI init");
        let refused = overlap_comm(&mut comm, &shape, Some("--overlap"))
            .err()
            .map(|e| e.to_string());
        assert!(
            refused
                .as_deref()
                .is_some_and(|e| e.contains("mpi backend cannot")),
            "{refused:?}"
        );
        let cfg = config(2, false, reduce);
        assert_rank_matches(&mut comm, shape, &s, &cfg);
        return;
    }
    if let Some(passed) = mpi_support::run(name, shape.world(), 120) {
        assert!(
            passed,
            "an mpi rank failed the composed check (or passed the deadline)"
        );
    }
}
