//! The rendezvous store: a small key-value server on rank 0 at
//! `MASTER_ADDR:MASTER_PORT` where the ranks of one job leave and pick up
//! what they need to meet (data-listener addresses, the NCCL unique id).
//!
//! Wire format: every message is a frame, `u32` little-endian length then
//! that many bytes, at most [`MAX_FRAME`]. A connection opens with
//! `"PBSTORE2" + rank:u32 + token`; the server answers `OK` or closes. Then
//! requests: `P key_len:u16 key value` (answer `OK` or `ERR why`),
//! `G key_len:u16 key` (answer `V value` or `N` when the key is not set
//! yet; the client polls).
//!
//! Keeping the door open under a crowd:
//! - one thread serves every connection (`poll`), so a crowd costs no
//!   threads; at most [`MAX_PENDING`] connections may be waiting to present
//!   their token, each for at most [`HELLO_WINDOW`]; when that many wait, the
//!   oldest is dropped for the newcomer (a rank sends its greeting at once
//!   and is answered within milliseconds; an idle stranger is the one
//!   dropped), and a client whose greeting goes unanswered reconnects until
//!   its deadline;
//! - the server checks every length before it allocates and drops a
//!   connection that sends a wrong token, a malformed frame or an absurd
//!   length, without stopping serving the others;
//! - every key is set once; a key ending in `/N` is set only by rank N (a
//!   rank's address comes from that rank); the keys and values held are
//!   capped at [`MAX_STORED`] bytes.
//!
//! Where the port comes from: a launcher on this host (`--nprocs`, or any
//! parent that starts rank 0) may bind the port itself and hand rank 0 the
//! listening socket, its descriptor number in [`STORE_FD_VAR`]; rank 0
//! serves on that socket when it listens on the job's address. The port is
//! then held from the moment it is chosen, so no other process (a test
//! beside it, an outgoing connection given it as an ephemeral port) can
//! take it before rank 0 serves. Without the variable rank 0 binds
//! `MASTER_ADDR:MASTER_PORT` itself, as under torchrun or srun.
//!
//! The token keeps out processes that do not know it; under `--nprocs` it
//! is random per job. The fixed [`super::DEFAULT_TOKEN`] is no secret (a
//! process that used it would be taken for a rank), so `launch::ranks`
//! refuses to join a job by hand with it.

use super::{pollfd, RankInfo, RendezvousError};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The largest frame either side accepts: a value of 64 KiB plus its key.
pub const MAX_FRAME: usize = 64 * 1024 + 1024;
/// The largest key.
pub const MAX_KEY: usize = 512;
/// The largest token a greeting may carry.
pub const MAX_TOKEN: usize = 1024;
const HELLO: &[u8; 8] = b"PBSTORE2";
/// How long a new connection may take to present its token.
pub const HELLO_WINDOW: Duration = Duration::from_secs(3);
/// Connections waiting to present their token at once (see the module docs).
pub const MAX_PENDING: usize = 256;
/// Connections of ranks (token presented) served at once.
const MAX_RANK_CONNECTIONS: usize = 65_536 + 64;
/// Bytes of keys and values held at once.
pub const MAX_STORED: usize = 16 << 20;
/// How often the server looks at its stop flag.
const TICK: Duration = Duration::from_millis(100);
/// An answer a client does not read is not queued beyond this.
const MAX_QUEUED_OUT: usize = 4 * MAX_FRAME;

/// The variable that gives rank 0 the descriptor of the store's listening
/// socket, bound by the process that started it (see the module docs).
pub const STORE_FD_VAR: &str = "PARBENCH_STORE_FD";

/// Rank 0's store server; it serves until dropped.
pub struct StoreServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    serve: Option<JoinHandle<()>>,
}

impl StoreServer {
    /// Listens on `addr` (and nowhere else) for clients carrying `token`.
    pub fn bind(addr: SocketAddr, token: &str) -> io::Result<StoreServer> {
        super::raise_fd_limit();
        Self::serve(TcpListener::bind(addr)?, token)
    }

