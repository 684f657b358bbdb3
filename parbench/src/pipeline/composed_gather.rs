//! How each rank's figures, its replica's check and its pipeline's steps
//! cross the world to world rank 0 after a composed run: each as one list
//! of `f64`s (the executor's wire form, [`super::exec::send_f64s`]), read
//! back with every count held to what is left, so a malformed list is a
//! protocol error naming its sender.

use super::composed::GradCheck;
use super::composed_record::{PipelineSteps, RankFigures};
use super::exec::{decode_steps, encode_steps};
use super::tp_stage::{CommSpan, HeldBytes, SpanGroup, StageStepTimes};
use super::{PipelineError, RankStep, RunRecord};
use crate::comm::mesh::MeshShape;

const TIMES_FIELDS: usize = 5 + 6 + 4 + 4 + 1;
const SPAN_FIELDS: usize = 4;

pub(super) fn encode_figures(f: &RankFigures) -> Vec<f64> {
    let mut v = vec![f.times.len() as f64];
    for t in &f.times {
        v.extend([
            t.compute_us,
            t.tp_comm_us,
            t.dp_comm_us,
            t.dp_exposed_us,
            t.buckets as f64,
            t.shard_gather_us,
            t.shard_scatter_us,
            t.shard_exposed_us,
            t.shard_calls as f64,
            t.shard_handover_us,
            t.optimizer_us,
        ]);
        v.extend(held_fields(&t.held_end));
        v.extend(held_fields(&t.held_peak));
        v.push(t.held_peak_total);
    }
    for step in &f.spans {
        v.push(step.len() as f64);
        for s in step {
            v.extend([span_code(s.group), s.action as f64, s.offset_us, s.dur_us]);
        }
    }
    v
}

/// A span's group as a number on the wire, and back.
fn span_code(g: SpanGroup) -> f64 {
    match g {
        SpanGroup::Tp => 0.0,
        SpanGroup::Dp => 1.0,
        SpanGroup::DpThread => 2.0,
        SpanGroup::ShardGather => 3.0,
        SpanGroup::ShardScatter => 4.0,
    }
}

fn held_fields(h: &HeldBytes) -> [f64; 4] {
    [h.params, h.grads, h.optimizer, h.buffers]
}

fn held_of(v: &[f64]) -> HeldBytes {
    HeldBytes {
        params: v[0],
        grads: v[1],
        optimizer: v[2],
        buffers: v[3],
    }
}

fn span_group(code: f64) -> SpanGroup {
    match code {
        c if c > 3.5 => SpanGroup::ShardScatter,
        c if c > 2.5 => SpanGroup::ShardGather,
        c if c > 1.5 => SpanGroup::DpThread,
        c if c > 0.5 => SpanGroup::Dp,
        _ => SpanGroup::Tp,
    }
}

fn malformed(from: usize, what: &str) -> PipelineError {
    PipelineError::Protocol(format!("rank {from} sent a malformed {what}"))
}

/// A count read from a record: a whole number no larger than what is left.
fn count(from: usize, v: Option<&f64>, left: usize, what: &str) -> Result<usize, PipelineError> {
    match v {
        Some(&x) if x >= 0.0 && x.fract() == 0.0 && x <= left as f64 => Ok(x as usize),
        _ => Err(malformed(from, what)),
    }
}

pub(super) fn decode_figures(
    from: usize,
    mesh: &MeshShape,
    v: &[f64],
) -> Result<RankFigures, PipelineError> {
    let n = count(from, v.first(), v.len(), "figures")?;
    let mut at = 1;
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = v
            .get(at..at + TIMES_FIELDS)
            .ok_or_else(|| malformed(from, "figures"))?;
        times.push(StageStepTimes {
            compute_us: t[0],
            tp_comm_us: t[1],
            dp_comm_us: t[2],
            dp_exposed_us: t[3],
            buckets: t[4].max(0.0) as usize,
            shard_gather_us: t[5],
            shard_scatter_us: t[6],
            shard_exposed_us: t[7],
            shard_calls: t[8].max(0.0) as usize,
            shard_handover_us: t[9],
            optimizer_us: t[10],
            held_end: held_of(&t[11..15]),
            held_peak: held_of(&t[15..19]),
            held_peak_total: t[19],
        });
        at += TIMES_FIELDS;
    }
    let mut spans = Vec::with_capacity(n);
    for _ in 0..n {
        let k = count(from, v.get(at), v.len(), "spans")?;
        at += 1;
        let raw = v
            .get(at..at + k * SPAN_FIELDS)
            .ok_or_else(|| malformed(from, "spans"))?;
        spans.push(
            raw.chunks_exact(SPAN_FIELDS)
                .map(|s| CommSpan {
                    group: span_group(s[0]),
                    action: s[1].max(0.0) as usize,
                    offset_us: s[2],
                    dur_us: s[3],
                })
                .collect(),
        );
        at += k * SPAN_FIELDS;
    }
    Ok(RankFigures {
        rank: from,
        coords: mesh.coords(from),
        times,
        spans,
    })
}

pub(super) fn encode_check(c: Option<GradCheck>) -> Vec<f64> {
    match c {
        None => vec![0.0],
        Some(g) => vec![
            1.0,
            g.max_rel_err,
            g.differing as f64,
            g.values as f64,
            g.weights_differing as f64,
            g.weights_compared as f64,
        ],
    }
}

