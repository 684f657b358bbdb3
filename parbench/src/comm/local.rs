//! Backend `local`: N ranks as threads of one process, exchanging through
//! shared memory — the CPU's stand-in for NVLink.
//!
//! Two paths carry a message from rank `s` to rank `d`:
//!
//! - **Rendezvous** ([`Transport::exchange`], the step of every algorithm):
//!   the sender posts a pointer to its own bytes in its slot, addressed to
//!   the receiver, which copies or reduces straight from them (single copy,
//!   no allocation, and only a handful of cache lines crossing between the
//!   cores: most of the 8-byte latency); the sender returns once the
//!   receiver marked the slot done. Each rank has at most one rendezvous
//!   outstanding, so one slot per rank suffices.
//! - **Eager** ([`Transport::send`]): the bytes are copied into a pooled
//!   buffer of the (s, d) pair's queue and `send` returns at once, so two
//!   ranks that send to each other at the same time never deadlock. Buffers
//!   return to the pair's pool after the receive, so steady traffic
//!   allocates nothing.
//!
//! Messages between a pair arrive in the order they were sent whichever path
//! they took: a receiver takes the pair's queued messages before the
//! sender's post, and they are all older than it, because a rank sends
//! nothing while its own post is outstanding.
//!
//! Waits spin briefly, then yield, then park until the peer wakes them (tests
//! run 8 ranks on 2 cores), and each checks the deadline and the world's abort flag: when
//! any rank fails, every other rank's wait returns [`CommError::PeerLost`]
//! naming the rank at fault.

use super::{Algo, CommError, CommResult, Exchange, HostComm, RecvInto, Transport};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// The communicator of the `local` backend.
pub type LocalComm = HostComm<LocalTransport>;

/// Runs `f` on `world` ranks, one scoped thread each (rank i = thread i), and
/// returns each rank's result in rank order.
///
/// When a rank returns an error or panics, the world is marked aborted and
/// every other rank's pending and later waits return [`CommError::PeerLost`]
/// naming it, promptly rather than at the deadline. A panic becomes that
/// rank's `PeerLost` error naming itself, with the panic message.
pub fn run<F, R>(world: usize, algo: Algo, timeout: Duration, f: F) -> Vec<CommResult<R>>
where
    F: Fn(&mut LocalComm) -> CommResult<R> + Sync,
    R: Send,
{
    let transports = LocalTransport::world(world);
    let run_rank = |t: LocalTransport| {
        let shared = Arc::clone(&t.shared);
        let rank = t.rank;
        let mut comm = HostComm::new(t, algo, timeout);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut comm)));
        match outcome {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                let culprit = match &e {
                    CommError::Timeout { peer, .. } | CommError::PeerLost { peer, .. } => *peer,
                    _ => rank,
                };
                shared.abort(culprit, &format!("rank {rank} failed: {e}"));
                Err(e)
            }
            Err(panic) => {
                let msg = panic_message(&panic);
                shared.abort(rank, &format!("rank {rank} panicked: {msg}"));
                Err(CommError::PeerLost {
                    rank,
                    peer: rank,
                    op: "run",
                    detail: format!("panicked: {msg}"),
                })
            }
        }
    };
    // The closure catches panics itself, so join fails only if catch_unwind
    // could not (a panic while panicking aborts anyway).
    thread_per_rank(transports, run_rank, |rank| CommError::PeerLost {
        rank,
        peer: rank,
        op: "run",
        detail: "thread could not be joined".into(),
    })
}

/// Runs `body` on one scoped thread per item (item `r` is rank `r`) and
/// returns what each returned, in rank order; a thread that cannot be
/// joined (it panicked) is `unjoined(rank)`.
pub(crate) fn thread_per_rank<I, R>(
    items: Vec<I>,
    body: impl Fn(I) -> CommResult<R> + Sync,
    unjoined: impl Fn(usize) -> CommError,
) -> Vec<CommResult<R>>
where
    I: Send,
    R: Send,
{
    let body = &body;
    std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .into_iter()
            .map(|item| scope.spawn(move || body(item)))
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| h.join().unwrap_or_else(|_| Err(unjoined(rank))))
            .collect()
    })
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".into()
    }
}