    /// Serves on `listener`, already bound, for clients carrying `token`.
    pub fn serve(listener: TcpListener, token: &str) -> io::Result<StoreServer> {
        super::raise_fd_limit();
        super::deepen_backlog(&listener);
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let server = Server {
            token: token.as_bytes().to_vec(),
            map: HashMap::new(),
            stored: 0,
        };
        let flag = stop.clone();
        let serve = std::thread::Builder::new()
            .name("parbench-store".into())
            .spawn(move || server.run(listener, &flag))?;
        Ok(StoreServer {
            addr,
            stop,
            serve: Some(serve),
        })
    }

    /// Where the server listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.serve.take() {
            let _ = t.join();
        }
    }
}

/// What the server holds.
struct Server {
    token: Vec<u8>,
    map: HashMap<Vec<u8>, Vec<u8>>,
    /// Bytes of keys and values in `map`.
    stored: usize,
}

/// One connection: bytes in, answers out, and whom it speaks for.
struct Conn {
    stream: TcpStream,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    /// `None` until the greeting: then the rank it named.
    rank: Option<u32>,
    /// Until when a connection without a greeting is kept.
    hello_by: Instant,
    /// Whether it sent any byte yet (silent ones are dropped first).
    heard: bool,
    close: bool,
}

impl Server {
    fn run(mut self, listener: TcpListener, stop: &AtomicBool) {
        let mut conns: Vec<Conn> = Vec::new();
        let mut fds: Vec<libc::pollfd> = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            fds.clear();
            fds.push(pollfd(listener.as_raw_fd(), libc::POLLIN));
            for c in &conns {
                let mut events = libc::POLLIN;
                if !c.out.is_empty() {
                    events |= libc::POLLOUT;
                }
                fds.push(pollfd(c.stream.as_raw_fd(), events));
            }
            let now = Instant::now();
            let wait = conns
                .iter()
                .filter(|c| c.rank.is_none())
                .map(|c| c.hello_by.saturating_duration_since(now))
                .fold(TICK, Duration::min);
            // SAFETY: `fds` is a valid array of fds.len() pollfds.
            unsafe {
                libc::poll(
                    fds.as_mut_ptr(),
                    fds.len() as libc::nfds_t,
                    wait.as_millis().max(1) as libc::c_int,
                )
            };
            for (c, p) in conns.iter_mut().zip(&fds[1..]) {
                if p.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0 {
                    self.read_from(c);
                }
                if p.revents & libc::POLLOUT != 0 || !c.out.is_empty() {
                    flush(c);
                }
            }
            let now = Instant::now();
            conns.retain(|c| !c.close && (c.rank.is_some() || now < c.hello_by));
            if fds[0].revents & libc::POLLIN != 0 {
                self.accept_all(&listener, &mut conns);
            }
        }
    }

    /// Takes every connection waiting in the backlog, making room among
    /// those that have not greeted (the oldest silent one goes first).
    fn accept_all(&mut self, listener: &TcpListener, conns: &mut Vec<Conn>) {
        loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let _ = stream.set_nodelay(true);
                    let pending = conns.iter().filter(|c| c.rank.is_none()).count();
                    if pending >= MAX_PENDING && !evict_one(conns) {
                        continue; // dropped: nothing could make room
                    }
                    if conns.len() >= MAX_PENDING + MAX_RANK_CONNECTIONS {
                        continue;
                    }
                    let mut c = Conn {
                        stream,
                        inbuf: Vec::new(),
                        out: Vec::new(),
                        rank: None,
                        hello_by: Instant::now() + HELLO_WINDOW,
                        heard: false,
                        close: false,
                    };
                    // A rank greets right after connecting: often its
                    // greeting is already here.
                    self.read_from(&mut c);
                    flush(&mut c);
                    if !c.close {
                        conns.push(c);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Out of descriptors: drop a waiting stranger and go on;
                // with none to drop, the connection waits in the backlog.
                Err(_) => {
                    if !evict_one(conns) {
                        return;
                    }
                }
            }
        }
    }

    fn read_from(&mut self, c: &mut Conn) {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match c.stream.read(&mut buf) {
                Ok(0) => {
                    c.close = true;
                    return;
                }
                Ok(n) => {
                    c.heard = true;
                    c.inbuf.extend_from_slice(&buf[..n]);
                    if let Err(()) = self.handle_frames(c) {
                        c.close = true;
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    c.close = true;
                    return;
                }
            }
        }
    }

    /// Answers every whole frame in `c.inbuf`; `Err` drops the connection.
    fn handle_frames(&mut self, c: &mut Conn) -> Result<(), ()> {
        loop {
            if c.inbuf.len() < 4 {
                return Ok(());
            }
            let n = u32::from_le_bytes([c.inbuf[0], c.inbuf[1], c.inbuf[2], c.inbuf[3]]) as usize;
            // Before the greeting only a greeting's length is taken.
            let limit = if c.rank.is_none() {
                HELLO.len() + 4 + MAX_TOKEN
            } else {
                MAX_FRAME
            };
            if n > limit {
                return Err(());
            }
            if c.inbuf.len() < 4 + n {
                return Ok(());
            }
            let frame: Vec<u8> = c.inbuf[4..4 + n].to_vec();
            c.inbuf.drain(..4 + n);
            let reply = match c.rank {
                None => match self.greet(&frame) {
                    Ok(rank) => {
                        c.rank = Some(rank);
                        b"OK".to_vec()
                    }
                    Err(Some(why)) => {
                        // Said once, then the connection is closed.
                        queue(c, why);
                        return Err(());
                    }
                    Err(None) => return Err(()),
                },
                Some(rank) => self.request(rank, &frame)?,
            };
            queue(c, &reply);
            if c.out.len() > MAX_QUEUED_OUT {
                return Err(());
            }
        }
    }

    /// Checks a greeting: the rank it names, or what to answer (if
    /// anything: a stranger that is no parbench client gets no answer).
    fn greet(&self, hello: &[u8]) -> Result<u32, Option<&'static [u8]>> {
        if hello.len() < HELLO.len() + 4 || &hello[..HELLO.len()] != HELLO {
            return Err(None);
        }
        let r = &hello[HELLO.len()..HELLO.len() + 4];
        let rank = u32::from_le_bytes([r[0], r[1], r[2], r[3]]);
        if !same_token(&hello[HELLO.len() + 4..], &self.token) {
            return Err(Some(b"ERR wrong job token"));
        }
        Ok(rank)
    }

    fn request(&mut self, rank: u32, req: &[u8]) -> Result<Vec<u8>, ()> {
        let (op, key, value) = parse_request(req).ok_or(())?;
        Ok(match op {
            b'P' => match self.put(rank, key, value) {
                Ok(()) => b"OK".to_vec(),
                Err(why) => format!("ERR {why}").into_bytes(),
            },
            b'G' => match self.map.get(key) {
                Some(v) => [b"V".as_slice(), v].concat(),
                None => b"N".to_vec(),
            },
            _ => return Err(()),
        })
    }

    fn put(&mut self, rank: u32, key: &[u8], value: &[u8]) -> Result<(), String> {
        let shown = String::from_utf8_lossy(key);
        if self.map.contains_key(key) {
            return Err(format!(
                "key '{shown}' is already set (every key is set once)"
            ));
        }
        if let Some(owner) = owner_of(key) {
            if owner != u64::from(rank) {
                return Err(format!(
                    "key '{shown}' belongs to rank {owner}, not to rank {rank}"
                ));
            }
        }
        let size = key.len() + value.len();
        if self.stored + size > MAX_STORED {
            return Err(format!("store full ({MAX_STORED} bytes held)"));
        }
        self.stored += size;
        self.map.insert(key.to_vec(), value.to_vec());
        Ok(())
    }
}

