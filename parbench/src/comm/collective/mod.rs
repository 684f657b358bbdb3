//! The collectives, one file each: every fact about a collective that does
//! not depend on a backend lives in its file, behind one trait ([`Spec`]),
//! and the one registry ([`registry!`] below, one line per collective)
//! makes the [`Collective`] enum, its `ALL`, its names and `FromStr`, and
//! the dispatch of every [`Spec`] method.
//!
//! A file says: the name on command lines and in records, the nccl-tests
//! binary it stands for, NCCL's name of it (tuning log), whether it reduces
//! or has a root, its byte rule (blocks of `count` elements in each buffer,
//! where the input and output sit in place), nccl-tests' bus-bandwidth
//! factor, and the algorithms `model` prices it with and the cost form of
//! each ([`CostForm`]; `model::alpha_beta` turns a form into alpha-beta
//! terms, so this module needs nothing from `model`).
//!
//! A file also says how parbench runs it and what it means: which
//! algorithm it runs for a user's `--algo` ([`Spec::choose`]), its host
//! algorithm over a [`Transport`] ([`Spec::host`]: what `HostComm` runs,
//! and what NCCL and MPI run for a collective their library lacks, over
//! their own point-to-point calls), and its sequential meaning
//! ([`Spec::expected`], which the conformance suite checks every backend
//! against). Backends keep their own native calls (a table per backend).
//! See docs/architecture.md, "Checklist: add a collective".

mod all_gather;
mod all_reduce;
mod all_to_all;
pub mod all_to_all_v;
mod broadcast;
#[cfg(test)]
mod gather;
mod reduce;
mod reduce_scatter;
pub mod sendrecv;

use super::algo::Algorithm;
use super::{Algo, CollArgs, CommResult, HostRun, Transport};
use std::str::FromStr;

/// The cost structure of one algorithm of one collective, by the name of
/// `model::alpha_beta`'s building block that prices it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CostForm {
    /// Ring reduce-scatter then all-gather, sliced (`sliced_ring`).
    RingAllReduce,
    /// One ring pass, sliced (`sliced_ring`): all_gather, or
    /// reduce_scatter when `reduced`.
    RingPass { reduced: bool },
    /// Recursive doubling all_reduce (`rd_all_reduce`).
    RecursiveDoublingAllReduce,
    /// Halving-doubling all_reduce (`rhd_all_reduce`).
    HalvingDoublingAllReduce,
    /// Binomial reduce then broadcast (`tree_all_reduce`).
    TreeAllReduce,
    /// Recursive doubling all_gather (`rd_all_gather`).
    RecursiveDoublingAllGather,
    /// Recursive halving reduce_scatter (`rh_reduce_scatter`).
    HalvingReduceScatter,
    /// Binomial tree broadcast, or reduce when `reduced` (`binomial_tree`).
    BinomialTree { reduced: bool },
    /// Pipelined chain broadcast, or reduce when `reduced` (`chain_terms`).
    Chain { reduced: bool },
    /// Pairwise exchange (`pairwise_all_to_all`).
    Pairwise,
    /// One message each way (`sendrecv`).
    SendRecv,
}

