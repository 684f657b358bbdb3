//! Building the full mesh: every rank listens on one data port, publishes
//! it in the store, accepts the ranks below it and connects to the ranks
//! above it. Each connection opens with a handshake that carries the job
//! token and both ranks; anything else on the data port is dropped.
//!
//! A crowd on the data port does not keep the ranks out: one thread reads
//! every handshake (`poll`), at most [`MAX_PENDING`] connections wait for
//! theirs at once, each for at most [`HELLO_WINDOW`], and when that many
//! wait the oldest (a silent one first) is dropped for the newcomer. A
//! rank's connection that is dropped before its answer connects again
//! until the deadline.

use crate::comm::{CommError, CommResult};
use crate::rendezvous::{RankInfo, Store};
use std::io::{self, Read, Write};
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket,
};
use std::os::fd::AsRawFd;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

const MAGIC: &[u8; 8] = b"PBTCPv01";
const ACK: &[u8; 8] = b"PBTCPack";
/// Fixed part of the handshake: magic, world, from, to (u32 each), token length (u16).
const FIXED: usize = 8 + 4 + 4 + 4 + 2;
const MAX_TOKEN: usize = 1024;
/// How long a connection to the data port may take to identify itself.
pub const HELLO_WINDOW: Duration = Duration::from_secs(3);
/// Connections waiting to present their handshake at once (see the module docs).
pub const MAX_PENDING: usize = 256;

/// The store key under which `rank` publishes the data address of mesh
/// number `mesh` (0: the transport's own; n: its n-th duplicate).
fn addr_key(mesh: usize, rank: usize) -> String {
    match mesh {
        0 => format!("parbench/tcp/addr/{rank}"),
        n => format!("parbench/tcp/dup{n}/addr/{rank}"),
    }
}

/// Connects this rank to every other (mesh number `mesh`, see
/// [`addr_key`]); `streams[r]` is the connection to rank `r` (`None` for
/// this rank).
pub(super) fn build(
    info: &RankInfo,
    store: &mut Store,
    mesh: usize,
    deadline: Instant,
) -> CommResult<Vec<Option<TcpStream>>> {
    let (rank, world) = (info.rank, info.world);
    let start = Instant::now();
    let ip = data_ip(info)?;
    crate::rendezvous::raise_fd_limit();
    let listener = TcpListener::bind(SocketAddr::new(ip, 0))
        .map_err(|e| CommError::Setup(format!("rank {rank}: cannot listen on {ip}: {e}")))?;
    crate::rendezvous::deepen_backlog(&listener);
    let local = listener.local_addr()?;
    store.put(
        &addr_key(mesh, rank),
        local.to_string().as_bytes(),
        deadline,
    )?;

    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel::<(usize, TcpStream)>();
    let acceptor = {
        let (stop, token) = (stop.clone(), info.token.clone());
        std::thread::Builder::new()
            .name("parbench-tcp-accept".into())
            .spawn(move || accept_loop(listener, rank, world, token, stop, tx))?
    };
    let result = (|| {
        let mut streams: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
        for (peer, slot) in streams.iter_mut().enumerate().skip(rank + 1) {
            let raw = store.get(&addr_key(mesh, peer), deadline)?;
            let addr = std::str::from_utf8(&raw)
                .ok()
                .and_then(|s| SocketAddr::from_str(s).ok())
                .ok_or_else(|| CommError::Protocol {
                    rank,
                    peer,
                    detail: "published a data address that does not parse".into(),
                })?;
            *slot = Some(connect_to(info, peer, addr, deadline)?);
        }
        let mut missing = rank;
        while missing > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((from, s)) if streams[from].is_none() => {
                    streams[from] = Some(s);
                    missing -= 1;
                }
                Ok(_) => {} // a second connection claiming the same rank: ignored
                Err(_) => {
                    let peer = (0..rank).find(|&r| streams[r].is_none()).unwrap_or(0);
                    return Err(CommError::Timeout {
                        rank,
                        peer,
                        op: "connect",
                        after: start.elapsed(),
                    });
                }
            }
        }
        Ok(streams)
    })();
    stop.store(true, Ordering::SeqCst);
    let _ = acceptor.join();
    result
}

/// `PARBENCH_IFADDR`, when set: an IP address, or one line saying it is not.
pub(super) fn ifaddr_from_env() -> Result<Option<IpAddr>, String> {
    match std::env::var("PARBENCH_IFADDR")
        .ok()
        .filter(|v| !v.trim().is_empty())
    {
        Some(v) => IpAddr::from_str(v.trim())
            .map(Some)
            .map_err(|_| format!("PARBENCH_IFADDR={v:?} is not an IP address")),
        None => Ok(None),
    }
}

