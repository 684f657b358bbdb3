//! One connection to one peer: nonblocking vectored reads and writes, and
//! a stash for bytes read ahead of their receive (to keep two ranks that
//! send to each other at once from deadlocking on full socket buffers).

use crate::comm::copy_bytes;
use std::io;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};

/// How much one drain of an idle peer reads at most.
const DRAIN_CHUNK: usize = 1 << 20;

/// What one nonblocking read or write did.
pub(super) enum Step {
    /// Moved this many bytes (more than zero).
    Moved(usize),
    /// Nothing to move now.
    WouldBlock,
    /// The connection is gone (closed by the peer, reset, ...).
    Closed(String),
}

/// The connection to one peer.
pub(super) struct Peer {
    stream: TcpStream,
    fd: RawFd,
    /// Bytes read from the socket before a receive asked for them: the
    /// stream continues at `stash[stash_pos..]`, then the socket.
    stash: Vec<u8>,
    stash_pos: usize,
    /// The peer closed its end (seen while draining): once the stash is
    /// used up, reads report the loss.
    eof: bool,
    /// The outgoing stream ended mid-frame (an aborted send): nothing more
    /// may be written to it, not even an abort notice.
    pub(super) out_dirty: bool,
    /// The next frame is known to be data (not an abort notice): an idle
    /// peer in that state needs no watching until the frame is read.
    head_data: bool,
}

/// Which congestion control a data connection uses (`PARBENCH_TCP_CONGESTION`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Congestion {
    /// The system's, except on loopback: [`LOOPBACK_CONGESTION`] (the default).
    Auto,
    /// The system's everywhere (`system`).
    System,
    /// This one everywhere (a name the kernel knows and allows).
    Named(String),
}

/// Loopback's congestion control under [`Congestion::Auto`]: one that does
/// not pace. A pacing one (bbr, a common system default) sends segments
/// from a timer that fires on either core; on loopback the two cores then
/// deliver one stream's segments out of order, the receiver reports them
/// missing and the sender retransmits. Measured here with bbr: 129-688
/// retransmitted segments per 400 exchanges of 1-2 MiB each way, and each
/// exchange 2x slower than with reno or cubic (which retransmitted none).
/// There is no congestion on loopback for either to control; reno is built
/// into every Linux kernel and allowed to every user.
pub(super) const LOOPBACK_CONGESTION: &str = "reno";

impl Congestion {
    pub(super) fn parse(v: Option<&str>) -> Congestion {
        match v.map(str::trim) {
            None | Some("") | Some("auto") => Congestion::Auto,
            Some("system") => Congestion::System,
            Some(name) => Congestion::Named(name.to_string()),
        }
    }
}

