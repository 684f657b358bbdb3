//! The rows of each suite's CSV. Column names are the field names;
//! docs/records.md documents each. Bump [`SCHEMA_VERSION`] when a column changes.

use serde::{Deserialize, Serialize};

/// Version written in every row's `schema` column.
pub const SCHEMA_VERSION: u32 = 1;

/// A row type with its file name and the fields that identify it across runs.
pub trait Record: Serialize + for<'de> Deserialize<'de> {
    /// File name inside a results folder (`collectives.csv`, ...).
    const FILE: &'static str;
    /// The figures (`f64` columns) that may be NaN: "not measured" (no
    /// model for the row, no check run, a column older files lack). Every
    /// other figure is finite and not negative (see
    /// [`super::io::check_figures`]).
    const MAY_BE_NAN: &'static [&'static str];
    /// The fields that name the same measurement in two runs (for `report compare`).
    fn key(&self) -> String;
    /// The run this row belongs to.
    fn run_id(&self) -> &str;
}

/// One (collective, dtype, op, size, in_place) measurement of bench-collectives.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CollectiveRow {
    pub schema: u32,
    pub run_id: String,
    pub backend: String,
    pub wire: String,
    pub algo: String,
    pub collective: String,
    pub dtype: String,
    pub op: String,
    pub root: i64,
    pub world: usize,
    pub bytes: u64,
    pub count: u64,
    pub in_place: bool,
    pub iters: u64,
    pub time_us: f64,
    pub time_min_us: f64,
    pub time_max_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub algbw_gbps: f64,
    pub busbw_gbps: f64,
    pub wrong: u64,
    pub model_us: f64,
    pub ceiling_gbps: f64,
}

/// A bench-collectives row's name in run.json's per-row records (the cores'
/// state, the rows above their ceiling): `all_reduce 1048576 B in`.
pub fn row_label(collective: &str, bytes: u64, in_place: bool) -> String {
    let place = if in_place { "in" } else { "out" };
    format!("{collective} {bytes} B {place}")
}

impl CollectiveRow {
    /// A row for tests to start from: a 2-rank local all_reduce of `bytes`
    /// out of place, float sum, every time and figure 1; a test sets the
    /// fields it holds.
    #[doc(hidden)]
    pub fn for_tests(run_id: &str, bytes: u64) -> Self {
        CollectiveRow {
            schema: SCHEMA_VERSION,
            run_id: run_id.into(),
            backend: "local".into(),
            wire: "shm".into(),
            algo: "ring".into(),
            collective: "all_reduce".into(),
            dtype: "float".into(),
            op: "sum".into(),
            root: -1,
            world: 2,
            bytes,
            count: bytes / 4,
            in_place: false,
            iters: 1,
            time_us: 1.0,
            time_min_us: 1.0,
            time_max_us: 1.0,
            p50_us: 1.0,
            p99_us: 1.0,
            algbw_gbps: 1.0,
            busbw_gbps: 1.0,
            wrong: 0,
            model_us: 1.0,
            ceiling_gbps: 1.0,
        }
    }

    /// The row's [`row_label`].
    pub fn label(&self) -> String {
        row_label(&self.collective, self.bytes, self.in_place)
    }
}

impl Record for CollectiveRow {
    const FILE: &'static str = "collectives.csv";
    const MAY_BE_NAN: &'static [&'static str] = &["model_us", "ceiling_gbps"];
    fn key(&self) -> String {
        format!(
            "{}/{}/{}/{}/{}/{}/{}/np{}/{}B/{}",
            self.backend,
            self.wire,
            self.algo,
            self.collective,
            self.dtype,
            self.op,
            self.root,
            self.world,
            self.bytes,
            if self.in_place { "in" } else { "out" }
        )
    }
    fn run_id(&self) -> &str {
        &self.run_id
    }
}

