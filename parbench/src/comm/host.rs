//! A [`super::Communicator`] made of a point-to-point [`super::Transport`] and the algorithms.

use super::{Algo, Transport};
use std::time::Duration;

/// The communicator of every CPU backend: a transport plus the algorithms in [`super::algo`].
pub struct HostComm<T: Transport> {
    pub(crate) transport: T,
    pub(crate) algo: Algo,
    pub(crate) timeout: Duration,
}

impl<T: Transport> HostComm<T> {
    /// A communicator over `transport`, choosing algorithms by `algo`, giving
    /// up on any wait after `timeout`.
    pub fn new(transport: T, algo: Algo, timeout: Duration) -> Self {
        HostComm {
            transport,
            algo,
            timeout,
        }
    }
}
