//! The one list of pipeline schedules: each schedule's name (command lines,
//! records, the planner's layouts), its generator ([`ScheduleKind`], built by
//! [`super::generate`]), and its closed form ([`BubbleSchedule`], priced by
//! [`crate::model::bubble`]). The generators, the simulator's checks, the
//! planner and bench-pipeline's analysis all look a schedule up here, so a
//! new schedule is one line of [`SCHEDULES`] plus its generator.

use std::fmt;
use std::str::FromStr;

/// The generated schedules (`--schedule`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScheduleKind {
    GPipe,
    OneFOneB,
    Interleaved,
    ZbH1,
}

/// The schedules that have a closed form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BubbleSchedule {
    /// All forwards, then all backwards (Huang et al. 2019).
    GPipe,
    /// One forward, one backward (PipeDream-Flush).
    OneFOneB,
    /// 1F1B with `chunks` (`v`) model chunks per rank (Narayanan et al. SC21).
    Interleaved { chunks: u64 },
    /// Zero bubble, 1F1B's memory (Qi et al. 2024).
    ZbH1,
    /// Zero bubble, about twice 1F1B's memory (Qi et al. 2024). Closed form
    /// only: no generator builds it yet.
    ZbH2,
}

/// One schedule: what it is called, what generates it, how its bubble is priced.
#[derive(Clone, Copy, Debug)]
pub struct ScheduleEntry {
    pub kind: ScheduleKind,
    /// The name on command lines, in records and in the planner's layouts.
    pub name: &'static str,
    /// Other spellings accepted on command lines (after trimming,
    /// lower-casing and `_` to `-`).
    pub aliases: &'static [&'static str],
    /// Whether it runs `v > 1` stages (chunks) per rank.
    pub chunked: bool,
    /// Its closed form at `chunks` stages per rank.
    pub closed_form: fn(chunks: u64) -> BubbleSchedule,
}

/// Every generated schedule, in the order sweeps run them.
pub const SCHEDULES: [ScheduleEntry; 4] = [
    ScheduleEntry {
        kind: ScheduleKind::GPipe,
        name: "gpipe",
        aliases: &[],
        chunked: false,
        closed_form: |_| BubbleSchedule::GPipe,
    },
    ScheduleEntry {
        kind: ScheduleKind::OneFOneB,
        name: "1f1b",
        aliases: &[],
        chunked: false,
        closed_form: |_| BubbleSchedule::OneFOneB,
    },
    ScheduleEntry {
        kind: ScheduleKind::Interleaved,
        name: "interleaved",
        aliases: &["interleaved-1f1b", "interleaved1f1b"],
        chunked: true,
        closed_form: |chunks| BubbleSchedule::Interleaved { chunks },
    },
    ScheduleEntry {
        kind: ScheduleKind::ZbH1,
        name: "zb-h1",
        aliases: &["zbh1", "zb1p"],
        chunked: false,
        closed_form: |_| BubbleSchedule::ZbH1,
    },
];

impl ScheduleKind {
    /// Every generated schedule, in the order sweeps run them ([`SCHEDULES`]' order).
    pub const ALL: [ScheduleKind; 4] = [
        SCHEDULES[0].kind,
        SCHEDULES[1].kind,
        SCHEDULES[2].kind,
        SCHEDULES[3].kind,
    ];

    /// Its line of [`SCHEDULES`].
    pub fn entry(self) -> &'static ScheduleEntry {
        let i = match self {
            ScheduleKind::GPipe => 0,
            ScheduleKind::OneFOneB => 1,
            ScheduleKind::Interleaved => 2,
            ScheduleKind::ZbH1 => 3,
        };
        &SCHEDULES[i]
    }

    /// The name on command lines and in records.
    pub fn name(self) -> &'static str {
        self.entry().name
    }

    /// Whether it runs more than one stage (chunk) per rank.
    pub fn chunked(self) -> bool {
        self.entry().chunked
    }

    /// Its closed form with `chunks` stages per rank.
    pub fn closed_form(self, chunks: u64) -> BubbleSchedule {
        (self.entry().closed_form)(chunks)
    }
}

impl fmt::Display for ScheduleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ScheduleKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let norm = s.trim().to_ascii_lowercase().replace('_', "-");
        if let Some(e) = SCHEDULES
            .iter()
            .find(|e| e.name == norm || e.aliases.contains(&norm.as_str()))
        {
            return Ok(e.kind);
        }
        let names: Vec<&str> = SCHEDULES.iter().map(|e| e.name).collect();
        let (last, rest) = names.split_last().unwrap_or((&"", &[]));
        Err(format!(
            "unknown schedule '{norm}' (expected {} or {last})",
            rest.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_line() {
        for (i, k) in ScheduleKind::ALL.into_iter().enumerate() {
            assert_eq!(k.entry().kind, k);
            assert_eq!(SCHEDULES[i].kind, k);
        }
    }

    #[test]
    fn unknown_names_list_the_registry() {
        assert_eq!(
            "Pipe_Dream".parse::<ScheduleKind>().unwrap_err(),
            "unknown schedule 'pipe-dream' (expected gpipe, 1f1b, interleaved or zb-h1)"
        );
        assert_eq!("ZB_H1".parse::<ScheduleKind>(), Ok(ScheduleKind::ZbH1));
        assert_eq!(
            ScheduleKind::Interleaved.closed_form(3),
            BubbleSchedule::Interleaved { chunks: 3 }
        );
    }
}
