//! Building the full mesh: every rank listens on one data port, publishes
//! it in the store, accepts the ranks below it and connects to the ranks
//! above it. Each connection opens with a handshake that carries the job
//! token and both ranks; anything else on the data port is dropped.

use crate::comm::{CommError, CommResult};
use crate::launch::{RankInfo, Store};
use std::io::{self, Read, Write};
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket,
};
use std::os::fd::AsRawFd;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

const MAGIC: &[u8; 8] = b"PBTCPv01";
const ACK: &[u8; 8] = b"PBTCPack";
/// Fixed part of the handshake: magic, world, from, to (u32 each), token length (u16).
const FIXED: usize = 8 + 4 + 4 + 4 + 2;
const MAX_TOKEN: usize = 1024;
/// How long a connection to the data port may take to identify itself.
const HELLO_WINDOW: Duration = Duration::from_secs(5);
/// Handshakes checked at once; more connections are closed unread.
const MAX_PENDING: usize = 256;

/// The store key under which `rank` publishes its data address.
fn addr_key(rank: usize) -> String {
    format!("parbench/tcp/addr/{rank}")
}

/// Connects this rank to every other; `streams[r]` is the connection to
/// rank `r` (`None` for this rank).
pub(super) fn build(
    info: &RankInfo,
    store: &mut Store,
    deadline: Instant,
) -> CommResult<Vec<Option<TcpStream>>> {
    let (rank, world) = (info.rank, info.world);
    let start = Instant::now();
    let ip = data_ip(info)?;
    let listener = TcpListener::bind(SocketAddr::new(ip, 0))
        .map_err(|e| CommError::Setup(format!("rank {rank}: cannot listen on {ip}: {e}")))?;
    let local = listener.local_addr()?;
    store.put(&addr_key(rank), local.to_string().as_bytes(), deadline)?;

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
            let raw = store.get(&addr_key(peer), deadline)?;
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

/// The address this rank's data listener binds: `PARBENCH_IFADDR` if set;
/// loopback when `MASTER_ADDR` is loopback; else the local address of the
/// route to `MASTER_ADDR` (the interface the other hosts can reach).
fn data_ip(info: &RankInfo) -> CommResult<IpAddr> {
    if let Some(v) = std::env::var("PARBENCH_IFADDR")
        .ok()
        .filter(|v| !v.trim().is_empty())
    {
        return IpAddr::from_str(v.trim())
            .map_err(|_| CommError::Setup(format!("PARBENCH_IFADDR={v:?} is not an IP address")));
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

fn connect_to(
    info: &RankInfo,
    peer: usize,
    addr: SocketAddr,
    deadline: Instant,
) -> CommResult<TcpStream> {
    let rank = info.rank;
    let lost = |detail: String| CommError::PeerLost {
        rank,
        peer,
        op: "connect",
        detail,
    };
    if info.token.len() > MAX_TOKEN {
        return Err(CommError::Setup(format!(
            "job token longer than {MAX_TOKEN} bytes"
        )));
    }
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(CommError::Timeout {
            rank,
            peer,
            op: "connect",
            after: Duration::ZERO,
        });
    }
    let mut s = TcpStream::connect_timeout(&addr, left)
        .map_err(|e| lost(format!("connect to {addr}: {e}")))?;
    s.set_nodelay(true)?;
    s.set_write_timeout(Some(left))?;
    s.set_read_timeout(Some(left))?;
    s.write_all(&handshake_bytes(info, peer))
        .map_err(|e| lost(format!("handshake: {e}")))?;
    let mut ack = [0u8; 12];
    s.read_exact(&mut ack).map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => CommError::Timeout {
            rank,
            peer,
            op: "connect",
            after: left,
        },
        _ => lost(format!(
            "no handshake answer from {addr} (another job on that port?): {e}"
        )),
    })?;
    if &ack[..8] != ACK || u32::from_le_bytes([ack[8], ack[9], ack[10], ack[11]]) as usize != peer {
        return Err(CommError::Protocol {
            rank,
            peer,
            detail: format!("bad handshake answer from {addr}"),
        });
    }
    s.set_read_timeout(None)?;
    s.set_write_timeout(None)?;
    Ok(s)
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
    let pending = Arc::new(AtomicUsize::new(0));
    let token = Arc::new(token);
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((s, _)) => {
                if pending.load(Ordering::SeqCst) >= MAX_PENDING {
                    continue; // dropped unread
                }
                pending.fetch_add(1, Ordering::SeqCst);
                let (tx, token, count) = (tx.clone(), token.clone(), pending.clone());
                let spawned = std::thread::Builder::new()
                    .name("parbench-tcp-hello".into())
                    .spawn(move || {
                        if let Ok(from) = check_hello(&s, rank, world, &token) {
                            let _ = tx.send((from, s));
                        }
                        count.fetch_sub(1, Ordering::SeqCst);
                    });
                if spawned.is_err() {
                    pending.fetch_sub(1, Ordering::SeqCst);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let mut p = libc::pollfd {
                    fd: listener.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd for the duration of the call.
                unsafe { libc::poll(&mut p, 1, 50) };
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Reads and checks one handshake; answers it when it is good. Any bad
/// byte or a silence past [`HELLO_WINDOW`] ends the connection (the caller
/// drops it).
fn check_hello(mut s: &TcpStream, rank: usize, world: usize, token: &str) -> io::Result<usize> {
    let bad = |w: &str| io::Error::new(io::ErrorKind::InvalidData, w.to_string());
    s.set_read_timeout(Some(HELLO_WINDOW))?;
    s.set_write_timeout(Some(HELLO_WINDOW))?;
    let mut fixed = [0u8; FIXED];
    s.read_exact(&mut fixed)?;
    let u32_at = |i: usize| {
        u32::from_le_bytes([fixed[i], fixed[i + 1], fixed[i + 2], fixed[i + 3]]) as usize
    };
    if &fixed[..8] != MAGIC {
        return Err(bad("not a parbench rank"));
    }
    let (w, from, to) = (u32_at(8), u32_at(12), u32_at(16));
    let tlen = u16::from_le_bytes([fixed[20], fixed[21]]) as usize;
    if w != world || to != rank || from >= rank || tlen != token.len() || tlen > MAX_TOKEN {
        return Err(bad("handshake for another job or rank"));
    }
    let mut got = vec![0u8; tlen];
    s.read_exact(&mut got)?;
    if got
        .iter()
        .zip(token.as_bytes())
        .fold(0u8, |a, (x, y)| a | (x ^ y))
        != 0
    {
        return Err(bad("wrong job token"));
    }
    let mut ack = [0u8; 12];
    ack[..8].copy_from_slice(ACK);
    ack[8..].copy_from_slice(&(rank as u32).to_le_bytes());
    s.write_all(&ack)?;
    s.set_read_timeout(None)?;
    s.set_write_timeout(None)?;
    Ok(from)
}
