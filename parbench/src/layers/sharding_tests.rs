//! The sharded block equals the unsharded one, for every mode and t = 1..4.

use super::*;
use crate::comm::{Communicator, DType};
use crate::compute::cpu::CpuCompute;
use crate::compute::Compute;

fn shape(heads: usize) -> BlockShape {
    BlockShape {
        hidden: 2 * heads * 4,
        heads,
        ffn: 2 * heads * 12,
        seq: 6,
        batch: 2,
    }
}

fn check(cfg: BlockConfig, tp: usize, dtype: DType, seed: u64, check_seed: u64) -> CheckReport {
    let reports = super::on_local_ranks(tp, |comm| {
        let dev = CpuCompute::new(dtype, 1).unwrap();
        let mut block = TpBlock::new(&dev, &cfg, tp, comm.rank(), seed).unwrap();
        let mut clock = PhaseClock::new();
        block.forward(&dev, comm, &mut clock).unwrap();
        if cfg.mode == Mode::Train {
            block.backward(&dev, comm, &mut clock).unwrap();
        }
        check_block(&dev, comm, &block, check_seed).unwrap()
    });
    for r in &reports[1..] {
        assert_eq!(r, &reports[0], "ranks disagree");
    }
    reports[0].clone()
}

fn assert_matches(cfg: BlockConfig, tp: usize, dtype: DType) {
    let r = check(cfg, tp, dtype, 7, 7);
    assert!(r.passed(), "{cfg:?} tp {tp} {dtype}: {:?}", r.tensors);
    let want = if cfg.mode == Mode::Train { 10 } else { 1 };
    assert_eq!(r.tensors.len(), want);
}

/// Every way a block runs: (mode, decode, sequence parallelism).
const MODES: [(Mode, bool, bool); 5] = [
    (Mode::Forward, false, false),
    (Mode::Forward, true, false),
    (Mode::Train, false, false),
    (Mode::Forward, false, true),
    (Mode::Train, false, true),
];

fn all_modes(heads: usize, tp: usize) {
    for (mode, decode, sp) in MODES {
        let cfg = BlockConfig {
            shape: shape(heads),
            mode,
            decode,
            seq_parallel: sp,
        };
        assert_matches(cfg, tp, DType::F32);
    }
}

#[test]
fn tp1_every_mode() {
    all_modes(4, 1);
}

#[test]
fn tp2_every_mode() {
    all_modes(4, 2);
}

#[test]
fn tp3_every_mode() {
    all_modes(6, 3);
}

#[test]
fn tp4_every_mode() {
    all_modes(4, 4);
}

#[test]
fn tp2_half_types_within_their_tolerance() {
    for dtype in [DType::F16, DType::BF16] {
        let cfg = BlockConfig {
            shape: shape(4),
            mode: Mode::Train,
            decode: false,
            seq_parallel: true,
        };
        assert_matches(cfg, 2, dtype);
    }
}

#[test]
fn the_check_catches_a_block_that_differs() {
    let cfg = BlockConfig {
        shape: shape(4),
        mode: Mode::Train,
        decode: false,
        seq_parallel: false,
    };
    let r = check(cfg, 2, DType::F32, 7, 8);
    assert!(!r.passed());
    assert!(r.tensors.iter().all(|(_, e)| *e > 1e-2), "{:?}", r.tensors);
}

/// Delegates to a communicator and counts the block's collective calls and
/// their nccl-tests sizes.
struct Counting<'a, M> {
    inner: &'a mut M,
    calls: Vec<(crate::comm::Collective, u64)>,
}

impl<M: Communicator> Communicator for Counting<'_, M> {
    type Buffer = M::Buffer;
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world(&self) -> usize {
        self.inner.world()
    }
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn wire(&self) -> String {
        self.inner.wire()
    }
    fn algo_for(&self, c: crate::comm::Collective, b: usize) -> String {
        self.inner.algo_for(c, b)
    }
    fn set_timeout(&mut self, t: std::time::Duration) {
        self.inner.set_timeout(t)
    }
    fn timeout(&self) -> std::time::Duration {
        self.inner.timeout()
    }
    fn alloc(&self, bytes: usize) -> crate::comm::CommResult<M::Buffer> {
        self.inner.alloc(bytes)
    }
    /// Every per-collective call lands here (the trait's defaults), so the
    /// count sees all of them under their nccl-tests size.
    fn collective(
        &mut self,
        coll: crate::comm::Collective,
        io: crate::comm::Io<'_, M::Buffer>,
        args: crate::comm::CollArgs,
    ) -> crate::comm::CommResult<()> {
        let size = coll.size_of(args.count, args.dtype.size(), self.world());
        self.calls.push((coll, size));
        self.inner.collective(coll, io, args)
    }
    fn send(
        &mut self,
        b: &M::Buffer,
        count: usize,
        dtype: DType,
        peer: usize,
    ) -> crate::comm::CommResult<()> {
        self.inner.send(b, count, dtype, peer)
    }
    fn recv(
        &mut self,
        b: &mut M::Buffer,
        count: usize,
        dtype: DType,
        peer: usize,
    ) -> crate::comm::CommResult<()> {
        self.inner.recv(b, count, dtype, peer)
    }
    fn send_recv(
        &mut self,
        s: &M::Buffer,
        to: usize,
        r: &mut M::Buffer,
        from: usize,
        count: usize,
        dtype: DType,
    ) -> crate::comm::CommResult<()> {
        self.inner.send_recv(s, to, r, from, count, dtype)
    }
    fn barrier(&mut self) -> crate::comm::CommResult<()> {
        self.inner.barrier()
    }
}

