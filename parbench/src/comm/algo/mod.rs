//! Collective algorithms, each written once over a [`super::Transport`].