/// The rank a key belongs to: the number after its last `/`, if any.
fn owner_of(key: &[u8]) -> Option<u64> {
    let last = key.rsplit(|&b| b == b'/').next()?;
    if key.len() == last.len() || last.is_empty() || !last.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(last).ok()?.parse().ok()
}

/// Drops the oldest connection that has not greeted, a silent one first;
/// whether one was dropped.
fn evict_one(conns: &mut Vec<Conn>) -> bool {
    let oldest = |heard: bool| {
        conns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.rank.is_none() && c.heard == heard)
            .min_by_key(|(_, c)| c.hello_by)
            .map(|(i, _)| i)
    };
    match oldest(false).or_else(|| oldest(true)) {
        Some(i) => {
            conns.swap_remove(i);
            true
        }
        None => false,
    }
}

fn queue(c: &mut Conn, body: &[u8]) {
    c.out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    c.out.extend_from_slice(body);
}

fn flush(c: &mut Conn) {
    while !c.out.is_empty() {
        match c.stream.write(&c.out) {
            Ok(0) => {
                c.close = true;
                return;
            }
            Ok(n) => {
                c.out.drain(..n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => {
                c.close = true;
                return;
            }
        }
    }
}

fn parse_request(req: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    if req.len() < 3 {
        return None;
    }
    let op = req[0];
    let klen = u16::from_le_bytes([req[1], req[2]]) as usize;
    if klen > MAX_KEY || req.len() < 3 + klen {
        return None;
    }
    Some((op, &req[3..3 + klen], &req[3 + klen..]))
}

fn same_token(a: &[u8], b: &[u8]) -> bool {
    // Length, then every byte (no early exit on the first difference).
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// Reads one frame before `deadline`; `Ok(None)` on a clean close before
/// its first byte. The stream's read timeout (set by the caller) bounds
/// each read, so the deadline is honoured.
fn read_frame(s: &mut TcpStream, deadline: Instant) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    if !read_full(s, &mut len, deadline, true)? {
        return Ok(None);
    }
    let n = u32::from_le_bytes(len) as usize;
    if n > MAX_FRAME {
        return Err(bad("absurd frame length"));
    }
    let mut body = vec![0u8; n];
    read_full(s, &mut body, deadline, false)?;
    Ok(Some(body))
}

fn read_full(
    s: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
    eof_ok: bool,
) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        if Instant::now() >= deadline {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "too slow"));
        }
        match s.read(&mut buf[got..]) {
            Ok(0) if got == 0 && eof_ok => return Ok(false),
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "closed mid-frame",
                ))
            }
            Ok(n) => got += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