/// What a collective is called: on command lines and in records, by the
/// nccl-tests binary it stands for, and in NCCL's tuning log (see
/// [`Spec::name`], [`Spec::nccl_tests_binary`], [`Spec::nccl_func`]).
pub struct Names(pub &'static str, pub &'static str, pub Option<&'static str>);

/// Everything about one collective that holds on every backend. The byte
/// rule's defaults are one block of `count` elements in each buffer, at
/// offset 0 in place.
pub trait Spec: Sync {
    /// Its three names, in one line of its file.
    fn names(&self) -> Names;
    /// The name on command lines and in records (`all_reduce`, ...).
    fn name(&self) -> &'static str {
        self.names().0
    }
    /// The nccl-tests binary whose output this collective's block stands for.
    fn nccl_tests_binary(&self) -> &'static str {
        self.names().1
    }
    /// NCCL's name of it in its tuning log; `None` for those NCCL builds
    /// from send/recv, which the log does not report.
    fn nccl_func(&self) -> Option<&'static str> {
        self.names().2
    }
    /// Whether it takes a reduction operator.
    fn reduces(&self) -> bool {
        false
    }
    /// Whether it takes a root.
    fn rooted(&self) -> bool {
        false
    }
    /// Blocks of `count` elements in each rank's send buffer.
    fn send_blocks(&self, world: usize) -> usize {
        let _ = world;
        1
    }
    /// Blocks of `count` elements in each rank's receive buffer.
    fn recv_blocks(&self, world: usize) -> usize {
        let _ = world;
        1
    }
    /// Where (elements) the input starts in the one buffer of an in-place call.
    fn in_place_input(&self, count: usize, rank: usize) -> usize {
        let _ = (count, rank);
        0
    }
    /// Where (elements) the output starts in the one buffer of an in-place call.
    fn in_place_output(&self, count: usize, rank: usize) -> usize {
        let _ = (count, rank);
        0
    }
    /// Whether it has an in-place form (one buffer holding the input and
    /// the output); a collective of two buffers only says `false`.
    fn in_place_form(&self) -> bool {
        true
    }
    /// NCCL's bytes (its tuning log's) of a call that sends `send_bytes` per rank.
    fn nccl_bytes(&self, send_bytes: u64, world: usize) -> u64 {
        let _ = world;
        send_bytes
    }
    /// nccl-tests' bus-bandwidth factor on `world` ranks (`doc/PERFORMANCE.md`).
    fn busbw_factor(&self, world: usize) -> f64;
    /// The algorithms the model prices it with: what a selector (`auto`,
    /// a library) is predicted to choose among.
    fn modelled(&self) -> &'static [Algorithm];
    /// The cost form of `algo` for it, as parbench's CPU backends run it;
    /// `None` for an algorithm it has no form for.
    fn form(&self, algo: Algorithm) -> Option<CostForm>;
    /// What parbench's host algorithms run for it when the user asked for
    /// `algo`, on `world` ranks with `bytes` per-rank block bytes. A request
    /// it has no such algorithm for falls back to its usual one (the
    /// returned plan says which, so records stay honest).
    fn choose(&self, algo: Algo, world: usize, bytes: usize) -> Algorithm;
    /// Whether rank `rank`'s input is read when the root is `root`
    /// (broadcast reads the root's only); the conformance suite hands the
    /// others garbage.
    fn reads_input(&self, rank: usize, root: usize) -> bool {
        let _ = (rank, root);
        true
    }
    /// Whether a call over a slice of every block means that slice of
    /// the call's output (each output element from the same element of
    /// the input blocks, as in every NCCL collective): how a bench may
    /// ask [`Spec::expected`] a slice at a time. `false` for a collective
    /// whose layout depends on `count` (all_to_all_v).
    fn sliceable(&self) -> bool {
        true
    }
    /// Its sequential meaning: the whole receive buffer rank `x.rank`
    /// holds afterwards, given every rank's input, or `None` where the
    /// collective leaves it undefined.
    fn expected(&self, x: &Expect<'_>) -> Option<Vec<u8>>;
    /// Its host algorithm: checks the buffers (NCCL's layouts, errors
    /// naming the collective and the buffer), moves the bytes over
    /// `run.t` with the algorithm `run.plan` and finishes `Avg`.
    fn host<T: Transport>(&self, run: HostRun<'_, T>) -> CommResult<()>
    where
        Self: Sized;
}

/// Every rank's input to one call, as [`Spec::expected`] reads it: built
/// on demand, so that a meaning reads only the blocks it needs.
pub struct Expect<'a> {
    pub world: usize,
    /// The rank whose output is wanted.
    pub rank: usize,
    pub args: CollArgs,
    /// Elements `first..first + n` of rank `r`'s input, as bytes: `(r, first, n)`.
    pub input: &'a dyn Fn(usize, usize, usize) -> Vec<u8>,
}

impl Expect<'_> {
    /// Block `j` (`count` elements) of rank `r`'s input.
    pub fn block(&self, r: usize, j: usize) -> Vec<u8> {
        (self.input)(r, j * self.args.count, self.args.count)
    }

    /// Block `j` of every rank's input, in rank order.
    pub fn blocks(&self, j: usize) -> Vec<Vec<u8>> {
        (0..self.world).map(|r| self.block(r, j)).collect()
    }
}

/// Borrows each of `v` as a slice (what `comm::reference` takes).
pub fn slices(v: &[Vec<u8>]) -> Vec<&[u8]> {
    v.iter().map(|b| b.as_slice()).collect()
}

/// What the files use, in one line each.
pub(crate) mod premul;

mod prelude {
    pub(super) use super::{CostForm, Expect, Names, Spec};
    pub(super) use crate::comm::algo::{self, Algorithm};
    pub(super) use crate::comm::host::views;
    pub(super) use crate::comm::{
        copy_bytes, finish_avg, nbytes, need, reference, Algo, CollArgs, CommResult, Communicator,
        HostRun, Io, RecvInto, ReduceOp, Transport,
    };
}

/// `(n - 1) / n`, 0 for no rank: the share of the data a rank receives in
/// the bandwidth-optimal all_gather, reduce_scatter and all_to_all.
pub fn others_share(world: usize) -> f64 {
    if world == 0 {
        0.0
    } else {
        (world as f64 - 1.0) / world as f64
    }
}

/// What broadcast and reduce (when `reduced`) are modelled with: a
/// binomial tree and a pipelined chain. A ring is run as a chain (as NCCL
/// and parbench run it).
fn rooted_form(algo: Algorithm, reduced: bool) -> Option<CostForm> {
    match algo {
        Algorithm::Tree => Some(CostForm::BinomialTree { reduced }),
        Algorithm::Ring | Algorithm::Chain => Some(CostForm::Chain { reduced }),
        _ => None,
    }
}

