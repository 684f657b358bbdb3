//! The tcp transport between real processes: send, recv and exchange with
//! empty, small and large messages, reducing receives, two ranks sending
//! large messages to each other at once, and a frame of the wrong length.

mod tcp_support;

use parbench::comm::tcp::{self, TcpTransport};
use parbench::comm::{CommError, DType, RecvInto, ReduceOp, Transport};
use std::time::{Duration, Instant};
use tcp_support::{job, pattern, worker};

const TIMEOUT: Duration = Duration::from_secs(30);
/// Far larger than the socket buffers the jobs below ask for
/// (`PARBENCH_TCP_BUF_BYTES`), so both directions must make progress.
const BIG: usize = 2 * 1024 * 1024 + 3;
const SMALL_SOCKET_BUFFERS: (&str, &str) = ("PARBENCH_TCP_BUF_BYTES", "65536");

fn soon() -> Instant {
    Instant::now() + TIMEOUT
}

fn point_to_point(t: &mut TcpTransport) {
    let (rank, world) = (t.rank(), t.world());
    for len in [0, 1, 7, 4096, BIG] {
        // Everyone sends to everyone first, then receives: with BIG
        // messages this only finishes if a blocked send drains its peers.
        for to in (0..world).filter(|&p| p != rank) {
            t.send(to, &pattern(rank, to, len), soon()).unwrap();
        }
        for from in (0..world).filter(|&p| p != rank) {
            let mut got = vec![0xAAu8; len];
            t.recv(from, RecvInto::Copy(&mut got), soon()).unwrap();
            assert!(
                got == pattern(from, rank, len),
                "rank {rank}: bad {len}-byte message from {from}"
            );
        }
    }
}

fn ring_exchange(t: &mut TcpTransport) {
    let (rank, world) = (t.rank(), t.world());
    let (next, prev) = ((rank + 1) % world, (rank + world - 1) % world);
    for len in [0, 3, 65_536, BIG] {
        let mut got = vec![0u8; len];
        t.exchange(
            next,
            &pattern(rank, next, len),
            prev,
            RecvInto::Copy(&mut got),
            soon(),
        )
        .unwrap();
        assert!(
            got == pattern(prev, rank, len),
            "rank {rank}: bad exchange of {len} bytes"
        );
    }
    // Reducing exchange: acc = own values, incoming = the previous rank's.
    for count in [0usize, 1, 5, 300_007] {
        let own: Vec<f32> = (0..count)
            .map(|i| (rank * 1000 + i % 1000) as f32)
            .collect();
        let theirs: Vec<f32> = (0..count)
            .map(|i| (next * 1000 + i % 1000) as f32)
            .collect();
        let mut acc = own.clone();
        let into = RecvInto::Reduce {
            acc: bytemuck::cast_slice_mut(&mut acc),
            dtype: DType::F32,
            op: ReduceOp::Sum,
        };
        t.exchange(next, bytemuck::cast_slice(&theirs), prev, into, soon())
            .unwrap();
        // prev sent values built from its own next, which is this rank.
        for (i, (&a, &o)) in acc.iter().zip(&own).enumerate() {
            assert_eq!(
                a,
                o + (rank * 1000 + i % 1000) as f32,
                "rank {rank}: element {i} of {count}"
            );
        }
    }
    let mut acc = [1i64, -5, 9];
    let into = RecvInto::Reduce {
        acc: bytemuck::cast_slice_mut(&mut acc),
        dtype: DType::I64,
        op: ReduceOp::Max,
    };
    t.exchange(
        next,
        bytemuck::cast_slice(&[0i64, 0, 100]),
        prev,
        into,
        soon(),
    )
    .unwrap();
    assert_eq!(acc, [1, 0, 100]);
}

#[test]
fn transport_moves_messages_between_processes() {
    if let Some(info) = worker("transport_moves_messages_between_processes") {
        let mut t = tcp::connect(&info, TIMEOUT).unwrap();
        assert_eq!((t.world(), t.backend()), (3, "tcp"));
        point_to_point(&mut t);
        ring_exchange(&mut t);
        return;
    }
    let status = job("transport_moves_messages_between_processes", 3)
        .env(SMALL_SOCKET_BUFFERS.0, SMALL_SOCKET_BUFFERS.1)
        .run()
        .unwrap();
    assert!(status.success());
}

#[test]
fn transport_with_two_ranks_and_one_rank() {
    if let Some(info) = worker("transport_with_two_ranks_and_one_rank") {
        let mut t = tcp::connect(&info, TIMEOUT).unwrap();
        if t.world() == 1 {
            // Messages to itself (sendrecv on one rank) arrive in order.
            t.send(0, &[1, 2], soon()).unwrap();
            t.send(0, &[3], soon()).unwrap();
            let (mut a, mut b) = ([0u8; 2], [0u8; 1]);
            t.recv(0, RecvInto::Copy(&mut a), soon()).unwrap();
            t.recv(0, RecvInto::Copy(&mut b), soon()).unwrap();
            assert_eq!((a, b), ([1, 2], [3]));
            let mut acc = [1.5f64];
            let into = RecvInto::Reduce {
                acc: bytemuck::cast_slice_mut(&mut acc),
                dtype: DType::F64,
                op: ReduceOp::Sum,
            };
            t.exchange(0, bytemuck::cast_slice(&[2.0f64]), 0, into, soon())
                .unwrap();
            assert_eq!(acc, [3.5]);
            let e = t.recv(0, RecvInto::Copy(&mut b), soon()).unwrap_err();
            assert!(matches!(e, CommError::InvalidArgument(_)), "{e}");
            let e = t.send(1, &[1], soon()).unwrap_err();
            assert!(matches!(e, CommError::InvalidArgument(_)), "{e}");
            return;
        }
        point_to_point(&mut t);
        ring_exchange(&mut t); // next == prev: both directions on one socket
        return;
    }
    assert!(job("transport_with_two_ranks_and_one_rank", 2)
        .env(SMALL_SOCKET_BUFFERS.0, SMALL_SOCKET_BUFFERS.1)
        .run()
        .unwrap()
        .success());
    assert!(job("transport_with_two_ranks_and_one_rank", 1)
        .run()
        .unwrap()
        .success());
}

#[test]
fn frame_of_the_wrong_length_is_a_protocol_error_naming_the_sender() {
    if let Some(info) = worker("frame_of_the_wrong_length_is_a_protocol_error_naming_the_sender") {
        let mut t = tcp::connect(&info, TIMEOUT).unwrap();
        if t.rank() == 0 {
            t.send(1, &[0u8; 10], soon()).unwrap();
            // Rank 1 gives up on the connection; rank 0 learns it at once.
            let mut b = [0u8; 4];
            let e = t.recv(1, RecvInto::Copy(&mut b), soon()).unwrap_err();
            assert!(matches!(e, CommError::PeerLost { peer: 1, .. }), "{e}");
        } else {
            let mut b = [0u8; 12];
            let e = t.recv(0, RecvInto::Copy(&mut b), soon()).unwrap_err();
            assert!(matches!(e, CommError::Protocol { peer: 0, .. }), "{e}");
            assert!(e.to_string().contains("10 bytes where 12"), "{e}");
            // The transport stays failed.
            let e = t.send(0, &[1], soon()).unwrap_err();
            assert!(matches!(e, CommError::PeerLost { peer: 0, .. }), "{e}");
        }
        return;
    }
    let name = "frame_of_the_wrong_length_is_a_protocol_error_naming_the_sender";
    assert!(job(name, 2).run().unwrap().success());
}
