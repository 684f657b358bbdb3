//! What the footer and run.json say of the cores' states the rows were
//! timed in (the probe and the waits: [`parbench::measure::core_state`]).

use parbench::measure::core_state::{
    RowState, MOST_WAIT, MOVED_RATIO, SOCKET_PROBE_BYTES, STATE_RATIO, WAIT_BUDGET,
};
use parbench::measure::{CoreState, StateFigures};

/// What the footer and run.json say of the cores' states.
#[derive(Clone, Debug, PartialEq)]
pub struct StatesSummary {
    /// The state the wire was measured in, and its rungs kept out of it.
    pub state: Option<CoreState>,
    pub rungs_off_state: usize,
    /// The wire's rungs (per ladder).
    pub rungs: usize,
    /// Rows that found another state after the wait.
    pub elsewhere: Vec<String>,
    /// Rows timed while the cores moved.
    pub moved: Vec<String>,
    /// Rows that waited, and the seconds waited in all.
    pub waited_rows: usize,
    pub waited_s: f64,
    pub rows: usize,
}

/// Rows not comparable beyond which the footer warns.
const WARN_SHARE: f64 = 0.25;

impl StatesSummary {
    /// The rows against a wire measured in `state` with `rungs_off_state`
    /// of its `rungs` out of it; `None` where the state is not tracked.
    pub fn of(
        (state, rungs_off_state, rungs): (Option<CoreState>, usize, usize),
        rows: &[RowState],
    ) -> Option<StatesSummary> {
        state?;
        let names = |f: &dyn Fn(&RowState) -> bool| -> Vec<String> {
            rows.iter()
                .filter(|r| f(r))
                .map(|r| r.row.clone())
                .collect()
        };
        Some(StatesSummary {
            state,
            rungs_off_state,
            rungs,
            elsewhere: names(&|r| !r.in_state && !r.moved()),
            moved: names(&|r| r.moved()),
            waited_rows: rows.iter().filter(|r| r.waited_s > 0.01).count(),
            waited_s: rows.iter().map(|r| r.waited_s).sum(),
            rows: rows.len(),
        })
    }

    /// Whether more than a quarter of the rows are not comparable, or more
    /// than a quarter of the wire's rungs stayed out of its state.
    pub fn warns(&self) -> bool {
        let quarter = |n: usize| WARN_SHARE * n as f64;
        (self.elsewhere.len() + self.moved.len()) as f64 > quarter(self.rows)
            || self.rungs_off_state as f64 > quarter(self.rungs)
    }

    /// Whether the state is a socket wire's (told apart by its transfers alone).
    fn sockets(&self) -> bool {
        self.state
            .is_some_and(|s| s.judged_by == StateFigures::Transfer)
    }

