//! The composed step's pipelines on one time base with each other.
//!
//! Each (data, tensor) pipeline's executor puts its own ranks on its first
//! rank's (its head's) clock, each step from that pipeline's first work
//! start ([`super::align`]). The tensor and data groups cross pipelines,
//! so a trace or an analysis that compares two pipelines needs them on one
//! base too: world rank 0 estimates every world rank's clock offset to its
//! own (the same ping-pongs, [`crate::measure::clock_sync`]), moves each
//! pipeline's step origin from its head's clock onto world rank 0's, and
//! counts every step from the world's first work start. A tensor-parallel
//! all-reduce then ends on every rank of its group after it began on every
//! other, and so does each data-parallel bucket, within the clocks' bounds.

use super::composed_record::PipelineSteps;
use super::PipelineError;
use crate::measure::clock_sync::RankClock;

/// Moves every pipeline's steps onto world rank 0's clock (`world[r]`: world
/// rank r's clock against world rank 0's), each step from the first work
/// start of any pipeline, and adds each head's bound to its ranks'
/// uncertainty.
pub(super) fn onto_world_base(
    pipelines: &mut [PipelineSteps],
    world: &[RankClock],
) -> Result<(), PipelineError> {
    let clock_of = |p: &PipelineSteps| {
        world.get(p.head).ok_or_else(|| {
            PipelineError::Protocol(format!("no clock estimate for world rank {}", p.head))
        })
    };
    let steps = pipelines.first().map_or(0, |p| p.steps.len());
    // Per pipeline, per step: its origin on world rank 0's clock.
    let mut origins: Vec<Vec<f64>> = Vec::with_capacity(pipelines.len());
    for p in pipelines.iter() {
        if p.steps.len() != steps || p.origins_us.len() != steps {
            return Err(PipelineError::Protocol(format!(
                "the pipeline of world rank {} has {} steps and {} origins, world rank 0's {steps}",
                p.head,
                p.steps.len(),
                p.origins_us.len()
            )));
        }
        let clock = clock_of(p)?;
        origins.push(p.origins_us.iter().map(|&t| clock.to_base(t)).collect());
    }
    for i in 0..steps {
        let first = origins.iter().map(|o| o[i]).fold(f64::INFINITY, f64::min);
        for (p, o) in pipelines.iter_mut().zip(&origins) {
            let shift = o[i] - first;
            for rs in &mut p.steps[i] {
                for a in &mut rs.actions {
                    a.map_times(|t| t + shift);
                }
            }
        }
    }
    for p in pipelines.iter_mut() {
        let head = clock_of(p)?.uncertainty_us();
        for u in &mut p.uncertainty_us {
            *u += head;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::Communicator;
    use crate::measure::clock_sync::TimeBase;
    use crate::pipeline::composed_record::dp_wait_us;
    use crate::pipeline::SpanGroup;
    use crate::pipeline::{ActionTiming, RankStep};
    use crate::schedule::{Action, ActionKind};

    fn one_action(start: f64) -> RankStep {
        RankStep {
            actions: vec![ActionTiming {
                action: Action::new(0, ActionKind::F, 0),
                asked_us: start,
                arrived_us: None,
                input_sent_us: None,
                start_us: start,
                work_end_us: start + 10.0,
                sent_us: None,
                end_us: start + 10.0,
            }],
            ..Default::default()
        }
    }

    fn clock(rank: usize, offset_us: f64) -> RankClock {
        RankClock::steady(rank, offset_us, 2.0)
    }

    /// Two pipelines, each from its own first work (0): the second's head
    /// runs 5000 us ahead and stamped its origin at 6100 (1100 on world
    /// rank 0's clock), the first at 1000. On one base the second starts
    /// 100 us after the first.
    #[test]
    fn each_pipeline_moves_by_its_heads_offset_and_origin() {
        let pipe = |head, origin| PipelineSteps {
            head,
            steps: vec![vec![one_action(0.0)]],
            uncertainty_us: vec![1.0],
            origins_us: vec![origin],
        };
        let mut p = vec![pipe(0, 1000.0), pipe(1, 6100.0)];
        let world = [clock(0, 0.0), clock(1, 5000.0)];
        onto_world_base(&mut p, &world).unwrap();
        let start = |i: usize| p[i].steps[0][0].actions[0].start_us;
        assert_eq!((start(0), start(1)), (0.0, 100.0));
        assert_eq!(p[1].uncertainty_us, [3.0]);
        // A pipeline without its origins is a protocol error, not a guess.
        p[1].origins_us.clear();
        assert!(onto_world_base(&mut p, &world).is_err());
    }

    /// Two replicas of one stage: rank 0 begins its bucket at 100 us (50
    /// us long), rank 1 at 130 (20 us): rank 0 waited 30 us of its 50 for
    /// rank 1, which waited none; and the breakdown keeps the rest apart.
    #[test]
    fn a_bucket_begun_first_waits_for_the_last_replica() {
        use crate::comm::mesh::{MeshShape, Order};
        use crate::pipeline::{CommSpan, ComposedRecord, RankFigures, RunRecord, StageStepTimes};
        let mesh = MeshShape::new(2, 1, 1, Order::MEGATRON).unwrap();
        let figures = |rank: usize, offset_us: f64, dur_us: f64| RankFigures {
            rank,
            coords: mesh.coords(rank),
            times: vec![StageStepTimes {
                dp_comm_us: dur_us,
                dp_exposed_us: dur_us,
                buckets: 1,
                ..Default::default()
            }],
            spans: vec![vec![CommSpan {
                group: SpanGroup::Dp,
                action: 0,
                offset_us,
                dur_us,
            }]],
        };
        let pipe = |head| PipelineSteps {
            head,
            steps: vec![vec![one_action(0.0)]],
            uncertainty_us: vec![0.0],
            origins_us: vec![0.0],
        };
        let rec = ComposedRecord {
            mesh,
            record: RunRecord {
                steps: vec![vec![one_action(0.0)]],
                grad_max_err: None,
                message_us: 0.0,
                clocks: Vec::new(),
                origins_us: vec![0.0],
            },
            pipelines: vec![pipe(0), pipe(1)],
            ranks: vec![figures(0, 100.0, 50.0), figures(1, 130.0, 20.0)],
            checks: Vec::new(),
            tp_wire: None,
            dp_wire: None,
            shard_wires: Default::default(),
            world_clocks: Vec::new(),
        };
        assert_eq!(dp_wait_us(&rec), [vec![30.0], vec![0.0]]);
        let b = rec.breakdown();
        assert_eq!((b[0].dp_wait_us, b[0].dp_after_wait_us), (30.0, 20.0));
        assert_eq!((b[1].dp_wait_us, b[1].dp_after_wait_us), (0.0, 20.0));
    }

    /// World rank r's clock runs r x this ahead (threads standing for hosts).
    const SKEW_US: f64 = 20_000.0;

    /// `(start, end, uncertainty)` of every slice named `name` on each
    /// world rank's track of a composed trace, in time order.
    fn slices(trace: &serde_json::Value, name: &str, unc: &[f64]) -> Vec<Vec<(f64, f64, f64)>> {
        let mut out = vec![Vec::new(); unc.len()];
        for e in trace["traceEvents"].as_array().unwrap() {
            if e["name"] == name && e["ph"] == "X" {
                let tid = e["tid"].as_u64().unwrap() as usize;
                let ts = e["ts"].as_f64().unwrap();
                out[tid].push((ts, ts + e["dur"].as_f64().unwrap(), unc[tid]));
            }
        }
        for v in &mut out {
            v.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        out
    }

    /// The k-th collective of a group ends on each of its ranks after it
    /// began on every other (it needs their data), within the two ranks'
    /// bounds: the group's slices overlap on one base.
    fn assert_groups_line_up(per_rank: &[Vec<(f64, f64, f64)>], groups: &[Vec<usize>], what: &str) {
        for g in groups {
            let n = per_rank[g[0]].len();
            assert!(n > 0, "no {what} slices on rank {}", g[0]);
            for &a in g {
                assert_eq!(per_rank[a].len(), n, "{what}: ranks {g:?}");
                for &b in g {
                    for (k, (&(_, end_a, ua), &(start_b, _, ub))) in
                        per_rank[a].iter().zip(&per_rank[b]).enumerate()
                    {
                        assert!(
                            end_a + ua + ub >= start_b,
                            "{what} {k}: ends on rank {a} at {end_a:.1} us, before it began on rank {b} at {start_b:.1} us (bounds {ua:.1} + {ub:.1} us)"
                        );
                    }
                }
            }
        }
    }

    /// dp 2 x tp 2 x pp 2 on threads whose clocks are skewed by 20 ms per
    /// rank, each time base estimated as for processes: the offsets are
    /// found, and on the trace's one base every tensor group's all-reduces
    /// and every data group's buckets line up across the pipelines. Without
    /// the heads' offsets applied the pipelines sit 20 to 60 ms apart and
    /// this fails.
    #[test]
    fn skewed_clocks_put_every_groups_collectives_in_line_on_the_trace() {
        use crate::comm::mesh::{MeshShape, Order};
        use crate::comm::{local, Algo, DType};
        use crate::compute::cpu::CpuCompute;
        use crate::layers::{BlockConfig, BlockShape, Mode};
        use crate::measure::clock_sync::skew_this_threads_clock;
        use crate::pipeline::{
            composed_trace, run_composed, ComposedConfig, DpReduce, MlpShape, PipelineConfig,
            TpStageConfig, Work,
        };
        use crate::schedule::{generate, ScheduleKind};
        let mesh = MeshShape::new(2, 2, 2, Order::MEGATRON).unwrap();
        let block = BlockConfig {
            shape: BlockShape {
                hidden: 8,
                heads: 2,
                ffn: 16,
                seq: 4,
                batch: 1,
            },
            mode: Mode::Train,
            decode: false,
            seq_parallel: false,
        };
        let schedule = generate(ScheduleKind::OneFOneB, 2, 2, 1).unwrap();
        let cfg = ComposedConfig {
            mesh,
            stages: TpStageConfig {
                block,
                layers_per_stage: 1,
                seed: 3,
                dp: 2,
                // Small buckets: more than one per rank to line up.
                reduce: DpReduce {
                    bucket_bytes: 1024,
                    ..DpReduce::default()
                },
            },
            pipeline: PipelineConfig {
                schedule: schedule.clone(),
                stage_layers: vec![1; 2],
                shape: MlpShape {
                    hidden: 8,
                    rows: block.tokens(),
                },
                work: Work::Compute,
                straggler: None,
                seed: 3,
                warmup: 0,
                steps: 1,
            },
            check: false,
            algo: Algo::Auto,
            corrupt_grad_rank: None,
        };
        let out = local::run(8, Algo::Auto, std::time::Duration::from_secs(60), |w| {
            let rank = w.rank();
            skew_this_threads_clock(SKEW_US * rank as f64);
            let c = CpuCompute::new(DType::F32, 1)
                .map_err(|e| crate::comm::CommError::Device(e.to_string()))?;
            run_composed(w, &c, &cfg, TimeBase::Estimated).map_err(|e| e.into_comm(rank))
        });
        let rec = out.into_iter().next().unwrap().unwrap().unwrap();
        for c in &rec.world_clocks {
            let want = SKEW_US * c.rank as f64;
            assert!(
                (c.before.offset_us - want).abs() <= c.before.uncertainty_us + 1e-3,
                "rank {}: offset {:?}, skewed by {want}",
                c.rank,
                c.before
            );
        }
        // Each world rank's bound on the base, from its pipeline.
        let mut unc = vec![0.0; 8];
        for p in &rec.pipelines {
            let h = mesh.coords(p.head);
            for (r, u) in unc.iter_mut().enumerate() {
                let c = mesh.coords(r);
                if (c.dp, c.tp) == (h.dp, h.tp) {
                    *u = p.uncertainty_us[c.pp];
                }
            }
        }
        let trace = composed_trace("skewed", &schedule, &rec, 0);
        let group = |same: fn(&crate::comm::mesh::Coords) -> (usize, usize)| {
            let mut groups: Vec<Vec<usize>> = Vec::new();
            for key in (0..8).map(|r| same(&mesh.coords(r))) {
                let g: Vec<usize> = (0..8).filter(|&r| same(&mesh.coords(r)) == key).collect();
                if !groups.contains(&g) {
                    groups.push(g);
                }
            }
            groups
        };
        let tp_groups = group(|c| (c.dp, c.pp));
        let dp_groups = group(|c| (c.tp, c.pp));
        assert_groups_line_up(&slices(&trace, "tp comm", &unc), &tp_groups, "tp comm");
        assert_groups_line_up(&slices(&trace, "dp bucket", &unc), &dp_groups, "dp bucket");
        assert_eq!(
            trace["otherData"]["world_clock"].as_array().unwrap().len(),
            8
        );
    }
}
