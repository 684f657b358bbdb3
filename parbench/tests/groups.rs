//! Sub-groups ([`parbench::comm::group::split`]) on the local and tcp
//! backends: every rank splits the world (even/odd ranks; tp x dp groups
//! of a 2 x 2 mesh; a rank that stays out), runs collectives in its group,
//! and checks the values against what its group's members hold.

mod group_support;
mod tcp_support;

use group_support::sum;
use parbench::comm::group::split;
use parbench::comm::{local, tcp, Algo, CommBuffer, CommResult, Communicator, DType, Io};
use std::time::Duration;
use tcp_support::{job, worker};

const TIMEOUT: Duration = Duration::from_secs(60);

/// Every check of one rank: returns a description of each wrong value.
fn check_rank<C: Communicator>(comm: &mut C) -> CommResult<Vec<String>> {
    let (rank, world) = (comm.rank(), comm.world());
    let mut wrong = Vec::new();
    // Even and odd ranks: each group sums its members' (rank + 1).
    {
        let mut g =
            split(comm, Some((rank % 2) as u32), 0, Algo::Auto)?.expect("every rank has a colour");
        let want: f64 = (0..world)
            .filter(|r| r % 2 == rank % 2)
            .map(|r| r as f64 + 1.0)
            .sum();
        let got = sum(&mut g, rank as f64 + 1.0)?;
        if got != want {
            wrong.push(format!("rank {rank} even/odd: {got} != {want}"));
        }
        let members = g.transport().members().ranks.clone();
        let expect: Vec<usize> = (0..world).filter(|r| r % 2 == rank % 2).collect();
        if members != expect || g.world() != expect.len() || g.rank() != rank / 2 {
            wrong.push(format!(
                "rank {rank}: members {members:?}, group rank {}",
                g.rank()
            ));
        }
        // A gather in the group: every member's parent rank, in group order.
        let mut send = g.alloc(8)?;
        send.write_from_host(&(rank as u64).to_le_bytes())?;
        let mut recv = g.alloc(8 * g.world())?;
        g.all_gather(
            Io::OutOfPlace {
                send: &send,
                recv: &mut recv,
            },
            1,
            DType::I64,
        )?;
        let mut bytes = vec![0u8; 8 * g.world()];
        recv.read_to_host(&mut bytes)?;
        let gathered: Vec<usize> = bytes
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()) as usize)
            .collect();
        if gathered != expect {
            wrong.push(format!(
                "rank {rank} all_gather: {gathered:?} != {expect:?}"
            ));
        }
    }
    // The parent still works after the group is gone.
    let all = sum(comm, 1.0)?;
    if all != world as f64 {
        wrong.push(format!("rank {rank} world after split: {all}"));
    }
    if world == 4 {
        // A 2 x 2 mesh, tp fastest: tp groups {0,1} {2,3}, dp groups {0,2} {1,3}.
        let (tp_id, dp_id) = (rank / 2, rank % 2);
        {
            let mut tp = split(comm, Some(tp_id as u32), rank as u32, Algo::Ring)?.unwrap();
            // Ranks 2t and 2t + 1, each giving 10 x its rank.
            let want = 10.0 * (4 * tp_id + 1) as f64;
            let got = sum(&mut tp, 10.0 * rank as f64)?;
            if got != want {
                wrong.push(format!("rank {rank} tp: {got} != {want}"));
            }
        }
        {
            // The key reverses the order: group rank 0 is the higher parent rank.
            let mut dp = split(comm, Some(dp_id as u32), (4 - rank) as u32, Algo::Auto)?.unwrap();
            let want = (10 * dp_id + 10 * (dp_id + 2)) as f64;
            let got = sum(&mut dp, 10.0 * rank as f64)?;
            if got != want {
                wrong.push(format!("rank {rank} dp: {got} != {want}"));
            }
            if dp.rank() != usize::from(rank < 2) {
                wrong.push(format!(
                    "rank {rank} dp rank {} (keys reverse the order)",
                    dp.rank()
                ));
            }
        }
        // Rank 3 stays out; 0, 1, 2 form one group.
        let colour = (rank != 3).then_some(7);
        match split(comm, colour, 0, Algo::Auto)? {
            Some(mut g) => {
                let got = sum(&mut g, rank as f64)?;
                if got != 3.0 || g.world() != 3 {
                    wrong.push(format!("rank {rank} without 3: {got}, world {}", g.world()));
                }
            }
            None if rank == 3 => {}
            None => wrong.push(format!("rank {rank} was left out")),
        }
    }
    comm.barrier()?;
    Ok(wrong)
}

#[test]
fn local_ranks_split_into_groups_that_reduce_their_own_values() {
    for world in [2, 3, 4] {
        let results = local::run(world, Algo::Auto, TIMEOUT, check_rank);
        for (rank, r) in results.into_iter().enumerate() {
            let wrong = r.unwrap_or_else(|e| panic!("world {world} rank {rank}: {e}"));
            assert!(wrong.is_empty(), "world {world}: {wrong:?}");
        }
    }
}

#[test]
fn tcp_ranks_split_into_groups_that_reduce_their_own_values() {
    let name = "tcp_ranks_split_into_groups_that_reduce_their_own_values";
    if let Some(info) = worker(name) {
        let mut comm = tcp::comm(&info, Algo::Auto, TIMEOUT).unwrap();
        let wrong = check_rank(&mut comm).unwrap();
        assert!(wrong.is_empty(), "{wrong:?}");
        return;
    }
    let status = job(name, 4).run();
    assert!(
        status.is_ok_and(|s| s.success()),
        "a tcp rank failed its group checks"
    );
}
