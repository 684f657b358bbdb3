//! Buffers that collectives read and write.

use super::{CommError, CommResult, DType, Element};
use crate::comm::copy_bytes;
use std::alloc::Layout;
use std::ptr::NonNull;

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
    /// Copies the start of `src` (a buffer of the same communicator) into
    /// the start of this one, as far as the shorter reaches: a copy between
    /// two buffers placed alike, as a collective's own copies run.
    fn copy_from(&mut self, src: &Self) -> CommResult<()>
    where
        Self: Sized;
}

/// Host memory, sized in bytes, that starts [`HOST_BUFFER_OFFSET`] bytes
/// past a page boundary.
///
/// Every buffer sits at the same place within its pages, as OSU's and
/// Intel's MPI benchmarks place theirs. Left to the heap, how far apart a
/// copy's source and destination lie modulo 4 KiB changes from run to run,
/// and on some CPUs (AMD Zen's `rep movsb`, which glibc's `memcpy`, MPI's
/// shared-memory transport and the kernel's socket copies use) a distance
/// of a few bytes runs several times slower. Measured on this project's
/// 2-core AMD EPYC machines:
/// - Open MPI's shared-memory all_reduce at 1 MiB through the `mpi` backend
///   ran 3-4x slower with heap-placed buffers (16 bytes apart modulo 4 KiB)
///   than a C program with page-placed ones; it matches the C program now.
/// - `tcp` all_reduce at 64 MiB runs about 1.4x slower when the buffers
///   start within a few bytes of a page boundary (offsets 0, 8, 16, 4088)
///   than from 64 to 4032 bytes past it, where the kernel's socket copies
///   keep clear of the page offsets its own buffers use. Hence the offset.
pub struct HostBuffer {
    /// `HOST_BUFFER_OFFSET` bytes past the start of a page-aligned
    /// allocation of `cap` bytes; dangling (8-aligned) when `cap` is 0.
    ptr: NonNull<u8>,
    cap: usize,
    len: usize,
}

/// Where every [`HostBuffer`] starts within its first page: a multiple of
/// every [`DType`]'s size and of a cache line.
pub const HOST_BUFFER_OFFSET: usize = 256;
const PAGE: usize = 4096;

// SAFETY: HostBuffer owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for HostBuffer {}
// SAFETY: shared access only reads.
unsafe impl Sync for HostBuffer {}

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostBuffer({} bytes)", self.len)
    }
}

impl Default for HostBuffer {
    fn default() -> Self {
        Self::zeroed(0)
    }
}

impl Clone for HostBuffer {
    fn clone(&self) -> Self {
        let mut b = Self::zeroed(self.len);
        copy_bytes(b.bytes_mut(), self.bytes());
        b
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if self.cap > 0 {
            // SAFETY: allocated in `zeroed` with this layout, ptr moved
            // HOST_BUFFER_OFFSET bytes into it.
            unsafe {
                let base = self.ptr.as_ptr().sub(HOST_BUFFER_OFFSET);
                std::alloc::dealloc(base, Layout::from_size_align_unchecked(self.cap, PAGE));
            }
        }
    }
}

impl HostBuffer {
    /// A zeroed buffer of `bytes` bytes.
    ///
    /// Panics, as `Vec` does, only when `bytes` cannot be allocated at all.
    pub fn zeroed(bytes: usize) -> Self {
        if bytes == 0 {
            return HostBuffer {
                ptr: NonNull::<u64>::dangling().cast(),
                cap: 0,
                len: 0,
            };
        }
        let layout = bytes
            .checked_add(HOST_BUFFER_OFFSET)
            .and_then(|n| n.checked_next_multiple_of(PAGE))
            .and_then(|cap| Layout::from_size_align(cap, PAGE).ok())
            .unwrap_or_else(|| panic!("a host buffer of {bytes} bytes exceeds the address space"));
        // SAFETY: the layout has a non-zero size. Zeroed memory comes from
        // calloc/mmap, so large buffers are not touched until written.
        let base = unsafe { std::alloc::alloc_zeroed(layout) };
        if base.is_null() {
            std::alloc::handle_alloc_error(layout)
        }
        // SAFETY: HOST_BUFFER_OFFSET + bytes <= layout.size().
        let ptr = unsafe { NonNull::new_unchecked(base.add(HOST_BUFFER_OFFSET)) };
        HostBuffer {
            ptr,
            cap: layout.size(),
            len: bytes,
        }
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice<T: Element>(data: &[T]) -> Self {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let mut b = Self::zeroed(bytes.len());
        copy_bytes(b.bytes_mut(), bytes);
        b
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: ptr starts len initialised bytes inside the allocation (or
        // is dangling and aligned with len 0), owned by self for the borrow.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, borrowed exclusively.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// A typed view; the length is truncated to whole elements.
    pub fn as_slice<T: Element>(&self) -> &[T] {
        let n = self.len / std::mem::size_of::<T>();
        bytemuck::cast_slice(&self.bytes()[..n * std::mem::size_of::<T>()])
    }

    /// A typed mutable view; the length is truncated to whole elements.
    pub fn as_mut_slice<T: Element>(&mut self) -> &mut [T] {
        let n = self.len / std::mem::size_of::<T>();
        bytemuck::cast_slice_mut(&mut self.bytes_mut()[..n * std::mem::size_of::<T>()])
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
        copy_bytes(&mut self.bytes_mut()[..n], &src[..n]);
        Ok(())
    }
    fn read_to_host(&self, dst: &mut [u8]) -> CommResult<()> {
        let n = dst.len().min(self.len);
        copy_bytes(&mut dst[..n], &self.bytes()[..n]);
        Ok(())
    }
    fn copy_from(&mut self, src: &Self) -> CommResult<()> {
        let n = src.len.min(self.len);
        copy_bytes(&mut self.bytes_mut()[..n], &src.bytes()[..n]);
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
pub(crate) fn need(buf: &HostBuffer, bytes: usize, what: impl std::fmt::Display) -> CommResult<()> {
    if buf.len_bytes() < bytes {
        return Err(CommError::InvalidArgument(format!(
            "{what} buffer holds {} bytes, the operation needs {bytes}",
            buf.len_bytes()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_buffer_starts_at_the_same_place_in_a_page() {
        for bytes in [
            1,
            7,
            4096,
            4096 - HOST_BUFFER_OFFSET,
            1 << 20,
            (1 << 20) + 3,
        ] {
            let b = HostBuffer::zeroed(bytes);
            assert_eq!(
                b.bytes().as_ptr() as usize % PAGE,
                HOST_BUFFER_OFFSET,
                "{bytes} B"
            );
            assert_eq!(b.bytes().len(), bytes);
            assert!(b.bytes().iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn typed_views_clones_and_empty_buffers() {
        let b = HostBuffer::from_slice(&[1.5f64, -2.0, 3.25]);
        assert_eq!(b.as_slice::<f64>(), &[1.5, -2.0, 3.25]);
        assert_eq!(b.count(DType::F64), 3);
        let mut c = b.clone();
        c.as_mut_slice::<f64>()[1] = 7.0;
        assert_eq!(b.as_slice::<f64>()[1], -2.0);
        assert_eq!(c.as_slice::<f64>(), &[1.5, 7.0, 3.25]);
        // A view truncates to whole elements.
        let odd = HostBuffer::zeroed(10);
        assert_eq!(odd.as_slice::<i64>().len(), 1);
        let empty = HostBuffer::default();
        assert!(empty.bytes().is_empty());
        assert!(empty.as_slice::<f64>().is_empty());
        assert!(empty.clone().bytes().is_empty());
    }
}