/// One tensor-parallel degree of one block configuration of bench-layers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerRow {
    pub schema: u32,
    pub run_id: String,
    pub backend: String,
    pub wire: String,
    pub mode: String,
    pub decode: bool,
    pub preset: String,
    pub hidden: u64,
    pub heads: u64,
    pub ffn: u64,
    pub seq: u64,
    pub batch: u64,
    pub dtype: String,
    pub tp: usize,
    pub seq_parallel: bool,
    pub iters: u64,
    pub compute_us: f64,
    pub comm_us: f64,
    pub total_us: f64,
    pub total_min_us: f64,
    pub total_max_us: f64,
    pub per_token_us: f64,
    pub bytes_per_call: u64,
    pub calls_per_block: u64,
    pub bytes_per_token: f64,
    pub comm_model_us: f64,
    pub speedup: f64,
    pub efficiency: f64,
    pub check_max_err: f64,
    /// The algorithm of each collective the block calls (`all_reduce=ring`).
    pub comm_algo: String,
    /// Where the link behind `comm_model_us` came from: `fit`, `flag` or `none`.
    pub link_source: String,
    /// That link's latency per message, microseconds.
    pub link_alpha_us: f64,
    /// That link's bandwidth, GB/s (1e9 B/s).
    pub link_gbps: f64,
    /// The rank whose times the row reports (the slowest one).
    pub slowest_rank: usize,
    /// Compute threads of each rank (CPU), 0 on GPUs.
    pub threads: usize,
    /// Matrix-product GFLOP/s of one rank during compute phases.
    pub compute_gflops: f64,
    // Columns added after the first layout: files written before them still
    // read (NaN for what they did not measure apart).
    /// Time in the barriers before the collectives, waiting for a slower
    /// peer's compute, us; NaN in rows whose `comm_us` includes it.
    #[serde(default = "not_measured")]
    pub wait_us: f64,
}

impl Record for LayerRow {
    const FILE: &'static str = "layers.csv";
    const MAY_BE_NAN: &'static [&'static str] = &[
        "comm_model_us",
        "speedup",
        "efficiency",
        "check_max_err",
        "link_alpha_us",
        "link_gbps",
        "compute_gflops",
        "wait_us",
    ];
    fn key(&self) -> String {
        format!(
            "{}/{}/{}/{}/{}/h{}a{}f{}s{}b{}/{}/tp{}/{}",
            self.backend,
            self.wire,
            self.mode,
            if self.decode { "decode" } else { "prefill" },
            self.preset,
            self.hidden,
            self.heads,
            self.ffn,
            self.seq,
            self.batch,
            self.dtype,
            self.tp,
            if self.seq_parallel { "sp" } else { "ar" }
        )
    }
    fn run_id(&self) -> &str {
        &self.run_id
    }
}

/// One context-parallel degree of bench-layers `--cp`: the attention
/// with the sequence split over `cp` ranks by `method` (and its heads over
/// `tp`), forward or train.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CpRow {
    pub schema: u32,
    pub run_id: String,
    pub backend: String,
    pub wire: String,
    /// `p2p` (ring), `all_gather` or `a2a` (Ulysses).
    pub method: String,
    /// Whether the ring's transfers ran on a thread beside the attention.
    pub overlapped: bool,
    pub heads: u64,
    pub head_dim: u64,
    pub seq: u64,
    pub batch: u64,
    pub cp: usize,
    pub iters: u64,
    pub compute_us: f64,
    /// Time the attention stood still for communication.
    pub wait_us: f64,
    /// The transfers from start to end, hidden or not.
    pub transfer_us: f64,
    pub total_us: f64,
    pub total_min_us: f64,
    pub total_max_us: f64,
    /// 1 - wait / transfer: the share of the transfers hidden behind compute.
    pub hidden_share: f64,
    /// Bytes one rank sends per call.
    pub bytes_sent: u64,
    /// Total time at cp 1 over this row's.
    pub speedup: f64,
    pub check_max_err: f64,
    pub slowest_rank: usize,
    // Columns added after the first layout: files written before them
    // read as what those runs were (causal forward, tp 1).
    /// `forward` or `train` (forward and backward per call).
    #[serde(default = "forward")]
    pub mode: String,
    /// Tensor-parallel degree: the heads split over `tp`, the world tp x cp.
    #[serde(default = "one")]
    pub tp: usize,
    /// Whether each query saw only the keys at or before it.
    #[serde(default = "yes")]
    pub causal: bool,
}

fn forward() -> String {
    "forward".into()
}

fn yes() -> bool {
    true
}

impl Record for CpRow {
    const FILE: &'static str = "layers_cp.csv";
    const MAY_BE_NAN: &'static [&'static str] = &["hidden_share", "speedup", "check_max_err"];
    fn key(&self) -> String {
        format!(
            "{}/{}/{}/{}/{}/h{}d{}s{}b{}/tp{}cp{}",
            self.backend,
            self.wire,
            self.method,
            self.mode,
            if self.causal { "causal" } else { "full" },
            self.heads,
            self.head_dim,
            self.seq,
            self.batch,
            self.tp,
            self.cp
        )
    }
    fn run_id(&self) -> &str {
        &self.run_id
    }
}