/// No rank has failed.
const NO_ABORT: usize = usize::MAX;

/// Rendezvous slot states.
const IDLE: u32 = 0;
/// Posted for the rank in `Slot::to`.
const POSTED: u32 = 1;
const TAKEN: u32 = 2;
const DONE: u32 = 3;
const CANCELLED: u32 = 4;

/// Keeps hot atomics of different ranks on different cache lines (two lines,
/// against the adjacent-line prefetcher).
#[repr(align(128))]
#[derive(Default)]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// The ordered channel from one rank to another.
#[derive(Default)]
struct Pair {
    /// Messages queued and not yet taken; read without the lock by the waiting receiver.
    pending: Padded<AtomicUsize>,
    /// Eager messages: owned copies of the bytes, oldest first.
    queue: Mutex<VecDeque<Vec<u8>>>,
    /// Eager buffers the receiver gave back, for the sender to reuse.
    pool: Mutex<Vec<Vec<u8>>>,
}

/// One rank's posted rendezvous: a pointer into its live `exchange` argument.
#[derive(Default)]
struct Slot {
    state: AtomicU32,
    ptr: AtomicPtr<u8>,
    len: AtomicUsize,
    /// The receiver of the post.
    to: AtomicUsize,
}

/// A rank that may be parked.
#[derive(Default)]
struct Sleeper {
    parked: AtomicBool,
    thread: Mutex<Option<std::thread::Thread>>,
}

/// What the ranks of one world share.
struct Shared {
    world: usize,
    /// `pairs[src * world + dst]`.
    pairs: Vec<Pair>,
    slots: Vec<Padded<Slot>>,
    /// Per rank: set while it is parked in a wait, so that whoever changes
    /// what it waits for unparks it.
    sleepers: Vec<Padded<Sleeper>>,
    /// Per rank: the peer it is blocked on (or [`NO_ABORT`] when it is not),
    /// left set when a wait fails, so that a timeout can follow the chain
    /// of blocked ranks to the one that holds everybody up.
    blocked_on: Vec<Padded<AtomicUsize>>,
    aborted: Padded<AtomicUsize>,
    abort_detail: Mutex<String>,
    /// How long a wait spins before it yields: when every rank has a core of
    /// its own, the peer is running and a few microseconds away, and handing
    /// the core to the scheduler would cost more than the wait (the 8-byte
    /// latency is this path); with more ranks than cores, spinning only
    /// delays the peer, so waits yield almost at once.
    spin_budget: Duration,
    /// The worlds duplicated from this one ([`Transport::duplicate`]), the
    /// n-th duplicate of every rank at index n.
    duplicates: Mutex<Vec<Arc<Shared>>>,
    /// The world this one duplicates: its abort ends this world's waits
    /// too (weak: the parent holds its duplicates).
    parent: Option<Weak<Shared>>,
}

