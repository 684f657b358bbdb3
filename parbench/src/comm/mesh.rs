//! The device mesh: a world of `D x T x P` ranks split into its tensor,
//! data and pipeline groups, each a communicator over its ranks, all three
//! held at once (Megatron-LM's `initialize_model_parallel`).
//!
//! Ranks are laid out with one axis fastest, then the next: Megatron's
//! order is tensor fastest, then data, then pipeline (`tp-dp-pp`:
//! `rank = t + T (d + D p)`), so that a tensor group sits inside a node
//! and a pipeline crosses nodes. Another order is a value ([`Order`]).
//!
//! The three groups share the world's point-to-point calls: each group's
//! transport is [`super::group::split`]'s over a [`SharedComm`], a handle
//! that borrows the world for one call at a time. That is sound because
//! two ranks of one group differ in exactly that group's coordinate
//! ([`MeshShape::link_axis`]), so every link of the world belongs to one
//! group at most and the messages on it keep their order, as the host
//! algorithms need.

use super::group::{split, Group};
use super::{Algo, CommError, CommResult, Communicator, DType, Io, LinkStats, StreamClock};
use std::fmt;
use std::str::FromStr;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// One axis of the mesh.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Axis {
    /// Tensor parallel: the ranks sharing one stage's matrices.
    Tp,
    /// Data parallel: the replicas of one shard of the model.
    Dp,
    /// Pipeline parallel: the stages of one replica.
    Pp,
}

impl Axis {
    /// Every axis.
    pub const ALL: [Axis; 3] = [Axis::Tp, Axis::Dp, Axis::Pp];

    /// The name used in `--order` and records.
    pub fn name(self) -> &'static str {
        match self {
            Axis::Tp => "tp",
            Axis::Dp => "dp",
            Axis::Pp => "pp",
        }
    }
}

/// The order of the axes in the rank number, fastest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Order(pub [Axis; 3]);

impl Order {
    /// Megatron-LM's: tensor fastest, then data, then pipeline.
    pub const MEGATRON: Order = Order([Axis::Tp, Axis::Dp, Axis::Pp]);
}

impl Default for Order {
    fn default() -> Self {
        Order::MEGATRON
    }
}

impl fmt::Display for Order {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c] = self.0;
        write!(f, "{a}-{b}-{c}")
    }
}

impl FromStr for Order {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "unknown order '{s}' (expected the axes tp, dp and pp, fastest first, as tp-dp-pp)"
            )
        };
        let axes: Vec<Axis> = s
            .split(['-', ','])
            .map(|a| {
                let a = a.trim().to_ascii_lowercase();
                Axis::ALL
                    .into_iter()
                    .find(|axis| axis.name() == a)
                    .ok_or_else(bad)
            })
            .collect::<Result<_, _>>()?;
        let [a, b, c] = axes[..] else {
            return Err(bad());
        };
        if a == b || b == c || a == c {
            return Err(bad());
        }
        Ok(Order([a, b, c]))
    }
}

/// A rank's place in the mesh.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Coords {
    pub tp: usize,
    pub dp: usize,
    pub pp: usize,
}

impl Coords {
    /// The coordinate along `axis`.
    pub fn get(&self, axis: Axis) -> usize {
        match axis {
            Axis::Tp => self.tp,
            Axis::Dp => self.dp,
            Axis::Pp => self.pp,
        }
    }

    fn set(&mut self, axis: Axis, v: usize) {
        match axis {
            Axis::Tp => self.tp = v,
            Axis::Dp => self.dp = v,
            Axis::Pp => self.pp = v,
        }
    }
}

impl fmt::Display for Coords {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "dp {} tp {} pp {}", self.dp, self.tp, self.pp)
    }
}

/// The sizes of the three axes and their order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MeshShape {
    pub dp: usize,
    pub tp: usize,
    pub pp: usize,
    pub order: Order,
}

impl MeshShape {
    /// A mesh of `dp x tp x pp` ranks; every size at least 1, the product
    /// within `usize` (one line naming what is wrong otherwise).
    pub fn new(dp: usize, tp: usize, pp: usize, order: Order) -> Result<Self, String> {
        if dp == 0 || tp == 0 || pp == 0 {
            return Err(format!(
                "the mesh needs at least one rank per axis, got dp {dp} x tp {tp} x pp {pp}"
            ));
        }
        dp.checked_mul(tp)
            .and_then(|v| v.checked_mul(pp))
            .ok_or_else(|| format!("dp {dp} x tp {tp} x pp {pp} ranks overflow"))?;
        Ok(MeshShape { dp, tp, pp, order })
    }

