//! Waiting for the stream within the deadline, aborting on any failure,
//! and what dropping a communicator does.

use super::{nccl_text, NcclComm};
use crate::comm::{CommError, CommResult};
use crate::gpu::GpuError;
use cudarc::nccl::sys;
use std::time::{Duration, Instant};

impl NcclComm {
    /// Waits for the stream until the deadline, watching NCCL's asynchronous
    /// error; aborts the communicator whenever the wait fails (timeout, NCCL
    /// error, CUDA error), so that no stuck kernel or proxy thread stays.
    pub(super) fn wait(&mut self, what: &'static str) -> CommResult<()> {
        self.live()?;
        if self.sizing {
            return Ok(());
        }
        let r = self.wait_for_stream(what);
        if let Err(e) = &r {
            self.abort(&e.to_string());
        }
        r
    }

    /// [`NcclComm::wait`] without the abort.
    pub(super) fn wait_for_stream(&mut self, what: &'static str) -> CommResult<()> {
        let deadline = Instant::now() + self.timeout;
        self.gpu.bind()?;
        let event = self
            .gpu
            .context()
            .new_event(None)
            .map_err(|e| GpuError::call("creating an event", e))?;
        event
            .record(self.gpu.stream())
            .map_err(|e| GpuError::call("recording an event", e))?;
        let start = Instant::now();
        loop {
            match event.try_is_complete() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => {
                    return Err(CommError::Device(format!(
                        "rank {}: {what}: {e}; communicator aborted",
                        self.rank
                    )))
                }
            }
            let mut async_err = sys::ncclResult_t::ncclSuccess;
            // SAFETY: live communicator, valid out-pointer.
            let r = unsafe { sys::ncclCommGetAsyncError(self.comm, &mut async_err) };
            let failed = [r, async_err].into_iter().find(|x| {
                !matches!(
                    x,
                    sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress
                )
            });
            if let Some(e) = failed {
                return Err(CommError::Device(format!(
                    "rank {}: {what}: NCCL reported {}; communicator aborted",
                    self.rank,
                    nccl_text(e)
                )));
            }
            let now = Instant::now();
            if now >= deadline {
                // NCCL does not say which peer is missing, so this is not a
                // CommError::Timeout (whose message names one peer).
                return Err(CommError::Device(format!(
                    "rank {}: NCCL {what} did not finish within {:?}; communicator aborted (NCCL cannot tell which rank is missing: rerun with NCCL_DEBUG=INFO, or look for the rank that failed first)",
                    self.rank, self.timeout
                )));
            }
            if now - start < Duration::from_millis(2) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// `ncclCommAbort`: stops this rank's NCCL kernels so the GPU is usable again.
    pub(super) fn abort(&mut self, why: &str) {
        if self.aborted.is_none() && !self.comm.is_null() {
            // SAFETY: live communicator, aborted once.
            unsafe {
                let _ = sys::ncclCommAbort(self.comm);
            }
            self.comm = std::ptr::null_mut();
        }
        self.aborted.get_or_insert_with(|| why.to_string());
    }
}

impl Drop for NcclComm {
    /// Finishes what was queued (within the deadline) so that buffers are
    /// not freed under running kernels, then destroys the communicator, or
    /// aborts it when anything failed: never leaves it (and NCCL's proxy
    /// threads) behind.
    fn drop(&mut self) {
        if self.comm.is_null() {
            return;
        }
        self.sizing = false;
        let flushed = self.flush().is_ok();
        let finished = self.wait("finishing before destroy").is_ok();
        match drop_action(self.comm.is_null(), flushed && finished) {
            DropAction::Nothing => {}
            DropAction::Destroy => {
                self.release_premul();
                // SAFETY: live communicator, destroyed once.
                unsafe {
                    let _ = sys::ncclCommDestroy(self.comm);
                }
                self.comm = std::ptr::null_mut();
            }
            DropAction::Abort => self.abort("dropped after a failed call"),
        }
    }
}

/// What dropping a communicator does to its NCCL handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum DropAction {
    /// Already aborted (the handle is gone).
    Nothing,
    /// Everything finished: `ncclCommDestroy`.
    Destroy,
    /// Something failed: `ncclCommAbort`.
    Abort,
}

pub(super) fn drop_action(aborted: bool, finished: bool) -> DropAction {
    match (aborted, finished) {
        (true, _) => DropAction::Nothing,
        (false, true) => DropAction::Destroy,
        (false, false) => DropAction::Abort,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_destroys_after_a_clean_finish_and_aborts_otherwise() {
        assert_eq!(drop_action(false, true), DropAction::Destroy);
        assert_eq!(drop_action(false, false), DropAction::Abort);
        assert_eq!(drop_action(true, false), DropAction::Nothing);
        assert_eq!(drop_action(true, true), DropAction::Nothing);
    }
}