/// The address this rank's data listener binds: `PARBENCH_IFADDR` if set;
/// loopback when `MASTER_ADDR` is loopback; else the local address of the
/// route to `MASTER_ADDR` (the interface the other hosts can reach).
fn data_ip(info: &RankInfo) -> CommResult<IpAddr> {
    if let Some(ip) = ifaddr_from_env().map_err(CommError::Setup)? {
        return Ok(ip);
    }
    let master = (info.master_addr.as_str(), info.master_port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| {
            CommError::Setup(format!("cannot resolve MASTER_ADDR={}", info.master_addr))
        })?;
    if master.ip().is_loopback() {
        return Ok(master.ip());
    }
    let any = match master {
        SocketAddr::V4(_) => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
        SocketAddr::V6(_) => SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0),
    };
    // A connected UDP socket sends nothing; it only asks the kernel for the route.
    let route = UdpSocket::bind(any).and_then(|u| u.connect(master).and_then(|_| u.local_addr()));
    route.map(|a| a.ip()).map_err(|e| {
        CommError::Setup(format!(
            "rank {}: no route to MASTER_ADDR={} ({e}); set PARBENCH_IFADDR to this host's address",
            info.rank, info.master_addr
        ))
    })
}

fn handshake_bytes(info: &RankInfo, to: usize) -> Vec<u8> {
    let mut h = Vec::with_capacity(FIXED + info.token.len());
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&(info.world as u32).to_le_bytes());
    h.extend_from_slice(&(info.rank as u32).to_le_bytes());
    h.extend_from_slice(&(to as u32).to_le_bytes());
    h.extend_from_slice(&(info.token.len() as u16).to_le_bytes());
    h.extend_from_slice(info.token.as_bytes());
    h
}