    /// Ranks in the world: the product of the three, not the sum.
    pub fn world(&self) -> usize {
        self.dp * self.tp * self.pp
    }

    /// The size of `axis`.
    pub fn size(&self, axis: Axis) -> usize {
        match axis {
            Axis::Tp => self.tp,
            Axis::Dp => self.dp,
            Axis::Pp => self.pp,
        }
    }

    /// Where `rank` sits (the caller keeps `rank < world()`).
    pub fn coords(&self, rank: usize) -> Coords {
        let mut c = Coords::default();
        let mut rest = rank;
        for axis in self.order.0 {
            let n = self.size(axis);
            c.set(axis, rest % n);
            rest /= n;
        }
        c
    }

    /// The rank at `c`.
    pub fn rank_of(&self, c: Coords) -> usize {
        self.order
            .0
            .iter()
            .rev()
            .fold(0, |acc, &axis| acc * self.size(axis) + c.get(axis))
    }

    /// The ranks of `rank`'s group along `axis`, in group order (by that
    /// coordinate).
    pub fn group_of(&self, rank: usize, axis: Axis) -> Vec<usize> {
        let mut c = self.coords(rank);
        (0..self.size(axis))
            .map(|i| {
                c.set(axis, i);
                self.rank_of(c)
            })
            .collect()
    }

    /// The one axis along which ranks `a` and `b` differ, or `None` when
    /// they differ in more than one (or are the same rank): the group a
    /// link between them belongs to.
    pub fn link_axis(&self, a: usize, b: usize) -> Option<Axis> {
        let (ca, cb) = (self.coords(a), self.coords(b));
        let differ: Vec<Axis> = Axis::ALL
            .into_iter()
            .filter(|&x| ca.get(x) != cb.get(x))
            .collect();
        match differ[..] {
            [one] => Some(one),
            _ => None,
        }
    }
}

impl fmt::Display for MeshShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "dp {} x tp {} x pp {} ({})",
            self.dp, self.tp, self.pp, self.order
        )
    }
}

/// A handle on a communicator that several groups share: every call
/// borrows it for that call alone. The communicator's own rank, world and
/// backend are kept, so asking for them takes no lock.
pub struct SharedComm<'a, 'w, C: Communicator> {
    cell: &'a Mutex<&'w mut C>,
    rank: usize,
    world: usize,
    backend: &'static str,
}

impl<'a, 'w, C: Communicator> SharedComm<'a, 'w, C> {
    /// A handle on the communicator in `cell`.
    pub fn new(cell: &'a Mutex<&'w mut C>) -> CommResult<Self> {
        let (rank, world, backend) = {
            let c = lock(cell)?;
            (c.rank(), c.world(), c.backend())
        };
        Ok(SharedComm {
            cell,
            rank,
            world,
            backend,
        })
    }

    fn get(&self) -> CommResult<MutexGuard<'a, &'w mut C>> {
        lock(self.cell)
    }
}

/// The communicator in `cell`; a poisoned lock (a rank's thread panicked
/// inside a call) is an error, not a second panic.
fn lock<'a, 'w, C>(cell: &'a Mutex<&'w mut C>) -> CommResult<MutexGuard<'a, &'w mut C>> {
    cell.lock().map_err(|_| {
        CommError::Setup("a call on the shared communicator panicked; the mesh is unusable".into())
    })
}

