//! Buffers that collectives read and write.

use super::{CommError, CommResult, DType, Element};

/// A buffer a communicator can move: host memory for CPU backends, device
/// memory for NCCL. The sweep code fills and checks buffers only through
/// this trait, so it is written once for every backend.
pub trait CommBuffer: Send {
    /// Size in bytes.
    fn len_bytes(&self) -> usize;
    /// Copies `src` into the start of the buffer.
    fn write_from_host(&mut self, src: &[u8]) -> CommResult<()>;
    /// Copies the start of the buffer into `dst`.
    fn read_to_host(&self, dst: &mut [u8]) -> CommResult<()>;
}

/// Host memory aligned for every [`DType`] (8 bytes), sized in bytes.
///
/// Backed by `u64` words so that typed views need no copy.
#[derive(Clone, Default)]
pub struct HostBuffer {
    words: Vec<u64>,
    len: usize,
}

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostBuffer({} bytes)", self.len)
    }
}

impl HostBuffer {
    /// A zeroed buffer of `bytes` bytes.
    pub fn zeroed(bytes: usize) -> Self {
        HostBuffer {
            words: vec![0u64; bytes.div_ceil(8)],
            len: bytes,
        }
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice<T: Element>(data: &[T]) -> Self {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let mut b = Self::zeroed(bytes.len());
        b.bytes_mut().copy_from_slice(bytes);
        b
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }

    /// The bytes, mutable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }

    /// A typed view; the length is truncated to whole elements.
    pub fn as_slice<T: Element>(&self) -> &[T] {
        let n = self.len / std::mem::size_of::<T>();
        &bytemuck::cast_slice(&self.words)[..n]
    }

    /// A typed mutable view; the length is truncated to whole elements.
    pub fn as_mut_slice<T: Element>(&mut self) -> &mut [T] {
        let n = self.len / std::mem::size_of::<T>();
        &mut bytemuck::cast_slice_mut(&mut self.words)[..n]
    }

    /// Number of whole `dtype` elements.
    pub fn count(&self, dtype: DType) -> usize {
        self.len / dtype.size()
    }
}

impl CommBuffer for HostBuffer {
    fn len_bytes(&self) -> usize {
        self.len
    }
    fn write_from_host(&mut self, src: &[u8]) -> CommResult<()> {
        let n = src.len().min(self.len);
        self.bytes_mut()[..n].copy_from_slice(&src[..n]);
        Ok(())
    }
    fn read_to_host(&self, dst: &mut [u8]) -> CommResult<()> {
        let n = dst.len().min(self.len);
        dst[..n].copy_from_slice(&self.bytes()[..n]);
        Ok(())
    }
}

/// `count x times` elements of `dtype` in bytes, or an error if that overflows.
pub(crate) fn nbytes(count: usize, times: usize, dtype: DType) -> CommResult<usize> {
    count
        .checked_mul(times)
        .and_then(|n| n.checked_mul(dtype.size()))
        .ok_or_else(|| {
            CommError::InvalidArgument(format!(
                "{count} x {times} elements of {dtype} overflow the address space"
            ))
        })
}

/// Fails unless `buf` holds at least `bytes` bytes.
pub(crate) fn need(buf: &HostBuffer, bytes: usize, what: &str) -> CommResult<()> {
    if buf.len_bytes() < bytes {
        return Err(CommError::InvalidArgument(format!(
            "{what} buffer holds {} bytes, the operation needs {bytes}",
            buf.len_bytes()
        )));
    }
    Ok(())
}
