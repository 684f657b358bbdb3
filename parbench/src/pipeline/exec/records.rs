//! The records ranks send each other: timing steps as flat f64s, gathered
//! on rank 0 through measure's gather, and values sent point to point.

use super::{ActionTiming, RankStep};
use crate::comm::{CommBuffer, Communicator, DType};
use crate::measure::gather_f64_any_len;
use crate::pipeline::PipelineError;
use crate::schedule::{Action, ActionKind};

impl ActionTiming {
    pub(crate) const FIELDS: usize = 10;

    pub(crate) fn to_f64s(self, out: &mut Vec<f64>) {
        let opt = |v: Option<f64>| v.unwrap_or(f64::NAN);
        out.extend([
            self.action.stage as f64,
            self.action.kind.index() as f64,
            self.action.mb as f64,
            self.asked_us,
            opt(self.arrived_us),
            opt(self.input_sent_us),
            self.start_us,
            self.work_end_us,
            opt(self.sent_us),
            self.end_us,
        ]);
    }

    pub(crate) fn from_f64s(v: &[f64]) -> Option<Self> {
        let kind = *ActionKind::ALL.get(*v.get(1)? as usize)?;
        let opt = |i: usize| v.get(i).copied().filter(|x| !x.is_nan());
        Some(ActionTiming {
            action: Action::new(*v.first()? as usize, kind, *v.get(2)? as usize),
            asked_us: *v.get(3)?,
            arrived_us: opt(4),
            input_sent_us: opt(5),
            start_us: *v.get(6)?,
            work_end_us: *v.get(7)?,
            sent_us: opt(8),
            end_us: *v.get(9)?,
        })
    }
}

/// The most values a rank may announce in a record it sends (timings,
/// gradients): a larger count is a malformed peer, not an allocation.
pub(super) const MAX_RECORD_VALUES: usize = 1 << 31;

pub(crate) fn send_f64s<Cm: Communicator>(
    comm: &mut Cm,
    data: &[f64],
    to: usize,
) -> Result<(), PipelineError> {
    let mut head = comm.alloc(8)?;
    head.write_from_host(&(data.len() as u64).to_le_bytes())?;
    comm.send(&head, 1, DType::I64, to)?;
    if !data.is_empty() {
        let mut buf = comm.alloc(data.len() * 8)?;
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        buf.write_from_host(&bytes)?;
        comm.send(&buf, data.len(), DType::F64, to)?;
    }
    Ok(())
}

pub(crate) fn recv_f64s<Cm: Communicator>(
    comm: &mut Cm,
    from: usize,
) -> Result<Vec<f64>, PipelineError> {
    let mut head = comm.alloc(8)?;
    comm.recv(&mut head, 1, DType::I64, from)?;
    let mut n = [0u8; 8];
    head.read_to_host(&mut n)?;
    let n = u64::from_le_bytes(n) as usize;
    if n > MAX_RECORD_VALUES {
        return Err(PipelineError::Protocol(format!(
            "rank {from} announced {n} values"
        )));
    }
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut buf = comm.alloc(n * 8)?;
    comm.recv(&mut buf, n, DType::F64, from)?;
    let mut bytes = vec![0u8; n * 8];
    buf.read_to_host(&mut bytes)?;
    Ok(bytes
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .collect())
}

pub(crate) fn encode_steps(steps: &[RankStep]) -> Vec<f64> {
    let mut v = vec![steps.len() as f64];
    for st in steps {
        v.extend([
            st.actions.len() as f64,
            st.peak_activations as f64,
            st.peak_activation_bytes as f64,
            st.device_uncertainty_us,
        ]);
        for a in &st.actions {
            a.to_f64s(&mut v);
        }
    }
    v
}

pub(crate) fn decode_steps(v: &[f64], from: usize) -> Result<Vec<RankStep>, PipelineError> {
    let bad = || PipelineError::Protocol(format!("rank {from} sent a malformed timing record"));
    let mut it = 0usize;
    let mut next = |n: usize| -> Result<&[f64], PipelineError> {
        let s = v.get(it..it + n).ok_or_else(bad)?;
        it += n;
        Ok(s)
    };
    let steps = next(1)?[0] as usize;
    let mut out = Vec::with_capacity(steps.min(1 << 16));
    for _ in 0..steps {
        let h = next(4)?;
        let (n, peak, bytes, device) = (h[0] as usize, h[1] as usize, h[2] as usize, h[3]);
        let mut actions = Vec::with_capacity(n.min(1 << 20));
        for _ in 0..n {
            actions.push(ActionTiming::from_f64s(next(ActionTiming::FIELDS)?).ok_or_else(bad)?);
        }
        out.push(RankStep {
            actions,
            peak_activations: peak,
            peak_activation_bytes: bytes,
            device_uncertainty_us: device,
        });
    }
    Ok(out)
}

/// Every rank's steps on rank 0, as `steps[i][rank]`.
pub(super) fn gather_steps<Cm: Communicator>(
    comm: &mut Cm,
    mine: &[RankStep],
) -> Result<Option<Vec<Vec<RankStep>>>, PipelineError> {
    let all = gather_f64_any_len(comm, &encode_steps(mine), MAX_RECORD_VALUES)?;
    if comm.rank() != 0 {
        return Ok(None);
    }
    let mut per_rank = vec![mine.to_vec()];
    for (r, v) in all.iter().enumerate().skip(1) {
        per_rank.push(decode_steps(v, r)?);
    }
    let steps = mine.len();
    if per_rank.iter().any(|p| p.len() != steps) {
        return Err(PipelineError::Protocol(
            "ranks timed different numbers of steps".into(),
        ));
    }
    Ok(Some(
        (0..steps)
            .map(|i| per_rank.iter().map(|p| p[i].clone()).collect())
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_records_round_trip() {
        let steps = vec![RankStep {
            actions: vec![
                ActionTiming {
                    action: Action::new(2, ActionKind::W, 5),
                    asked_us: 1.0,
                    arrived_us: None,
                    input_sent_us: None,
                    start_us: 2.0,
                    work_end_us: 3.5,
                    sent_us: None,
                    end_us: 4.0,
                },
                ActionTiming {
                    action: Action::new(1, ActionKind::I, 5),
                    asked_us: 4.0,
                    arrived_us: Some(4.5),
                    input_sent_us: Some(4.2),
                    start_us: 5.0,
                    work_end_us: 6.0,
                    sent_us: Some(6.1),
                    end_us: 7.0,
                },
            ],
            peak_activations: 3,
            peak_activation_bytes: 4096,
            device_uncertainty_us: 1.5,
        }];
        assert_eq!(decode_steps(&encode_steps(&steps), 1).unwrap(), steps);
        assert!(decode_steps(&[1.0, 2.0], 1).is_err());
    }
}
