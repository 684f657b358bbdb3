//! The rendezvous store: a small key-value server on rank 0 at
//! `MASTER_ADDR:MASTER_PORT` where the ranks of one job leave and pick up
//! what they need to meet (data-listener addresses, the NCCL unique id).
//!
//! Wire format: every message is a frame, `u32` little-endian length then
//! that many bytes, at most [`MAX_FRAME`]. A connection opens with
//! `"PBSTORE1" + token`; the server answers `OK` or closes. Then requests:
//! `P key_len:u16 key value` (answer `OK`), `G key_len:u16 key` (answer
//! `V value` or `N` when the key is not set yet; the client polls).
//! The server checks every length before it allocates, drops a connection
//! that sends a wrong token, a malformed frame or an absurd length, and
//! never stops serving the others because of one.

use super::{LaunchError, RankInfo};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The largest frame either side accepts: a value of 64 KiB plus its key.
pub const MAX_FRAME: usize = 64 * 1024 + 1024;
/// The largest key.
pub const MAX_KEY: usize = 512;
const HELLO: &[u8; 8] = b"PBSTORE1";
/// How long a new connection may take to present its token.
const HELLO_WINDOW: Duration = Duration::from_secs(5);
/// How often blocked server threads look at the stop flag.
const TICK: Duration = Duration::from_millis(100);
/// Connections served at once; more are closed at once (a flood of strays
/// must not exhaust threads).
const MAX_CONNECTIONS: usize = 1024;
/// Keys kept at once.
const MAX_KEYS: usize = 1 << 16;

/// Rank 0's store server; it serves until dropped.
pub struct StoreServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

struct Shared {
    token: Vec<u8>,
    map: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
    stop: Arc<AtomicBool>,
    live: AtomicUsize,
}

impl StoreServer {
    /// Listens on `addr` (and nowhere else) for clients carrying `token`.
    pub fn bind(addr: SocketAddr, token: &str) -> io::Result<StoreServer> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared {
            token: token.as_bytes().to_vec(),
            map: Mutex::new(HashMap::new()),
            stop: stop.clone(),
            live: AtomicUsize::new(0),
        });
        let accept = std::thread::Builder::new()
            .name("parbench-store".into())
            .spawn(move || accept_loop(listener, shared))?;
        Ok(StoreServer {
            addr,
            stop,
            accept: Some(accept),
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
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    while !shared.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                if shared.live.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
                    continue; // dropped: closes the connection
                }
                shared.live.fetch_add(1, Ordering::SeqCst);
                let s = shared.clone();
                let spawned = std::thread::Builder::new()
                    .name("parbench-store-conn".into())
                    .spawn(move || {
                        // A bad client only ends its own connection.
                        let _ = serve(stream, &s);
                        s.live.fetch_sub(1, Ordering::SeqCst);
                    });
                if spawned.is_err() {
                    shared.live.fetch_sub(1, Ordering::SeqCst);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_readable(&listener, TICK),
            Err(_) => std::thread::sleep(TICK), // e.g. EMFILE: back off, keep serving
        }
    }
}

fn wait_readable(l: &TcpListener, timeout: Duration) {
    let mut p = libc::pollfd {
        fd: l.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut p, 1, timeout.as_millis() as libc::c_int) };
}

