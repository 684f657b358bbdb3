//! The conformance suite: every collective against [`super::reference`], run
//! by every rank of any host-memory communicator.
//!
//! Each rank calls [`run_suite`] with the same [`Matrix`]; the ranks then run
//! the same cases in the same order. Every rank builds every rank's input
//! itself (from [`super::reference::input`]), so it knows the expected
//! result without any extra communication and checks its own output. The
//! same suite thus runs over threads (`local`) and processes (`tcp`).

use super::collective::Expect;
use super::reference::{input, input_at};
use super::{
    CollArgs, Collective, CommError, CommResult, Communicator, DType, HostBuffer, Io, ReduceOp,
};
use std::fmt;

/// Which cases to run.
#[derive(Clone, Debug)]
pub struct Matrix {
    /// The operations to check; [`Collective::SendRecv`] stands for the
    /// point-to-point cases (send_recv, and send then recv).
    pub collectives: Vec<Collective>,
    /// Element types of the small cases.
    pub dtypes: Vec<DType>,
    /// Operators of the reducing collectives in the small cases.
    pub ops: Vec<ReduceOp>,
    /// Counts (per rank) of the small cases: every collective x dtype x op x
    /// placement x root.
    pub counts: Vec<usize>,
    /// Counts of the large cases: every collective x placement with
    /// `large_dtypes`, `ReduceOp::Sum` and the last rank as root.
    pub large_counts: Vec<usize>,
    /// Element types of the large cases.
    pub large_dtypes: Vec<DType>,
}

impl Matrix {
    /// Every type and operator at counts 0, 1 and 7, and 1,048,579 elements
    /// (not a multiple of any world size above 1 up to 8 but 1) in every type.
    pub fn full() -> Self {
        Matrix {
            collectives: Collective::ALL.to_vec(),
            dtypes: DType::ALL.to_vec(),
            ops: ReduceOp::ALL.to_vec(),
            counts: vec![0, 1, 7],
            large_counts: vec![1_048_579],
            large_dtypes: DType::ALL.to_vec(),
        }
    }

    /// The small cases of [`Matrix::full`] only.
    pub fn small() -> Self {
        Matrix {
            large_counts: Vec::new(),
            ..Matrix::full()
        }
    }
}

/// One case whose result differed from the reference on one rank.
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch {
    /// The rank that saw it.
    pub rank: usize,
    /// The case, e.g. `all_reduce float sum count=7 in-place`.
    pub case: String,
    /// Where and how it differed.
    pub detail: String,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {}: {}: {}", self.rank, self.case, self.detail)
    }
}

/// Runs every case of `m` on this rank and returns the mismatches it saw.
/// A communicator error (timeout, lost peer, rejected argument) ends the
/// suite with that error, naming the case.
pub fn run_suite<C>(comm: &mut C, m: &Matrix) -> CommResult<Vec<Mismatch>>
where
    C: Communicator<Buffer = HostBuffer>,
{
    let mut out = Vec::new();
    let mut salt = 0usize;
    let world = comm.world();
    let mut roots = vec![0, world.saturating_sub(1)];
    roots.dedup();
    let mut cases: Vec<Case> = Vec::new();
    for &coll in m.collectives.iter().filter(|&&c| c != Collective::SendRecv) {
        for &count in &m.counts {
            for &dtype in &m.dtypes {
                for in_place in [false, true] {
                    let ops = if coll.reduces() {
                        m.ops.clone()
                    } else {
                        vec![ReduceOp::Sum]
                    };
                    let case_roots = if coll.rooted() {
                        roots.clone()
                    } else {
                        vec![0]
                    };
                    for &op in &ops {
                        for &root in &case_roots {
                            let args = CollArgs::new(count, dtype).op(op).root(root);
                            cases.push(Case {
                                coll,
                                args,
                                in_place,
                            });
                        }
                    }
                }
            }
        }
        for &count in &m.large_counts {
            for &dtype in &m.large_dtypes {
                for in_place in [false, true] {
                    let args = CollArgs::new(count, dtype).root(world.saturating_sub(1));
                    cases.push(Case {
                        coll,
                        args,
                        in_place,
                    });
                }
            }
        }
    }
    for case in cases {
        salt += 1;
        if let Some(detail) = case.run(comm, salt).map_err(|e| name_case(e, &case))? {
            out.push(Mismatch {
                rank: comm.rank(),
                case: case.to_string(),
                detail,
            });
        }
    }
    let p2p_counts = if m.collectives.contains(&Collective::SendRecv) {
        m.counts.as_slice()
    } else {
        &[]
    };
    for &count in p2p_counts {
        for &dtype in &m.dtypes {
            for (at_once, what) in [(true, "send_recv"), (false, "send then recv")] {
                salt += 1;
                let case = format!("{what} {dtype} count={count}");
                if let Some(detail) = check_ring_transfer(comm, count, dtype, salt, at_once)? {
                    out.push(Mismatch {
                        rank: comm.rank(),
                        case,
                        detail,
                    });
                }
            }
        }
    }
    comm.barrier()?;
    Ok(out)
}