impl<C: Communicator> Communicator for SharedComm<'_, '_, C> {
    type Buffer = C::Buffer;

    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.world
    }
    fn backend(&self) -> &'static str {
        self.backend
    }
    fn wire(&self) -> String {
        self.get().map_or_else(|_| "?".into(), |c| c.wire())
    }
    fn algo_for(&self, coll: super::Collective, bytes: usize) -> String {
        self.get()
            .map_or_else(|_| "?".into(), |c| c.algo_for(coll, bytes))
    }
    fn set_timeout(&mut self, timeout: Duration) {
        if let Ok(mut c) = self.get() {
            c.set_timeout(timeout);
        }
    }
    fn timeout(&self) -> Duration {
        self.get().map_or(super::DEFAULT_TIMEOUT, |c| c.timeout())
    }
    fn alloc(&self, bytes: usize) -> CommResult<Self::Buffer> {
        self.get()?.alloc(bytes)
    }
    fn collective(
        &mut self,
        coll: super::Collective,
        io: Io<'_, Self::Buffer>,
        args: super::CollArgs,
    ) -> CommResult<()> {
        self.get()?.collective(coll, io, args)
    }
    fn send(
        &mut self,
        buf: &Self::Buffer,
        count: usize,
        dtype: DType,
        peer: usize,
    ) -> CommResult<()> {
        self.get()?.send(buf, count, dtype, peer)
    }
    fn recv(
        &mut self,
        buf: &mut Self::Buffer,
        count: usize,
        dtype: DType,
        peer: usize,
    ) -> CommResult<()> {
        self.get()?.recv(buf, count, dtype, peer)
    }
    fn send_recv(
        &mut self,
        send: &Self::Buffer,
        to: usize,
        recv: &mut Self::Buffer,
        from: usize,
        count: usize,
        dtype: DType,
    ) -> CommResult<()> {
        self.get()?.send_recv(send, to, recv, from, count, dtype)
    }
    fn barrier(&mut self) -> CommResult<()> {
        self.get()?.barrier()
    }
    fn sync(&mut self) -> CommResult<()> {
        self.get()?.sync()
    }
    fn link_stats(&self) -> Option<LinkStats> {
        self.get().ok()?.link_stats()
    }
    fn stream_clock(&mut self, points: usize) -> CommResult<Option<Box<dyn StreamClock>>> {
        self.get()?.stream_clock(points)
    }
    fn device_ceiling(&mut self) -> CommResult<Option<(String, f64)>> {
        self.get()?.device_ceiling()
    }
}

/// A group of the mesh: a communicator over the ranks of one axis.
pub type MeshGroup<'h, 'w, C> = Group<'h, SharedComm<'h, 'w, C>>;

/// This rank's three groups, held at once, and where it sits.
pub struct Mesh<'h, 'w, C: Communicator> {
    pub shape: MeshShape,
    pub coords: Coords,
    /// The ranks sharing this rank's stage matrices.
    pub tp: MeshGroup<'h, 'w, C>,
    /// The replicas of this rank's shard.
    pub dp: MeshGroup<'h, 'w, C>,
    /// The stages of this rank's replica (group rank = stage rank).
    pub pp: MeshGroup<'h, 'w, C>,
}

/// Splits `world` into `shape`'s groups (a collective: every rank of the
/// world calls it, with the same shape) and runs `body` with them.
/// The world must have `shape.world()` ranks; the groups' collectives
/// choose their algorithms by `algo`.
pub fn with_mesh<'w, C, R, F>(
    world: &'w mut C,
    shape: &MeshShape,
    algo: Algo,
    body: F,
) -> CommResult<R>
where
    C: Communicator,
    F: for<'h> FnOnce(&mut Mesh<'h, 'w, C>) -> CommResult<R>,
{
    if world.world() != shape.world() {
        return Err(CommError::InvalidArgument(format!(
            "the mesh {shape} needs {} ranks, the world has {}",
            shape.world(),
            world.world()
        )));
    }
    let rank = world.rank();
    let coords = shape.coords(rank);
    let cell = Mutex::new(world);
    let mut handles = [
        SharedComm::new(&cell)?,
        SharedComm::new(&cell)?,
        SharedComm::new(&cell)?,
    ];
    let [h_tp, h_dp, h_pp] = &mut handles;
    let tp = axis_group(h_tp, shape, Axis::Tp, algo)?;
    let dp = axis_group(h_dp, shape, Axis::Dp, algo)?;
    let pp = axis_group(h_pp, shape, Axis::Pp, algo)?;
    let mut mesh = Mesh {
        shape: *shape,
        coords,
        tp,
        dp,
        pp,
    };
    body(&mut mesh)
}

