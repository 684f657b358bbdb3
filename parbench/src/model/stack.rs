//! Software stacks: what one framework generation runs when it trains a
//! transformer, as `report plan --stack NAME` applies it. A stack fixes
//! how attention, gradient accumulation and the loss run, what overlaps
//! what, how the data-parallel ranks hold the state, the schedules it
//! runs and its microbatch default; [`StepModel`] carries the terms of
//! the step that differ between stacks. Each figure names its source
//! here and in docs/report.md ("Stacks").
//!
//! Adding a stack is adding an entry to [`STACKS`]; a later feature
//! (context parallelism, FP8, expert parallelism) adds a field with the
//! value every existing stack runs.

use super::context::CpComm;
use super::moe::{MoeStack, MCORE_MOE};
use super::opcost::{
    Attention, FlashKernel, GradAccumulation, OPTIMIZER_BYTES_PER_PARAM, STREAM_BYTES,
};
use super::plan::Shard;

/// Bytes per logit element of Megatron's vocabulary-parallel
/// cross-entropy without `--cross-entropy-loss-fusion` (Megatron-Core
/// r0.8 `tensor_parallel/cross_entropy.py`; the same passes in the
/// Megatron-LM of 2021): forward, `.float()` (read 2, write 4), the max
/// (read 4), the in-place subtraction and exponential (read and write 4,
/// twice), the sum (read 4) and the in-place division into the softmax
/// (read and write 4): 38; backward, the in-place multiply by the loss's
/// gradient (read and write 4) and the cast back to 16 bits (read 4,
/// write 2): 14. The fp32 logits are kept from forward to backward.
pub const MEGATRON_LOSS_BYTES: (f64, f64) = (38.0, 14.0);

/// Bytes per logit element of torchtitan's loss, PyTorch's
/// `cross_entropy(pred.float(), labels)`: forward, the cast (read 2, write
/// 4) and `log_softmax` (read 4 twice, write 4): 18; backward, the NLL's
/// gradient (write 4), `log_softmax`'s backward (read 4 twice, write 4)
/// and the cast back (read 4, write 2): 22.
pub const TORCH_LOSS_BYTES: (f64, f64) = (18.0, 22.0);

/// The share of the SMs one NCCL collective kernel holds while it runs
/// beside compute: 15% of an H100's SMs active for a lone NCCL kernel,
/// 85% for the compute kernel beside it (NVIDIA/nccl issue 1432, an
/// Nsight profile; Megatron-LM issue 1001 asks why compute slows when it
/// overlaps communication). Compute overlapped with a collective runs on
/// the rest.
pub const NCCL_OVERLAP_SM_SHARE: f64 = 0.15;

/// SMs Transformer Engine's userbuffers take while a tensor-parallel
/// collective overlaps its GEMM (`initialize_ub`'s defaults): the
/// pipelined and bulk overlaps 16, the ring exchange 1.
pub const UB_REDUCE_SCATTER_SMS: f64 = 16.0;
pub const UB_ALL_GATHER_SMS: f64 = 1.0;

/// Chunks of a pipelined userbuffers overlap (`initialize_ub`'s
/// `num_splits`, 4 for the pipeline method): the last chunk's
/// reduce-scatter runs after the last product.
pub const UB_PIPELINE_SPLITS: f64 = 4.0;

/// Host time to launch one kernel from PyTorch eager code: the median
/// `cudaLaunchKernel` call in an Nsight Systems profile of eager launches,
/// 4.58 us of CPU (kekzl/imp pull request 1367). A GPU whose kernels take
/// less than the host needs to issue them waits for the host.
pub const EAGER_LAUNCH_S: f64 = 4.58e-6;

/// Kernels one transformer layer launches a microbatch as Transformer
/// Engine runs it, forward and backward, counted from its modules:
/// forward two norms, four GEMMs, the attention, the activation, two
/// bias-dropout-adds and four sequence-parallel collectives (14);
/// backward each GEMM's two products (8), the attention's, the
/// activation's and the norms' backward (4), the adds' (2) and the four
/// collectives again plus the all-gathers they redo (8): 22.
pub const LAYER_KERNELS: (f64, f64) = (14.0, 22.0);