/// Every rank's seeded [`Communicator::all_to_all_v`] cases
/// ([`super::alltoallv::check_seeded`]): all pairs empty, a few elements
/// each (some pairs empty), and up to 300,007 bytes each. Works on any
/// communicator, device buffers included.
pub fn run_v_suite<C: Communicator>(comm: &mut C) -> CommResult<Vec<Mismatch>> {
    let cases = [
        (1, 0, DType::F32),
        (2, 3, DType::BF16),
        (3, 9, DType::F8E4M3),
        (4, 300_007, DType::U8),
    ];
    let mut out = Vec::new();
    for (seed, max, dtype) in cases {
        if let Some(detail) = super::alltoallv::check_seeded(comm, seed, max, dtype)? {
            out.push(Mismatch {
                rank: comm.rank(),
                case: format!("all_to_all_v {dtype} up to {max} per pair (seed {seed})"),
                detail,
            });
        }
    }
    comm.barrier()?;
    Ok(out)
}

fn name_case(e: CommError, case: &Case) -> CommError {
    match e {
        CommError::InvalidArgument(s) => CommError::InvalidArgument(format!("{case}: {s}")),
        other => other,
    }
}

/// One call of the matrix.
#[derive(Clone, Copy, Debug)]
struct Case {
    coll: Collective,
    args: CollArgs,
    in_place: bool,
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = &self.args;
        write!(f, "{} {}", self.coll, a.dtype)?;
        if self.coll.reduces() {
            write!(f, " {}", a.op)?;
        }
        if self.coll.rooted() {
            write!(f, " root={}", a.root)?;
        }
        let place = if self.in_place {
            "in-place"
        } else {
            "out-of-place"
        };
        write!(f, " count={} {place}", a.count)
    }
}

/// A buffer holding `bytes`.
fn buffer(bytes: &[u8]) -> HostBuffer {
    let mut b = HostBuffer::zeroed(bytes.len());
    b.bytes_mut().copy_from_slice(bytes);
    b
}

/// A buffer of `n` bytes of a recognisable non-zero pattern, so that output
/// an operation forgot to write shows up.
fn garbage(n: usize) -> HostBuffer {
    let mut b = HostBuffer::zeroed(n);
    b.bytes_mut().fill(0x5a);
    b
}