impl Peer {
    pub(super) fn new(stream: TcpStream, congestion: &Congestion) -> io::Result<Peer> {
        stream.set_nonblocking(true)?;
        stream.set_nodelay(true)?;
        let fd = stream.as_raw_fd();
        match congestion {
            Congestion::System => {}
            Congestion::Auto => {
                let loopback = stream.peer_addr().is_ok_and(|a| a.ip().is_loopback());
                if loopback {
                    // Best effort: a kernel that refuses keeps its own.
                    let _ = set_congestion(fd, LOOPBACK_CONGESTION);
                }
            }
            Congestion::Named(name) => set_congestion(fd, name).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("PARBENCH_TCP_CONGESTION={name:?}: the kernel refused it: {e}"),
                )
            })?,
        }
        Ok(Peer {
            stream,
            fd,
            stash: Vec::new(),
            stash_pos: 0,
            eof: false,
            out_dirty: false,
            head_data: false,
        })
    }

    pub(super) fn fd(&self) -> RawFd {
        self.fd
    }

    /// Whether a read would find stashed bytes without touching the socket.
    pub(super) fn has_stash(&self) -> bool {
        self.stash_pos < self.stash.len()
    }

    /// Whether the peer is known to have closed and nothing is left to read.
    pub(super) fn drained_and_closed(&self) -> bool {
        self.eof && !self.has_stash()
    }

    /// Whether the next frame is known to be data.
    pub(super) fn head_is_data(&self) -> bool {
        self.head_data
    }

    /// Reads into `a` then `b` (either may be empty, not both), from the
    /// stash first, else from the socket.
    pub(super) fn read_into(&mut self, a: &mut [u8], b: &mut [u8]) -> Step {
        self.head_data = false;
        if self.has_stash() {
            let src = &self.stash[self.stash_pos..];
            let na = a.len().min(src.len());
            copy_bytes(&mut a[..na], &src[..na]);
            let nb = b.len().min(src.len() - na);
            copy_bytes(&mut b[..nb], &src[na..na + nb]);
            self.stash_pos += na + nb;
            if self.stash_pos == self.stash.len() {
                // Keep the capacity: the next drain reuses it.
                self.stash.clear();
                self.stash_pos = 0;
            }
            return Step::Moved(na + nb);
        }
        if self.eof {
            return Step::Closed("connection closed by the peer".into());
        }
        let (mut iov, first, cnt) = two_iovecs(a.as_mut_ptr(), a.len(), b.as_mut_ptr(), b.len());
        let ptr = iov[first..].as_mut_ptr();
        // SAFETY: the iovecs point into `a` and `b`, which outlive the call.
        let n = unsafe { libc::readv(self.fd, ptr, cnt) };
        match n {
            0 => {
                self.eof = true;
                Step::Closed("connection closed by the peer".into())
            }
            n if n > 0 => Step::Moved(n as usize),
            _ => os_error_step(),
        }
    }

    /// Writes `a` then `b` (either may be empty, not both) without blocking
    /// and without raising SIGPIPE on a closed connection.
    pub(super) fn write_from(&mut self, a: &[u8], b: &[u8]) -> Step {
        let (mut iov, first, cnt) = two_iovecs(
            a.as_ptr() as *mut u8,
            a.len(),
            b.as_ptr() as *mut u8,
            b.len(),
        );
        let ptr = iov[first..].as_mut_ptr();
        // SAFETY: zeroed msghdr is valid; iov points into `a` and `b`, which
        // outlive the call and are only read.
        let n = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = ptr;
            msg.msg_iovlen = cnt as _;
            libc::sendmsg(self.fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
        };
        if n > 0 {
            Step::Moved(n as usize)
        } else {
            os_error_step()
        }
    }

    /// Moves whatever the socket holds now into the stash (a peer that
    /// sends to us while we are blocked sending). End of stream is noted,
    /// not an error: the peer may simply be done.
    pub(super) fn drain(&mut self) -> Step {
        if self.eof {
            return Step::WouldBlock;
        }
        if self.stash_pos > 0 && self.stash_pos == self.stash.len() {
            self.stash.clear();
            self.stash_pos = 0;
        } else if self.stash_pos >= DRAIN_CHUNK && self.stash_pos * 2 >= self.stash.len() {
            // Mostly consumed: move the rest to the front instead of growing.
            self.stash.drain(..self.stash_pos);
            self.stash_pos = 0;
        }
        let old = self.stash.len();
        self.stash.reserve(DRAIN_CHUNK);
        // SAFETY: recv writes at most DRAIN_CHUNK bytes into the reserved,
        // unused capacity after `old`; the length then grows by what it wrote.
        let n = unsafe {
            libc::recv(
                self.fd,
                self.stash.as_mut_ptr().add(old).cast(),
                DRAIN_CHUNK,
                libc::MSG_DONTWAIT,
            )
        };
        let moved = if n > 0 { n as usize } else { 0 };
        // SAFETY: the first `moved` bytes after `old` were written by recv.
        unsafe { self.stash.set_len(old + moved) };
        match n {
            0 => {
                self.eof = true;
                Step::WouldBlock
            }
            n if n > 0 => Step::Moved(moved),
            _ => {
                let step = os_error_step();
                if let Step::Closed(_) = step {
                    // Reset or similar: as good as closed for this peer.
                    self.eof = true;
                }
                step
            }
        }
    }

    /// The next frame header of an idle peer, without consuming it, unless
    /// it was seen already (then `None`, as when no whole header is there).
    /// Only valid between frames, which an idle peer's stream always is.
    pub(super) fn peek_unseen_header(&mut self) -> Option<u64> {
        if self.head_data {
            return None;
        }
        if self.has_stash() && self.stash.len() - self.stash_pos < 8 {
            // A drain stopped inside a header: the rest is in the socket.
            let _ = self.drain();
        }
        let h = self.peek_header()?;
        let len = u64::from_le_bytes(h);
        self.head_data = len & (1 << 63) == 0;
        Some(len)
    }

    fn peek_header(&mut self) -> Option<[u8; 8]> {
        let mut h = [0u8; 8];
        if self.has_stash() {
            let src = &self.stash[self.stash_pos..];
            if src.len() >= 8 {
                h.copy_from_slice(&src[..8]);
                return Some(h);
            }
            return None;
        }
        if self.eof {
            return None;
        }
        // SAFETY: `h` is 8 writable bytes.
        let n = unsafe {
            libc::recv(
                self.fd,
                h.as_mut_ptr().cast(),
                8,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        match n {
            8 => Some(h),
            0 => {
                self.eof = true;
                None
            }
            _ => None,
        }
    }

    /// After the peer is gone: reads what it left in the socket and walks
    /// the frames, starting `skip` bytes in (the rest of a frame being
    /// received), for a control frame; returns its header. Data frames are
    /// skipped by their length, which is only compared, never allocated.
    pub(super) fn find_control(&mut self, skip: usize) -> Option<u64> {
        // The peer is gone, so what is left is bounded by its socket buffers.
        let mut budget = 256usize << 20;
        while budget > 0 {
            match self.drain() {
                Step::Moved(n) => budget = budget.saturating_sub(n),
                _ => break,
            }
        }
        let rest = self.stash.get(self.stash_pos..)?;
        let mut at = skip;
        while let Some(h) = rest.get(at..at.checked_add(8)?) {
            let len = u64::from_le_bytes(h.try_into().ok()?);
            if len & (1 << 63) != 0 {
                // Hints (kind 3) are not a verdict: look on for one.
                if (len >> 32) & 0xff != 3 {
                    return Some(len);
                }
                at = at.checked_add(8)?;
                continue;
            }
            at = at.checked_add(8)?.checked_add(usize::try_from(len).ok()?)?;
        }
        None
    }

    /// Puts `bytes` back in front of the incoming stream (bytes a vectored
    /// read took past a control frame). Rare: allocates.
    pub(super) fn unread(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let mut front = bytes.to_vec();
        front.extend_from_slice(&self.stash[self.stash_pos..]);
        self.stash = front;
        self.stash_pos = 0;
        self.head_data = false;
    }

    /// Consumes the 8 bytes [`Peer::peek_header`] returned.
    pub(super) fn skip_header(&mut self) {
        let mut h = [0u8; 8];
        let _ = self.read_into(&mut h, &mut []);
    }

    /// Best-effort write of a whole small message (an abort notice): never
    /// blocks; gives up if the socket buffer cannot take it at once.
    pub(super) fn try_write_whole(&mut self, msg: &[u8]) -> bool {
        if self.out_dirty {
            return false;
        }
        match self.write_from(msg, &[]) {
            Step::Moved(n) if n == msg.len() => true,
            Step::Moved(_) => {
                self.out_dirty = true;
                false
            }
            _ => false,
        }
    }

    /// Sets both socket buffers (only when asked: a set size turns off the
    /// kernel's autotuning, which usually does better on its own).
    pub(super) fn set_buffers(&self, bytes: usize) -> io::Result<()> {
        let v = bytes.min(i32::MAX as usize) as libc::c_int;
        for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
            // SAFETY: a valid fd and a c_int option value.
            let rc = unsafe {
                libc::setsockopt(
                    self.fd,
                    libc::SOL_SOCKET,
                    opt,
                    (&v as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// The connection's congestion control, as the kernel names it.
    pub(super) fn congestion(&self) -> Option<String> {
        let mut name = [0u8; 32];
        let mut len = name.len() as libc::socklen_t;
        // SAFETY: `name` is `len` writable bytes; the kernel writes at most that.
        let rc = unsafe {
            libc::getsockopt(
                self.fd,
                libc::IPPROTO_TCP,
                libc::TCP_CONGESTION,
                name.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return None;
        }
        let got = &name[..(len as usize).min(name.len())];
        let end = got.iter().position(|&b| b == 0).unwrap_or(got.len());
        Some(String::from_utf8_lossy(&got[..end]).into_owned())
    }

    /// Segments the kernel has retransmitted on this connection so far.
    pub(super) fn retransmits(&self) -> Option<u64> {
        // SAFETY: a zeroed tcp_info is valid; the kernel fills at most `len` bytes.
        unsafe {
            let mut info: libc::tcp_info = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
            let rc = libc::getsockopt(
                self.fd,
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&mut info as *mut libc::tcp_info).cast(),
                &mut len,
            );
            (rc == 0).then_some(u64::from(info.tcpi_total_retrans))
        }
    }

    /// Closes both directions now, so the peer sees the end at once.
    pub(super) fn shutdown(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// Sets `name` on the socket `fd`: what [`super::check_env`] tries first.
pub(super) fn try_congestion(fd: RawFd, name: &str) -> io::Result<()> {
    set_congestion(fd, name)
}

fn set_congestion(fd: RawFd, name: &str) -> io::Result<()> {
    // SAFETY: a valid fd and `name.len()` readable bytes.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_ptr().cast(),
            name.len() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `a` then `b` as the iovecs of one `readv`/`sendmsg`, with the index of
/// the first to pass and how many: an empty `a` is skipped and an empty
/// `b` left off (the kernel needs no zero-length entry).
fn two_iovecs(
    a: *mut u8,
    a_len: usize,
    b: *mut u8,
    b_len: usize,
) -> ([libc::iovec; 2], usize, libc::c_int) {
    let iov = [
        libc::iovec {
            iov_base: a.cast(),
            iov_len: a_len,
        },
        libc::iovec {
            iov_base: b.cast(),
            iov_len: b_len,
        },
    ];
    let (first, cnt) = match (a_len, b_len) {
        (0, _) => (1, 1),
        (_, 0) => (0, 1),
        _ => (0, 2),
    };
    (iov, first, cnt)
}

fn os_error_step() -> Step {
    let e = io::Error::last_os_error();
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Step::WouldBlock,
        _ => Step::Closed(e.to_string()),
    }
}