/// Zeroing the gradients before a step's first backward: one write of
/// each element (the planner without a stack).
pub const GRAD_ZEROING_PASSES: f64 = 1.0;

/// Megatron-LM of 2021 (`megatron/model/distributed.py` at cdde433,
/// 2021-04): `zero_grad_buffer` zeroes the whole main-gradient buffer
/// (a write) and `allreduce_gradients` divides it by the data-parallel
/// size before the all-reduce (a read and a write): 3.
pub const MEGATRON_2021_BUFFER_PASSES: f64 = 3.0;

/// Megatron-Core r0.8 (`distributed/param_and_grad_buffer.py`,
/// `training.py`, `arguments.py` at core_r0.8.0), on the whole gradient
/// buffer, the distributed optimizer's shard or not: the reset zeroes it
/// (a write); each bucket's `start_grad_sync` takes its norm to check for
/// NaN (a read; `--check-for-nan-in-loss-and-grad` is on by default) and
/// multiplies it by `1/dp` (a read and a write;
/// `--ddp-average-in-collective` is off by default): 4.
pub const MCORE_R08_BUFFER_PASSES: f64 = 4.0;

/// Parameters per gradient bucket of NeMo's optimizer: apex's
/// `DistributedFusedAdam` sizes a bucket `1024 x 1024 x bucket_cap_mb /
/// grad_sync_dtype`'s bytes elements, whatever the data-parallel size;
/// NeMo 24.07's GPT-3 and Llama recipes set `bucket_cap_mb: 220`
/// (NeMo-Framework-Launcher `conf/training/gpt3/*.yaml`) and bf16
/// gradients: 220 MiB / 2.
pub const NEMO_BUCKET_PARAMS: f64 = 1024.0 * 1024.0 * 220.0 / 2.0;

/// The terms of a training step that differ between stacks. The default
/// is the planner without a stack: nothing overlapped but what
/// `dp_overlap` says, 16-bit gradients, a fused loss.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepModel {
    /// Tensor-parallel collectives overlapped with the GEMMs next to them
    /// (Megatron-Core's `--tp-comm-overlap`, Transformer Engine's
    /// userbuffers): the GEMM split in `tp` chunks, each chunk's
    /// communication behind the next chunk's product.
    pub tp_overlap: bool,
    /// The distributed optimizer's parameter all-gather overlapped with
    /// the next step's forward (`--overlap-param-gather`).
    pub param_gather_overlap: bool,
    /// The share of the SMs an overlapped data-parallel collective takes
    /// from the compute it overlaps (0: none taken).
    pub dp_sm_share: f64,
    /// SMs an overlapped tensor-parallel collective takes: a pipelined or
    /// bulk overlap's, and a ring exchange's (0: none).
    pub tp_sms: (f64, f64),
    /// Bytes of one gradient element as it accumulates and is reduced
    /// across data-parallel ranks (4: fp32 main gradients).
    pub grad_bytes: u64,
    /// Bytes per logit element of the loss, forward and backward.
    pub loss_bytes: (f64, f64),
    /// The loss keeps fp32 logits (4 bytes an element) for its backward.
    pub fp32_logits: bool,
    /// Host seconds to launch a kernel (0: the host is never the limit).
    pub launch_s: f64,
    /// Parameters per gradient bucket: `max(base, per_dp x dp)`
    /// (Megatron-Core's `DistributedDataParallel`: 40M and 1M, "so that
    /// NCCL's ring chunks stay bandwidth-bound"); (0, 0): the planner's
    /// `bucket_bytes` (DDP's 25 MiB).
    pub bucket_params: (f64, f64),
    /// Reads and writes of every element of the rank's whole gradient
    /// buffer (`grad_bytes` each) once a step, not sharded by the
    /// distributed optimizer: zeroing it, and what the stack's
    /// data-parallel code does to it before the reduction
    /// ([`GRAD_ZEROING_PASSES`], [`MEGATRON_2021_BUFFER_PASSES`],
    /// [`MCORE_R08_BUFFER_PASSES`]).
    pub grad_buffer_passes: f64,
    /// A backward hook adds the 16-bit gradient of every parameter whose
    /// GEMM does not accumulate it (the embedding) into its main gradient,
    /// every microbatch (Megatron's `DistributedDataParallel` param hook,
    /// `param.main_grad.add_(param.grad.data)`, in Megatron-LM of 2021 and
    /// Megatron-Core r0.8).
    pub main_grad_hook: bool,
    /// How MoE layers run: the token dispatcher, grouped GEMMs.
    pub moe: MoeStack,
    /// How context parallelism exchanges keys and values (`None`: the
    /// stack has none, and a layout with `cp > 1` is refused).
    pub cp_comm: Option<CpComm>,
    /// `--recompute selective` reruns a flash attention's forward in the
    /// backward: Megatron's selective recomputation checkpoints the whole
    /// core attention (Megatron-Core r0.8 `attention.py`:
    /// `checkpoint_core_attention` when `recompute_granularity ==
    /// 'selective'`), flash or not. torchtitan's selective AC saves the
    /// SDPA output instead (its `_save_list`).
    pub selective_reruns_flash: bool,
    /// The distributed optimizer keeps, beside the 16-bit weights, only
    /// the 16 bits an fp32 master weight adds to its bf16 one (apex
    /// `DistributedFusedAdam`'s `store_param_remainders`, an int16 shard),
    /// unless the weights are FP8 (`fp8_params`: full fp32 masters); its
    /// Adam step is apex's kernels' ([`Self::adam_bytes`]).
    pub master_remainders: bool,
    /// FP8 weights (`fp8_params`) are all-gathered as their FP8 bytes,
    /// 1 an element, not at the 16-bit width (NeMo's
    /// `MegatronDistributedFusedAdam`: `param_sync_dtype=torch.uint8` for
    /// `Float8Tensor` parameters).
    pub fp8_param_gather: bool,
}

