//! The sharded block equals the unsharded one, for every mode and t = 1..4.

use super::*;
use crate::comm::{Communicator, DType};
use crate::compute::cpu::CpuCompute;

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
    let reports = fake_comm::run(tp, |comm| {
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

fn all_modes(heads: usize, tp: usize) {
    for (mode, decode, sp) in [
        (Mode::Forward, false, false),
        (Mode::Forward, true, false),
        (Mode::Train, false, false),
        (Mode::Forward, false, true),
        (Mode::Train, false, true),
    ] {
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
