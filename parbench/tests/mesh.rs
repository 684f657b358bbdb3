//! The device mesh ([`parbench::comm::mesh`]) on local threads and tcp
//! processes: every rank holds its tensor, data and pipeline groups at
//! once, and each group's all-reduce sums exactly its members' values,
//! with calls on the three groups interleaved.

mod group_support;
mod mpi_support;
mod tcp_support;

use group_support::sum;
use parbench::comm::mesh::{with_mesh, Axis, Mesh, MeshShape, Order};
use parbench::comm::{local, tcp, Algo, CommResult, Communicator};
use std::time::Duration;
use tcp_support::{job, worker};

const TIMEOUT: Duration = Duration::from_secs(60);

/// A value only rank `r` gives in round `round`: sums of them name the
/// ranks that took part.
fn mark(r: usize, round: usize) -> f64 {
    (1u64 << r) as f64 * (round + 1) as f64
}

/// Every check of one rank of `shape`: a description of each wrong value.
fn check_rank<C: Communicator>(world: &mut C, shape: MeshShape) -> CommResult<Vec<String>> {
    let rank = world.rank();
    with_mesh(world, &shape, Algo::Auto, |mesh: &mut Mesh<'_, '_, C>| {
        let mut wrong = Vec::new();
        if mesh.coords != shape.coords(rank) {
            wrong.push(format!("rank {rank}: coords {}", mesh.coords));
        }
        // Rounds of tp, dp, pp calls in turn: the groups live together.
        for round in 0..3 {
            for axis in [Axis::Tp, Axis::Dp, Axis::Pp, Axis::Dp] {
                let want_members = shape.group_of(rank, axis);
                let want: f64 = want_members.iter().map(|&r| mark(r, round)).sum();
                let g = match axis {
                    Axis::Tp => &mut mesh.tp,
                    Axis::Dp => &mut mesh.dp,
                    Axis::Pp => &mut mesh.pp,
                };
                let members = g.transport().members().ranks.clone();
                if members != want_members || g.rank() != shape.coords(rank).get(axis) {
                    wrong.push(format!(
                        "rank {rank} {axis}: members {members:?}, group rank {}",
                        g.rank()
                    ));
                }
                let got = sum(g, mark(rank, round))?;
                if got != want {
                    wrong.push(format!("rank {rank} {axis} round {round}: {got} != {want}"));
                }
            }
        }
        Ok(wrong)
    })
}

fn shapes() -> Vec<MeshShape> {
    let mut out = Vec::new();
    for order in ["tp-dp-pp", "tp-pp-dp", "pp-dp-tp"] {
        let order: Order = order.parse().unwrap();
        for (d, t, p) in [
            (2, 2, 2),
            (1, 2, 1),
            (2, 1, 1),
            (1, 1, 2),
            (2, 2, 1),
            (1, 2, 2),
        ] {
            out.push(MeshShape::new(d, t, p, order).unwrap());
        }
    }
    out
}

#[test]
fn local_meshes_reduce_within_each_group() {
    for shape in shapes() {
        let results = local::run(shape.world(), Algo::Auto, TIMEOUT, |c| check_rank(c, shape));
        for (rank, r) in results.into_iter().enumerate() {
            let wrong = r.unwrap_or_else(|e| panic!("{shape} rank {rank}: {e}"));
            assert!(wrong.is_empty(), "{shape}: {wrong:?}");
        }
    }
}

#[test]
fn tcp_mesh_of_eight_processes_reduces_within_each_group() {
    let name = "tcp_mesh_of_eight_processes_reduces_within_each_group";
    let shape = MeshShape::new(2, 2, 2, Order::MEGATRON).unwrap();
    if let Some(info) = worker(name) {
        let mut comm = tcp::comm(&info, Algo::Auto, TIMEOUT).unwrap();
        let wrong = check_rank(&mut comm, shape).unwrap();
        assert!(wrong.is_empty(), "{wrong:?}");
        return;
    }
    let status = job(name, shape.world()).run();
    assert!(
        status.is_ok_and(|s| s.success()),
        "a tcp rank failed its mesh checks"
    );
}

/// The same checks over `MpiComm`: the test re-runs its own binary under
/// `mpirun -np 8` (Open MPI), each rank splitting the MPI world into the
/// 2 x 2 x 2 mesh. Skips with a plain message without `mpirun`.
#[cfg(feature = "mpi")]
#[test]
fn mpi_mesh_of_eight_ranks_reduces_within_each_group() {
    let name = "mpi_mesh_of_eight_ranks_reduces_within_each_group";
    let shape = MeshShape::new(2, 2, 2, Order::MEGATRON).unwrap();
    if mpi_support::is_rank(name) {
        let mut comm = parbench::comm::mpi::MpiComm::init(TIMEOUT).expect("MPI init");
        let wrong = check_rank(&mut comm, shape).unwrap();
        assert!(wrong.is_empty(), "{wrong:?}");
        return;
    }
    if let Some(passed) = mpi_support::run(name, shape.world(), 120) {
        assert!(
            passed,
            "an mpi rank failed its mesh checks (or passed the deadline)"
        );
    }
}
