//! The figures `compare` judges in the context-parallel and MoE records:
//! layers_cp.csv (bench-layers `--cp`), cp-ring.csv (`bench-collectives
//! cp-ring`) and moe.csv (`bench-collectives moe`).

use super::rule::spread_below;
use super::{Compared, Figure, Worse};
use parbench::results::{CpRingRow, CpRow, MoeRow};

fn time(name: &'static str, value: f64, noise: f64) -> Figure {
    Figure {
        name,
        value,
        worse: Worse::Higher,
        noise,
        time_us: Some(value),
    }
}

/// A spread of `us` as a share of `of` (0 when not finite).
fn points(us: f64, of: f64) -> f64 {
    let p = us / of;
    if p.is_finite() {
        p
    } else {
        0.0
    }
}

impl Compared for CpRow {
    const SUITE: &'static str = "layers_cp";
    /// The call's time and the time it stood still for transfers, each
    /// with the call's spread below its mean; beyond cp 1 the share of the
    /// transfers hidden (NaN at cp 1, where nothing is sent), its noise the
    /// call's spread over the transfers.
    fn figures(&self) -> Vec<Figure> {
        let below = (self.total_us - self.total_min_us).max(0.0);
        let rel = |v: f64| spread_below(v - below, v);
        let mut out = vec![
            time("total_us", self.total_us, rel(self.total_us)),
            time("wait_us", self.wait_us, rel(self.wait_us)),
        ];
        if self.cp > 1 {
            out.push(Figure {
                name: "hidden_share",
                value: self.hidden_share,
                worse: Worse::LowerFraction,
                // The call's spread, all of it standing still, in points of the share.
                noise: points(below, self.transfer_us),
                time_us: None,
            });
        }
        out
    }
    fn key_parts(&self) -> Vec<(&'static str, String)> {
        vec![
            ("backend", self.backend.clone()),
            ("wire", self.wire.clone()),
            ("method", self.method.clone()),
            ("mode", self.mode.clone()),
            ("cp", self.cp.to_string()),
        ]
    }
}

impl Compared for CpRingRow {
    const SUITE: &'static str = "cp-ring";
    /// The overlapped pass and the exchange alone, with the overlapped
    /// pass's median below its combined time as the row's own spread; and
    /// the share of the exchange hidden, its noise that spread over the
    /// exchange.
    fn figures(&self) -> Vec<Figure> {
        let noise = spread_below(self.overlapped_p50_us, self.overlapped_us);
        let below = (self.overlapped_us - self.overlapped_p50_us).max(0.0);
        vec![
            time("overlapped_us", self.overlapped_us, noise),
            time("exchange_us", self.exchange_us, noise),
            Figure {
                name: "hidden",
                value: self.hidden,
                worse: Worse::LowerFraction,
                // The overlapped pass's spread in points of the share.
                noise: points(below, self.exchange_us),
                time_us: None,
            },
        ]
    }
    fn key_parts(&self) -> Vec<(&'static str, String)> {
        vec![
            ("backend", self.backend.clone()),
            ("wire", self.wire.clone()),
            ("ranks", self.world.to_string()),
            ("stand-in", self.stand_in.clone()),
            ("size", self.bytes.to_string()),
        ]
    }
}

impl Compared for MoeRow {
    const SUITE: &'static str = "moe";
    /// The phase's time, with its combined time's spread above the median
    /// iteration as the row's own noise (no fastest iteration recorded).
    fn figures(&self) -> Vec<Figure> {
        vec![time(
            "time_us",
            self.time_us,
            spread_below(self.p50_us, self.time_us),
        )]
    }
    fn key_parts(&self) -> Vec<(&'static str, String)> {
        vec![
            ("backend", self.backend.clone()),
            ("wire", self.wire.clone()),
            ("ranks", self.world.to_string()),
            ("phase", self.phase.clone()),
            ("routing", self.routing.clone()),
            ("size", format!("{}x{}", self.tokens, self.hidden)),
        ]
    }
}
