//! Launching for real: `join_or_spawn` / `spawn_local_ranks` re-running
//! the current binary, a job formed from each launcher family's variables,
//! and a killed launcher taking its ranks with it.

mod tcp_support;

use parbench::comm::tcp;
use parbench::launch::{self, LaunchSource, LocalJob, Role};
use std::process::Command;
use std::time::{Duration, Instant};
use tcp_support::{all_pairs, gone, wait_all, ROLE};

const TIMEOUT: Duration = Duration::from_secs(30);

fn this_test(name: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, name);
    c
}

#[test]
fn join_or_spawn_runs_ranks_of_the_running_binary() {
    let name = "join_or_spawn_runs_ranks_of_the_running_binary";
    if std::env::var(ROLE).ok().as_deref() != Some(name) {
        // The test process itself starts one launcher, as a user starts a binary.
        let status = this_test(name).env_remove("RANK").status().unwrap();
        assert!(status.success(), "{status:?}");
        return;
    }
    // Here: the launcher (no rank variables) or one of its ranks (same arguments).
    match launch::join_or_spawn(Some(3)).unwrap() {
        Role::Launcher(status) => assert!(status.success()),
        Role::Rank(info) => {
            assert_eq!((info.world, info.source), (3, LaunchSource::Spawned));
            assert_eq!(info.local_rank, Some(info.rank));
            assert_eq!(info.token_from, "PARBENCH_JOB_TOKEN");
            all_pairs(
                &mut tcp::connect(&info, TIMEOUT).unwrap(),
                100,
                Instant::now() + TIMEOUT,
            );
        }
        Role::Single => panic!("--nprocs 3 must spawn"),
    }
}

/// A launcher family: the `LaunchSource` it must be read as, its rank,
/// world and local-rank variables, and the job-id variables it sets.
type Family = (
    &'static str,
    [&'static str; 3],
    &'static [(&'static str, &'static str)],
);

#[test]
fn every_launcher_family_forms_a_job() {
    let name = "every_launcher_family_forms_a_job";
    if std::env::var(ROLE).ok().as_deref() == Some(name) {
        let info = launch::RankInfo::from_env().unwrap().unwrap();
        let want = std::env::var("EXPECT_SOURCE").unwrap();
        assert_eq!(format!("{:?}", info.source), want);
        assert_eq!(info.local_rank, Some(info.rank));
        all_pairs(
            &mut tcp::connect(&info, TIMEOUT).unwrap(),
            100,
            Instant::now() + TIMEOUT,
        );
        return;
    }
    let families: [Family; 4] = [
        (
            "Torchrun",
            ["RANK", "WORLD_SIZE", "LOCAL_RANK"],
            &[("TORCHELASTIC_RUN_ID", "run-7")],
        ),
        (
            "OpenMpi",
            [
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
            ],
            &[("PMIX_NAMESPACE", "prterun-x@1")],
        ),
        ("Pmi", ["PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"], &[]),
        (
            "Slurm",
            ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"],
            &[("SLURM_JOB_ID", "99")],
        ),
    ];
    for (source, [rank_var, world_var, local_var], extra) in families {
        // Held until rank 0 serves on it, as a launcher on this host would.
        let store = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = store.local_addr().unwrap().port();
        let mut children: Vec<_> = (0..2)
            .map(|r| {
                let mut c = this_test(name);
                if r == 0 {
                    parbench::launch::hand_store_listener(&mut c, &store);
                }
                for v in [
                    "RANK",
                    "WORLD_SIZE",
                    "PARBENCH_SPAWNED",
                    "PARBENCH_JOB_TOKEN",
                ] {
                    c.env_remove(v);
                }
                c.env(rank_var, r.to_string())
                    .env(world_var, "2")
                    .env(local_var, r.to_string())
                    .env("MASTER_ADDR", "127.0.0.1")
                    .env("MASTER_PORT", port.to_string())
                    .env("EXPECT_SOURCE", source)
                    .envs(extra.iter().copied())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let status = wait_all(&mut children, 30);
        assert!(
            status.iter().all(|s| s.is_some_and(|s| s.success())),
            "{source}: {status:?}"
        );
    }
}

#[test]
fn killed_launcher_takes_its_ranks_with_it() {
    let name = "killed_launcher_takes_its_ranks_with_it";
    if std::env::var(ROLE).ok().as_deref() == Some(name) {
        // The launcher: three ranks that would sleep for a minute.
        let script = "echo $$ > \"$PIDDIR/$RANK.pid\"; exec sleep 60";
        let _ = LocalJob::new(3, "/bin/sh", ["-c", script]).run();
        return;
    }
    let dir = std::env::temp_dir().join(format!("parbench-tcp-launch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut launcher = this_test(name).env("PIDDIR", &dir).spawn().unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    let pids: Vec<u32> = loop {
        let read: Vec<Option<u32>> = (0..3)
            .map(|r| {
                std::fs::read_to_string(dir.join(format!("{r}.pid")))
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
            })
            .collect();
        if read.iter().all(Option::is_some) {
            break read.into_iter().flatten().collect();
        }
        assert!(Instant::now() < until, "ranks did not start");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(pids.iter().all(|&p| !gone(p)));
    launcher.kill().unwrap(); // SIGKILL: no chance to clean up
    launcher.wait().unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while !pids.iter().all(|&p| gone(p)) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        pids.iter().all(|&p| gone(p)),
        "ranks outlived their launcher: {pids:?}"
    );
}
