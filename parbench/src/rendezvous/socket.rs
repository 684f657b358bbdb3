//! The socket settings every listener of a job shares: the rendezvous
//! store's, the tcp mesh's, and their `poll(2)` entries.

/// Raises this process's soft limit on open files to its hard limit (at
/// most 65,536), once: a rank that serves the store or a data port holds a
/// descriptor per connection, and a crowd of strangers must not run it out
/// of them before the job's own ranks are in.
pub(crate) fn raise_fd_limit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: rlimit is plain data; getrlimit fills it, setrlimit reads it.
        unsafe {
            let mut l: libc::rlimit = std::mem::zeroed();
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 {
                let want = l.rlim_max.min(65_536);
                if l.rlim_cur < want {
                    l.rlim_cur = want;
                    let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &l);
                }
            }
        }
    });
}

/// Lets `listener` queue more connections than the standard library's
/// 128 (the kernel caps it at `net.core.somaxconn`), so that a burst of
/// connections does not refuse a rank before the accept loop takes them.
pub(crate) fn deepen_backlog(listener: &std::net::TcpListener) {
    use std::os::fd::AsRawFd;
    // SAFETY: listen(2) on a listening socket only changes its backlog.
    unsafe { libc::listen(listener.as_raw_fd(), 4096) };
}

/// A `poll(2)` entry waiting for `events` on `fd` (the sockets of the
/// transport, the mesh's listener and the rendezvous store all poll).
pub(crate) fn pollfd(fd: std::os::fd::RawFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}