/// The block calls exactly the collectives, sizes and counts the model
/// charges it for (Megatron's 2 forward, 2 backward; doubled and split
/// into all-gather and reduce-scatter with sequence parallelism).
#[test]
fn the_block_calls_the_collectives_the_model_counts() {
    for tp in [1, 2] {
        for (mode, decode, sp) in MODES {
            let cfg = BlockConfig {
                shape: shape(4),
                mode,
                decode,
                seq_parallel: sp,
            };
            let traffic = cfg.tp_traffic(tp, DType::F32);
            let calls = super::on_local_ranks(tp, |comm| {
                let dev = CpuCompute::new(DType::F32, 1).unwrap();
                let mut block = TpBlock::new(&dev, &cfg, tp, comm.rank(), 1).unwrap();
                let mut counting = Counting {
                    inner: comm,
                    calls: Vec::new(),
                };
                let mut clock = PhaseClock::new();
                block.forward(&dev, &mut counting, &mut clock).unwrap();
                if mode == Mode::Train {
                    block.backward(&dev, &mut counting, &mut clock).unwrap();
                }
                counting.calls
            });
            let got = &calls[0];
            assert_eq!(
                got.len() as u64,
                traffic.calls_per_block(),
                "{cfg:?} tp {tp}"
            );
            for (coll, n) in traffic.collectives() {
                let made = got.iter().filter(|c| c.0 == coll).count() as u64;
                assert_eq!(made, n, "{coll} {cfg:?} tp {tp}");
            }
            assert!(
                got.iter().all(|c| c.1 == traffic.bytes_per_call()),
                "{got:?}"
            );
        }
    }
}

/// Every parameter gradient and the input gradient of `block`, on the host.
fn grads_of(dev: &CpuCompute, block: &TpBlock<CpuCompute>) -> Vec<Vec<f32>> {
    let mut out = grads_of_params(dev, block);
    let dx = block.input_grad().unwrap();
    let mut v = vec![0f32; dx.count(dev.dtype())];
    dev.download(dx, &mut v).unwrap();
    out.push(v);
    out
}

/// The backward split into its input-gradient and weight-gradient passes,
/// run on a microbatch's own state as a pipeline stage runs it, gives the
/// combined backward's gradients bit for bit, at t = 1 and 2, with and
/// without sequence parallelism; the input pass alone leaves every
/// parameter gradient at zero, and a second microbatch adds to them.
#[test]
fn split_backward_on_a_state_equals_the_combined_backward() {
    for (tp, seq_parallel) in [(1, false), (2, false), (2, true)] {
        let cfg = BlockConfig {
            shape: shape(2),
            mode: Mode::Train,
            decode: false,
            seq_parallel,
        };
        super::on_local_ranks(tp, |comm| {
            let dev = CpuCompute::new(DType::F32, 1).unwrap();
            let rank = comm.rank();
            let mut whole = TpBlock::new(&dev, &cfg, tp, rank, 5).unwrap();
            let mut clock = PhaseClock::new();
            whole.forward(&dev, comm, &mut clock).unwrap();
            whole.backward(&dev, comm, &mut clock).unwrap();
            let want = grads_of(&dev, &whole);

            let mut split = TpBlock::new(&dev, &cfg, tp, rank, 5).unwrap();
            split.zero_grads(&dev).unwrap();
            let ds = layout::DataSpecs::new(&cfg, tp);
            let upload = |v: Vec<f32>| {
                let mut b = dev.alloc(v.len()).unwrap();
                dev.upload(&v, &mut b).unwrap();
                b
            };
            let download = |b: &crate::comm::HostBuffer| {
                let mut v = vec![0f32; b.count(DType::F32)];
                dev.download(b, &mut v).unwrap();
                v
            };
            // One microbatch through the state API, as a stage runs it:
            // its output, the parameter gradients between the passes, and
            // its input gradient.
            let mut microbatch = |split: &mut TpBlock<CpuCompute>| {
                let x = upload(ds.x.shard_values(5, tp, rank));
                let dy = upload(ds.dy.shard_values(5, tp, rank));
                let mut st = split.new_state(&dev, x).unwrap();
                split
                    .forward_state(&dev, comm, &mut clock, &mut st)
                    .unwrap();
                let y = download(&st.take_output(&dev).unwrap());
                split
                    .backward_input_state(&dev, comm, &mut clock, &mut st, dy)
                    .unwrap();
                let between = grads_of_params(&dev, split);
                let dx = download(&st.take_input_grad(&dev).unwrap());
                split.backward_weight_state(&dev, &mut clock, &st).unwrap();
                (y, between, dx)
            };
            let (y, between, dx) = microbatch(&mut split);
            assert_eq!(&y, &download(whole.output()), "tp {tp}: forward output");
            assert!(
                between.iter().flatten().all(|&v| v == 0.0),
                "tp {tp}: the input pass touched a weight gradient"
            );
            let mut got = grads_of_params(&dev, &split);
            got.push(dx);
            assert_eq!(got, want, "tp {tp} sp {seq_parallel}");

            // A second microbatch (the same one) accumulates: twice the gradients.
            microbatch(&mut split);
            let twice = grads_of_params(&dev, &split);
            for (t, w) in twice.iter().zip(&want) {
                let doubled: Vec<f32> = w.iter().map(|v| 2.0 * v).collect();
                assert_eq!(t, &doubled, "tp {tp}: accumulation");
            }
        });
    }
}

fn grads_of_params(dev: &CpuCompute, block: &TpBlock<CpuCompute>) -> Vec<Vec<f32>> {
    block
        .param_grads()
        .unwrap()
        .all()
        .iter()
        .map(|b| {
            let mut v = vec![0f32; b.count(dev.dtype())];
            dev.download(b, &mut v).unwrap();
            v
        })
        .collect()
}
