//! Strangers at the door: while a job is forming, connections to the
//! rendezvous port and to a rank's data port send garbage, wrong tokens,
//! absurd lengths or nothing at all. The job must still form and finish.

mod tcp_support;

use parbench::comm::tcp;
use parbench::comm::Transport;
use parbench::launch::store::StoreClient;
use parbench::launch::RankInfo;
use parbench::launch::Store;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use tcp_support::{all_pairs, assert_all_succeeded, job, wait_all, worker};

const TOKEN: &str = "the-right-token";

/// A rank's part once the job formed: it sends every other rank a pattern
/// and checks theirs; rank 0 keeps the store up until the test has put
/// "test/done" (the strangers are done with it).
fn exchange_with_every_peer(info: &RankInfo) {
    let mut t = tcp::connect(info, Duration::from_secs(30)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    all_pairs(&mut t, 1000, deadline);
    if t.rank() == 0 {
        t.store()
            .expect("the transport holds the store")
            .get("test/done", deadline)
            .unwrap();
    }
}

/// Writes `junk` and expects the other side to close the connection.
fn refused(addr: &str, junk: &[u8]) {
    let mut s = TcpStream::connect(addr).unwrap();
    let _ = s.write_all(junk);
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            panic!("{addr}: a stranger's connection was left open")
        }
        Ok(0) | Err(_) => {}
        Ok(n) => {
            // The store answers a wrong token with one refusal, then closes.
            assert!(
                buf[..n].windows(5).any(|w| w == b"wrong"),
                "{addr}: unexpected answer {:?}",
                &buf[..n]
            );
        }
    }
}

fn handshake(world: u32, from: u32, to: u32, token: &[u8], claimed_len: u16) -> Vec<u8> {
    let mut h = b"PBTCPv01".to_vec();
    for v in [world, from, to] {
        h.extend_from_slice(&v.to_le_bytes());
    }
    h.extend_from_slice(&claimed_len.to_le_bytes());
    h.extend_from_slice(token);
    h
}

#[test]
fn strangers_on_the_rendezvous_and_data_ports_do_not_stop_the_job() {
    let name = "strangers_on_the_rendezvous_and_data_ports_do_not_stop_the_job";
    if let Some(info) = worker(name) {
        if info.rank == 2 {
            // Rank 2 joins only when the strangers are done, so that rank 1
            // is still accepting connections while they call.
            let mut store = Store::join(&info, Duration::from_secs(30)).unwrap();
            store
                .get("test/go", Instant::now() + Duration::from_secs(30))
                .unwrap();
        }
        exchange_with_every_peer(&info);
        return;
    }
    let (mut children, port) = job(name, 3)
        .env("PARBENCH_JOB_TOKEN", TOKEN)
        .start_with_store_port()
        .unwrap();
    let store = format!("127.0.0.1:{port}");
    let until = Instant::now() + Duration::from_secs(20);
    // Wait for rank 0's store, holding one silent connection open all along.
    let _silent = loop {
        match TcpStream::connect(&store) {
            Ok(s) => break s,
            Err(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("store never came up: {e}"),
        }
    };
    // With the right token, find rank 1's data port and knock on it while
    // rank 1 is still accepting (rank 2 waits for "test/go").
    let mut client = StoreClient::connect(&store, TOKEN, 9, until).unwrap();
    let data = String::from_utf8(client.get("parbench/tcp/addr/1", until).unwrap()).unwrap();
    let _silent_data = TcpStream::connect(&data).unwrap();
    let mut knocks: Vec<(String, Vec<u8>)> = vec![
        (data.clone(), b"hello there, I am not a rank".to_vec()),
        (data.clone(), handshake(3, 0, 1, b"wrong-token-abc", 15)),
        (data.clone(), handshake(3, 0, 1, b"", u16::MAX)), // absurd token length
        (
            data.clone(),
            handshake(3, 2, 1, TOKEN.as_bytes(), TOKEN.len() as u16),
        ), // rank 2 never connects down
        (
            data.clone(),
            handshake(7, 0, 1, TOKEN.as_bytes(), TOKEN.len() as u16),
        ), // another world size
        (store.clone(), u32::MAX.to_le_bytes().to_vec()),  // absurd length
        (
            store.clone(),
            b"\x10\x00\x00\x00GET / HTTP/1.1\r\n\r\n".to_vec(),
        ), // not a greeting
        (store.clone(), vec![9, 0, 0, 0, b'P', b'B', b'S']), // half a frame, then silence
    ];
    let threads: Vec<_> = knocks
        .drain(..)
        .map(|(a, j)| std::thread::spawn(move || refused(&a, &j)))
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let wrong = StoreClient::connect(
        &store,
        "wrong-token",
        9,
        Instant::now() + Duration::from_secs(10),
    );
    assert!(wrong.is_err());
    client.put("test/go", b"", until).unwrap();
    client.put("test/done", b"", until).unwrap();

    let status = wait_all(&mut children, 40);
    assert_all_succeeded(&status);
}

#[test]
fn the_store_port_is_held_from_launch_until_rank_0_serves_on_it() {
    // Was: the launcher chose a free port and let it go; a process beside
    // it (another test's connection) took it before rank 0 bound it, and
    // the job failed with "Address already in use".
    let name = "the_store_port_is_held_from_launch_until_rank_0_serves_on_it";
    if let Some(info) = worker(name) {
        exchange_with_every_peer(&info);
        return;
    }
    let (mut children, port) = job(name, 2)
        .env("PARBENCH_JOB_TOKEN", TOKEN)
        .start_with_store_port()
        .unwrap();
    // At once, before rank 0 can have reached its store: nobody else may
    // bind the port (rank 0 holds the launcher's socket).
    let taken = std::net::TcpListener::bind(("127.0.0.1", port));
    assert!(
        taken
            .as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::AddrInUse),
        "the store's port {port} was free to take: {taken:?}"
    );
    // And rank 0 serves the job's store on it.
    let until = Instant::now() + Duration::from_secs(20);
    let mut client = StoreClient::connect(&format!("127.0.0.1:{port}"), TOKEN, 9, until).unwrap();
    client.get("parbench/tcp/addr/1", until).unwrap();
    client.put("test/done", b"", until).unwrap();
    assert_all_succeeded(&wait_all(&mut children, 40));
}