fn serve(mut stream: TcpStream, shared: &Shared) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(TICK))?;
    let hello = read_frame(
        &mut stream,
        Some(Instant::now() + HELLO_WINDOW),
        &shared.stop,
    )?;
    let Some(hello) = hello else { return Ok(()) };
    if hello.len() < HELLO.len() || &hello[..HELLO.len()] != HELLO {
        return Err(bad("not a parbench store client"));
    }
    if !same_token(&hello[HELLO.len()..], &shared.token) {
        let _ = write_frame(&mut stream, b"ERR wrong job token");
        return Err(bad("wrong job token"));
    }
    write_frame(&mut stream, b"OK")?;
    while let Some(req) = read_frame(&mut stream, None, &shared.stop)? {
        let (op, key, value) = parse_request(&req)?;
        match op {
            b'P' => {
                let mut map = shared.map.lock().map_err(|_| bad("store poisoned"))?;
                if map.len() >= MAX_KEYS && !map.contains_key(key) {
                    drop(map);
                    write_frame(&mut stream, b"ERR store full")?;
                    continue;
                }
                map.insert(key.to_vec(), value.to_vec());
                drop(map);
                write_frame(&mut stream, b"OK")?;
            }
            b'G' => {
                let map = shared.map.lock().map_err(|_| bad("store poisoned"))?;
                let reply = match map.get(key) {
                    Some(v) => [b"V".as_slice(), v].concat(),
                    None => b"N".to_vec(),
                };
                drop(map);
                write_frame(&mut stream, &reply)?;
            }
            _ => return Err(bad("unknown request")),
        }
    }
    Ok(())
}

fn parse_request(req: &[u8]) -> io::Result<(u8, &[u8], &[u8])> {
    if req.len() < 3 {
        return Err(bad("short request"));
    }
    let op = req[0];
    let klen = u16::from_le_bytes([req[1], req[2]]) as usize;
    if klen > MAX_KEY || req.len() < 3 + klen {
        return Err(bad("bad key length"));
    }
    Ok((op, &req[3..3 + klen], &req[3 + klen..]))
}

fn same_token(a: &[u8], b: &[u8]) -> bool {
    // Length, then every byte (no early exit on the first difference).
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// Reads one frame; `Ok(None)` on a clean close before its first byte.
/// Reads time out every [`TICK`] (set on the stream) so that `stop` and
/// `deadline` are honoured.
fn read_frame(
    s: &mut TcpStream,
    deadline: Option<Instant>,
    stop: &AtomicBool,
) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    if !read_full(s, &mut len, deadline, stop, true)? {
        return Ok(None);
    }
    let n = u32::from_le_bytes(len) as usize;
    if n > MAX_FRAME {
        return Err(bad("absurd frame length"));
    }
    let mut body = vec![0u8; n];
    read_full(s, &mut body, deadline, stop, false)?;
    Ok(Some(body))
}