pub(super) fn decode_check(from: usize, v: &[f64]) -> Result<Option<GradCheck>, PipelineError> {
    match v {
        [flag] if *flag == 0.0 => Ok(None),
        [_, err, differing, values, w_differing, w_compared] => Ok(Some(GradCheck {
            max_rel_err: *err,
            differing: differing.max(0.0) as usize,
            values: values.max(0.0) as usize,
            weights_differing: w_differing.max(0.0) as usize,
            weights_compared: w_compared.max(0.0) as usize,
        })),
        _ => Err(malformed(from, "check")),
    }
}

/// A pipeline's first rank sends its steps: `[1, ranks, uncertainty per
/// rank, steps, each step's origin, then per rank the length and the
/// executor's encoding of its timed steps]`; any other rank `[0]`.
pub(super) fn encode_pipeline(rec: Option<&RunRecord>) -> Vec<f64> {
    let Some(rec) = rec else {
        return vec![0.0];
    };
    let ranks = rec.steps.first().map_or(0, Vec::len);
    let mut v = vec![1.0, ranks as f64];
    v.extend((0..ranks).map(|r| rec.uncertainty_us(r)));
    v.push(rec.origins_us.len() as f64);
    v.extend(&rec.origins_us);
    for r in 0..ranks {
        let mine: Vec<RankStep> = rec.steps.iter().filter_map(|s| s.get(r).cloned()).collect();
        let enc = encode_steps(&mine);
        v.push(enc.len() as f64);
        v.extend(enc);
    }
    v
}

pub(super) fn decode_pipeline(
    from: usize,
    v: &[f64],
) -> Result<Option<PipelineSteps>, PipelineError> {
    if v.first() == Some(&0.0) && v.len() == 1 {
        return Ok(None);
    }
    let bad = || malformed(from, "pipeline record");
    let ranks = count(from, v.get(1), v.len(), "pipeline record")?;
    let unc = v.get(2..2 + ranks).ok_or_else(bad)?.to_vec();
    let mut at = 2 + ranks;
    let n = count(from, v.get(at), v.len(), "pipeline record")?;
    let origins = v.get(at + 1..at + 1 + n).ok_or_else(bad)?.to_vec();
    at += 1 + n;
    // Per rank its steps; then turned round into steps of ranks.
    let mut per_rank = Vec::with_capacity(ranks);
    for _ in 0..ranks {
        let n = count(from, v.get(at), v.len(), "pipeline record")?;
        at += 1;
        per_rank.push(decode_steps(v.get(at..at + n).ok_or_else(bad)?, from)?);
        at += n;
    }
    let steps = per_rank.first().map_or(0, Vec::len);
    if per_rank.iter().any(|r| r.len() != steps) {
        return Err(bad());
    }
    let steps = (0..steps)
        .map(|i| per_rank.iter().map(|r| r[i].clone()).collect())
        .collect();
    Ok(Some(PipelineSteps {
        head: from,
        steps,
        uncertainty_us: unc,
        origins_us: origins,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::mesh::Order;
    use crate::pipeline::ActionTiming;

    #[test]
    fn figures_and_checks_cross_the_wire_unchanged() {
        let mesh = MeshShape::new(2, 2, 2, Order::MEGATRON).unwrap();
        let f = RankFigures {
            rank: 5,
            coords: mesh.coords(5),
            times: vec![StageStepTimes {
                compute_us: 1.5,
                tp_comm_us: 2.0,
                dp_comm_us: 3.0,
                dp_exposed_us: 1.0,
                buckets: 2,
                shard_gather_us: 4.0,
                shard_scatter_us: 5.0,
                shard_exposed_us: 6.0,
                shard_calls: 7,
                shard_handover_us: 7.5,
                optimizer_us: 8.0,
                held_end: HeldBytes {
                    params: 1.0,
                    grads: 2.0,
                    optimizer: 3.0,
                    buffers: 4.0,
                },
                held_peak: HeldBytes::default(),
                held_peak_total: 11.0,
            }],
            spans: vec![vec![CommSpan {
                group: SpanGroup::Dp,
                action: 3,
                offset_us: 10.0,
                dur_us: 4.0,
            }]],
        };
        assert_eq!(decode_figures(5, &mesh, &encode_figures(&f)).unwrap(), f);
        let g = GradCheck {
            max_rel_err: 1e-7,
            differing: 3,
            values: 10,
            weights_differing: 1,
            weights_compared: 4,
        };
        assert_eq!(decode_check(1, &encode_check(Some(g))).unwrap(), Some(g));
        assert_eq!(decode_check(1, &encode_check(None)).unwrap(), None);
        assert!(decode_figures(5, &mesh, &[3.0, 1.0]).is_err());
        let step = |t: f64| RankStep {
            actions: vec![ActionTiming {
                action: crate::schedule::Action::new(0, crate::schedule::ActionKind::F, 1),
                asked_us: t,
                arrived_us: None,
                input_sent_us: Some(t + 1.0),
                start_us: t + 2.0,
                work_end_us: t + 3.0,
                sent_us: None,
                end_us: t + 4.0,
            }],
            peak_activations: 1,
            peak_activation_bytes: 64,
            device_uncertainty_us: 0.0,
        };
        let rec = RunRecord {
            steps: vec![vec![step(0.0), step(10.0)], vec![step(20.0), step(30.0)]],
            grad_max_err: None,
            message_us: 1.0,
            clocks: Vec::new(),
            origins_us: vec![100.0, 200.0],
        };
        let p = decode_pipeline(4, &encode_pipeline(Some(&rec)))
            .unwrap()
            .unwrap();
        assert_eq!((p.head, &p.steps), (4, &rec.steps));
        assert_eq!(p.origins_us, rec.origins_us);
        assert_eq!(decode_pipeline(4, &encode_pipeline(None)).unwrap(), None);
        assert!(decode_pipeline(1, &[1.0, 9.0]).is_err());
    }
}