#[test]
fn a_crowd_of_idle_connections_at_the_store_and_a_data_port_does_not_stop_the_job() {
    // Was: 1,120 idle connections at the store killed the job (rank 1:
    // "lost the store ... Connection reset by peer"), and more than 256 at
    // a rank's data port while the mesh was built did too.
    let name = "a_crowd_of_idle_connections_at_the_store_and_a_data_port_does_not_stop_the_job";
    if let Some(info) = worker(name) {
        if info.rank == 2 {
            // Comes to the store only once the crowd stands at both doors.
            let marker = std::env::var_os("CROWD_MARKER").unwrap();
            let until = Instant::now() + Duration::from_secs(30);
            while !std::path::Path::new(&marker).exists() {
                assert!(Instant::now() < until, "the crowd never stood");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        exchange_with_every_peer(&info);
        return;
    }
    // The ranks get the usual 1,024 descriptors (as on the machine where
    // the crowd killed the job); this process keeps enough for the crowd.
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid struct.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    let mine = lim.rlim_cur;
    if lim.rlim_max < 2048 {
        eprintln!(
            "skipped: the descriptor limit ({}) is too low for a crowd",
            lim.rlim_max
        );
        return;
    }
    lim.rlim_cur = 1024;
    // SAFETY: as above; lowering the soft limit is always allowed.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    let marker = std::env::temp_dir().join(format!(
        "parbench-crowd-{}-{}",
        std::process::id(),
        parbench::launch::new_token()
    ));
    let started = job(name, 3)
        .env("CROWD_MARKER", &marker)
        .env("PARBENCH_JOB_TOKEN", TOKEN)
        .start_with_store_port();
    lim.rlim_cur = mine.max(2048);
    // SAFETY: as above; back up to at most the hard limit.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    let (mut children, port) = started.unwrap();
    let store = format!("127.0.0.1:{port}");
    let until = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(&store).is_err() {
        assert!(Instant::now() < until, "store never came up");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut client = StoreClient::connect(&store, TOKEN, 9, until).unwrap();
    let data = String::from_utf8(client.get("parbench/tcp/addr/1", until).unwrap()).unwrap();
    // More than a rank's 1,024 descriptors at the store, and past the 256
    // waiting connections a door keeps at the data port: the doors must
    // drop strangers to let the ranks in.
    let mut crowd = Vec::new();
    for (addr, n) in [(&store, 1200), (&data, 400)] {
        for _ in 0..n {
            if let Ok(s) = TcpStream::connect(addr) {
                crowd.push(s);
            }
        }
    }
    assert!(
        crowd.len() > 2 * 256,
        "only {} connections opened",
        crowd.len()
    );
    std::fs::write(&marker, b"").unwrap();
    client.put("test/done", b"", until).unwrap();
    let status = wait_all(&mut children, 60);
    drop(crowd);
    let _ = std::fs::remove_file(&marker);
    assert_all_succeeded(&status);
}