fn read_full(
    s: &mut TcpStream,
    buf: &mut [u8],
    deadline: Option<Instant>,
    stop: &AtomicBool,
    eof_ok: bool,
) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        if stop.load(Ordering::SeqCst) {
            return Err(io::Error::new(io::ErrorKind::Interrupted, "store stopped"));
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
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
    /// Connects to the store at `addr`, retrying until `deadline` (rank 0
    /// may start later than the others), and presents `token`.
    pub fn connect(
        addr: &str,
        token: &str,
        rank: usize,
        deadline: Instant,
    ) -> Result<StoreClient, LaunchError> {
        let err = |detail: String| LaunchError::Store {
            addr: addr.to_string(),
            detail,
        };
        if HELLO.len() + token.len() > MAX_FRAME {
            return Err(err("job token too long".into()));
        }
        let start = Instant::now();
        let stream = loop {
            let last = match try_connect(addr, deadline) {
                Ok(s) => break s,
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(LaunchError::StoreTimeout {
                    rank,
                    what: format!("rank 0's store ({last})"),
                    addr: addr.to_string(),
                    after: start.elapsed(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut client = StoreClient {
            stream,
            addr: addr.to_string(),
            rank,
        };
        client
            .stream
            .set_nodelay(true)
            .map_err(|e| err(e.to_string()))?;
        let hello = [HELLO.as_slice(), token.as_bytes()].concat();
        let reply = client.call(&hello, deadline, "the store's greeting")?;
        if reply != b"OK" {
            return Err(err(format!("refused: {}", String::from_utf8_lossy(&reply))));
        }
        Ok(client)
    }

    /// Sets `key` to `value` (at most 64 KiB) for every rank to read.
    pub fn put(&mut self, key: &str, value: &[u8], deadline: Instant) -> Result<(), LaunchError> {
        let req = request(b'P', key, value).map_err(|d| self.err(d))?;
        let reply = self.call(&req, deadline, key)?;
        if reply != b"OK" {
            return Err(self.err(format!("put {key}: {}", String::from_utf8_lossy(&reply))));
        }
        Ok(())
    }

    /// Waits until `key` is set (by any rank), then returns its value.
    pub fn get(&mut self, key: &str, deadline: Instant) -> Result<Vec<u8>, LaunchError> {
        let req = request(b'G', key, &[]).map_err(|d| self.err(d))?;
        let start = Instant::now();
        let mut pause = Duration::from_micros(200);
        loop {
            let reply = self.call(&req, deadline, key)?;
            match reply.split_first() {
                Some((b'V', v)) => return Ok(v.to_vec()),
                Some((b'N', [])) => {}
                _ => return Err(self.err(format!("get {key}: malformed answer"))),
            }
            if Instant::now() >= deadline {
                return Err(LaunchError::StoreTimeout {
                    rank: self.rank,
                    what: format!("key '{key}'"),
                    addr: self.addr.clone(),
                    after: start.elapsed(),
                });
            }
            std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    fn call(&mut self, body: &[u8], deadline: Instant, what: &str) -> Result<Vec<u8>, LaunchError> {
        let timeout = |s: &Self, start: Instant| LaunchError::StoreTimeout {
            rank: s.rank,
            what: what.to_string(),
            addr: s.addr.clone(),
            after: start.elapsed(),
        };
        let start = Instant::now();
        let left = deadline.saturating_duration_since(start);
        if left.is_zero() {
            return Err(timeout(self, start));
        }
        let set = self
            .stream
            .set_write_timeout(Some(left))
            .and_then(|_| self.stream.set_read_timeout(Some(left.min(TICK))));
        set.map_err(|e| self.err(e.to_string()))?;
        write_frame(&mut self.stream, body)
            .map_err(|e| self.err(format!("lost the store (rank 0): {e}")))?;
        let never = AtomicBool::new(false);
        match read_frame(&mut self.stream, Some(deadline), &never) {
            Ok(Some(reply)) => Ok(reply),
            Ok(None) => Err(self
                .err("rank 0's store closed the connection (wrong token, or rank 0 ended)".into())),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => Err(timeout(self, start)),
            Err(e) => Err(self.err(format!("lost the store (rank 0): {e}"))),
        }
    }

    fn err(&self, detail: String) -> LaunchError {
        LaunchError::Store {
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
    pub fn join(info: &RankInfo, timeout: Duration) -> Result<Store, LaunchError> {
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
    pub fn put(&mut self, key: &str, value: &[u8], deadline: Instant) -> Result<(), LaunchError> {
        self.client.put(key, value, deadline)
    }

    /// Waits until `key` is set, then returns its value.
    pub fn get(&mut self, key: &str, deadline: Instant) -> Result<Vec<u8>, LaunchError> {
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

fn bind_first(addr: &str, token: &str) -> Result<StoreServer, LaunchError> {
    let err = |detail: String| LaunchError::Store {
        addr: addr.to_string(),
        detail,
    };
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| err(format!("cannot resolve MASTER_ADDR: {e}")))?
        .collect();
    let mut last = String::from("MASTER_ADDR resolves to no address");
    for a in addrs {
        match StoreServer::bind(a, token) {
            Ok(s) => return Ok(s),
            Err(e) => last = format!("rank 0 cannot listen on {a}: {e} (is MASTER_ADDR this host's address and MASTER_PORT free?)"),
        }
    }
    Err(err(last))
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
            .get("never", Instant::now() + Duration::from_millis(50))
            .unwrap_err();
        assert!(
            matches!(missing, LaunchError::StoreTimeout { rank: 1, .. }),
            "{missing}"
        );
        assert!(a.put("big", &vec![0u8; 70_000], soon()).is_err());
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
}