impl StepModel {
    /// Bytes a parameter of [`Self::grad_buffer_passes`].
    pub fn grad_buffer_bytes(&self) -> f64 {
        self.grad_buffer_passes * self.grad_bytes as f64
    }

    /// Bytes of the master weight a parameter the optimizer holds:
    /// 4 (fp32), or 2 with [`Self::master_remainders`] and 16-bit weights.
    pub fn master_bytes(&self, fp8_params: bool) -> f64 {
        if self.master_remainders && !fp8_params {
            2.0
        } else {
            4.0
        }
    }

    /// Bytes a parameter of one Adam step: Megatron's fused step
    /// ([`OPTIMIZER_BYTES_PER_PARAM`]), or with [`Self::master_remainders`]
    /// apex's kernels at the stack's gradient width `g`. With remainders
    /// (`multi_tensor_fused_adam_with_param_remainders`): read the
    /// gradient, the bf16 weight, its remainder and two fp32 moments,
    /// write the remainder, the moments and the bf16 weight to gather, and
    /// the norm reads the gradient: `2g + 24`, 28. With FP8 weights
    /// (`multi_tensor_fused_adam` on fp32 masters, then NeMo's
    /// `cast_to_fp8` of the shard, read 4 and write 1): `2g + 29`, 33.
    pub fn adam_bytes(&self, fp8_params: bool) -> f64 {
        if !self.master_remainders {
            return OPTIMIZER_BYTES_PER_PARAM;
        }
        let g = self.grad_bytes as f64;
        let (reads, writes) = if fp8_params {
            (g + 4.0 + 8.0 + 4.0, 4.0 + 8.0 + 1.0)
        } else {
            (g + 2.0 + 2.0 + 8.0, 2.0 + 8.0 + 2.0)
        };
        reads + writes + g
    }

    /// Bytes per element of [`Self::main_grad_hook`]'s add: read the
    /// 16-bit gradient, read and write the main gradient at the stack's
    /// gradient width.
    pub fn main_grad_add_bytes(&self) -> f64 {
        if self.main_grad_hook {
            2.0 + 2.0 * self.grad_bytes as f64
        } else {
            0.0
        }
    }
}