    /// What moves between states, as the footer names it.
    fn subject(&self) -> &'static str {
        if self.sockets() {
            "the wire"
        } else {
            "the cores"
        }
    }

    /// The footer's lines.
    pub fn lines(&self) -> Vec<String> {
        let who = self.subject();
        let mut out = vec![match self.state {
            Some(s) if self.sockets() => format!(
                "# Wire's state ({} exchanged between ranks through the sockets, every rank at once: on a VM the loopback moves between modes, and every row with it): the wire measured at {:.2} GB/s; each row timed once the wire was there (waiting at most {MOST_WAIT:.0} s): {} of {} rows waited, {:.1} s in all",
                parbench::units::bytes(SOCKET_PROBE_BYTES as f64),
                s.shared_gbps,
                self.waited_rows,
                self.rows,
                self.waited_s
            ),
            s => format!(
                "# Cores' state (8 B exchange; 64 KiB of just-written lines between ranks; 16 KiB copy in each; a host moving the ranks' cores moves every figure): the wire measured at {}; each row timed once the cores were there (waiting at most {MOST_WAIT:.0} s): {} of {} rows waited, {:.1} s in all",
                s.map_or("-".to_string(), |s| format!(
                    "{:.2} us, {:.0} GB/s shared, {:.0} GB/s copy",
                    s.exchange_us, s.shared_gbps, s.copy_gbps
                )),
                self.waited_rows, self.rows, self.waited_s
            ),
        }];
        let listed = |rows: &[String]| {
            let shown: Vec<&str> = rows.iter().take(6).map(String::as_str).collect();
            let more = rows.len().saturating_sub(shown.len());
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            format!("{}{more}", shown.join(", "))
        };
        if self.waited_s >= WAIT_BUDGET - 0.01 {
            out.push(format!(
                "#   the rows' waiting time ({WAIT_BUDGET:.0} s in all) ran out: later rows were timed at once"
            ));
        }
        if self.rungs_off_state > 0 {
            out.push(format!(
                "#   {} of the wire's {} rungs stayed out of its state through every try: the model near their working sets may be off by the states' difference",
                self.rungs_off_state, self.rungs
            ));
        }
        if !self.elsewhere.is_empty() {
            out.push(format!(
                "#   {} rows found {who} elsewhere after the wait (model marked ~, left out of the fits): {}",
                self.elsewhere.len(),
                listed(&self.elsewhere)
            ));
        }
        if !self.moved.is_empty() {
            out.push(format!(
                "#   {} rows timed while {who} moved, between their wait and the end of their timing (model marked ~, left out of the fits): {}",
                self.moved.len(),
                listed(&self.moved)
            ));
        }
        if self.warns() {
            out.push(format!("# WARNING: more than a quarter of the rows, or of the wire's rungs, ran with {who} elsewhere than where the wire was measured: the model and the ceilings are not to be trusted; rerun on a quieter machine"));
        }
        out
    }

    pub fn json(&self, rows: &[RowState]) -> serde_json::Value {
        serde_json::json!({
            "probe": if self.sockets() {
                format!(
                    "parbench::measure::core_state_probe_with: medians of 16 timed 8 B exchanges, of 16 exchanges of {0} just-written buffers, of 16 samples of 8 KiB copies, every rank at once, rank 0's; states told apart by the {0} exchanges alone",
                    parbench::units::bytes(SOCKET_PROBE_BYTES as f64)
                )
            } else {
                "parbench::measure::core_state_probe: medians of 16 timed 8 B exchanges, of 16 exchanges of 32 KiB just-written buffers, of 16 samples of 8 KiB copies, every rank at once, rank 0's".to_string()
            },
            "same_state_within": STATE_RATIO,
            "moved_within": MOVED_RATIO,
            "most_wait_s": MOST_WAIT,
            "wait_budget_s": WAIT_BUDGET,
            "state": self.state,
            "rungs_out_of_state": self.rungs_off_state,
            "rungs": self.rungs,
            "rows_elsewhere": self.elsewhere,
            "rows_moved": self.moved,
            "waited_rows": self.waited_rows,
            "waited_s": self.waited_s,
            "rows": rows,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A footer of `rows` rows against a wire measured in the state of a
    /// record (0.15 us, 8 GB/s shared, 95 GB/s copy).
    fn summary(rows: usize) -> StatesSummary {
        let state = r#"{"exchange_us": 0.15, "shared_gbps": 8.0, "copy_gbps": 95.0}"#;
        StatesSummary {
            state: Some(serde_json::from_str(state).unwrap()),
            rungs_off_state: 0,
            rungs: 20,
            elsewhere: Vec::new(),
            moved: Vec::new(),
            waited_rows: 0,
            waited_s: 0.0,
            rows,
        }
    }

    #[test]
    fn many_rungs_out_of_the_state_warn() {
        let one_off = StatesSummary {
            rungs_off_state: 1,
            ..summary(4)
        };
        assert!(!one_off.warns());
        assert!(one_off
            .lines()
            .join("\n")
            .contains("1 of the wire's 20 rungs stayed out"));
        let many_off = StatesSummary {
            rungs_off_state: 6,
            ..summary(4)
        };
        assert!(many_off.warns());
    }

    #[test]
    fn the_footer_counts_rows_elsewhere_and_moved_and_warns_past_a_quarter() {
        let s = StatesSummary {
            elsewhere: vec!["all_gather 65536 B out".into()],
            waited_rows: 3,
            waited_s: 1.25,
            ..summary(8)
        };
        assert!(!s.warns());
        let lines = s.lines().join("\n");
        assert!(
            lines.contains("the wire measured at 0.15 us, 8 GB/s shared, 95 GB/s copy"),
            "{lines}"
        );
        assert!(
            lines.contains("3 of 8 rows waited, 1.2 s in all"),
            "{lines}"
        );
        assert!(lines.contains("1 rows found the cores elsewhere after the wait (model marked ~, left out of the fits): all_gather 65536 B out"), "{lines}");
        assert!(!lines.contains("WARNING"), "{lines}");
        let many = StatesSummary {
            moved: vec!["a".into(), "b".into()],
            ..s
        };
        assert!(many.warns());
        assert!(many.lines().join("\n").contains("WARNING"));
    }
}
