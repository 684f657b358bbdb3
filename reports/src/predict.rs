//! The one place where `report` asks the analytical model for a figure.
//!
//! TEMPORARY: parbench::model is being written (issue 7 item 1) and lands in
//! main later; until it does, the functions below hold the formulas of
//! REFERENCES.md so the rest of the report can be built and tested. When the
//! model lands, each body becomes a call into parbench::model and these
//! formulas disappear (shared logic lives once).

/// Bytes per element of a dtype name as records and flags spell it.
pub fn dtype_bytes(dtype: &str) -> Option<u64> {
    dtype
        .parse::<parbench::comm::DType>()
        .ok()
        .map(|d| d.size() as u64)
}

/// nccl-tests' bus-bandwidth factor of a collective on `world` ranks.
pub fn busbw_factor(collective: &str, world: usize) -> Option<f64> {
    let n = world as f64;
    match collective {
        "all_reduce" => Some(2.0 * (n - 1.0) / n),
        "all_gather" | "reduce_scatter" | "all_to_all" => Some((n - 1.0) / n),
        "broadcast" | "reduce" | "sendrecv" => Some(1.0),
        _ => None,
    }
}

/// A wire's cost per message and per byte, as fitted to measured times or given.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// Latency per message (alpha), microseconds.
    pub alpha_us: f64,
    /// Bandwidth per link (1/beta), GB/s (1e9 bytes per second).
    pub gbps: f64,
}

/// An alpha-beta fit of one collective's measured times.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fit {
    /// The per-link alpha and beta the algorithm's cost formula implies.
    pub link: Link,
    /// Root-mean-square relative error of the fit over the points.
    pub rms_rel_err: f64,
    pub points: usize,
}

/// (latency steps, bytes-on-the-wire factor) of a ring collective on p ranks:
/// time = steps alpha + factor n beta.
fn ring_coefficients(collective: &str, p: f64) -> Option<(f64, f64)> {
    match collective {
        "all_reduce" => Some((2.0 * (p - 1.0), 2.0 * (p - 1.0) / p)),
        "all_gather" | "reduce_scatter" | "all_to_all" => Some((p - 1.0, (p - 1.0) / p)),
        "broadcast" | "reduce" | "sendrecv" => Some((1.0, 1.0)),
        _ => None,
    }
}

/// Fits the measured (bytes, microseconds) points of a ring collective on
/// `world` ranks to the alpha-beta formula, weighting each point by its
/// relative error so small messages count as much as large ones.
pub fn fit(collective: &str, world: usize, points: &[(f64, f64)]) -> Option<Fit> {
    let (steps, factor) = ring_coefficients(collective, world as f64)?;
    let pts: Vec<(f64, f64)> = points
        .iter()
        .copied()
        .filter(|(n, t)| n.is_finite() && t.is_finite() && *t > 0.0 && *n >= 0.0)
        .collect();
    if pts.len() < 2 {
        return None;
    }
    // Weighted least squares of t = a + b n with weights 1/t^2.
    let (mut sw, mut sx, mut sy, mut sxx, mut sxy) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(n, t) in &pts {
        let w = 1.0 / (t * t);
        sw += w;
        sx += w * n;
        sy += w * t;
        sxx += w * n * n;
        sxy += w * n * t;
    }
    let det = sw * sxx - sx * sx;
    if det.abs() < f64::MIN_POSITIVE {
        return None;
    }
    let b = ((sw * sxy - sx * sy) / det).max(0.0);
    let a = ((sy - b * sx) / sw).max(0.0);
    let err = (pts
        .iter()
        .map(|&(n, t)| ((a + b * n - t) / t).powi(2))
        .sum::<f64>()
        / pts.len() as f64)
        .sqrt();
    let beta_us_per_byte = b / factor;
    Some(Fit {
        link: Link {
            alpha_us: a / steps,
            gbps: if beta_us_per_byte > 0.0 {
                1e-3 / beta_us_per_byte
            } else {
                f64::INFINITY
            },
        },
        rms_rel_err: err,
        points: pts.len(),
    })
}