impl Default for StepModel {
    fn default() -> Self {
        StepModel {
            tp_overlap: false,
            param_gather_overlap: false,
            dp_sm_share: 0.0,
            tp_sms: (0.0, 0.0),
            grad_bytes: 2,
            loss_bytes: STREAM_BYTES.logit,
            fp32_logits: false,
            launch_s: 0.0,
            bucket_params: (0.0, 0.0),
            grad_buffer_passes: GRAD_ZEROING_PASSES,
            main_grad_hook: false,
            moe: MCORE_MOE,
            cp_comm: Some(CpComm::P2p),
            selective_reruns_flash: true,
            master_remainders: false,
            fp8_param_gather: false,
        }
    }
}

/// What Megatron-LM of 2021 runs: nothing overlapped, fp16 gradients,
/// the unfused fp32 loss; Megatron-Core changes some of it.
const MEGATRON_2021_STEP: StepModel = StepModel {
    tp_overlap: false,
    param_gather_overlap: false,
    dp_sm_share: 0.0,
    tp_sms: (0.0, 0.0),
    grad_bytes: 2,
    loss_bytes: MEGATRON_LOSS_BYTES,
    fp32_logits: true,
    launch_s: EAGER_LAUNCH_S,
    bucket_params: (0.0, 0.0),
    grad_buffer_passes: MEGATRON_2021_BUFFER_PASSES,
    main_grad_hook: true,
    moe: MCORE_MOE,
    cp_comm: None,
    selective_reruns_flash: true,
    master_remainders: false,
    fp8_param_gather: false,
};

/// What Megatron-Core r0.8 runs (the `megatron-core` stack; NeMo on it
/// changes the optimizer).
const MCORE_R08_STEP: StepModel = StepModel {
    tp_overlap: true,
    param_gather_overlap: true,
    dp_sm_share: NCCL_OVERLAP_SM_SHARE,
    tp_sms: (UB_REDUCE_SCATTER_SMS, UB_ALL_GATHER_SMS),
    grad_bytes: 4,
    bucket_params: (40e6, 1e6),
    grad_buffer_passes: MCORE_R08_BUFFER_PASSES,
    cp_comm: Some(CpComm::P2p),
    ..MEGATRON_2021_STEP
};

/// How a stack runs a pipeline a user named without a schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackSchedules {
    /// One chunk per rank.
    pub plain: &'static str,
    /// More than one chunk per rank (`vpp=` given).
    pub interleaved: &'static str,
}

/// 1F1B, interleaved with more than one chunk a rank: what Megatron-LM
/// and torchtitan run by default.
const ONE_F_ONE_B: StackSchedules = StackSchedules {
    plain: "1f1b",
    interleaved: "interleaved",
};

/// One framework generation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stack {
    /// The name `--stack` takes.
    pub name: &'static str,
    /// What it implies, in a line for the plan's header.
    pub implies: &'static str,
    /// Where its settings come from.
    pub source: &'static str,
    pub attention: Attention,
    /// The flash kernel it runs on Hopper (on an A100 both run at
    /// FlashAttention-2's rate).
    pub flash_kernel: FlashKernel,
    pub accumulation: GradAccumulation,
    /// The data-parallel reduction overlapped with the backward.
    pub dp_overlap: bool,
    /// How the data-parallel ranks hold the state.
    pub shard: Shard,
    /// Sequence parallelism whenever `tp > 1`.
    pub sequence_parallel: bool,
    /// The schedules it runs, searched without `--layout`.
    pub search: &'static [&'static str],
    /// The schedule of a named layout.
    pub schedules: StackSchedules,
    /// Sequences per microbatch when a layout does not say.
    pub micro_batch: u64,
    /// Without a pipeline, a data rank's whole share of the batch in one
    /// microbatch (torchtitan's `local_batch_size`), not `micro_batch`.
    pub whole_batch_without_pipeline: bool,
    /// FP8 as Transformer Engine's recipe runs it (`--precision fp8`
    /// is refused on a stack without).
    pub te_fp8: bool,
    pub step: StepModel,
}

