//! From each rank's own stamps to one time base: every stamp moved onto
//! rank 0's clock ([`RankClock::to_base`]), each step counted from its
//! first work start, and every receive matched with the send of its
//! message, so that waiting for the peer and transfer can be told apart.

use super::{PipelineError, RankStep};
use crate::measure::clock_sync::RankClock;
use crate::schedule::{Message, Schedule};
use std::collections::HashMap;

/// `steps[i][rank]` on each rank's clock to the same on rank 0's, each step
/// from its first work start; fills every wire input's `input_sent_us`.
/// Also returns each step's origin (that first work start on rank 0's
/// clock), so that a caller holding several such records (the composed
/// step's pipelines) can put them on one base with each other.
///
/// A rank that asked for its input before the step's first work began (it
/// left the barrier first) is counted as asking at the step's start: the
/// step is from the first work to the last, as the simulator's.
pub(crate) fn onto_base(
    s: &Schedule,
    steps: Vec<Vec<RankStep>>,
    clocks: &[RankClock],
) -> Result<(Vec<Vec<RankStep>>, Vec<f64>), PipelineError> {
    if clocks.len() != s.ranks() {
        return Err(PipelineError::Protocol(format!(
            "{} clock estimates for {} ranks",
            clocks.len(),
            s.ranks()
        )));
    }
    let mut origins = Vec::with_capacity(steps.len());
    let steps = steps
        .into_iter()
        .map(|mut step| {
            for (rs, clock) in step.iter_mut().zip(clocks) {
                for a in &mut rs.actions {
                    a.map_times(|t| clock.to_base(t));
                }
            }
            let origin = step
                .iter()
                .flat_map(|rs| rs.actions.iter().map(|a| a.start_us))
                .fold(f64::INFINITY, f64::min);
            let origin = if origin.is_finite() { origin } else { 0.0 };
            for rs in &mut step {
                for a in &mut rs.actions {
                    a.map_times(|t| t - origin);
                    a.asked_us = a.asked_us.max(0.0);
                }
            }
            match_sends(s, &mut step)?;
            origins.push(origin);
            Ok(step)
        })
        .collect::<Result<_, PipelineError>>()?;
    Ok((steps, origins))
}

/// Sets each wire input's `input_sent_us` to when its producer posted the send.
fn match_sends(s: &Schedule, step: &mut [RankStep]) -> Result<(), PipelineError> {
    let sent: HashMap<Message, f64> = step
        .iter()
        .flat_map(|rs| rs.actions.iter())
        .filter_map(|a| Some((s.output_of(a.action)?.0, a.sent_us?)))
        .collect();
    for rs in step.iter_mut() {
        for a in rs.actions.iter_mut().filter(|a| a.arrived_us.is_some()) {
            let m = s.input_of(a.action).map(|(m, _)| m);
            a.input_sent_us = Some(m.and_then(|m| sent.get(&m).copied()).ok_or_else(|| {
                PipelineError::Protocol(format!(
                    "{} received an input that no rank recorded sending",
                    a.action
                ))
            })?);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::ActionTiming;
    use super::*;
    use crate::schedule::{generate, Action, ActionKind, ScheduleKind};

    fn clock(rank: usize, offset_us: f64) -> RankClock {
        RankClock::steady(rank, offset_us, 1.0)
    }

    fn act(
        a: Action,
        asked: f64,
        arrived: Option<f64>,
        start: f64,
        end: f64,
        sent: bool,
    ) -> ActionTiming {
        ActionTiming {
            action: a,
            asked_us: asked,
            arrived_us: arrived,
            input_sent_us: None,
            start_us: start,
            work_end_us: end,
            sent_us: sent.then_some(end),
            end_us: end + 1.0,
        }
    }

    /// GPipe on two ranks, one microbatch; rank 1's clock runs 5000 us
    /// ahead. Rank 0: F from 1000 to 1010 (send at 1010), B from 1050.
    /// Rank 1 asks at 6005 (its clock; 1005 on rank 0's), has the input at
    /// 6012, runs F and B, sends B's gradient at 6040 (1040).
    #[test]
    fn stamps_move_onto_rank_0s_clock_and_receives_meet_their_sends() {
        let s = generate(ScheduleKind::GPipe, 2, 1, 1).unwrap();
        let r0 = RankStep {
            actions: vec![
                act(
                    Action::new(0, ActionKind::F, 0),
                    1000.0,
                    None,
                    1000.0,
                    1010.0,
                    true,
                ),
                act(
                    Action::new(0, ActionKind::B, 0),
                    1011.0,
                    Some(1049.0),
                    1050.0,
                    1060.0,
                    false,
                ),
            ],
            ..Default::default()
        };
        let r1 = RankStep {
            actions: vec![
                act(
                    Action::new(1, ActionKind::F, 0),
                    6005.0,
                    Some(6012.0),
                    6012.0,
                    6020.0,
                    false,
                ),
                act(
                    Action::new(1, ActionKind::B, 0),
                    6021.0,
                    None,
                    6021.0,
                    6040.0,
                    true,
                ),
            ],
            ..Default::default()
        };
        let clocks = [clock(0, 0.0), clock(1, 5000.0)];
        let (out, origins) = onto_base(&s, vec![vec![r0, r1]], &clocks).unwrap();
        assert_eq!(origins, [1000.0], "rank 0's first work, on its clock");
        let (r0, r1) = (&out[0][0].actions, &out[0][1].actions);
        assert_eq!(r0[0].start_us, 0.0, "the step starts at the first work");
        let f1 = r1[0];
        assert_eq!((f1.asked_us, f1.start_us), (5.0, 12.0));
        // Asked at 5, the send was posted at 10: 5 waiting, 2 transfer.
        assert_eq!(f1.input_sent_us, Some(10.0));
        assert_eq!((f1.waiting_us(), f1.transfer_us()), (5.0, 2.0));
        assert_eq!(f1.waiting_us() + f1.transfer_us(), f1.recv_us());
        let b0 = r0[1];
        assert_eq!(b0.input_sent_us, Some(40.0));
        assert_eq!((b0.waiting_us(), b0.transfer_us()), (29.0, 10.0));
        assert_eq!(r1[1].input_sent_us, None);
        assert_eq!(r1[1].waiting_us() + r1[1].transfer_us(), 0.0);
    }

    #[test]
    fn a_receive_without_its_send_is_a_protocol_error() {
        let s = generate(ScheduleKind::GPipe, 2, 1, 1).unwrap();
        let r0 = RankStep {
            actions: vec![act(
                Action::new(0, ActionKind::F, 0),
                0.0,
                None,
                0.0,
                1.0,
                false,
            )],
            ..Default::default()
        };
        let r1 = RankStep {
            actions: vec![act(
                Action::new(1, ActionKind::F, 0),
                0.0,
                Some(2.0),
                2.0,
                3.0,
                false,
            )],
            ..Default::default()
        };
        let e = onto_base(&s, vec![vec![r0, r1]], &[clock(0, 0.0), clock(1, 0.0)]).unwrap_err();
        assert!(e.to_string().contains("1F0"), "{e}");
    }
}
