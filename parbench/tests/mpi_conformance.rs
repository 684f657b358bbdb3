//! The conformance suite over the `mpi` backend: the test re-runs its own
//! binary under `mpirun`, each rank running the suite through `MpiComm`.
//! Needs the `mpi` feature and Open MPI's `mpirun`; says plainly when it skips.
#![cfg(feature = "mpi")]

use parbench::comm::conformance::{run_suite, run_v_suite, Matrix};
use parbench::comm::mpi::{rerun_under_mpirun, MpiComm};
use parbench::comm::{Collective, DType, ReduceOp};
use std::time::Duration;

const ROLE: &str = "PARBENCH_MPI_TEST_ROLE";

/// MPI has no half types: the reducing collectives run every other type, the
/// data movers run all of them.
fn matrices() -> [Matrix; 2] {
    let reducing = Matrix {
        collectives: vec![
            Collective::AllReduce,
            Collective::ReduceScatter,
            Collective::Reduce,
        ],
        // Every type but the floats narrower than 32 bits, in `ALL`'s order.
        dtypes: DType::ALL
            .into_iter()
            .filter(|d| !d.is_float() || d.size() >= 4)
            .collect(),
        ops: ReduceOp::ALL.to_vec(),
        counts: vec![0, 1, 7],
        large_counts: vec![1_048_579],
        large_dtypes: vec![DType::F32],
    };
    let moving = Matrix {
        collectives: vec![
            Collective::AllGather,
            Collective::Broadcast,
            Collective::AllToAll,
            Collective::AllToAllV,
            Collective::SendRecv,
        ],
        dtypes: DType::ALL.to_vec(),
        ops: vec![ReduceOp::Sum],
        counts: vec![0, 1, 7],
        large_counts: vec![1_048_579],
        large_dtypes: vec![DType::BF16],
    };
    [reducing, moving]
}

#[test]
fn mpi_backend_passes_the_conformance_suite() {
    if std::env::var(ROLE).is_ok() {
        // A rank of the job below.
        let mut comm = MpiComm::init(Duration::from_secs(60)).expect("MPI init");
        let mut wrong = Vec::new();
        for m in matrices() {
            wrong.extend(run_suite(&mut comm, &m).expect("suite ran"));
        }
        wrong.extend(run_v_suite(&mut comm).expect("all_to_all_v cases ran"));
        for w in &wrong {
            eprintln!("{w}");
        }
        assert!(wrong.is_empty(), "{} mismatches", wrong.len());
        return;
    }
    let test = "mpi_backend_passes_the_conformance_suite";
    for np in [1, 2, 3, 4] {
        let Some(out) = rerun_under_mpirun(np, &[test, "--exact", "--nocapture"], (ROLE, "1"))
        else {
            eprintln!("SKIP {test}: mpirun not found (apt-get install openmpi-bin)");
            return;
        };
        let out = out.expect("mpirun runs");
        assert!(
            out.status.success(),
            "mpirun -np {np} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