fn write_frame(s: &mut TcpStream, body: &[u8]) -> io::Result<()> {
    let mut msg = Vec::with_capacity(4 + body.len());
    msg.extend_from_slice(&(body.len() as u32).to_le_bytes());
    msg.extend_from_slice(body);
    s.write_all(&msg)
}

/// A connection to the job's store.
pub struct StoreClient {
    stream: TcpStream,
    addr: String,
    rank: usize,
}

impl StoreClient {
    /// Connects to the store at `addr` and presents `rank` and `token`,
    /// retrying until `deadline`: rank 0 may start later than the others,
    /// and a server under a crowd of strangers may drop a connection
    /// before its greeting is read. A refusal (a wrong token) is final.
    pub fn connect(
        addr: &str,
        token: &str,
        rank: usize,
        deadline: Instant,
    ) -> Result<StoreClient, RendezvousError> {
        let err = |detail: String| RendezvousError::Store {
            addr: addr.to_string(),
            detail,
        };
        if token.len() > MAX_TOKEN {
            return Err(err(format!("job token longer than {MAX_TOKEN} bytes")));
        }
        let rank32 = u32::try_from(rank).map_err(|_| err(format!("rank {rank} too large")))?;
        let hello = [HELLO.as_slice(), &rank32.to_le_bytes(), token.as_bytes()].concat();
        let start = Instant::now();
        let mut last;
        loop {
            last = match try_connect(addr, deadline) {
                Ok(stream) => {
                    let mut client = StoreClient {
                        stream,
                        addr: addr.to_string(),
                        rank,
                    };
                    // One greeting waits at most a few seconds: a dropped
                    // connection is retried, not waited on.
                    let by = deadline.min(Instant::now() + 2 * HELLO_WINDOW);
                    match client.exchange(&hello, by) {
                        Ok(Some(reply)) if reply == b"OK" => return Ok(client),
                        Ok(Some(reply)) => {
                            return Err(err(format!(
                                "refused: {}",
                                String::from_utf8_lossy(&reply)
                            )))
                        }
                        Ok(None) => "the store closed the connection at the greeting".into(),
                        Err(e) => format!("greeting: {e}"),
                    }
                }
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(RendezvousError::StoreTimeout {
                    rank,
                    what: format!("rank 0's store ({last})"),
                    addr: addr.to_string(),
                    after: start.elapsed(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sets `key` to `value` (at most 64 KiB) for every rank to read. Every
    /// key is set once; a key ending in `/N` only by rank N.
    pub fn put(
        &mut self,
        key: &str,
        value: &[u8],
        deadline: Instant,
    ) -> Result<(), RendezvousError> {
        let req = request(b'P', key, value).map_err(|d| self.err(d))?;
        let reply = self.call(&req, deadline, key, Instant::now())?;
        if reply != b"OK" {
            return Err(self.err(format!("put {key}: {}", String::from_utf8_lossy(&reply))));
        }
        Ok(())
    }

    /// Waits until `key` is set (by any rank), then returns its value.
    pub fn get(&mut self, key: &str, deadline: Instant) -> Result<Vec<u8>, RendezvousError> {
        let req = request(b'G', key, &[]).map_err(|d| self.err(d))?;
        let start = Instant::now();
        let mut pause = Duration::from_micros(200);
        loop {
            let reply = self.call(&req, deadline, &format!("key '{key}'"), start)?;
            match reply.split_first() {
                Some((b'V', v)) => return Ok(v.to_vec()),
                Some((b'N', [])) => {}
                _ => return Err(self.err(format!("get {key}: malformed answer"))),
            }
            if Instant::now() >= deadline {
                return Err(self.timeout(&format!("key '{key}'"), start));
            }
            std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    fn timeout(&self, what: &str, since: Instant) -> RendezvousError {
        RendezvousError::StoreTimeout {
            rank: self.rank,
            what: what.to_string(),
            addr: self.addr.clone(),
            after: since.elapsed(),
        }
    }

    /// Sends one frame and reads the answer before `deadline`; `Ok(None)`
    /// when the server closed the connection instead.
    fn exchange(&mut self, body: &[u8], deadline: Instant) -> io::Result<Option<Vec<u8>>> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "no time left"));
        }
        self.stream.set_nodelay(true)?;
        self.stream.set_write_timeout(Some(left))?;
        self.stream.set_read_timeout(Some(left.min(TICK)))?;
        write_frame(&mut self.stream, body)?;
        read_frame(&mut self.stream, deadline)
    }

    /// One request: its answer, or an error naming the wait (timed from
    /// `since`, the start of the whole wait, not of this request).
    fn call(
        &mut self,
        body: &[u8],
        deadline: Instant,
        what: &str,
        since: Instant,
    ) -> Result<Vec<u8>, RendezvousError> {
        match self.exchange(body, deadline) {
            Ok(Some(reply)) => Ok(reply),
            Ok(None) => {
                Err(self.err("rank 0's store closed the connection (rank 0 ended?)".into()))
            }
            Err(e) if e.kind() == io::ErrorKind::TimedOut => Err(self.timeout(what, since)),
            Err(e) => Err(self.err(format!("lost the store (rank 0): {e}"))),
        }
    }

    fn err(&self, detail: String) -> RendezvousError {
        RendezvousError::Store {
            addr: self.addr.clone(),
            detail,
        }
    }
}

/// One attempt to reach `addr` (every address it resolves to).
fn try_connect(addr: &str, deadline: Instant) -> Result<TcpStream, String> {
    let addrs = addr
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve: {e}"))?;
    let mut last = String::from("resolves to no address");
    for a in addrs {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        match TcpStream::connect_timeout(&a, left.min(Duration::from_secs(2))) {
            Ok(s) => return Ok(s),
            Err(e) => last = e.to_string(),
        }
    }
    Err(last)
}

fn request(op: u8, key: &str, value: &[u8]) -> Result<Vec<u8>, String> {
    if key.len() > MAX_KEY || 3 + key.len() + value.len() > MAX_FRAME {
        return Err(format!(
            "key '{key}' or its value is too large (key <= {MAX_KEY} B, value <= 64 KiB)"
        ));
    }
    let mut r = Vec::with_capacity(3 + key.len() + value.len());
    r.push(op);
    r.extend_from_slice(&(key.len() as u16).to_le_bytes());
    r.extend_from_slice(key.as_bytes());
    r.extend_from_slice(value);
    Ok(r)
}

/// A rank's handle on the job's store: rank 0 also serves it, for as long
/// as this handle lives (keep it until every rank has read what it needs;
/// a communicator built on it holds it for its own lifetime).
pub struct Store {
    client: StoreClient,
    _server: Option<StoreServer>,
}

impl Store {
    /// Joins the store of the job `info` describes; rank 0 starts it on
    /// `MASTER_ADDR:MASTER_PORT` (that address only). Gives up after `timeout`.
    pub fn join(info: &RankInfo, timeout: Duration) -> Result<Store, RendezvousError> {
        let deadline = Instant::now() + timeout;
        let addr = format!("{}:{}", bracket_v6(&info.master_addr), info.master_port);
        let server = if info.rank == 0 {
            Some(bind_first(&addr, &info.token)?)
        } else {
            None
        };
        let target = match &server {
            Some(s) => s.addr().to_string(),
            None => addr,
        };
        let client = StoreClient::connect(&target, &info.token, info.rank, deadline)?;
        Ok(Store {
            client,
            _server: server,
        })
    }

    /// Sets `key` to `value` (at most 64 KiB) for every rank to read.
    pub fn put(
        &mut self,
        key: &str,
        value: &[u8],
        deadline: Instant,
    ) -> Result<(), RendezvousError> {
        self.client.put(key, value, deadline)
    }

    /// Waits until `key` is set, then returns its value.
    pub fn get(&mut self, key: &str, deadline: Instant) -> Result<Vec<u8>, RendezvousError> {
        self.client.get(key, deadline)
    }

    /// The store's address as the ranks reach it.
    pub fn addr(&self) -> &str {
        &self.client.addr
    }
}

fn bracket_v6(host: &str) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

fn bind_first(addr: &str, token: &str) -> Result<StoreServer, RendezvousError> {
    let err = |detail: String| RendezvousError::Store {
        addr: addr.to_string(),
        detail,
    };
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| err(format!("cannot resolve MASTER_ADDR: {e}")))?
        .collect();
    if let Some(listener) = handed_listener(&addrs) {
        return StoreServer::serve(listener, token).map_err(|e| {
            err(format!(
                "rank 0 cannot serve on the socket its launcher bound: {e}"
            ))
        });
    }
    let mut last = String::from("MASTER_ADDR resolves to no address");
    for a in addrs {
        match StoreServer::bind(a, token) {
            Ok(s) => return Ok(s),
            Err(e) => last = format!("rank 0 cannot listen on {a}: {e} (is MASTER_ADDR this host's address and MASTER_PORT free?)"),
        }
    }
    Err(err(last))
}

/// The listening socket a launcher handed this process in [`STORE_FD_VAR`],
/// when it listens on one of `addrs`; taken at most once a process. A
/// descriptor that is no listening socket on those addresses is left open
/// and untouched (it is not this function's to close).
fn handed_listener(addrs: &[SocketAddr]) -> Option<TcpListener> {
    static TAKEN: AtomicBool = AtomicBool::new(false);
    let fd: RawFd = std::env::var(STORE_FD_VAR).ok()?.trim().parse().ok()?;
    if TAKEN.swap(true, Ordering::SeqCst) {
        return None;
    }
    listener_on(fd, addrs)
}

/// `fd` as a listener when it is a listening socket on one of `addrs`
/// (then owned by the listener); otherwise `None`, with `fd` left as it was.
fn listener_on(fd: RawFd, addrs: &[SocketAddr]) -> Option<TcpListener> {
    if fd <= 2 || !is_listening_socket(fd) {
        return None;
    }
    // SAFETY: `fd` is an open listening socket (checked above) that this
    // process inherited for this purpose and takes once (the caller's
    // TAKEN); if it is not on `addrs` it is given back unclosed below.
    let listener = unsafe { TcpListener::from_raw_fd(fd) };
    match listener.local_addr() {
        Ok(a) if addrs.contains(&a) => {
            // Rank 0's own children (none today) must not inherit it.
            // SAFETY: fcntl on a descriptor this process owns.
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
            Some(listener)
        }
        _ => {
            let _ = listener.into_raw_fd();
            None
        }
    }
}

/// Whether `fd` is an open socket in the listening state.
fn is_listening_socket(fd: RawFd) -> bool {
    let mut listening: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `listening`; on a
    // descriptor that is not an open socket it fails and writes nothing.
    let ok = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            (&mut listening as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    ok == 0 && listening == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> StoreServer {
        StoreServer::bind("127.0.0.1:0".parse().unwrap(), "tok").unwrap()
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    #[test]
    fn a_handed_descriptor_is_taken_only_as_a_listener_on_the_job_address() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = l.local_addr().unwrap();
        let elsewhere: SocketAddr = "127.0.0.1:1".parse().unwrap();
        // Not on the job's address: left open, still listening.
        assert!(listener_on(l.as_raw_fd(), &[elsewhere]).is_none());
        assert!(is_listening_socket(l.as_raw_fd()));
        // A file, a connected socket, a closed number: not taken.
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        assert!(listener_on(file.as_raw_fd(), &[at]).is_none());
        let conn = TcpStream::connect(at).unwrap();
        let conn_addr = conn.local_addr().unwrap();
        assert!(listener_on(conn.as_raw_fd(), &[conn_addr]).is_none());
        assert!(listener_on(1 << 20, &[at]).is_none());
        // On the job's address: served, and clients reach it.
        let taken = listener_on(l.into_raw_fd(), &[at]).unwrap();
        let s = StoreServer::serve(taken, "tok").unwrap();
        assert_eq!(s.addr(), at);
        let mut c = StoreClient::connect(&at.to_string(), "tok", 0, soon()).unwrap();
        c.put("k", b"v", soon()).unwrap();
        assert_eq!(c.get("k", soon()).unwrap(), b"v".to_vec());
    }

    #[test]
    fn put_then_get_across_clients() {
        let s = server();
        let addr = s.addr().to_string();
        let mut a = StoreClient::connect(&addr, "tok", 0, soon()).unwrap();
        let mut b = StoreClient::connect(&addr, "tok", 1, soon()).unwrap();
        let id = [7u8; 128];
        a.put("nccl/id", &id, soon()).unwrap();
        assert_eq!(b.get("nccl/id", soon()).unwrap(), id.to_vec());
        a.put("empty", &[], soon()).unwrap();
        assert_eq!(b.get("empty", soon()).unwrap(), Vec::<u8>::new());
        let missing = b
            .get("never", Instant::now() + Duration::from_millis(300))
            .unwrap_err();
        assert!(
            matches!(missing, RendezvousError::StoreTimeout { rank: 1, after, .. } if after >= Duration::from_millis(250)),
            "{missing}"
        );
        // The whole wait, not the last poll's: "after 300.x ms".
        assert!(missing.to_string().contains(" ms "), "{missing}");
        assert!(a.put("big", &vec![0u8; 70_000], soon()).is_err());
    }

    #[test]
    fn keys_are_set_once_and_a_rank_sets_only_its_own() {
        let s = server();
        let addr = s.addr().to_string();
        let mut r1 = StoreClient::connect(&addr, "tok", 1, soon()).unwrap();
        let mut other = StoreClient::connect(&addr, "tok", 2, soon()).unwrap();
        let e = other
            .put("parbench/tcp/addr/1", b"127.0.0.1:9", soon())
            .unwrap_err();
        assert!(e.to_string().contains("belongs to rank 1"), "{e}");
        r1.put("parbench/tcp/addr/1", b"127.0.0.1:5", soon())
            .unwrap();
        let e = r1
            .put("parbench/tcp/addr/1", b"127.0.0.1:6", soon())
            .unwrap_err();
        assert!(e.to_string().contains("already set"), "{e}");
        assert_eq!(
            other.get("parbench/tcp/addr/1", soon()).unwrap(),
            b"127.0.0.1:5"
        );
        assert_eq!(owner_of(b"nccl/host/12"), Some(12));
        assert_eq!(owner_of(b"nccl/unique_id"), None);
        assert_eq!(owner_of(b"7"), None);
    }

    #[test]
    fn the_store_holds_at_most_its_cap() {
        let s = server();
        let addr = s.addr().to_string();
        let mut c = StoreClient::connect(&addr, "tok", 0, soon()).unwrap();
        let value = vec![1u8; 64 * 1024];
        let mut kept = 0;
        let full = loop {
            match c.put(&format!("k{kept}"), &value, soon()) {
                Ok(()) => kept += 1,
                Err(e) => break e,
            }
            assert!(kept <= MAX_STORED / value.len(), "no cap");
        };
        assert!(full.to_string().contains("store full"), "{full}");
        assert_eq!(kept, MAX_STORED / (value.len() + 3));
        // Reads go on.
        assert_eq!(c.get("k0", soon()).unwrap(), value);
    }

    #[test]
    fn wrong_token_and_garbage_are_refused_and_the_store_lives_on() {
        let s = server();
        let addr = s.addr().to_string();
        let bad = StoreClient::connect(&addr, "other", 1, soon())
            .err()
            .unwrap();
        assert!(bad.to_string().contains("wrong job token"), "{bad}");
        for junk in [
            &u32::MAX.to_le_bytes()[..],                     // absurd length
            &[5, 0, 0, 0, b'x', b'y', b'z', b'z', b'y'][..], // wrong greeting
            b"GET / HTTP/1.1\r\n\r\n",
        ] {
            let mut raw = TcpStream::connect(&addr).unwrap();
            raw.write_all(junk).unwrap();
            raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut buf = [0u8; 16];
            // The server closes the connection (EOF or reset), nothing else.
            assert!(matches!(raw.read(&mut buf), Ok(0) | Err(_)));
        }
        let mut ok = StoreClient::connect(&addr, "tok", 0, soon()).unwrap();
        ok.put("k", b"v", soon()).unwrap();
        assert_eq!(ok.get("k", soon()).unwrap(), b"v");
    }

    #[test]
    fn a_crowd_of_idle_connections_does_not_keep_ranks_out() {
        let s = server();
        let addr = s.addr().to_string();
        // More silent strangers than may wait at once (and than the 1,024
        // threads the store once had), held open.
        let mut crowd = Vec::new();
        for _ in 0..1100 {
            match TcpStream::connect(&addr) {
                Ok(c) => crowd.push(c),
                Err(_) => break, // this process ran out of descriptors
            }
        }
        assert!(
            crowd.len() > MAX_PENDING,
            "only {} connections",
            crowd.len()
        );
        let t = Instant::now();
        let mut a = StoreClient::connect(&addr, "tok", 0, soon()).unwrap();
        let mut b = StoreClient::connect(&addr, "tok", 1, soon()).unwrap();
        a.put("x", b"1", soon()).unwrap();
        assert_eq!(b.get("x", soon()).unwrap(), b"1");
        assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
        // The strangers were dropped (or still wait), never answered.
        let mut buf = [0u8; 4];
        crowd[0]
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        assert!(!matches!(crowd[0].read(&mut buf), Ok(n) if n > 0));
    }
}
