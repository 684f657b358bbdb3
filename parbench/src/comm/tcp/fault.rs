//! Faults: what failed with which peer, waiting for sockets within the
//! deadline, and telling the other peers (abort frames and hints).

use super::{
    control, decode, RecvOp, SendOp, TcpTransport, ABORT_GRACE, ABORT_LOST, ABORT_TIMEOUT, CONTROL,
    SUSPECT,
};
use crate::comm::CommError;
use std::time::{Duration, Instant};

/// Why the transport stopped working: every later call repeats it.
#[derive(Clone, Debug)]
pub(super) struct Failure {
    pub(super) peer: usize,
    pub(super) timeout: bool,
    pub(super) detail: String,
    /// How long this rank itself waited, when the timeout was its own
    /// deadline; `None` when another rank timed out and said so (this
    /// rank's call then did not time out, whatever it had waited).
    pub(super) waited: Option<Duration>,
}

/// What went wrong with one peer during a call.
pub(super) enum Fault {
    Lost {
        peer: usize,
        detail: String,
    },
    Protocol {
        peer: usize,
        detail: String,
    },
    /// `from` told us that `named` was lost or timed out.
    Remote {
        from: usize,
        named: usize,
        timeout: bool,
    },
}

impl TcpTransport {
    /// The error a call reports for a failure: a timeout only with the
    /// time this rank's own wait took, every later call repeating it.
    pub(super) fn failure_error(&self, f: &Failure, op: &'static str) -> CommError {
        if let (true, Some(after)) = (f.timeout, f.waited) {
            CommError::Timeout {
                rank: self.rank,
                peer: f.peer,
                op,
                after,
            }
        } else {
            CommError::PeerLost {
                rank: self.rank,
                peer: f.peer,
                op,
                detail: f.detail.clone(),
            }
        }
    }

    pub(super) fn follow_hints(&self, peer: usize) -> usize {
        follow_hints(&self.hints, self.rank, peer)
    }

    /// Writes a control frame naming `named` to every other peer whose
    /// outgoing stream is between frames (best effort, never blocks).
    pub(super) fn notify(&mut self, kind: u64, named: usize, pending: Option<&SendOp<'_>>) {
        let msg = control(kind, named);
        let mid_frame = pending.filter(|s| s.sent > 0 && !s.done()).map(|s| s.peer);
        for (r, p) in self.peers.iter_mut().enumerate() {
            if let Some(p) = p {
                if r != named && Some(r) != mid_frame {
                    p.try_write_whole(&msg);
                }
            }
        }
    }

