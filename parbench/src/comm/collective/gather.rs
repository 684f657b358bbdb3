//! gather (nccl-tests' Gather; unit tests only): `count` elements from each
//! rank, all `count x world` out on the root in rank order (other ranks'
//! output is undefined). It exists to show that a collective is its file
//! and its registry line: nothing else in the library names it, yet every
//! backend runs it (host backends with the algorithm below, NCCL and MPI
//! with it over their point-to-point calls), the conformance suite checks
//! it and the model knows it has no cost form.

use super::all_gather::AllGather;
use super::prelude::*;

pub struct Gather;

impl Spec for Gather {
    /// NCCL builds it from send/recv: no name in its tuning log.
    fn names(&self) -> Names {
        Names("gather", "gather_perf", None)
    }
    fn rooted(&self) -> bool {
        true
    }
    // all_gather's buffers and bus bandwidth: only the receivers differ.
    fn recv_blocks(&self, world: usize) -> usize {
        AllGather.recv_blocks(world)
    }
    fn in_place_input(&self, count: usize, rank: usize) -> usize {
        AllGather.in_place_input(count, rank)
    }
    fn busbw_factor(&self, world: usize) -> f64 {
        AllGather.busbw_factor(world)
    }
    /// Not modelled.
    fn modelled(&self) -> &'static [Algorithm] {
        &[]
    }
    fn form(&self, _algo: Algorithm) -> Option<CostForm> {
        None
    }
    fn choose(&self, _algo: Algo, _world: usize, _bytes: usize) -> Algorithm {
        Algorithm::PointToPoint
    }
    /// Every rank's input in rank order, on the root.
    fn expected(&self, x: &Expect<'_>) -> Option<Vec<u8>> {
        (x.rank == x.args.root).then(|| reference::all_gather(&super::slices(&x.blocks(0))))
    }
    /// Every other rank sends its block to the root, which takes them in
    /// rank order.
    fn host<T: Transport>(&self, run: HostRun<'_, T>) -> CommResult<()> {
        let (a, t) = (run.args, run.t);
        let (world, rank) = (t.world(), t.rank());
        let block = nbytes(a.count, 1, a.dtype)?;
        let total = nbytes(a.count, world, a.dtype)?;
        let (own, buf) = views(run.io, "gather", block, total)?;
        let mine = rank * block..(rank + 1) * block;
        if rank != a.root {
            let data = own.unwrap_or(&buf[mine]);
            return t.send(a.root, data, run.deadline);
        }
        if let Some(own) = own {
            copy_bytes(&mut buf[mine], own);
        }
        for r in (0..world).filter(|&r| r != a.root) {
            let into = RecvInto::Copy(&mut buf[r * block..(r + 1) * block]);
            t.recv(r, into, run.deadline)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::conformance::{run_suite, Matrix, Mismatch};
    use crate::comm::{group, local, Collective, Communicator, DType, HostBuffer};
    use std::time::Duration;

    const TIMEOUT: Duration = Duration::from_secs(60);
    const ROLE: &str = "PARBENCH_GATHER_TEST_ROLE";

    /// Every type at counts 0, 1, 7 (both roots), and one uneven large count.
    fn matrix() -> Matrix {
        Matrix {
            collectives: vec![Collective::Gather],
            large_counts: vec![100_003],
            large_dtypes: vec![DType::F32, DType::BF16],
            ..Matrix::small()
        }
    }

    fn problems(results: Vec<CommResult<Vec<Mismatch>>>) -> Vec<String> {
        let mut out = Vec::new();
        for (rank, r) in results.into_iter().enumerate() {
            match r {
                Ok(m) => out.extend(m.iter().map(|m| m.to_string())),
                Err(e) => out.push(format!("rank {rank} failed: {e}")),
            }
        }
        out
    }

    #[test]
    fn a_collective_is_its_file_and_its_registry_line() {
        let g = Collective::Gather;
        // Test-only: not among the collectives sweeps run and records name.
        assert!(!Collective::ALL.contains(&g));
        assert_eq!((g.name(), g.rooted(), g.reduces()), ("gather", true, false));
        assert_eq!((g.send_elems(3, 4), g.recv_elems(3, 4)), (3, 12));
        assert_eq!(g.in_place_input(3, 2), 6);
        assert_eq!(
            crate::comm::algo::Algorithm::choose(g, Algo::Ring, 4, 64).name(),
            "p2p"
        );
        // The model knows it has no cost form: no prediction.
        let p2p = crate::model::ModelAlgo::of("p2p");
        assert_eq!(crate::model::alpha_beta::terms(g, &p2p, 4, 1024), None);
    }

    #[test]
    fn gather_passes_the_conformance_suite_on_local() {
        for world in 1..=4 {
            let p = problems(local::run(world, Algo::Auto, TIMEOUT, |c| {
                run_suite(c, &matrix())
            }));
            assert!(p.is_empty(), "world {world}:\n{}", p.join("\n"));
        }
    }

    /// What NCCL and MPI run for a collective their library lacks (the
    /// host algorithm over the backend's own send and receive, the buffers
    /// staged), here over local's: the root gathers every rank's input, in
    /// place and out of place.
    #[test]
    fn gather_runs_over_a_communicators_point_to_point() {
        let (world, count, root) = (3, 5, 1);
        let args = CollArgs::new(count, DType::I32).root(root);
        let input = |r: usize| crate::comm::reference::input(r, count, DType::I32, args.op, 4);
        let want: Vec<u8> = (0..world).flat_map(input).collect();
        let results = local::run(world, Algo::Auto, TIMEOUT, |c| {
            let rank = c.rank();
            let send = HostBuffer::from_slice::<u8>(&input(rank));
            let mut recv = HostBuffer::zeroed(want.len());
            let io = Io::OutOfPlace {
                send: &send,
                recv: &mut recv,
            };
            group::run_over_point_to_point(c, Collective::Gather, io, args)?;
            let mut one = HostBuffer::zeroed(want.len());
            one.bytes_mut()[rank * 20..(rank + 1) * 20].copy_from_slice(&input(rank));
            group::run_over_point_to_point(c, Collective::Gather, Io::InPlace(&mut one), args)?;
            Ok((rank, recv.bytes().to_vec(), one.bytes().to_vec()))
        });
        for r in results {
            let (rank, out, in_place) = r.expect("rank ran");
            if rank == root {
                assert_eq!((&out, &in_place), (&want, &want), "root");
            } else {
                // Other ranks' buffers are left as they were.
                assert!(out.iter().all(|&b| b == 0), "rank {rank}");
            }
        }
    }

    #[test]
    fn gather_passes_the_conformance_suite_on_tcp() {
        const NAME: &str =
            "comm::collective::gather::tests::gather_passes_the_conformance_suite_on_tcp";
        if std::env::var(ROLE).ok().as_deref() == Some("tcp") {
            let info = crate::rendezvous::RankInfo::from_env()
                .expect("launch variables")
                .expect("a rank");
            let mut comm = crate::comm::tcp::comm(&info, Algo::Auto, TIMEOUT).expect("tcp ranks");
            let wrong = run_suite(&mut comm, &matrix()).expect("suite ran");
            assert!(wrong.is_empty(), "{wrong:?}");
            return;
        }
        let exe = std::env::current_exe().expect("test binary");
        for world in 1..=3 {
            let status = crate::launch::LocalJob::new(
                world,
                &exe,
                [NAME, "--exact", "--nocapture", "--test-threads=1"],
            )
            .env(ROLE, "tcp")
            .run();
            assert!(status.is_ok_and(|s| s.success()), "tcp world {world}");
        }
    }

    /// MPI has no gather in parbench's table: `MpiComm` runs it over
    /// MPI's send and receive (`group::run_over_point_to_point`).
    #[cfg(feature = "mpi")]
    #[test]
    fn gather_passes_the_conformance_suite_on_mpi() {
        const NAME: &str =
            "comm::collective::gather::tests::gather_passes_the_conformance_suite_on_mpi";
        if std::env::var(ROLE).ok().as_deref() == Some("mpi") {
            let mut comm = crate::comm::mpi::MpiComm::init(TIMEOUT).expect("MPI init");
            let wrong = run_suite(&mut comm, &matrix()).expect("suite ran");
            assert!(wrong.is_empty(), "{wrong:?}");
            return;
        }
        let args = [NAME, "--exact", "--nocapture", "--test-threads=1"];
        for np in [1, 2, 3] {
            let Some(out) = crate::comm::mpi::rerun_under_mpirun(np, &args, (ROLE, "mpi")) else {
                eprintln!("SKIP {NAME}: mpirun not found (apt-get install openmpi-bin)");
                return;
            };
            let out = out.expect("mpirun runs");
            assert!(
                out.status.success(),
                "mpirun -np {np}: {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
