//! The conformance suite: every collective against [`super::reference`], run
//! by every rank of any host-memory communicator.
//!
//! Each rank calls [`run_suite`] with the same [`Matrix`]; the ranks then run
//! the same cases in the same order. Every rank builds every rank's input
//! itself (from [`super::reference::input`]), so it knows the expected
//! result without any extra communication and checks its own output. The
//! same suite thus runs over threads (`local`) and processes (`tcp`).

use super::reference::{self, input, input_at};
use super::{Collective, CommError, CommResult, Communicator, DType, HostBuffer, Io, ReduceOp};
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
                            cases.push(Case {
                                coll,
                                dtype,
                                op,
                                count,
                                in_place,
                                root,
                            });
                        }
                    }
                }
            }
        }
        for &count in &m.large_counts {
            for &dtype in &m.large_dtypes {
                for in_place in [false, true] {
                    cases.push(Case {
                        coll,
                        dtype,
                        op: ReduceOp::Sum,
                        count,
                        in_place,
                        root: world.saturating_sub(1),
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
    dtype: DType,
    op: ReduceOp,
    count: usize,
    in_place: bool,
    root: usize,
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.coll, self.dtype)?;
        if self.coll.reduces() {
            write!(f, " {}", self.op)?;
        }
        if self.coll.rooted() {
            write!(f, " root={}", self.root)?;
        }
        let place = if self.in_place {
            "in-place"
        } else {
            "out-of-place"
        };
        write!(f, " count={} {place}", self.count)
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
    /// Runs the case; `Some(detail)` when the output differs.
    fn run<C>(&self, comm: &mut C, salt: usize) -> CommResult<Option<String>>
    where
        C: Communicator<Buffer = HostBuffer>,
    {
        let (world, rank) = (comm.world(), comm.rank());
        let Case {
            coll,
            dtype,
            op,
            count,
            in_place,
            root,
        } = *self;
        let block = count * dtype.size();
        // This rank's input: `count` elements, or `count x world` for the
        // operations whose send buffer holds a block per rank.
        let per_rank = match coll {
            Collective::ReduceScatter | Collective::AllToAll => count * world,
            _ => count,
        };
        // What the expected output depends on: every rank's whole input, or
        // (reduce_scatter, all_to_all) every rank's block `rank`, or
        // (broadcast) the root's input.
        let needed: Vec<Vec<u8>> = match coll {
            Collective::ReduceScatter | Collective::AllToAll => (0..world)
                .map(|r| input_at(r, rank * count, count, dtype, op, salt))
                .collect(),
            Collective::Broadcast => vec![input(root, count, dtype, op, salt)],
            _ => (0..world)
                .map(|r| input(r, count, dtype, op, salt))
                .collect(),
        };
        let refs: Vec<&[u8]> = needed.iter().map(|v| v.as_slice()).collect();
        let mine_owned = input(rank, per_rank, dtype, op, salt);
        let mine = &mine_owned;
        let (want, got, send_after): (Option<Vec<u8>>, Vec<u8>, Option<Vec<u8>>) = match coll {
            Collective::AllReduce => {
                let want = reference::all_reduce(&refs, dtype, op);
                let (got, send) = run_io(in_place, mine, mine.len(), |io| {
                    comm.all_reduce(io, count, dtype, op)
                })?;
                (Some(want), got, send)
            }
            Collective::AllGather => {
                let want = reference::all_gather(&refs);
                let (got, send) = if in_place {
                    let mut full = garbage(block * world).bytes().to_vec();
                    full[rank * block..(rank + 1) * block].copy_from_slice(mine);
                    let mut b = buffer(&full);
                    comm.all_gather(Io::InPlace(&mut b), count, dtype)?;
                    (b.bytes().to_vec(), None)
                } else {
                    run_io(false, mine, block * world, |io| {
                        comm.all_gather(io, count, dtype)
                    })?
                };
                (Some(want), got, send)
            }
            Collective::ReduceScatter => {
                // Every rank's block `rank`, reduced (reduce_scatter with one block each).
                let want = reference::reduce_scatter(&refs, block, dtype, op, 0);
                let (got, send) = run_io(in_place, mine, block, |io| {
                    comm.reduce_scatter(io, count, dtype, op)
                })?;
                let got = if in_place {
                    got[rank * block..(rank + 1) * block].to_vec()
                } else {
                    got
                };
                (Some(want), got, send)
            }
            Collective::Broadcast => {
                let want = reference::broadcast(&refs, 0);
                let input = if rank == root {
                    mine.clone()
                } else {
                    garbage(block).bytes().to_vec()
                };
                let (got, send) = run_io(in_place, &input, block, |io| {
                    comm.broadcast(io, count, dtype, root)
                })?;
                (Some(want), got, send)
            }
            Collective::Reduce => {
                let want = reference::reduce(&refs, dtype, op);
                let (got, send) = run_io(in_place, mine, block, |io| {
                    comm.reduce(io, count, dtype, op, root)
                })?;
                // The result is defined on the root only.
                (Some(want).filter(|_| rank == root), got, send)
            }
            Collective::AllToAll => {
                // Block `rank` of every rank, in rank order.
                let want = reference::all_to_all(&refs, block, 0);
                let (got, send) = run_io(in_place, mine, block * world, |io| {
                    comm.all_to_all(io, count, dtype)
                })?;
                (Some(want), got, send)
            }
            Collective::SendRecv => (None, Vec::new(), None),
        };
        if let Some(send) = send_after {
            let original = if coll == Collective::Broadcast && rank != root {
                garbage(block).bytes().to_vec()
            } else {
                mine.clone()
            };
            if let Some(d) = compare(&send, &original, dtype) {
                return Ok(Some(format!("send buffer changed: {d}")));
            }
        }
        Ok(want.and_then(|w| compare(&got, &w, dtype)))
    }
}

/// Calls `call` in place (one buffer holding `input`; the output is the
/// whole buffer afterwards) or out of place (send holding `input`, recv of
/// `out_bytes` garbage; the output is recv). Returns the output and, out of
/// place, the send buffer's bytes afterwards.
fn run_io(
    in_place: bool,
    input: &[u8],
    out_bytes: usize,
    call: impl FnOnce(Io<'_, HostBuffer>) -> CommResult<()>,
) -> CommResult<(Vec<u8>, Option<Vec<u8>>)> {
    if in_place {
        let mut b = buffer(input);
        call(Io::InPlace(&mut b))?;
        Ok((b.bytes().to_vec(), None))
    } else {
        let send = buffer(input);
        let mut recv = garbage(out_bytes);
        call(Io::OutOfPlace {
            send: &send,
            recv: &mut recv,
        })?;
        let out = recv.bytes().to_vec();
        Ok((out, Some(send.bytes().to_vec())))
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
