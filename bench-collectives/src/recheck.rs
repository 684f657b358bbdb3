//! The footer's lines of the wire's ceiling measured again after the
//! sweep ([`parbench::measure::wire::recheck`]).

use parbench::measure::wire::recheck::WireRecheck;

/// The footer's lines of a recheck.
pub trait RecheckLines {
    fn lines(&self) -> Vec<String>;
}

impl RecheckLines for WireRecheck {
    fn lines(&self) -> Vec<String> {
        let each: Vec<String> = self
            .rungs
            .iter()
            .map(|r| {
                format!(
                    "{}: {:.2} GB/s, x{:.2}",
                    parbench::units::bytes(r.working_set as f64),
                    r.after_gbps,
                    r.ratio()
                )
            })
            .collect();
        let mut out = vec![format!(
            "# Wire measured again after the sweep (the ceiling's ladders at a few working sets; x = after / before): {}",
            each.join("; ")
        )];
        let moved = self.moved();
        if let (Some(r), false) = (moved, self.in_state) {
            let probes = self.probes.map_or(String::new(), |(b, a)| {
                format!(
                    " (its state probes read {:.2} and {:.2} GB/s)",
                    b.shared_gbps, a.shared_gbps
                )
            });
            out.push(format!(
                "#   the ceiling read x{:.2} at {} after the sweep with the wire in another state than it was measured in{probes}: that state's figure, not a change of the wire's; the rows timed in it are marked ~",
                r.ratio(),
                parbench::units::bytes(r.working_set as f64),
            ));
        } else if let Some(r) = moved {
            out.push(format!(
                "# WARNING: the wire's ceiling moved x{:.2} at {} between the ladder before the sweep ({:.2} GB/s) and after it ({:.2}): the machine's state changed during the run; the ceilings, %ceil and the model come from the ladder before the sweep and are not to be trusted; rerun on a quieter machine",
                r.ratio(),
                parbench::units::bytes(r.working_set as f64),
                r.before_gbps,
                r.after_gbps
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parbench::measure::wire::recheck::Recheck;

    #[test]
    fn a_wire_that_moved_either_way_beyond_the_ratio_is_warned() {
        let at = |ws: u64, before: f64, after: f64| Recheck {
            working_set: ws,
            before_gbps: before,
            after_gbps: after,
        };
        let recheck = |rungs: Vec<Recheck>| WireRecheck {
            rungs,
            cost_s: 0.0,
            probes: None,
            in_state: true,
        };
        let quiet = recheck(vec![at(64 << 10, 2.0, 2.4), at(1 << 20, 4.0, 3.0)]);
        assert!(quiet.moved().is_none());
        assert_eq!(quiet.lines().len(), 1);
        // One rung's jitter, the others within: not a move.
        let jitter = recheck(vec![
            at(64 << 10, 5.15, 9.43),
            at(1 << 20, 7.57, 9.08),
            at(4 << 20, 9.48, 6.54),
        ]);
        assert!(jitter.moved().is_none());
        // Two rungs beyond, but opposite ways: not one move either.
        let split = recheck(vec![at(64 << 10, 2.0, 4.0), at(1 << 20, 4.0, 2.0)]);
        assert!(split.moved().is_none());
        // t1 of issue 14: loopback at 1.95 GB/s before, rows at 5.
        let moved = recheck(vec![at(64 << 10, 1.2, 2.0), at(1 << 20, 1.95, 5.1)]);
        assert_eq!(moved.moved().map(|r| r.working_set), Some(1 << 20));
        let lines = moved.lines();
        assert!(
            lines[1].starts_with("# WARNING: the wire's ceiling moved x2.62 at 1 MiB"),
            "{lines:?}"
        );
        // A sweep small enough for one rung: that one decides.
        let slower = recheck(vec![at(1 << 20, 6.0, 3.0)]);
        assert!(slower.moved().is_some());
        assert_eq!(moved.json()["moved"], true);
        // The same figures measured again with the wire in another state
        // (the probes saw the loopback's other mode): said, not warned.
        let probe = |shared_gbps: f64| parbench::measure::CoreState {
            exchange_us: 7.6,
            shared_gbps,
            copy_gbps: 70.0,
            judged_by: parbench::measure::StateFigures::Transfer,
        };
        let elsewhere = WireRecheck {
            probes: Some((probe(4.6), probe(4.5))),
            in_state: false,
            ..moved.clone()
        };
        let lines = elsewhere.lines();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(!lines[1].contains("WARNING"), "{lines:?}");
        assert!(lines[1].contains("another state"), "{lines:?}");
        assert!(lines[1].contains("4.60 and 4.50 GB/s"), "{lines:?}");
        assert_eq!(elsewhere.json()["in_state"], false);
    }
}