/// Ring all_reduce time of `bytes` on `world` ranks over `link`, microseconds.
pub fn ring_all_reduce_us(link: Link, bytes: f64, world: usize) -> f64 {
    let p = world as f64;
    2.0 * (p - 1.0) * link.alpha_us + 2.0 * (p - 1.0) / p * bytes / (link.gbps * 1e3)
}

/// A transformer's shape, for tensor-parallel traffic.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    pub name: String,
    pub layers: u64,
    pub hidden: u64,
}

/// The model presets the capacity table sizes.
pub fn presets() -> Vec<Shape> {
    vec![
        Shape {
            name: "gpt3-175b (96 x 12288)".into(),
            layers: 96,
            hidden: 12288,
        },
        Shape {
            name: "llama-70b (80 x 8192)".into(),
            layers: 80,
            hidden: 8192,
        },
        Shape {
            name: "llama-13b (40 x 5120)".into(),
            layers: 40,
            hidden: 5120,
        },
        Shape {
            name: "llama-7b (32 x 4096)".into(),
            layers: 32,
            hidden: 4096,
        },
    ]
}

/// Tensor-parallel traffic of one forward token step (decode) or one
/// forward pass over `seq` tokens, Megatron arrangement.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TpTraffic {
    /// Bytes of one all-reduce: batch x seq x hidden x dtype bytes.
    pub bytes_per_call: f64,
    /// Ring factor 2(t-1)/t: bytes each device sends per byte reduced.
    pub ring_factor: f64,
    /// The rule of thumb: about 2 bytes moved per byte reduced.
    pub approx_factor: f64,
    /// All-reduces per forward pass: 2 per layer.
    pub calls: u64,
}

impl TpTraffic {
    /// Bytes each device sends per call, exact ring.
    pub fn moved_per_call(&self) -> f64 {
        self.bytes_per_call * self.ring_factor
    }
    /// Bytes per forward pass with the rule-of-thumb factor.
    pub fn approx_total(&self) -> f64 {
        self.bytes_per_call * self.approx_factor * self.calls as f64
    }
    /// Bytes per forward pass, exact ring.
    pub fn exact_total(&self) -> f64 {
        self.moved_per_call() * self.calls as f64
    }
}

/// The forward tensor-parallel traffic of a model of `layers` layers.
pub fn tp_traffic(
    batch: u64,
    seq: u64,
    hidden: u64,
    layers: u64,
    tp: usize,
    dtype_bytes: u64,
) -> TpTraffic {
    let t = tp as f64;
    TpTraffic {
        bytes_per_call: (batch * seq * hidden * dtype_bytes) as f64,
        ring_factor: 2.0 * (t - 1.0) / t,
        approx_factor: 2.0,
        calls: 2 * layers,
    }
}

/// Fraction of a GPipe/1F1B step spent idle: (S-1)/(S+M-1).
pub fn bubble_of_step(stages: usize, microbatches: usize) -> f64 {
    let (s, m) = (stages as f64, microbatches as f64);
    (s - 1.0) / (s + m - 1.0)
}

/// Bubble time over the ideal time (Megatron's form): (S-1)/M.
pub fn bubble_of_ideal(stages: usize, microbatches: usize) -> f64 {
    (stages as f64 - 1.0) / microbatches as f64
}

/// Interleaved 1F1B with v chunks: bubble (S-1)/v over ideal M, as a fraction of the step.
pub fn bubble_of_step_interleaved(stages: usize, microbatches: usize, chunks: usize) -> f64 {
    let b = (stages as f64 - 1.0) / chunks.max(1) as f64;
    b / (b + microbatches as f64)
}

/// The fewest microbatches that keep a GPipe/1F1B pipeline of `stages` busy
/// at least `busy` of the step.
pub fn microbatches_for_busy(stages: usize, busy: f64) -> Option<usize> {
    if !(0.0..1.0).contains(&busy) {
        return None;
    }
    let s = stages as f64;
    // busy <= M/(S+M-1)  <=>  M >= busy (S-1) / (1-busy)
    let m = (busy * (s - 1.0) / (1.0 - busy) - 1e-9).ceil().max(1.0);
    Some(m as usize)
}
