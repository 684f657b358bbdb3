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
//! What stays per backend, because a backend implements it: the
//! `Communicator` method (host backends run `comm/algo/` over their
//! transport, NCCL and MPI call their library), its sequential meaning in
//! `comm/reference.rs` and its conformance row. See docs/architecture.md,
//! "Checklist: add a collective".

mod all_gather;
mod all_reduce;
mod all_to_all;
mod broadcast;
mod reduce;
mod reduce_scatter;
mod sendrecv;

use super::algo::Algorithm;
use std::fmt;
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

/// Everything about one collective that holds on every backend. The byte
/// rule's defaults are one block of `count` elements in each buffer, at
/// offset 0 in place.
pub trait Spec: Sync {
    /// The name on command lines and in records (`all_reduce`, ...).
    fn name(&self) -> &'static str;
    /// The nccl-tests binary whose output this collective's block stands for.
    fn nccl_tests_binary(&self) -> &'static str;
    /// NCCL's name of it in its tuning log; `None` for those NCCL builds
    /// from send/recv, which the log does not report.
    fn nccl_func(&self) -> Option<&'static str>;
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

/// The algorithms [`rooted_form`] prices.
const TREE_AND_CHAIN: &[Algorithm] = &[Algorithm::Tree, Algorithm::Chain];

/// The registry: one line per collective, `Variant => file::Spec`, in the
/// order sweeps run them. It makes the enum, `ALL` and the dispatch.
macro_rules! registry {
    ($($variant:ident => $file:ident::$spec:ident,)*) => {
        /// The operations a communicator offers, as the benches and records name them.
        #[derive(
            Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize,
            serde::Deserialize,
        )]
        #[serde(rename_all = "snake_case")]
        pub enum Collective {
            $($variant,)*
        }

        impl Collective {
            /// Every collective, in the order sweeps run them.
            pub const ALL: [Collective; [$(stringify!($variant),)*].len()] =
                [$(Collective::$variant,)*];

            /// This collective's file.
            pub fn spec(self) -> &'static dyn Spec {
                match self {
                    $(Collective::$variant => &$file::$spec,)*
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
    SendRecv => sendrecv::SendRecv,
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

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
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
        assert_eq!(
            "x".parse::<Collective>().unwrap_err(),
            "unknown collective 'x' (expected all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all or sendrecv)"
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
