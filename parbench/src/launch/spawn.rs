//! `--nprocs N`: N local ranks of one program on loopback, watched by the
//! process that started them.

use super::LaunchError;
use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::time::Duration;

/// How often the launcher looks at its children: short enough that a failed
/// rank's partners are stopped before they report their own (secondary) errors.
const WATCH_INTERVAL: Duration = Duration::from_millis(5);

/// N ranks of one program on this host, meeting on loopback.
///
/// Each child gets torchrun's variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
/// `LOCAL_WORLD_SIZE`, `MASTER_ADDR=127.0.0.1`, `MASTER_PORT` = a free port),
/// a fresh random `PARBENCH_JOB_TOKEN`, and `PARBENCH_SPAWNED=1`; it dies
/// with the thread that spawned it (`PR_SET_PDEATHSIG`), so no rank outlives
/// a killed launcher.
#[derive(Clone, Debug)]
pub struct LocalJob {
    ranks: usize,
    program: PathBuf,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
}

impl LocalJob {
    /// `ranks` copies of `program` with `args`.
    pub fn new(
        ranks: usize,
        program: impl Into<PathBuf>,
        args: impl IntoIterator<Item = impl Into<OsString>>,
    ) -> Self {
        LocalJob {
            ranks,
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            env: Vec::new(),
        }
    }

    /// `ranks` copies of the running binary with this process's arguments.
    pub fn of_current_exe(ranks: usize) -> Result<Self, LaunchError> {
        let exe =
            std::env::current_exe().map_err(|source| LaunchError::Spawn { rank: 0, source })?;
        Ok(Self::new(ranks, exe, std::env::args_os().skip(1)))
    }

    /// Adds a variable to every child's environment.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// Starts the ranks and waits for all of them. `Ok` holds the common
    /// (successful) exit status; the first rank that fails stops the others
    /// (SIGKILL) and is returned as [`LaunchError::RankFailed`].
    pub fn run(&self) -> Result<ExitStatus, LaunchError> {
        let mut children = self.start()?;
        watch(&mut children)
    }

    /// Starts the ranks without waiting; the caller owns (and must reap) them.
    /// Rank `i` is `children[i]`. The children die when the calling *thread*
    /// ends (that is how `PR_SET_PDEATHSIG` works): call this from a thread
    /// that outlives them, as [`LocalJob::run`] does by waiting in it.
    pub fn start(&self) -> Result<Vec<Child>, LaunchError> {
        if self.ranks == 0 || self.ranks > 4096 {
            return Err(LaunchError::Invalid(format!(
                "--nprocs {} (expected 1 to 4096)",
                self.ranks
            )));
        }
        let port = free_loopback_port().map_err(|source| LaunchError::Spawn { rank: 0, source })?;
        let token = new_token();
        let parent = std::process::id() as libc::pid_t;
        let mut children: Vec<Child> = Vec::with_capacity(self.ranks);
        for rank in 0..self.ranks {
            let mut cmd = Command::new(&self.program);
            cmd.args(&self.args)
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", self.ranks.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("LOCAL_WORLD_SIZE", self.ranks.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("PARBENCH_JOB_TOKEN", &token)
                .env("PARBENCH_SPAWNED", "1")
                .envs(self.env.iter().map(|(k, v)| (k, v)));
            // SAFETY: the closure runs in the child between fork and exec and
            // calls only async-signal-safe functions (prctl, getppid, _exit).
            unsafe {
                cmd.pre_exec(move || {
                    if libc::prctl(
                        libc::PR_SET_PDEATHSIG,
                        libc::SIGKILL as libc::c_ulong,
                        0,
                        0,
                        0,
                    ) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    // The launcher died before prctl took effect: follow it now.
                    if libc::getppid() != parent {
                        libc::_exit(137);
                    }
                    Ok(())
                });
            }
            match cmd.spawn() {
                Ok(child) => children.push(child),
                Err(source) => {
                    stop_all(&mut children);
                    return Err(LaunchError::Spawn { rank, source });
                }
            }
        }
        Ok(children)
    }
}

/// Spawns `n` local ranks of the running binary (same arguments, plus
/// `extra_env`) and waits for them; see [`LocalJob`].
pub fn spawn_local_ranks(n: usize, extra_env: &[(&str, &str)]) -> Result<ExitStatus, LaunchError> {
    let mut job = LocalJob::of_current_exe(n)?;
    for (k, v) in extra_env {
        job = job.env(k, v);
    }
    job.run()
}

/// The exit code a launcher passes on for `status`: the child's code, or
/// 128 + signal as shells report a killed process.
pub fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 1,
    }
}

/// A fresh random job token (128 bits from the OS, hex).
pub fn new_token() -> String {
    let mut bytes = [0u8; 16];
    let from_os = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if from_os.is_err() {
        // No /dev/urandom (a bare chroot): time and pid still separate jobs.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let mix = t ^ ((std::process::id() as u128) << 64);
        bytes = mix.to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A port that was free on 127.0.0.1 a moment ago (rank 0 binds it next; a
/// race with another process gives rank 0 a clear bind error).
fn free_loopback_port() -> std::io::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

fn watch(children: &mut [Child]) -> Result<ExitStatus, LaunchError> {
    let mut done: Vec<Option<ExitStatus>> = vec![None; children.len()];
    loop {
        for (rank, child) in children.iter_mut().enumerate() {
            if done[rank].is_some() {
                continue;
            }
            match child.try_wait() {
                Ok(Some(status)) if status.success() => done[rank] = Some(status),
                Ok(Some(status)) => {
                    stop_all(children);
                    return Err(LaunchError::RankFailed { rank, status });
                }
                Ok(None) => {}
                Err(source) => {
                    stop_all(children);
                    return Err(LaunchError::Spawn { rank, source });
                }
            }
        }
        if let Some(Some(status)) = done.iter().all(Option::is_some).then(|| done[0]) {
            return Ok(status);
        }
        std::thread::sleep(WATCH_INTERVAL);
    }
}

/// Kills and reaps every child still running.
fn stop_all(children: &mut [Child]) {
    for c in children.iter_mut() {
        if let Ok(None) = c.try_wait() {
            let _ = c.kill();
        }
    }
    for c in children.iter_mut() {
        let _ = c.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_fresh_hex() {
        let (a, b) = (new_token(), new_token());
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn exit_codes_follow_children() {
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(9)), 137);
    }

    #[test]
    fn runs_ranks_and_reports_the_failing_one() {
        let ok = LocalJob::new(
            3,
            "/bin/sh",
            [
                "-c",
                "test \"$WORLD_SIZE\" = 3 && test -n \"$PARBENCH_JOB_TOKEN\"",
            ],
        )
        .run()
        .unwrap();
        assert!(ok.success());
        // Rank 1 fails at once; ranks 0 and 2 would sleep for a minute unless stopped.
        let t = std::time::Instant::now();
        let err = LocalJob::new(
            3,
            "/bin/sh",
            ["-c", "if [ \"$RANK\" = 1 ]; then exit 7; fi; sleep 60"],
        )
        .run()
        .unwrap_err();
        assert!(
            matches!(err, LaunchError::RankFailed { rank: 1, .. }),
            "{err}"
        );
        if let LaunchError::RankFailed { status, .. } = &err {
            assert_eq!(status.code(), Some(7));
        }
        assert!(t.elapsed() < Duration::from_secs(30));
        assert_eq!(err.exit_code(), 7);
        let zero = LocalJob::new(0, "/bin/true", Vec::<String>::new())
            .run()
            .unwrap_err();
        assert!(matches!(zero, LaunchError::Invalid(_)));
    }
}