    /// Sleeps until one of the call's sockets can move. Meanwhile it acts
    /// on abort notices from idle peers and, while a send is blocked, drains
    /// every other peer into its stash (the peer we send to may itself be
    /// blocked sending to us).
    pub(super) fn wait(
        &mut self,
        sending: Option<usize>,
        receiving: Option<usize>,
        deadline: Instant,
    ) -> Result<(), Fault> {
        for r in 0..self.peers.len() {
            // Every stream but the one being received is between frames.
            if Some(r) == receiving {
                continue;
            }
            let Some(p) = self.peers[r].as_mut() else {
                continue;
            };
            while let Some(len) = p.peek_unseen_header() {
                if len & CONTROL == 0 {
                    break;
                }
                p.skip_header();
                let (kind, named) = decode(len);
                if kind == SUSPECT {
                    self.hints[r] = Some(named);
                    continue;
                }
                return Err(Fault::Remote {
                    from: r,
                    named,
                    timeout: kind == ABORT_TIMEOUT,
                });
            }
        }
        self.pollfds.clear();
        for (r, p) in self.peers.iter().enumerate() {
            let Some(p) = p else { continue };
            let mut ev: libc::c_short = 0;
            if Some(r) == sending {
                ev |= libc::POLLOUT;
            }
            let partner = Some(r) == receiving;
            let drain = sending.is_some() && !p.drained_and_closed();
            let watch = !p.drained_and_closed() && !p.head_is_data();
            if partner || drain || watch {
                ev |= libc::POLLIN;
            }
            if ev != 0 {
                self.pollfds.push(super::pollfd(p.fd(), ev));
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = left.as_millis().clamp(1, 1000) as libc::c_int;
        // SAFETY: pollfds is a valid array of its length for the call.
        let rc = unsafe {
            libc::poll(
                self.pollfds.as_mut_ptr(),
                self.pollfds.len() as libc::nfds_t,
                ms,
            )
        };
        if rc <= 0 || sending.is_none() {
            return Ok(());
        }
        for i in 0..self.pollfds.len() {
            let pfd = self.pollfds[i];
            if pfd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) == 0 {
                continue;
            }
            let r = self
                .peers
                .iter()
                .position(|p| p.as_ref().is_some_and(|p| p.fd() == pfd.fd));
            if let Some(r) = r.filter(|&r| Some(r) != receiving) {
                // A close seen here surfaces when this peer is needed.
                let _ = self.peer_mut(r).drain();
            }
        }
        Ok(())
    }

    /// A peer that closed its connection may have told us why first: it
    /// failed on another rank, sent us an abort notice and exited. Before
    /// blaming it, read what it left in the socket and look for that notice
    /// (beyond the rest of the frame being received from it, if any).
    pub(super) fn explain_loss(&mut self, f: Fault, recv: Option<&RecvOp<'_>>) -> Fault {
        let Fault::Lost { peer, detail } = f else {
            return f;
        };
        let skip = match recv.filter(|r| r.peer == peer) {
            None => Some(0),
            Some(r) if r.checked => Some(r.into.len() - r.got),
            Some(r) if r.hdr_got == 0 => Some(0),
            Some(_) => None, // stopped inside a header: no frame boundary to start from
        };
        let notice = skip.and_then(|skip| self.peer_mut(peer).find_control(skip));
        match notice.map(decode) {
            Some((kind, named)) => Fault::Remote {
                from: peer,
                named,
                timeout: kind == ABORT_TIMEOUT,
            },
            None => Fault::Lost { peer, detail },
        }
    }

    /// Turns a fault into the call's error, tells every other peer (so that
    /// ranks waiting elsewhere fail at once naming the same rank), and marks
    /// the transport failed.
    pub(super) fn fail(
        &mut self,
        f: Fault,
        pending: Option<&mut SendOp<'_>>,
        recv: Option<&RecvOp<'_>>,
        op: &'static str,
    ) -> CommError {
        let f = self.explain_loss(f, recv);
        let (failure, err) = match f {
            Fault::Lost { peer, detail } => {
                let fl = Failure {
                    peer,
                    timeout: false,
                    detail,
                    waited: None,
                };
                let e = self.failure_error(&fl, op);
                (fl, e)
            }
            Fault::Protocol { peer, detail } => {
                let fl = Failure {
                    peer,
                    timeout: false,
                    detail: format!("protocol error: {detail}"),
                    waited: None,
                };
                (
                    fl,
                    CommError::Protocol {
                        rank: self.rank,
                        peer,
                        detail,
                    },
                )
            }
            Fault::Remote {
                from,
                named,
                timeout,
            } => {
                let detail = if timeout {
                    format!("rank {from} timed out waiting for it")
                } else {
                    format!("rank {from} lost it")
                };
                let fl = Failure {
                    peer: named,
                    timeout,
                    detail,
                    waited: None,
                };
                let e = self.failure_error(&fl, op);
                (fl, e)
            }
        };
        let skip = match &err {
            CommError::Protocol { peer, .. } => Some(*peer),
            _ => None,
        };
        self.abort_all(&failure, pending, skip);
        self.failed = Some(failure);
        err
    }

    /// Best effort: finishes the half-sent frame (briefly) so the stream
    /// stays on a frame boundary, then writes an abort notice naming the
    /// failed rank to every peer that can take it without blocking.
    pub(super) fn abort_all(
        &mut self,
        f: &Failure,
        pending: Option<&mut SendOp<'_>>,
        skip: Option<usize>,
    ) {
        if let Some(s) = pending {
            if !s.done() {
                let until = Instant::now() + ABORT_GRACE;
                while !s.done() && Instant::now() < until && s.peer != f.peer {
                    match self.advance_send(s) {
                        Ok(true) => {}
                        Ok(false) => std::thread::sleep(Duration::from_micros(100)),
                        Err(_) => break,
                    }
                }
                if !s.done() {
                    self.peer_mut(s.peer).out_dirty = true;
                }
            }
        }
        let kind = if f.timeout { ABORT_TIMEOUT } else { ABORT_LOST };
        let notice = control(kind, f.peer);
        for (r, p) in self.peers.iter_mut().enumerate() {
            if let Some(p) = p {
                if r != f.peer && Some(r) != skip {
                    p.try_write_whole(&notice);
                }
            }
        }
    }
}

/// The end of the chain of hints from `peer`: whom it waits for, whom that
/// one waits for, ... never `me`, and a cycle stops the walk.
pub(super) fn follow_hints(hints: &[Option<usize>], me: usize, peer: usize) -> usize {
    let mut cur = peer;
    for _ in 0..hints.len() {
        match hints.get(cur).copied().flatten() {
            Some(next) if next != me && next != cur => cur = next,
            _ => break,
        }
    }
    cur
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn hints_lead_to_the_rank_at_the_end_of_the_chain() {
        // 3 waits for 2, 2 waits for 1, 1 said nothing.
        let hints = [None, None, Some(1), Some(2)];
        assert_eq!(follow_hints(&hints, 0, 3), 1);
        assert_eq!(follow_hints(&hints, 0, 1), 1);
        // A chain never ends at the rank asking, and a cycle stops.
        assert_eq!(follow_hints(&[None, Some(0)], 0, 1), 1);
        assert_eq!(follow_hints(&[None, Some(2), Some(1)], 0, 1), 2);
    }
}