/// What Megatron-Core r0.8 runs; NeMo on it (`nemo-24`) changes the
/// optimizer.
const MEGATRON_CORE: Stack = Stack {
    name: "megatron-core",
    implies: "Megatron-Core r0.8 (2024): flash attention (cuDNN's through Transformer Engine on Hopper), accumulation fused, distributed optimizer with fp32 gradients, grad-reduce and param-gather overlapped, sequence parallel with tensor parallel, tp-comm-overlap, unfused fp32 loss, context parallel by a ring of K/V exchanges (p2p), FP8 by Transformer Engine's recipe, 1F1B (interleaved with vpp=), microbatch 1",
    source: "Megatron-LM README 'Training Speed and Scalability' (core r0.8): --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap; arguments.py: bf16 keeps fp32 main gradients; cross_entropy_loss_fusion off by default; Transformer Engine's attention, which prefers cuDNN's fused kernel over FlashAttention-2 on Hopper when both apply (NeMo's memory_optimizations.rst, NVIDIA/NeMo pull request 9188)",
    attention: Attention::Flash,
    flash_kernel: FlashKernel::Cudnn,
    accumulation: GradAccumulation::Fused,
    dp_overlap: true,
    shard: Shard::Zero1,
    sequence_parallel: true,
    search: &["1f1b", "interleaved"],
    schedules: ONE_F_ONE_B,
    micro_batch: 1,
    whole_batch_without_pipeline: false,
    te_fp8: true,
    step: MCORE_R08_STEP,
};

/// Every stack `--stack` knows.
pub const STACKS: [Stack; 4] = [
    Stack {
        name: "megatron-2021",
        implies: "Megatron-LM of SC21: attention unfused, accumulation unfused, fp16 gradients all-reduced after the backward, no sequence parallelism, 1F1B (interleaved with vpp=), microbatch 1, no context parallelism or FP8",
        source: "Narayanan et al. SC21; Megatron-LM 2021 (examples/pretrain_gpt3_175B.sh: --micro-batch-size 1; gradient accumulation fusion came 2022-02-13)",
        attention: Attention::Unfused,
        flash_kernel: FlashKernel::FlashAttention2,
        accumulation: GradAccumulation::Unfused,
        dp_overlap: false,
        shard: Shard::None,
        sequence_parallel: false,
        search: &["1f1b", "interleaved"],
        schedules: ONE_F_ONE_B,
        micro_batch: 1,
        whole_batch_without_pipeline: false,
        te_fp8: false,
        step: MEGATRON_2021_STEP,
    },
    MEGATRON_CORE,
    Stack {
        name: "nemo-24",
        implies: "NeMo 24.07-24.11 on Megatron-Core: megatron-core's choices with apex's distributed Adam (distributed_fused_adam): bf16 gradients reduce-scattered in bf16, master weights as 16-bit remainders (fp32 with fp8_params), fp32 moments, parameters all-gathered at the weights' width (FP8 weights in FP8) overlapped with the forward, 220 MiB buckets",
        source: "NeMo r2.0.0 megatron_base_model.py setup_optimization (param_sync_dtype = the model's, store_param_remainders unless fp8_params) and core/optim/distributed_adam.py (FP8 weights gathered as uint8); apex DistributedFusedAdam (_init_grad_buffer in grad_sync_dtype, reduce-scatter with ReduceOp.AVG, zero_grad); NeMo-Framework-Launcher 24.07 gpt3 yamls (distributed_fused_adam, bucket_cap_mb 220, overlap_grad_sync and overlap_param_sync true) and examples/training/*/h100/*fp8*.sh (+training.model.optim.grad_sync_dtype=bf16); dgxc-benchmarking v24.11.1 (grad_sync_dtype bf16)",
        step: StepModel {
            grad_bytes: 2,
            bucket_params: (NEMO_BUCKET_PARAMS, 0.0),
            // apex's `zero_grad` zeroes the whole buffer; its
            // reduce-scatter averages inside NCCL (`ReduceOp.AVG`) and
            // no NaN check reads the buffer.
            grad_buffer_passes: GRAD_ZEROING_PASSES,
            master_remainders: true,
            fp8_param_gather: true,
            ..MCORE_R08_STEP
        },
        ..MEGATRON_CORE
    },
    Stack {
        name: "torchtitan",
        implies: "torchtitan (2024-2025): FSDP2 (ZeRO-3), fp32 gradient reduction, flash attention (SDPA's flash backend: FlashAttention-2), sequence parallel with tensor parallel, collectives not overlapped with their GEMMs, PyTorch's loss, context parallel by all-gathers of K/V (context_parallel's allgather rotation), 1F1B (interleaved 1F1B with vpp=), pipeline microbatch 1, a data rank's whole batch at once without a pipeline",
        source: "torchtitan docs: FSDP2 with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), pipeline_parallel_schedule 1F1B, pipeline_parallel_microbatch_size 1; async TP off by default; attention through PyTorch's scaled_dot_product_attention, whose flash backend is FlashAttention-2 (PyTorch 2.2 release notes) and comes first among its backends",
        attention: Attention::Flash,
        flash_kernel: FlashKernel::FlashAttention2,
        accumulation: GradAccumulation::Fused,
        dp_overlap: true,
        shard: Shard::Zero3,
        sequence_parallel: true,
        search: &["1f1b", "interleaved", "zb-v", "interleaved-zb"],
        schedules: ONE_F_ONE_B,
        micro_batch: 1,
        whole_batch_without_pipeline: true,
        te_fp8: false,
        step: StepModel {
            param_gather_overlap: true,
            dp_sm_share: NCCL_OVERLAP_SM_SHARE,
            grad_bytes: 4,
            loss_bytes: TORCH_LOSS_BYTES,
            // `zero_grad` sets FSDP2's gradients to None (no zeroing
            // pass); its copy-in and division before each reduce-scatter
            // run per microbatch and are not counted here.
            grad_buffer_passes: 0.0,
            main_grad_hook: false,
            cp_comm: Some(CpComm::AllGather),
            selective_reruns_flash: false,
            ..MEGATRON_2021_STEP
        },
    },
];