/// What broadcast and reduce run: a ring request is the chain (as NCCL
/// runs it), `auto` pipelines a large message down a chain on three or
/// more ranks, anything else is the binomial tree.
fn rooted_choice(algo: Algo, world: usize, bytes: usize) -> Algorithm {
    match algo {
        Algo::Ring => Algorithm::Chain,
        Algo::Auto if world > 2 && bytes >= super::algo::AUTO_CHAIN_MIN_BYTES => Algorithm::Chain,
        _ => Algorithm::Tree,
    }
}

/// The algorithms [`rooted_form`] prices.
const TREE_AND_CHAIN: &[Algorithm] = &[Algorithm::Tree, Algorithm::Chain];

/// The registry: one line per collective, `Variant => file::Spec`, in the
/// order sweeps run them. It makes the enum, `ALL` and the dispatch. Lines
/// after `; test:` exist in this crate's unit tests only and are left out of
/// `ALL` (so sweeps, names and records are the real ones): they show a
/// collective made of its file and its line alone.
macro_rules! registry {
    (
        $($variant:ident => $file:ident::$spec:ident,)*
        ; test: $($t_variant:ident => $t_file:ident::$t_spec:ident,)*
    ) => {
        /// The operations a communicator offers, as the benches and records name them.
        #[derive(
            Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize,
            serde::Deserialize,
        )]
        #[serde(rename_all = "snake_case")]
        pub enum Collective {
            $($variant,)*
            $(#[cfg(test)] $t_variant,)*
        }

        impl Collective {
            /// Every collective, in the order sweeps run them.
            pub const ALL: [Collective; [$(stringify!($variant),)*].len()] =
                [$(Collective::$variant,)*];

            /// This collective's file.
            pub fn spec(self) -> &'static dyn Spec {
                match self {
                    $(Collective::$variant => &$file::$spec,)*
                    $(#[cfg(test)] Collective::$t_variant => &$t_file::$t_spec,)*
                }
            }

            /// Runs this collective's host algorithm ([`Spec::host`]),
            /// `MulSum`'s pre-multiplication first ([`premul`]).
            pub fn run_host<T: Transport>(self, run: HostRun<'_, T>) -> CommResult<()> {
                premul::run(self, run)
            }

            /// The file's own host algorithm, given an op it reduces by.
            fn run_spec_host<T: Transport>(self, run: HostRun<'_, T>) -> CommResult<()> {
                match self {
                    $(Collective::$variant => $file::$spec.host(run),)*
                    $(#[cfg(test)] Collective::$t_variant => $t_file::$t_spec.host(run),)*
                }
            }
        }
    };
}

registry! {
    AllReduce => all_reduce::AllReduce,
    AllGather => all_gather::AllGather,
    ReduceScatter => reduce_scatter::ReduceScatter,
    Broadcast => broadcast::Broadcast,
    Reduce => reduce::Reduce,
    AllToAll => all_to_all::AllToAll,
    AllToAllV => all_to_all_v::AllToAllV,
    SendRecv => sendrecv::SendRecv,
    ; test:
    Gather => gather::Gather,
}

impl Collective {
    /// The name used on command lines and in records (`all_reduce`, ...).
    pub fn name(self) -> &'static str {
        self.spec().name()
    }

    /// Whether the operation takes a reduction operator.
    pub fn reduces(self) -> bool {
        self.spec().reduces()
    }

    /// Whether the operation takes a root.
    pub fn rooted(self) -> bool {
        self.spec().rooted()
    }
}

impl FromStr for Collective {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let norm = s.to_ascii_lowercase().replace('-', "_");
        Collective::ALL
            .into_iter()
            .find(|c| c.name() == norm || c.name().replace('_', "") == norm)
            .ok_or_else(|| format!("unknown collective '{s}' (expected {})", names_in_words()))
    }
}

/// Every name, `a, b or c`.
fn names_in_words() -> String {
    let names: Vec<&str> = Collective::ALL.iter().map(|c| c.name()).collect();
    match names.split_last() {
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_the_error_lists_them() {
        for c in Collective::ALL {
            assert_eq!(c.name().parse::<Collective>(), Ok(c));
        }
        assert_eq!("AllReduce".parse::<Collective>(), Ok(Collective::AllReduce));
        assert_eq!("all-to-all".parse::<Collective>(), Ok(Collective::AllToAll));
        assert_eq!("alltoallv".parse::<Collective>(), Ok(Collective::AllToAllV));
        assert_eq!(
            "x".parse::<Collective>().unwrap_err(),
            "unknown collective 'x' (expected all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all, all_to_all_v or sendrecv)"
        );
    }

    #[test]
    fn every_modelled_algorithm_has_a_form() {
        for c in Collective::ALL {
            assert!(!c.spec().modelled().is_empty(), "{c}");
            for &a in c.spec().modelled() {
                assert!(c.spec().form(a).is_some(), "{c} {a:?}");
            }
        }
    }
}
