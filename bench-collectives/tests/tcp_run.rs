//! End-to-end runs of the binary on the `tcp` backend: `-np 2` spawns two
//! rank processes on loopback.

mod common;
use common::*;

#[test]
fn two_processes_sweep_exactly_and_rank_zero_records() {
    let dir = scratch("tcp");
    let out = dir.to_str().unwrap();
    let mut args = small_on("tcp");
    args.extend_from_slice(&[
        "all_reduce",
        "all_gather",
        "broadcast",
        "-r",
        "1",
        "--out",
        out,
    ]);
    let o = run(&args, &[]);
    let text = stdout(&o);
    assert!(o.status.success(), "{text}\n{}", stderr(&o));
    assert!(text.contains("tcp over tcp, 2 ranks"), "{text}");
    assert!(
        text.contains("# ceiling ") && text.contains("send/recv streams"),
        "{text}"
    );
    assert!(text.contains("# Out of bounds values : 0 OK"), "{text}");
    // Only rank 0 prints the table.
    assert_eq!(text.matches("# all_reduce, busbw").count(), 1, "{text}");
    let (_, rows) = read_csv(&dir.join("collectives.csv"));
    assert_eq!(rows.len(), 3 * 4 * 2);
    for r in &rows {
        assert_eq!(
            (
                r["backend"].as_str(),
                r["world"].as_str(),
                r["wrong"].as_str()
            ),
            ("tcp", "2", "0"),
            "{r:?}"
        );
    }
    assert!(rows
        .iter()
        .filter(|r| r["collective"] == "broadcast")
        .all(|r| r["root"] == "1"));
    // Every row priced from the figures the run recorded.
    let runs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).unwrap()).unwrap();
    let extra = &runs[0]["extra"];
    for r in &rows {
        assert_model_priced(extra, r);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_wrong_element_on_another_process_makes_exit_code_seven() {
    let dir = scratch("tcp-corrupt");
    let out = dir.to_str().unwrap();
    let args = with(&small_on("tcp"), &["all_reduce", "-e", "64", "--out", out]);
    let o = run(&args, &[("PARBENCH_SELFTEST_CORRUPT_RANK", "1")]);
    assert_eq!(o.status.code(), Some(7), "{}\n{}", stdout(&o), stderr(&o));
    let (_, rows) = read_csv(&dir.join("collectives.csv"));
    assert!(
        !rows.is_empty() && rows.iter().all(|r| r["wrong"] == "1"),
        "{rows:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts a tcp job of `np` ranks that runs until it is stopped (8-byte
/// all_reduces, every wait 10 s) and returns it with its ranks' pids.
fn start_endless_tcp_job(np: usize, name: &str) -> (std::process::Child, Vec<(usize, i32)>) {
    let dir = scratch(name);
    let np_text = np.to_string();
    let child = start(&[
        "--backend",
        "tcp",
        "-np",
        &np_text,
        "--timeout",
        "10",
        "-b",
        "8",
        "-e",
        "8",
        "-n",
        "1000000",
        "-w",
        "0",
        "all_reduce",
        "--out",
        dir.to_str().unwrap(),
    ]);
    let ranks = ranks_of(child.id(), np, 30);
    (child, ranks)
}

/// Kills rank `victim` of a 4-rank tcp job right after the ranks start
/// and returns what the launcher printed and its exit status.
fn kill_one_rank(victim: usize, after_ms: u64, trial: usize) -> std::process::Output {
    let (child, ranks) = start_endless_tcp_job(4, &format!("kill-{trial}"));
    std::thread::sleep(std::time::Duration::from_millis(after_ms));
    let pid = ranks.iter().find(|(r, _)| *r == victim).unwrap().1;
    // SAFETY: plain kill(2) of a child of the binary under test.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    finish_within(child, 60)
}

#[test]
fn a_killed_rank_is_named_by_the_launcher_every_time() {
    // Once 3 runs in 20 printed nothing at all, and the exit code was that
    // of the lowest-numbered failed rank.
    let trials = 20;
    let mut named = 0;
    for trial in 0..trials {
        let victim = 1 + trial % 3;
        // At start-up, at the rendezvous, in the ceiling's measurement, in the sweep.
        let after_ms = [0, 50, 200, 500, 1000][trial % 5];
        let o = kill_one_rank(victim, after_ms, trial);
        let err = stderr(&o);
        let want = format!("rank {victim} was killed by signal 9 (SIGKILL)");
        assert!(
            err.contains(&want),
            "trial {trial}: {err:?} does not name rank {victim}"
        );
        // The first rank to fail in time sets the exit code: 128 + 9.
        assert_eq!(o.status.code(), Some(137), "trial {trial}: {err}");
        for line in err.lines() {
            assert!(
                line.starts_with("bench-collectives: "),
                "trial {trial}: torn line {line:?}"
            );
            for r in 0..4 {
                let twice = format!("rank {r}: rank {r}:");
                assert!(!line.contains(&twice), "trial {trial}: {line}");
            }
        }
        named += 1;
    }
    assert_eq!(named, trials);
}

#[test]
fn a_rank_alone_names_itself_once_and_the_wait_it_really_waited() {
    // Rank 0 of a world of 2 whose rank 1 never comes: it waits for rank
    // 1's address in the store until --timeout, and says so once.
    // Held from here until rank 0 serves on it, as a launcher would hold it.
    let store = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = store.local_addr().unwrap().port().to_string();
    let dir = scratch("alone");
    let t = std::time::Instant::now();
    let mut cmd = binary();
    cmd.args(flags("--backend tcp --timeout 1 -b 8 -e 8 --out"))
        .arg(&dir)
        .envs([
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", &port),
            ("PARBENCH_JOB_TOKEN", "alone"),
        ]);
    parbench::launch::hand_store_listener(&mut cmd, &store);
    let o = cmd.output().expect("the binary starts");
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(t.elapsed() < std::time::Duration::from_secs(30));
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert_eq!(err.matches("rank 0:").count(), 1, "one prefix: {err}");
    // The whole wait (about the 1 s deadline), not the last poll's microseconds.
    let after = err.split("timed out after ").nth(1).unwrap_or("");
    let (n, unit) = after.split_once(' ').unwrap_or(("", ""));
    let secs: f64 = n.parse::<f64>().unwrap_or(0.0)
        * match unit.split_whitespace().next() {
            Some("s") => 1.0,
            Some("ms") => 1e-3,
            _ => 0.0,
        };
    assert!((0.9..5.0).contains(&secs), "{secs} s: {err}");
}

#[test]
fn the_spawner_gives_each_job_its_own_random_token() {
    // Was: without a launcher's token every job used the fixed default,
    // so any local process could speak for a rank.
    let mut tokens = Vec::new();
    for job in 0..2 {
        let (child, ranks) = start_endless_tcp_job(2, &format!("token-{job}"));
        let of_rank: Vec<String> = ranks
            .iter()
            .map(|(_, pid)| {
                let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
                env.split(|&b| b == 0)
                    .find_map(|v| v.strip_prefix(b"PARBENCH_JOB_TOKEN="))
                    .map(|t| String::from_utf8_lossy(t).into_owned())
                    .unwrap_or_default()
            })
            .collect();
        // SAFETY: kill(2) of the launcher this test started; its ranks die with it.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let _ = finish_within(child, 30);
        assert_eq!(of_rank[0], of_rank[1], "one token per job");
        assert_eq!(of_rank[0].len(), 32, "{of_rank:?}");
        assert!(of_rank[0].chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(of_rank[0], "parbench-default-token");
        tokens.push(of_rank[0].clone());
    }
    assert_ne!(tokens[0], tokens[1], "a fresh token per job");
}

#[test]
fn a_job_started_by_hand_without_a_token_is_refused() {
    // Was: it joined with the public default token, so any local user
    // could register as rank 1, receive rank 0's handshake and stop it.
    let dir = scratch("no-token");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_bench-collectives"));
    // Every variable a token is taken from (`launch::env`'s job_token).
    let token_vars =
        "PARBENCH_JOB_TOKEN TORCHELASTIC_RUN_ID PMIX_NAMESPACE OMPI_MCA_ess_base_jobid PMI_KVSNAME SLURM_JOB_ID";
    for var in token_vars.split_whitespace() {
        cmd.env_remove(var);
    }
    cmd.args(["--backend", "tcp", "-e", "8", "--timeout", "5", "--out"])
        .arg(&dir)
        .envs([
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "1"),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let o = finish_within(cmd.spawn().unwrap(), 30);
    assert_refused(&o, "no token", &["PARBENCH_JOB_TOKEN", "rank 0"]);
    assert!(!dir.join("collectives.csv").exists(), "measured");
}