/// Connects to `peer` at `addr` and completes the handshake, connecting
/// again (until `deadline`) when the peer's port drops the connection
/// before answering: under a crowd of strangers it drops the oldest
/// waiting connection, which may be ours.
fn connect_to(
    info: &RankInfo,
    peer: usize,
    addr: SocketAddr,
    deadline: Instant,
) -> CommResult<TcpStream> {
    let rank = info.rank;
    if info.token.len() > MAX_TOKEN {
        return Err(CommError::Setup(format!(
            "job token longer than {MAX_TOKEN} bytes"
        )));
    }
    let start = Instant::now();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(CommError::Timeout {
                rank,
                peer,
                op: "connect",
                after: start.elapsed(),
            });
        }
        match try_handshake(info, peer, addr, left.min(2 * HELLO_WINDOW)) {
            Ok(s) => return Ok(s),
            Err(Attempt::Final(e)) => return Err(e),
            Err(Attempt::Again(detail)) => {
                if Instant::now() + Duration::from_millis(20) >= deadline {
                    return Err(CommError::PeerLost {
                        rank,
                        peer,
                        op: "connect",
                        detail: format!(
                            "{detail} (for {})",
                            crate::error_line::duration_text(start.elapsed())
                        ),
                    });
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// Why one connection attempt failed: worth another, or not.
enum Attempt {
    Again(String),
    Final(CommError),
}

fn try_handshake(
    info: &RankInfo,
    peer: usize,
    addr: SocketAddr,
    within: Duration,
) -> Result<TcpStream, Attempt> {
    let again = |what: &str, e: io::Error| Attempt::Again(format!("{what} {addr}: {e}"));
    let mut s = TcpStream::connect_timeout(&addr, within).map_err(|e| again("connect to", e))?;
    let setup = |s: &TcpStream| {
        s.set_nodelay(true)?;
        s.set_write_timeout(Some(within))?;
        s.set_read_timeout(Some(within))
    };
    setup(&s).map_err(|e| Attempt::Final(e.into()))?;
    s.write_all(&handshake_bytes(info, peer))
        .map_err(|e| again("handshake with", e))?;
    let mut ack = [0u8; 12];
    s.read_exact(&mut ack).map_err(|e| {
        again(
            "no handshake answer (dropped, or another job on that port?) from",
            e,
        )
    })?;
    if &ack[..8] != ACK || u32::from_le_bytes([ack[8], ack[9], ack[10], ack[11]]) as usize != peer {
        return Err(Attempt::Final(CommError::Protocol {
            rank: info.rank,
            peer,
            detail: format!("bad handshake answer from {addr}"),
        }));
    }
    let clear = |s: &TcpStream| {
        s.set_read_timeout(None)?;
        s.set_write_timeout(None)
    };
    clear(&s).map_err(|e| Attempt::Final(e.into()))?;
    Ok(s)
}

/// A connection to the data port that has not completed its handshake.
struct Pending {
    stream: TcpStream,
    got: Vec<u8>,
    by: Instant,
}

fn accept_loop(
    listener: TcpListener,
    rank: usize,
    world: usize,
    token: String,
    stop: Arc<AtomicBool>,
    tx: mpsc::Sender<(usize, TcpStream)>,
) {
    if rank == 0 {
        return;
    }
    let _ = listener.set_nonblocking(true);
    let mut pending: Vec<Pending> = Vec::new();
    let mut fds: Vec<libc::pollfd> = Vec::new();
    let want = FIXED + token.len();
    while !stop.load(Ordering::SeqCst) {
        fds.clear();
        fds.push(super::pollfd(listener.as_raw_fd(), libc::POLLIN));
        fds.extend(
            pending
                .iter()
                .map(|p| super::pollfd(p.stream.as_raw_fd(), libc::POLLIN)),
        );
        // SAFETY: `fds` is a valid array of fds.len() pollfds.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 50) };
        let mut done: Vec<usize> = Vec::new();
        for (i, p) in pending.iter_mut().enumerate() {
            if fds[i + 1].revents != 0 {
                match read_hello(p, want, rank, world, &token) {
                    Hello::More => {}
                    Hello::Good(from) => {
                        if let Ok(s) = p.stream.try_clone() {
                            let _ = tx.send((from, s));
                        }
                        done.push(i);
                    }
                    Hello::Bad => done.push(i),
                }
            }
        }
        let now = Instant::now();
        let mut i = 0;
        pending.retain(|p| {
            let keep = !done.contains(&i) && now < p.by;
            i += 1;
            keep
        });
        if fds[0].revents & libc::POLLIN == 0 {
            continue;
        }
        loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let mut p = Pending {
                        stream,
                        got: Vec::with_capacity(want),
                        by: Instant::now() + HELLO_WINDOW,
                    };
                    // A rank sends its handshake right after connecting.
                    match read_hello(&mut p, want, rank, world, &token) {
                        Hello::Good(from) => {
                            let _ = tx.send((from, p.stream));
                            continue;
                        }
                        Hello::Bad => continue,
                        Hello::More => {}
                    }
                    if pending.len() >= MAX_PENDING {
                        drop_oldest(&mut pending);
                    }
                    pending.push(p);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Out of descriptors: make room, or let the backlog wait.
                Err(_) => {
                    if pending.is_empty() {
                        break;
                    }
                    drop_oldest(&mut pending);
                }
            }
        }
    }
}

/// Drops the oldest waiting connection, a silent one first.
fn drop_oldest(pending: &mut Vec<Pending>) {
    let oldest = |silent: bool| {
        pending
            .iter()
            .enumerate()
            .filter(|(_, p)| p.got.is_empty() == silent)
            .min_by_key(|(_, p)| p.by)
            .map(|(i, _)| i)
    };
    if let Some(i) = oldest(true).or_else(|| oldest(false)) {
        pending.swap_remove(i);
    }
}

enum Hello {
    /// Not all of it yet.
    More,
    /// A rank below this one, checked and answered.
    Good(usize),
    /// Anything else: the connection is dropped.
    Bad,
}

/// Reads what has arrived of a handshake (never more than a handshake's
/// length) and checks it once whole; answers a good one.
fn read_hello(p: &mut Pending, want: usize, rank: usize, world: usize, token: &str) -> Hello {
    let mut buf = [0u8; FIXED + MAX_TOKEN];
    loop {
        let need = want - p.got.len();
        if need == 0 {
            break;
        }
        match p.stream.read(&mut buf[..need]) {
            Ok(0) => return Hello::Bad,
            Ok(n) => {
                p.got.extend_from_slice(&buf[..n]);
                // The fixed part tells at once whether it is for this rank.
                if p.got.len() >= FIXED && p.got.len() - n < FIXED {
                    if let Err(()) = check_fixed(&p.got[..FIXED], rank, world, token.len()) {
                        return Hello::Bad;
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Hello::More,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Hello::Bad,
        }
    }
    let got = &p.got[FIXED..];
    if got
        .iter()
        .zip(token.as_bytes())
        .fold(0u8, |a, (x, y)| a | (x ^ y))
        != 0
    {
        return Hello::Bad;
    }
    let from = u32::from_le_bytes([p.got[12], p.got[13], p.got[14], p.got[15]]) as usize;
    let mut ack = [0u8; 12];
    ack[..8].copy_from_slice(ACK);
    ack[8..].copy_from_slice(&(rank as u32).to_le_bytes());
    // Twelve bytes into a new connection's empty send buffer: written
    // whole at once; the stream goes back to blocking for the transport.
    let answered = p.stream.set_nonblocking(false).is_ok()
        && p.stream
            .set_write_timeout(Some(HELLO_WINDOW))
            .and_then(|_| p.stream.write_all(&ack))
            .and_then(|_| p.stream.set_write_timeout(None))
            .is_ok();
    if answered {
        Hello::Good(from)
    } else {
        Hello::Bad
    }
}

/// Checks the fixed part of a handshake: this job's world, addressed to
/// this rank, from a rank below it, with a token of the right length.
fn check_fixed(fixed: &[u8], rank: usize, world: usize, token_len: usize) -> Result<(), ()> {
    let u32_at = |i: usize| {
        u32::from_le_bytes([fixed[i], fixed[i + 1], fixed[i + 2], fixed[i + 3]]) as usize
    };
    if &fixed[..8] != MAGIC {
        return Err(());
    }
    let (w, from, to) = (u32_at(8), u32_at(12), u32_at(16));
    let tlen = u16::from_le_bytes([fixed[20], fixed[21]]) as usize;
    if w != world || to != rank || from >= rank || tlen != token_len || tlen > MAX_TOKEN {
        return Err(());
    }
    Ok(())
}