impl Case {
    /// Runs the case; `Some(detail)` when the output differs. Everything
    /// about the collective comes from its file: the byte rule (buffers,
    /// where the input and output sit in place), which ranks' inputs are
    /// read, and the expected output.
    fn run<C>(&self, comm: &mut C, salt: usize) -> CommResult<Option<String>>
    where
        C: Communicator<Buffer = HostBuffer>,
    {
        let (world, rank) = (comm.world(), comm.rank());
        let (coll, args, in_place) = (self.coll, self.args, self.in_place);
        let (count, dtype, op, root) = (args.count, args.dtype, args.op, args.root);
        let (spec, size) = (coll.spec(), dtype.size());
        let send_bytes = coll.send_elems(count, world) * size;
        let recv_bytes = coll.recv_elems(count, world) * size;
        // This rank's input, or garbage where the collective does not read it.
        let mine = if spec.reads_input(rank, root) {
            input(rank, coll.send_elems(count, world), dtype, op, salt)
        } else {
            garbage(send_bytes).bytes().to_vec()
        };
        let want = spec.expected(&Expect {
            world,
            rank,
            args,
            input: &|r, first, n| input_at(r, first, n, dtype, op, salt),
        });
        let (got, send_after) = if in_place {
            // One buffer: garbage around the input, where the file puts it.
            let mut b = garbage(send_bytes.max(recv_bytes));
            let at = coll.in_place_input(count, rank) * size;
            b.bytes_mut()[at..at + send_bytes].copy_from_slice(&mine);
            comm.collective(coll, Io::InPlace(&mut b), args)?;
            let out = coll.in_place_output(count, rank) * size;
            (b.bytes()[out..out + recv_bytes].to_vec(), None)
        } else {
            let send = buffer(&mine);
            let mut recv = garbage(recv_bytes);
            comm.collective(
                coll,
                Io::OutOfPlace {
                    send: &send,
                    recv: &mut recv,
                },
                args,
            )?;
            (recv.bytes().to_vec(), Some(send.bytes().to_vec()))
        };
        if let Some(send) = send_after {
            if let Some(d) = compare(&send, &mine, dtype) {
                return Ok(Some(format!("send buffer changed: {d}")));
            }
        }
        Ok(want.and_then(|w| compare(&got, &w, dtype)))
    }
}

/// `None` if equal, else the first differing element.
fn compare(got: &[u8], want: &[u8], dtype: DType) -> Option<String> {
    if got == want {
        return None;
    }
    if got.len() != want.len() {
        return Some(format!(
            "{} bytes where {} were expected",
            got.len(),
            want.len()
        ));
    }
    let size = dtype.size();
    let i = got
        .chunks(size)
        .zip(want.chunks(size))
        .position(|(a, b)| a != b)
        .unwrap_or(0);
    let (g, w) = crate::with_dtype!(dtype, T => (
        element::<T>(got, i),
        element::<T>(want, i),
    ));
    let wrong = got
        .chunks(size)
        .zip(want.chunks(size))
        .filter(|(a, b)| a != b)
        .count();
    Some(format!(
        "{wrong} of {} elements wrong; first at {i}: got {g}, want {w}",
        got.len() / size
    ))
}

fn element<T: super::Element>(bytes: &[u8], i: usize) -> f64 {
    let size = std::mem::size_of::<T>();
    bytes
        .get(i * size..(i + 1) * size)
        .map(|b| bytemuck::pod_read_unaligned::<T>(b).to_f64())
        .unwrap_or(f64::NAN)
}

/// Every rank sends to `rank + 1` and receives from `rank - 1`: in one call
/// (`send_recv`) when `at_once`, else a send and then a receive, so that
/// every send is outstanding at once, which must not deadlock (two ranks
/// sending to each other at once when the world is 2).
fn check_ring_transfer<C>(
    comm: &mut C,
    count: usize,
    dtype: DType,
    salt: usize,
    at_once: bool,
) -> CommResult<Option<String>>
where
    C: Communicator<Buffer = HostBuffer>,
{
    let (world, rank) = (comm.world(), comm.rank());
    let (to, from) = ((rank + 1) % world, (rank + world - 1) % world);
    let send = buffer(&input(rank, count, dtype, ReduceOp::Sum, salt));
    let mut recv = garbage(count * dtype.size());
    if at_once {
        comm.send_recv(&send, to, &mut recv, from, count, dtype)?;
    } else {
        comm.send(&send, count, dtype, to)?;
        comm.recv(&mut recv, count, dtype, from)?;
    }
    let want = input(from, count, dtype, ReduceOp::Sum, salt);
    Ok(compare(recv.bytes(), &want, dtype))
}