/// See [`Shared::spin_budget`].
fn spin_budget(world: usize) -> Duration {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if world <= cores {
        Duration::from_micros(50)
    } else {
        Duration::ZERO
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks leaves the data consistent (every
    // critical section is a push or a pop), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn new(world: usize, parent: Option<Weak<Shared>>) -> Shared {
        Shared {
            world,
            pairs: (0..world * world).map(|_| Pair::default()).collect(),
            slots: (0..world).map(|_| Padded::default()).collect(),
            sleepers: (0..world).map(|_| Padded::default()).collect(),
            blocked_on: (0..world)
                .map(|_| Padded(AtomicUsize::new(NO_ABORT)))
                .collect(),
            aborted: Padded(AtomicUsize::new(NO_ABORT)),
            abort_detail: Mutex::new(String::new()),
            spin_budget: spin_budget(world),
            duplicates: Mutex::new(Vec::new()),
            parent,
        }
    }

    /// The `n`-th world duplicated from this one, made by the first rank
    /// that asks for it.
    fn duplicate(self: &Arc<Self>, n: usize) -> Arc<Shared> {
        let mut dups = lock(&self.duplicates);
        while dups.len() <= n {
            dups.push(Arc::new(Shared::new(
                self.world,
                Some(Arc::downgrade(self)),
            )));
        }
        Arc::clone(&dups[n])
    }

    fn pair(&self, src: usize, dst: usize) -> &Pair {
        &self.pairs[src * self.world + dst]
    }

    /// Marks the world failed because of `culprit`; the first call wins.
    fn abort(&self, culprit: usize, detail: &str) {
        let mut text = lock(&self.abort_detail);
        if self
            .aborted
            .compare_exchange(NO_ABORT, culprit, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            *text = detail.to_string();
        }
        drop(text);
        for r in 0..self.world {
            self.wake(r);
        }
    }

    /// The rank at the end of the chain of blocked ranks that starts at
    /// `peer`: the one everybody waits for (a rank in a cycle of waits, if
    /// the waits form one, which a correct algorithm never does).
    fn holdup(&self, peer: usize) -> usize {
        let mut r = peer;
        for _ in 0..self.world {
            match self.blocked_on.get(r).map(|b| b.load(Ordering::Acquire)) {
                Some(next) if next < self.world && next != r => r = next,
                _ => break,
            }
        }
        r
    }

    /// Unparks `rank` if it sleeps in a wait. Called after every change a
    /// rank may wait for (a message queued, a slot done, an abort); the
    /// SeqCst pair with [`LocalTransport::wait`] ensures that either the
    /// sleeper sees the change before parking or this call sees it parked.
    fn wake(&self, rank: usize) {
        let s = &self.sleepers[rank];
        if s.parked.load(Ordering::SeqCst) {
            if let Some(t) = lock(&s.thread).as_ref() {
                t.unpark();
            }
        }
    }

    fn abort_error(&self, rank: usize, op: &'static str) -> Option<CommError> {
        let culprit = self.aborted.load(Ordering::Acquire);
        if culprit == NO_ABORT {
            // A duplicate fails with the world it was made from.
            return self
                .parent
                .as_ref()
                .and_then(Weak::upgrade)
                .and_then(|p| p.abort_error(rank, op));
        }
        Some(CommError::PeerLost {
            rank,
            peer: culprit,
            op,
            detail: lock(&self.abort_detail).clone(),
        })
    }
}

/// The point-to-point core of one rank of the `local` backend.
pub struct LocalTransport {
    rank: usize,
    shared: Arc<Shared>,
    /// Duplicates this rank made so far: the next is world number this.
    duplicated: usize,
}

impl LocalTransport {
    /// The `world` connected transports of one world, rank i at index i,
    /// without running anything: hand each to its own thread (wrapped in
    /// [`HostComm::new`]) to build a world by hand; [`run`] does this for you.
    /// A rank whose thread fails should call [`LocalTransport::abort`] so the
    /// others stop waiting for it.
    pub fn world(world: usize) -> Vec<LocalTransport> {
        let shared = Arc::new(Shared::new(world, None));
        (0..world)
            .map(|rank| LocalTransport {
                rank,
                shared: Arc::clone(&shared),
                duplicated: 0,
            })
            .collect()
    }

    /// Marks the world failed because of `culprit`: every rank's waits then
    /// return [`CommError::PeerLost`] naming it. The first call wins.
    pub fn abort(&self, culprit: usize, detail: &str) {
        self.shared.abort(culprit, detail);
    }

    fn check_peer(&self, peer: usize) -> CommResult<()> {
        if peer >= self.shared.world {
            return Err(CommError::InvalidArgument(format!(
                "peer {peer} out of range for world {}",
                self.shared.world
            )));
        }
        Ok(())
    }

    fn check_abort(&self, op: &'static str) -> CommResult<()> {
        match self.shared.abort_error(self.rank, op) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Waits until `ready()` holds, giving up at `deadline` (naming `peer`)
    /// or when the world aborts: spins briefly (the peer is usually a step
    /// away), then yields (more ranks than cores), then parks until woken.
    fn wait(
        &self,
        peer: usize,
        op: &'static str,
        deadline: Instant,
        mut ready: impl FnMut() -> bool,
    ) -> CommResult<()> {
        const SPINS: u32 = 100;
        const YIELDS: u32 = 50;
        let mut i: u32 = 0;
        let mut started: Option<Instant> = None;
        let mut spin_start: Option<Instant> = None;
        loop {
            if ready() {
                if started.is_some() {
                    self.shared.blocked_on[self.rank].store(NO_ABORT, Ordering::Release);
                }
                return Ok(());
            }
            i = i.saturating_add(1);
            if i < SPINS {
                std::hint::spin_loop();
                continue;
            }
            if started.is_none() && !self.shared.spin_budget.is_zero() {
                let t0 = *spin_start.get_or_insert_with(Instant::now);
                if t0.elapsed()
                    < self
                        .shared
                        .spin_budget
                        .min(deadline.saturating_duration_since(t0))
                {
                    for _ in 0..SPINS {
                        std::hint::spin_loop();
                    }
                    continue;
                }
            }
            self.check_abort(op)?;
            let now = Instant::now();
            let start = *started.get_or_insert_with(|| {
                self.shared.blocked_on[self.rank].store(peer, Ordering::Release);
                now
            });
            if now >= deadline {
                let culprit = self.shared.holdup(peer);
                let e = CommError::Timeout {
                    rank: self.rank,
                    peer: culprit,
                    op,
                    after: now.saturating_duration_since(start),
                };
                let via = if culprit == peer {
                    String::new()
                } else {
                    format!(" (which waits, directly or not, for rank {culprit})")
                };
                let detail = format!("rank {} timed out waiting for rank {peer}{via}", self.rank);
                self.shared.abort(culprit, &detail);
                return Err(e);
            }
            if i < SPINS + YIELDS {
                std::thread::yield_now();
                continue;
            }
            let me = &self.shared.sleepers[self.rank];
            // The thread waiting now: a rank's communicator may move between
            // threads (a duplicate made on the compute thread, then used by
            // the data group's thread), and unparking the one that first
            // waited would leave this one to its nap's end.
            *lock(&me.thread) = Some(std::thread::current());
            me.parked.store(true, Ordering::SeqCst);
            if !ready() && self.shared.aborted.load(Ordering::SeqCst) == NO_ABORT {
                let nap = deadline
                    .saturating_duration_since(now)
                    .min(Duration::from_millis(20));
                std::thread::park_timeout(nap);
            }
            me.parked.store(false, Ordering::SeqCst);
        }
    }

    /// Queues `msg` on the channel to `peer`.
    fn push(&self, peer: usize, msg: Vec<u8>) {
        let pair = self.shared.pair(self.rank, peer);
        lock(&pair.queue).push_back(msg);
        pair.pending.fetch_add(1, Ordering::SeqCst);
        self.shared.wake(peer);
    }

    /// Posts `data` in this rank's slot for `peer`.
    fn post(&self, peer: usize, data: &[u8]) {
        let slot = &self.shared.slots[self.rank];
        slot.ptr.store(data.as_ptr() as *mut u8, Ordering::Relaxed);
        slot.len.store(data.len(), Ordering::Relaxed);
        slot.to.store(peer, Ordering::Relaxed);
        slot.state.store(POSTED, Ordering::SeqCst);
        self.shared.wake(peer);
    }

    /// Waits until `peer` has taken this rank's posted bytes.
    fn complete_post(&self, peer: usize, op: &'static str, deadline: Instant) -> CommResult<()> {
        let slot = &self.shared.slots[self.rank];
        let waited = self.wait(peer, op, deadline, || {
            slot.state.load(Ordering::Acquire) == DONE
        });
        match waited {
            Ok(()) => {
                slot.state.store(IDLE, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                self.retract();
                Err(e)
            }
        }
    }

    /// Withdraws this rank's post before its bytes go out of scope: if the
    /// receiver is reading them right now, waits for it (a bounded copy with
    /// no waits inside), so no one ever reads freed memory.
    fn retract(&self) {
        let slot = &self.shared.slots[self.rank];
        loop {
            match slot.state.load(Ordering::Acquire) {
                POSTED => {
                    if slot
                        .state
                        .compare_exchange(POSTED, CANCELLED, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        return;
                    }
                }
                TAKEN => {
                    std::hint::spin_loop();
                    std::thread::yield_now();
                }
                DONE => {
                    slot.state.store(IDLE, Ordering::Relaxed);
                    return;
                }
                _ => return,
            }
        }
    }

    /// Takes the next message from `peer` into `into`.
    fn take(
        &self,
        peer: usize,
        into: RecvInto<'_>,
        op: &'static str,
        deadline: Instant,
    ) -> CommResult<()> {
        let pair = self.shared.pair(peer, self.rank);
        let slot = &self.shared.slots[peer];
        let posted_for_me = || {
            slot.state.load(Ordering::Acquire) == POSTED
                && slot.to.load(Ordering::Relaxed) == self.rank
        };
        self.wait(peer, op, deadline, || {
            pair.pending.load(Ordering::Acquire) > 0 || posted_for_me()
        })?;
        // Queued messages are older than a post (see the module's notes).
        // The queue's counter is raised before a later post is published,
        // so seeing the post means seeing the count.
        if pair.pending.load(Ordering::Acquire) == 0 {
            return self.take_posted(peer, into, op);
        }
        let msg = lock(&pair.queue).pop_front();
        pair.pending.fetch_sub(1, Ordering::AcqRel);
        match msg {
            Some(bytes) => {
                let res = into.deliver(self.rank, peer, &bytes, "message of");
                let mut pool = lock(&pair.pool);
                if pool.len() < 64 {
                    pool.push(bytes);
                }
                res
            }
            None => Err(CommError::Protocol {
                rank: self.rank,
                peer,
                detail: "message counter and queue disagree".into(),
            }),
        }
    }

    /// Copies or reduces the bytes `peer` posted in its slot for this rank
    /// into `into`, then marks the slot done.
    fn take_posted(&self, peer: usize, into: RecvInto<'_>, op: &'static str) -> CommResult<()> {
        let slot = &self.shared.slots[peer];
        let withdrew = || {
            self.check_abort(op).err().unwrap_or(CommError::PeerLost {
                rank: self.rank,
                peer,
                op,
                detail: "peer withdrew its message".into(),
            })
        };
        if slot
            .state
            .compare_exchange(POSTED, TAKEN, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(withdrew());
        }
        if slot.to.load(Ordering::Acquire) != self.rank {
            // The post we saw was withdrawn and another, for another rank,
            // made in between: leave that one alone.
            slot.state.store(POSTED, Ordering::Release);
            return Err(withdrew());
        }
        let ptr = slot.ptr.load(Ordering::Relaxed);
        let len = slot.len.load(Ordering::Relaxed);
        // SAFETY: the sender stored a pointer to `len` live bytes of its
        // `exchange` argument before publishing the post (Release, read here
        // with Acquire); it keeps them borrowed and unmodified until it sees
        // DONE, which is stored only after the last read below, and its
        // retract waits while the state is TAKEN.
        let src = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
        let res = into.deliver(self.rank, peer, src, "message of");
        slot.state.store(DONE, Ordering::SeqCst);
        self.shared.wake(peer);
        res
    }

    /// Marks the world failed after an error in a transfer with `peer`
    /// (a no-op if a timeout or another rank already did), so that no rank
    /// goes on matching messages after a broken step.
    fn fail(&self, peer: usize, e: CommError) -> CommError {
        self.shared.abort(peer, &format!("rank {}: {e}", self.rank));
        e
    }
}

impl Transport for LocalTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.shared.world
    }

    fn backend(&self) -> &'static str {
        "local"
    }

    fn wire(&self) -> String {
        "shm".into()
    }

    /// Threads share the world's memory, so a duplicate is a new world of
    /// channels that every rank's n-th duplicate joins; nothing crosses.
    fn duplicate(&mut self, _deadline: Instant) -> CommResult<Option<Box<dyn Transport>>> {
        self.check_abort("duplicate")?;
        let shared = self.shared.duplicate(self.duplicated);
        self.duplicated += 1;
        Ok(Some(Box::new(LocalTransport {
            rank: self.rank,
            shared,
            duplicated: 0,
        })))
    }

    fn send(&mut self, peer: usize, data: &[u8], _deadline: Instant) -> CommResult<()> {
        self.check_peer(peer)?;
        self.check_abort("send")?;
        let pair = self.shared.pair(self.rank, peer);
        let mut bytes = lock(&pair.pool).pop().unwrap_or_default();
        bytes.clear();
        bytes.extend_from_slice(data);
        self.push(peer, bytes);
        Ok(())
    }

    fn recv(&mut self, peer: usize, into: RecvInto<'_>, deadline: Instant) -> CommResult<()> {
        self.check_peer(peer)?;
        self.check_abort("recv")?;
        self.take(peer, into, "recv", deadline)
            .map_err(|e| self.fail(peer, e))
    }

    fn exchange_step(&mut self, step: Exchange<'_>, deadline: Instant) -> CommResult<()> {
        let (to, data, from, into) = (step.to, step.data, step.from, step.into);
        self.check_peer(to)?;
        self.check_peer(from)?;
        self.check_abort("exchange")?;
        self.post(to, data);
        if let Err(e) = self.take(from, into, "exchange", deadline) {
            self.retract();
            return Err(self.fail(from, e));
        }
        self.complete_post(to, "exchange", deadline)
            .map_err(|e| self.fail(to, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(20)
    }

    fn recv_vec(t: &mut LocalTransport, peer: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        t.recv(peer, RecvInto::Copy(&mut v), soon()).unwrap();
        v
    }

    /// Eager sends and rendezvous from one rank arrive in the order they
    /// were made, whether or not eager messages are still queued at the post.
    #[test]
    fn eager_and_rendezvous_messages_keep_their_order() {
        let mut ts = LocalTransport::world(2);
        let mut t1 = ts.pop().unwrap();
        let mut t0 = ts.pop().unwrap();
        std::thread::scope(|s| {
            s.spawn(move || {
                for round in 0..200u8 {
                    // A post with an eager message still queued, then one without.
                    t0.send(1, &[round, 1], soon()).unwrap();
                    let mut got = [0u8; 2];
                    t0.exchange(1, &[round, 2], 1, RecvInto::Copy(&mut got), soon())
                        .unwrap();
                    assert_eq!(got, [round, 20]);
                    t0.exchange(1, &[round, 3], 1, RecvInto::Copy(&mut got), soon())
                        .unwrap();
                    assert_eq!(got, [round, 30]);
                }
            });
            s.spawn(move || {
                for round in 0..200u8 {
                    if round % 2 == 0 {
                        // Let rank 0 post before this rank looks.
                        std::thread::sleep(Duration::from_micros(50));
                    }
                    assert_eq!(recv_vec(&mut t1, 0, 2), [round, 1]);
                    let mut got = [0u8; 2];
                    t1.exchange(0, &[round, 20], 0, RecvInto::Copy(&mut got), soon())
                        .unwrap();
                    assert_eq!(got, [round, 2]);
                    t1.exchange(0, &[round, 30], 0, RecvInto::Copy(&mut got), soon())
                        .unwrap();
                    assert_eq!(got, [round, 3]);
                }
            });
        });
    }

    /// A rank waiting on a peer whose slot holds a post for another rank
    /// does not take it.
    #[test]
    fn a_post_goes_only_to_its_receiver() {
        let mut ts = LocalTransport::world(3);
        let mut t2 = ts.pop().unwrap();
        let mut t1 = ts.pop().unwrap();
        let mut t0 = ts.pop().unwrap();
        std::thread::scope(|s| {
            s.spawn(move || {
                // Posts for rank 1 while rank 2 already waits on rank 0.
                std::thread::sleep(Duration::from_millis(20));
                let mut got = [0u8; 1];
                t0.exchange(1, b"X", 1, RecvInto::Copy(&mut got), soon())
                    .unwrap();
                assert_eq!(&got, b"W");
                t0.send(2, b"V", soon()).unwrap();
            });
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(40));
                let mut got = [0u8; 1];
                t1.exchange(0, b"W", 0, RecvInto::Copy(&mut got), soon())
                    .unwrap();
                assert_eq!(&got, b"X");
            });
            s.spawn(move || {
                assert_eq!(recv_vec(&mut t2, 0, 1), b"V");
            });
        });
    }
}
