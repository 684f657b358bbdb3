//! The one list of pipeline schedules: each schedule's name (command lines,
//! records, the planner's layouts), its placement, the shapes it takes, its
//! generator (a function of [`super::generate`], [`super::looped`] or
//! [`super::v_shape`]), and its closed form ([`BubbleSchedule`], priced by
//! [`crate::model::bubble`]). [`super::generate()`] builds a schedule from
//! a line; the simulator's checks, the planner and bench-pipeline's analysis
//! all look a schedule up here. A new schedule is its generator and its
//! line in `schedules!` (below), which makes its [`ScheduleKind`] variant and its
//! place in `ScheduleKind::ALL` (docs/architecture.md, "Checklist: add a
//! schedule").

use super::{generate, looped, v_shape, Action};
use std::fmt;
use std::str::FromStr;

/// How a schedule places its stages on ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Placement {
    /// One stage per rank: stage `r` on rank `r`.
    One,
    /// `v` stages per rank (`--chunks`), stage `s` on rank `s % R`
    /// (PyTorch's "loop" style).
    Looped,
    /// Two stages per rank in a V: rank `r` holds stages `r` and `2R-1-r`
    /// (PyTorch's "v" style), so the first and last stages share rank 0.
    V,
}

impl Placement {
    /// Stages per rank when the user asks for `chosen` chunks.
    pub fn stages_per_rank(self, chosen: usize) -> usize {
        match self {
            Placement::One => 1,
            Placement::Looped => chosen,
            Placement::V => 2,
        }
    }

    /// The rank of `stage` on `ranks` ranks (`None` past the last stage).
    pub fn rank_of(self, stage: usize, ranks: usize, stages_per_rank: usize) -> Option<usize> {
        if ranks == 0 || stage >= ranks.checked_mul(stages_per_rank)? {
            return None;
        }
        Some(match self {
            Placement::One | Placement::Looped => stage % ranks,
            Placement::V if stage < ranks => stage,
            Placement::V => 2 * ranks - 1 - stage,
        })
    }
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
    /// GPipe over `chunks` looped stages per rank (Lamy-Poirier 2023,
    /// "Breadth-First Pipeline Parallelism").
    LoopedBfs { chunks: u64 },
    /// PyTorch's interleaved zero bubble (ZB1P with `chunks` stages per
    /// rank): no paper states its bubble; ZB-H1's over `v`, to which the
    /// simulator holds PyTorch's order.
    InterleavedZb { chunks: u64 },
    /// ZB-V, two stages per rank in a V (Qi et al. 2024, section 6).
    ZbV,
    /// DualPipeV, DualPipe cut in half onto the V placement (DeepSeek-V3
    /// technical report; the DualPipe repository's README).
    DualPipeV,
}

/// The actions of every rank for `ranks` ranks, `microbatches`
/// microbatches and `chunks` stages per rank (a shape its entry's
/// `accepts` took).
pub type Generator = fn(ranks: usize, microbatches: usize, chunks: usize) -> Vec<Vec<Action>>;

/// Whether a schedule can be built for `ranks` ranks, `microbatches`
/// microbatches and `chunks` stages per rank, or why not (one line).
pub type Accepts = fn(ranks: usize, microbatches: usize, chunks: usize) -> Result<(), String>;

/// Every shape.
fn any_shape(_: usize, _: usize, _: usize) -> Result<(), String> {
    Ok(())
}

/// One schedule: what it is called, what generates it, how its bubble is priced.
#[derive(Clone, Copy, Debug)]
pub struct ScheduleEntry {
    /// The kind its registry line names.
    pub kind: ScheduleKind,
    /// The name on command lines, in records and in the planner's layouts.
    pub name: &'static str,
    /// Other spellings accepted on command lines (after trimming,
    /// lower-casing and `_` to `-`); PyTorch's `get_schedule_class` name
    /// is one of them.
    pub aliases: &'static [&'static str],
    /// How it places stages on ranks.
    pub placement: Placement,
    /// The shapes it takes (beyond at least one rank, microbatch and chunk).
    pub accepts: Accepts,
    /// Its generator.
    pub generate: Generator,
    /// Its closed form at `chunks` stages per rank.
    pub closed_form: fn(chunks: u64) -> BubbleSchedule,
}

/// Makes [`ScheduleKind`] (a variant per line), [`SCHEDULES`] (the lines'
/// entries, in order) and `ScheduleKind::ALL` from one line per schedule,
/// so that no list of kinds can miss a line.
macro_rules! schedules {
    ($($kind:ident => { $($field:ident: $value:expr),* $(,)? },)*) => {
        /// The generated schedules (`--schedule`).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum ScheduleKind {
            $($kind,)*
        }

        /// Every generated schedule, in the order sweeps run them.
        pub const SCHEDULES: [ScheduleEntry; [$(stringify!($kind),)*].len()] = [
            $(ScheduleEntry { kind: ScheduleKind::$kind, $($field: $value,)* },)*
        ];

        impl ScheduleKind {
            /// Every generated schedule, in the order sweeps run them ([`SCHEDULES`]' order).
            pub const ALL: [ScheduleKind; SCHEDULES.len()] = [$(ScheduleKind::$kind,)*];
        }
    };
}

