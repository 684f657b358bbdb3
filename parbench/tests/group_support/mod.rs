//! Shared by the sub-group and mesh tests (`groups.rs`, `mesh.rs`): the
//! one-value sum that tells which ranks a group holds.
#![allow(dead_code)]

use parbench::comm::{CommBuffer, CommResult, Communicator, DType, Io, ReduceOp};

/// all_reduce (sum) of `value` over `comm`, in place, as f64.
pub fn sum<C: Communicator>(comm: &mut C, value: f64) -> CommResult<f64> {
    let mut buf = comm.alloc(8)?;
    buf.write_from_host(&value.to_le_bytes())?;
    comm.all_reduce(Io::InPlace(&mut buf), 1, DType::F64, ReduceOp::Sum)?;
    comm.sync()?;
    let mut out = [0u8; 8];
    buf.read_to_host(&mut out)?;
    Ok(f64::from_le_bytes(out))
}