impl Stack {
    /// The stack called `name`.
    pub fn by_name(name: &str) -> Option<&'static Stack> {
        STACKS.iter().find(|s| s.name.eq_ignore_ascii_case(name))
    }

    /// The names, for help and errors.
    pub fn names() -> Vec<&'static str> {
        STACKS.iter().map(|s| s.name).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::SCHEDULES;

    #[test]
    fn every_stack_names_known_schedules_and_is_found() {
        for s in &STACKS {
            assert_eq!(Stack::by_name(s.name).map(|x| x.name), Some(s.name));
            for name in s
                .search
                .iter()
                .chain([&s.schedules.plain, &s.schedules.interleaved])
            {
                assert!(
                    SCHEDULES.iter().any(|e| e.name == *name),
                    "{}: {name}",
                    s.name
                );
            }
            assert!(s.micro_batch >= 1 && !s.implies.is_empty() && !s.source.is_empty());
        }
        assert!(Stack::by_name("deepspeed-0.1").is_none());
    }

    /// NeMo's optimizer by apex's bytes; Megatron-Core's stays at 34.
    #[test]
    fn apex_adam_bytes_and_masters() {
        let nemo = Stack::by_name("nemo-24").unwrap().step;
        assert_eq!(
            (nemo.master_bytes(false), nemo.master_bytes(true)),
            (2.0, 4.0)
        );
        assert_eq!(
            (nemo.adam_bytes(false), nemo.adam_bytes(true)),
            (28.0, 33.0)
        );
        assert_eq!(nemo.grad_buffer_bytes(), 2.0);
        assert_eq!(nemo.bucket_params.0, 115_343_360.0);
        let mcore = Stack::by_name("megatron-core").unwrap().step;
        assert_eq!(mcore.adam_bytes(true), OPTIMIZER_BYTES_PER_PARAM);
        assert_eq!(mcore.master_bytes(false), 4.0);
    }
}