schedules! {
    GPipe => {
        name: "gpipe", aliases: &[], placement: Placement::One, accepts: any_shape,
        generate: generate::gpipe, closed_form: |_| BubbleSchedule::GPipe,
    },
    OneFOneB => {
        name: "1f1b", aliases: &[], placement: Placement::One, accepts: any_shape,
        generate: generate::one_f_one_b, closed_form: |_| BubbleSchedule::OneFOneB,
    },
    Interleaved => {
        name: "interleaved", aliases: &["interleaved-1f1b", "interleaved1f1b"],
        placement: Placement::Looped, accepts: generate::interleaved_accepts,
        generate: generate::interleaved, closed_form: |chunks| BubbleSchedule::Interleaved { chunks },
    },
    ZbH1 => {
        name: "zb-h1", aliases: &["zbh1"], placement: Placement::One, accepts: any_shape,
        generate: generate::zb_h1, closed_form: |_| BubbleSchedule::ZbH1,
    },
    LoopedBfs => {
        name: "looped-bfs", aliases: &["loopedbfs", "bfs"], placement: Placement::Looped,
        accepts: any_shape, generate: looped::looped_bfs,
        closed_form: |chunks| BubbleSchedule::LoopedBfs { chunks },
    },
    InterleavedZb => {
        name: "interleaved-zb",
        aliases: &["interleavedzerobubble", "interleaved-zero-bubble", "zb1p"],
        placement: Placement::Looped, accepts: looped::interleaved_zb_accepts,
        generate: looped::interleaved_zb, closed_form: |chunks| BubbleSchedule::InterleavedZb { chunks },
    },
    ZbV => {
        name: "zb-v", aliases: &["zbv", "zbvzerobubble"], placement: Placement::V,
        accepts: any_shape, generate: v_shape::zb_v, closed_form: |_| BubbleSchedule::ZbV,
    },
    DualPipeV => {
        name: "dualpipev", aliases: &["dualpipe-v", "dual-pipe-v"], placement: Placement::V,
        accepts: v_shape::dualpipe_v_accepts, generate: v_shape::dualpipe_v,
        closed_form: |_| BubbleSchedule::DualPipeV,
    },
}

impl ScheduleKind {
    /// Its line of [`SCHEDULES`].
    pub fn entry(self) -> &'static ScheduleEntry {
        // The macro numbers the variants in the lines' order.
        &SCHEDULES[self as usize]
    }

    /// The name on command lines and in records.
    pub fn name(self) -> &'static str {
        self.entry().name
    }

    /// How it places stages on ranks.
    pub fn placement(self) -> Placement {
        self.entry().placement
    }

    /// Whether it runs the user's `v` (`--chunks`) stages per rank.
    pub fn chunked(self) -> bool {
        self.placement() == Placement::Looped
    }

    /// Stages per rank when the user asks for `chosen` chunks.
    pub fn stages_per_rank(self, chosen: usize) -> usize {
        self.placement().stages_per_rank(chosen)
    }

    /// Whether it can be built for `ranks` ranks, `microbatches`
    /// microbatches and the user's `chunks`, or why not (one line).
    pub fn accepts(self, ranks: usize, microbatches: usize, chunks: usize) -> Result<(), String> {
        if ranks == 0 || microbatches == 0 || chunks == 0 {
            return Err("needs at least one stage, microbatch and chunk per rank".into());
        }
        (self.entry().accepts)(ranks, microbatches, self.stages_per_rank(chunks))
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
        let mut names: Vec<&str> = SCHEDULES
            .iter()
            .flat_map(|e| std::iter::once(e.name).chain(e.aliases.iter().copied()))
            .collect();
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n, "a spelling names two schedules");
    }

    #[test]
    fn the_v_placement_folds_the_stages() {
        let v: Vec<usize> = (0..8)
            .map(|s| Placement::V.rank_of(s, 4, 2).unwrap())
            .collect();
        assert_eq!(v, [0, 1, 2, 3, 3, 2, 1, 0]);
        assert_eq!(Placement::Looped.rank_of(5, 4, 2), Some(1));
        assert_eq!(Placement::V.rank_of(8, 4, 2), None);
        assert_eq!(Placement::One.rank_of(0, 0, 1), None);
    }

    #[test]
    fn unknown_names_list_the_registry() {
        assert_eq!(
            "Pipe_Dream".parse::<ScheduleKind>().unwrap_err(),
            "unknown schedule 'pipe-dream' (expected gpipe, 1f1b, interleaved, zb-h1, looped-bfs, \
             interleaved-zb, zb-v or dualpipev)"
        );
        assert_eq!("ZB_H1".parse::<ScheduleKind>(), Ok(ScheduleKind::ZbH1));
        // PyTorch's get_schedule_class names.
        for (torch, kind) in [
            ("LoopedBFS", ScheduleKind::LoopedBfs),
            ("InterleavedZeroBubble", ScheduleKind::InterleavedZb),
            ("ZBVZeroBubble", ScheduleKind::ZbV),
            ("DualPipeV", ScheduleKind::DualPipeV),
            ("Interleaved1F1B", ScheduleKind::Interleaved),
        ] {
            assert_eq!(torch.parse::<ScheduleKind>(), Ok(kind), "{torch}");
        }
        assert_eq!(
            ScheduleKind::Interleaved.closed_form(3),
            BubbleSchedule::Interleaved { chunks: 3 }
        );
    }
}
