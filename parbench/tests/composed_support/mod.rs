//! Shared by the composed-step tests (`composed`, `sharded`): the one small
//! transformer block they all run, so that both check the same model.
#![allow(dead_code)]

use parbench::layers::{BlockConfig, BlockShape, Mode};

/// A training block small enough for every dp x tp x pp split the tests run.
pub fn block(seq_parallel: bool) -> BlockConfig {
    BlockConfig {
        shape: BlockShape {
            hidden: 8,
            heads: 2,
            ffn: 16,
            seq: 4,
            batch: 1,
        },
        mode: Mode::Train,
        decode: false,
        seq_parallel,
    }
}