/// This rank's group along `axis`, split from `comm`, a communicator over
/// the whole world of `shape` (a collective of it): each of
/// [`with_mesh`]'s groups, and the data-parallel reduction's group of its
/// own over a duplicate of the world ([`Communicator::duplicate_host`]).
/// The colour names the group (its first rank), the key orders it by the
/// axis' coordinate.
pub fn axis_group<'c, C: Communicator>(
    comm: &'c mut C,
    shape: &MeshShape,
    axis: Axis,
    algo: Algo,
) -> CommResult<Group<'c, C>> {
    let rank = comm.rank();
    if comm.world() != shape.world() {
        return Err(CommError::InvalidArgument(format!(
            "the mesh {shape} needs {} ranks, the communicator has {}",
            shape.world(),
            comm.world()
        )));
    }
    let colour = shape.group_of(rank, axis)[0];
    let colour = u32::try_from(colour)
        .map_err(|_| CommError::InvalidArgument(format!("rank {colour} out of range")))?;
    let key = shape.coords(rank).get(axis) as u32;
    split(comm, Some(colour), key, algo)?
        .ok_or_else(|| CommError::Setup(format!("rank {rank} left out of its {axis} group")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shapes() -> Vec<MeshShape> {
        let orders = ["tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "pp-dp-tp"];
        let mut out = Vec::new();
        for o in orders {
            for (d, t, p) in [
                (2, 2, 2),
                (1, 2, 1),
                (2, 1, 1),
                (1, 1, 2),
                (3, 2, 2),
                (1, 4, 2),
            ] {
                out.push(MeshShape::new(d, t, p, o.parse().unwrap()).unwrap());
            }
        }
        out
    }

    #[test]
    fn megatron_order_puts_tensor_fastest_then_data_then_pipeline() {
        let m = MeshShape::new(2, 2, 2, Order::MEGATRON).unwrap();
        // rank = t + T (d + D p)
        for r in 0..8 {
            let c = m.coords(r);
            assert_eq!(r, c.tp + 2 * (c.dp + 2 * c.pp), "{r}: {c}");
        }
        assert_eq!(m.group_of(5, Axis::Tp), vec![4, 5]);
        assert_eq!(m.group_of(5, Axis::Dp), vec![5, 7]);
        assert_eq!(m.group_of(5, Axis::Pp), vec![1, 5]);
        let other = MeshShape::new(2, 2, 2, "tp-pp-dp".parse().unwrap()).unwrap();
        assert_eq!(other.group_of(5, Axis::Dp), vec![1, 5]);
        assert_eq!(other.group_of(5, Axis::Pp), vec![5, 7]);
    }

    /// Every rank is one place and back; a group's members differ from
    /// each other only along its axis, so no link is in two groups.
    #[test]
    fn every_link_belongs_to_one_group() {
        for m in shapes() {
            let mut owner = std::collections::HashMap::new();
            for r in 0..m.world() {
                assert_eq!(m.rank_of(m.coords(r)), r, "{m}");
                for axis in Axis::ALL {
                    let g = m.group_of(r, axis);
                    assert_eq!(g.len(), m.size(axis));
                    assert_eq!(g[m.coords(r).get(axis)], r, "{m}: {r} {axis}");
                    for &a in &g {
                        for &b in &g {
                            if a == b {
                                continue;
                            }
                            assert_eq!(m.link_axis(a, b), Some(axis), "{m}: {a}-{b}");
                            let prev = owner.insert((a.min(b), a.max(b)), axis);
                            assert!(prev.is_none_or(|p| p == axis), "{m}: {a}-{b}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn orders_and_sizes_parse_or_say_what_is_wrong() {
        assert_eq!("tp-dp-pp".parse::<Order>().unwrap(), Order::MEGATRON);
        assert_eq!("PP,dp,tp".parse::<Order>().unwrap().to_string(), "pp-dp-tp");
        for bad in ["tp-dp", "tp-tp-pp", "tp-dp-pp-tp", "", "tp-dp-xx"] {
            assert!(bad.parse::<Order>().is_err(), "{bad}");
        }
        assert!(MeshShape::new(0, 2, 2, Order::MEGATRON).is_err());
        assert!(MeshShape::new(usize::MAX, 2, 2, Order::MEGATRON).is_err());
    }

    #[test]
    fn a_world_of_the_wrong_size_is_refused() {
        let shape = MeshShape::new(2, 2, 1, Order::MEGATRON).unwrap();
        let out = super::super::local::run(2, Algo::Auto, Duration::from_secs(10), |c| {
            with_mesh(c, &shape, Algo::Auto, |_| Ok(()))
        });
        for r in out {
            assert!(matches!(r, Err(CommError::InvalidArgument(_))), "{r:?}");
        }
    }
}
