//! Rank discovery (torchrun, mpirun, srun variables), self-spawn of N local
//! ranks, and the rendezvous store.
