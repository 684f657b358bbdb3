//! The algorithm a record or a flag names, as the model reads it.
//!
//! Records keep the name they were written with (`ring`, `auto`, `nccl`,
//! `mpi(staged-in-place)`, ...); the model's functions take a [`ModelAlgo`],
//! parsed once where the record is read or the flag parsed
//! ([`ModelAlgo::of`]), so no formula matches on a string.

use crate::comm::algo::Algorithm;
use std::fmt;

/// What an algorithm name means to the model. Serialized as its name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(from = "String", into = "String")]
pub enum ModelAlgo {
    /// A choice made by someone else: the size-based `auto`, or a library
    /// that does not say what it ran (`nccl`, `mpi...`). The name as given.
    /// The model predicts the best of the collective's algorithms for it.
    Selector(String),
    /// One of parbench's algorithms: what a CPU backend records it ran, or
    /// what a user asked for by name.
    Ran(Algorithm),
    /// A name the model has no form for (NCCL's `nvls`, a typo): every
    /// prediction of it is `None`. The name as given.
    Unknown(String),
}

/// Every [`Algorithm`], in the order of its declaration.
pub const ALGORITHMS: [Algorithm; 7] = [
    Algorithm::Ring,
    Algorithm::Tree,
    Algorithm::RecursiveDoubling,
    Algorithm::HalvingDoubling,
    Algorithm::Chain,
    Algorithm::Pairwise,
    Algorithm::PointToPoint,
];

impl ModelAlgo {
    /// The meaning of `name` (case-insensitive): `auto`, `nccl` and any
    /// `mpi...` are selectors; an [`Algorithm::name`] is that algorithm;
    /// anything else is unknown.
    pub fn of(name: &str) -> ModelAlgo {
        let lower = name.to_ascii_lowercase();
        if lower == "auto" || lower == "nccl" || lower.starts_with("mpi") {
            return ModelAlgo::Selector(name.to_string());
        }
        match ALGORITHMS.into_iter().find(|a| a.name() == lower) {
            Some(a) => ModelAlgo::Ran(a),
            None => ModelAlgo::Unknown(name.to_string()),
        }
    }

    /// Whether this names a choice made by someone else ([`ModelAlgo::Selector`]).
    pub fn is_selector(&self) -> bool {
        matches!(self, ModelAlgo::Selector(_))
    }

    /// The algorithm, when one was named.
    pub fn ran(&self) -> Option<Algorithm> {
        match self {
            ModelAlgo::Ran(a) => Some(*a),
            _ => None,
        }
    }

    /// The name: as given for a selector or an unknown name, the
    /// algorithm's own name otherwise.
    pub fn name(&self) -> &str {
        match self {
            ModelAlgo::Selector(s) | ModelAlgo::Unknown(s) => s,
            ModelAlgo::Ran(a) => a.name(),
        }
    }
}

impl From<Algorithm> for ModelAlgo {
    fn from(a: Algorithm) -> Self {
        ModelAlgo::Ran(a)
    }
}

impl From<&str> for ModelAlgo {
    fn from(name: &str) -> Self {
        ModelAlgo::of(name)
    }
}

impl From<String> for ModelAlgo {
    fn from(name: String) -> Self {
        ModelAlgo::of(&name)
    }
}

impl From<ModelAlgo> for String {
    fn from(a: ModelAlgo) -> Self {
        a.name().to_string()
    }
}

impl fmt::Display for ModelAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_to_what_they_mean() {
        for a in ALGORITHMS {
            assert_eq!(ModelAlgo::of(a.name()), ModelAlgo::Ran(a));
            assert_eq!(ModelAlgo::of(&a.name().to_uppercase()), ModelAlgo::Ran(a));
        }
        for sel in ["auto", "nccl", "NCCL", "mpi", "mpi(staged-in-place)"] {
            let m = ModelAlgo::of(sel);
            assert!(m.is_selector(), "{sel}");
            assert_eq!(m.name(), sel);
        }
        assert_eq!(
            ModelAlgo::of("nvls"),
            ModelAlgo::Unknown("nvls".to_string())
        );
        assert_eq!(ModelAlgo::of("Ring").to_string(), "ring");
        assert_eq!(ModelAlgo::of("bogus").ran(), None);
    }
}
