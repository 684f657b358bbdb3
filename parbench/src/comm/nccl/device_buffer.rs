//! A GPU's memory as a communicator's buffer: what NCCL sends and
//! receives, and what the CUDA compute device computes in, one type.
//!
//! The impl lives here, with the backend that moves device memory, so that
//! `gpu` stays below `comm` and knows nothing of communicators.

use crate::comm::{CommBuffer, CommResult};
use crate::gpu::DeviceBuffer;

impl CommBuffer for DeviceBuffer {
    fn len_bytes(&self) -> usize {
        self.len()
    }
    fn write_from_host(&mut self, src: &[u8]) -> CommResult<()> {
        let n = src.len().min(self.len());
        Ok(self.upload_at(0, &src[..n])?)
    }
    fn read_to_host(&self, dst: &mut [u8]) -> CommResult<()> {
        let n = dst.len().min(self.len());
        Ok(self.download_at(0, &mut dst[..n])?)
    }
    fn copy_from(&mut self, src: &Self) -> CommResult<()> {
        Ok(self.copy_from_device(src)?)
    }
}