/// One (schedule, stages, microbatches, chunks) run of bench-pipeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PipelineRow {
    pub schema: u32,
    pub run_id: String,
    pub backend: String,
    pub wire: String,
    pub schedule: String,
    pub stages: usize,
    pub microbatches: usize,
    pub chunks: usize,
    pub work: String,
    pub stage_layers: String,
    pub hidden: u64,
    pub microbatch_size: u64,
    pub steps: u64,
    pub step_us: f64,
    pub step_min_us: f64,
    pub step_max_us: f64,
    pub busy_us: f64,
    pub idle_us: f64,
    pub bubble_measured: f64,
    pub bubble_simulated: f64,
    pub bubble_formula: f64,
    pub peak_activations: u64,
    pub peak_activation_bytes: u64,
    pub expected_peak_activations: u64,
    pub grad_max_err: f64,
    pub timeline: String,
    // Columns added after the first layout: files written before them still
    // read (empty straggler, NaN for the figures they did not measure).
    /// `RANK:MS` of `--slow-rank`, empty without one.
    #[serde(default)]
    pub straggler: String,
    /// The simulated step from this run's measured per-action costs, us.
    #[serde(default = "not_measured")]
    pub step_simulated_us: f64,
    /// One-way time of one activation message between ranks 0 and 1, us.
    #[serde(default = "not_measured")]
    pub message_us: f64,
    /// The simulator replaying each step with its own measured action times.
    #[serde(default = "not_measured")]
    pub bubble_replayed: f64,
    /// Of the idle time, waiting for a peer that had not yet sent: summed
    /// over the ranks, per step (mean over steps), us.
    #[serde(default = "not_measured")]
    pub wait_us: f64,
    /// Of the idle time, transfers under way (sent, not yet arrived):
    /// summed over the ranks, per step (mean over steps), us.
    #[serde(default = "not_measured")]
    pub transfer_us: f64,
    /// The largest uncertainty of any rank's times on the common base
    /// (clock offset bound plus a device stream's anchor; 0 on one clock), us.
    #[serde(default = "not_measured")]
    pub clock_uncertainty_us: f64,
    /// Data-parallel and tensor-parallel degrees (`--dp`, `--tp`): the
    /// world is `dp x tp x stages`; 1 and 1 for the plain pipeline.
    #[serde(default = "one")]
    pub dp: usize,
    #[serde(default = "one")]
    pub tp: usize,
    /// Per rank per step (median over the timed steps, mean over ranks): the
    /// tensor-parallel collectives, the data-parallel reduction, and its
    /// part after the rank's last action (0 for the plain pipeline), us.
    #[serde(default)]
    pub tp_comm_us: f64,
    #[serde(default)]
    pub dp_comm_us: f64,
    #[serde(default)]
    pub dp_exposed_us: f64,
}

fn not_measured() -> f64 {
    f64::NAN
}

fn one() -> usize {
    1
}

impl Record for PipelineRow {
    const FILE: &'static str = "pipeline.csv";
    const MAY_BE_NAN: &'static [&'static str] = &[
        "bubble_formula",
        "grad_max_err",
        "step_simulated_us",
        "message_us",
        "bubble_replayed",
        "wait_us",
        "transfer_us",
        "clock_uncertainty_us",
    ];
    fn key(&self) -> String {
        format!(
            "{}/{}/{}/S{}/M{}/v{}/{}/{}/h{}/mb{}{}{}{}",
            self.backend,
            self.wire,
            self.schedule,
            self.stages,
            self.microbatches,
            self.chunks,
            self.work,
            self.stage_layers,
            self.hidden,
            self.microbatch_size,
            if self.straggler.is_empty() {
                ""
            } else {
                "/straggler"
            },
            self.straggler,
            // The plain pipeline keeps the key it had before the mesh.
            if (self.dp, self.tp) == (1, 1) {
                String::new()
            } else {
                format!("/dp{}/tp{}", self.dp, self.tp)
            }
        )
    }
    fn run_id(&self) -> &str {
        &self.run_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_rows_written_before_the_wait_column_still_read() {
        let old = "schema,run_id,backend,wire,mode,decode,preset,hidden,heads,ffn,seq,batch,dtype,tp,seq_parallel,iters,compute_us,comm_us,total_us,total_min_us,total_max_us,per_token_us,bytes_per_call,calls_per_block,bytes_per_token,comm_model_us,speedup,efficiency,check_max_err,comm_algo,link_source,link_alpha_us,link_gbps,slowest_rank,threads,compute_gflops\n\
1,r,local,shm,forward,false,tiny,512,8,2048,128,1,float,2,false,10,8000.0,300.0,8300.0,8200.0,8400.0,64.8,262144,2,4096.0,36.0,0.9,0.45,3e-7,all_reduce=ring,fit,1.0,16.0,0,1,50.0\n";
        let mut rd = csv::Reader::from_reader(old.as_bytes());
        let row: LayerRow = rd.deserialize().next().unwrap().unwrap();
        assert_eq!(row.comm_us, 300.0);
        assert!(row.wait_us.is_nan(), "not timed apart: {}", row.wait_us);
    }

    #[test]
    fn pipeline_rows_written_before_the_added_columns_still_read() {
        let old = "schema,run_id,backend,wire,schedule,stages,microbatches,chunks,work,stage_layers,hidden,microbatch_size,steps,step_us,step_min_us,step_max_us,busy_us,idle_us,bubble_measured,bubble_simulated,bubble_formula,peak_activations,peak_activation_bytes,expected_peak_activations,grad_max_err,timeline\n\
1,r,local,shm,1f1b,4,8,1,compute,2 2 2 2,256,32,5,1.0,1.0,1.0,1.0,1.0,0.2,0.2,0.27,4,100,4,0.0,t.json\n";
        let mut rd = csv::Reader::from_reader(old.as_bytes());
        let row: PipelineRow = rd.deserialize().next().unwrap().unwrap();
        assert_eq!(row.straggler, "");
        assert!(row.bubble_replayed.is_nan() && row.message_us.is_nan());
        assert!(row.wait_us.is_nan() && row.transfer_us.is_nan());
        assert!(row.clock_uncertainty_us.is_nan());
        // The layout before the waiting and transfer columns.
        let older = "schema,run_id,backend,wire,schedule,stages,microbatches,chunks,work,stage_layers,hidden,microbatch_size,steps,step_us,step_min_us,step_max_us,busy_us,idle_us,bubble_measured,bubble_simulated,bubble_formula,peak_activations,peak_activation_bytes,expected_peak_activations,grad_max_err,timeline,straggler,step_simulated_us,message_us,bubble_replayed\n\
1,r,tcp,tcp,zb-h1,2,8,1,compute,2 2,256,32,5,1.0,1.0,1.0,1.0,1.0,0.2,0.2,0.27,2,100,2,0.0,t.json,,1.0,30.0,0.21\n";
        let mut rd = csv::Reader::from_reader(older.as_bytes());
        let row: PipelineRow = rd.deserialize().next().unwrap().unwrap();
        assert_eq!(row.bubble_replayed, 0.21);
        assert!(row.wait_us.is_nan() && row.transfer_us.is_nan());
        // Rows before the mesh's columns were plain pipelines.
        assert_eq!((row.dp, row.tp), (1, 1));
        assert_eq!(
            (row.tp_comm_us, row.dp_comm_us, row.dp_exposed_us),
            (0.0, 0.0, 0.0)
        );
    }

    #[test]
    fn cp_rows_written_before_mode_tp_and_causal_still_read() {
        let old = "schema,run_id,backend,wire,method,overlapped,heads,head_dim,seq,batch,cp,iters,compute_us,wait_us,transfer_us,total_us,total_min_us,total_max_us,hidden_share,bytes_sent,speedup,check_max_err,slowest_rank\n\
1,r,local,shm,p2p,true,4,16,64,1,2,5,10.0,1.0,3.0,12.0,11.0,13.0,0.66,4096,1.5,1e-7,1\n";
        // Through the reader every tool uses: the older header is a prefix of this one.
        let dir = std::env::temp_dir().join(format!("parbench-old-cp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(CpRow::FILE);
        std::fs::write(&path, old).unwrap();
        let rows = super::super::io::read_rows::<CpRow>(&path).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let row = &rows[0];
        assert_eq!(
            (row.mode.as_str(), row.tp, row.causal),
            ("forward", 1, true)
        );
        assert_eq!((row.cp, row.bytes_sent), (2, 4096));
        assert!(row.key().contains("/forward/causal/") && row.key().ends_with("tp1cp2"));
    }
}
