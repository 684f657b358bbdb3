//! `--nprocs N`: N local ranks of one program on loopback, watched by the
//! process that started them.
//!
//! The launcher names every fault itself: the first rank to end with a
//! failure, in time (a thread per rank waits for its exit and notes when),
//! is reported on stderr in one line (which rank, its exit code or signal,
//! how long after launch) before the others are stopped: SIGTERM, then
//! SIGKILL after [`STOP_GRACE`] for any rank still running. A rank killed
//! outright (SIGKILL) prints nothing itself; this line is then the only
//! one that names it. A signal to the launcher (SIGINT, SIGTERM) is passed
//! on to the ranks the same way when [`super::interrupt`] is installed.

use super::LaunchError;
use crate::error_line::{duration_text, eprint_line, signal_name};
use crate::rendezvous::store::STORE_FD_VAR;
use std::ffi::{OsStr, OsString};
use std::os::fd::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// How long stopped ranks have to end on SIGTERM (rank 0 records what it
/// measured as cut short) before they are killed.
pub const STOP_GRACE: Duration = Duration::from_secs(2);

/// N ranks of one program on this host, meeting on loopback.
///
/// Each child gets torchrun's variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
/// `LOCAL_WORLD_SIZE`, `MASTER_ADDR=127.0.0.1`, `MASTER_PORT` = a port the
/// launcher holds bound until rank 0 serves on it),
/// a fresh random `PARBENCH_JOB_TOKEN`, and `PARBENCH_SPAWNED=1`; it dies
/// with the thread that spawned it (`PR_SET_PDEATHSIG`), so no rank outlives
/// a killed launcher.
#[derive(Clone, Debug)]
pub struct LocalJob {
    ranks: usize,
    program: PathBuf,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    label: String,
}

impl LocalJob {
    /// How many ranks the job starts.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// `ranks` copies of `program` with `args`.
    pub fn new(
        ranks: usize,
        program: impl Into<PathBuf>,
        args: impl IntoIterator<Item = impl Into<OsString>>,
    ) -> Self {
        let program: PathBuf = program.into();
        let label = program
            .file_name()
            .map_or_else(|| "launcher".into(), |n| n.to_string_lossy().into_owned());
        LocalJob {
            ranks,
            program,
            args: args.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            label,
        }
    }

    /// What the launcher's fault line starts with (default: the program's
    /// file name), e.g. `bench-layers: tp 4`.
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = label.into();
        self
    }

    /// `ranks` copies of the running binary with this process's arguments.
    pub fn of_current_exe(ranks: usize) -> Result<Self, LaunchError> {
        let exe = std::env::current_exe().map_err(|error| LaunchError::Spawn { rank: 0, error })?;
        Ok(Self::new(ranks, exe, std::env::args_os().skip(1)))
    }

    /// Adds a variable to every child's environment.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// Starts the ranks and waits for all of them. `Ok` holds the common
    /// (successful) exit status. The first rank to fail (in time) is named
    /// on stderr at once, in one line, then the others are stopped (see the
    /// module docs); it comes back as [`LaunchError::RankFailed`], already
    /// reported.
    pub fn run(&self) -> Result<ExitStatus, LaunchError> {
        let children = self.start()?;
        supervise(children, Instant::now(), &self.label)
    }

    /// Starts the ranks without waiting; the caller owns (and must reap) them.
    /// Rank `i` is `children[i]`. The children die when the calling *thread*
    /// ends (that is how `PR_SET_PDEATHSIG` works): call this from a thread
    /// that outlives them, as [`LocalJob::run`] does by waiting in it.
    pub fn start(&self) -> Result<Vec<Child>, LaunchError> {
        let (children, _) = self.start_with_store_port()?;
        Ok(children)
    }

    /// [`LocalJob::start`], also returning the port of the job's store.
    /// Unless the caller set `MASTER_ADDR` or `MASTER_PORT` itself, the
    /// launcher binds that port on loopback and hands the listening
    /// socket to rank 0 ([`hand_store_listener`]), so the port stays
    /// taken from the moment it is chosen.
    pub fn start_with_store_port(&self) -> Result<(Vec<Child>, u16), LaunchError> {
        let max = crate::limits::MAX_SPAWNED_RANKS;
        if self.ranks == 0 || self.ranks > max {
            return Err(LaunchError::Invalid(format!(
                "--nprocs {} (expected 1 to {max})",
                self.ranks
            )));
        }
        let spawn_error = |error| LaunchError::Spawn { rank: 0, error };
        // Held until every rank has started; rank 0 keeps its own copy.
        let store = std::net::TcpListener::bind("127.0.0.1:0").map_err(spawn_error)?;
        let store_port = store.local_addr().map_err(spawn_error)?.port();
        let caller_set = |key: &str| self.env.iter().any(|(k, _)| k == key);
        // A caller that names the store's address keeps the old way: rank
        // 0 binds it (and the port chosen here is let go at once).
        let store = (!caller_set("MASTER_ADDR") && !caller_set("MASTER_PORT")).then_some(store);
        let port = self
            .env
            .iter()
            .rev()
            .find(|(k, _)| k == "MASTER_PORT")
            .and_then(|(_, v)| v.to_str()?.parse().ok())
            .unwrap_or(store_port);
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
                .env_remove(STORE_FD_VAR)
                .envs(self.env.iter().map(|(k, v)| (k, v)));
            if let (0, Some(store)) = (rank, &store) {
                hand_store_listener(&mut cmd, store);
            }
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
                    return Err(LaunchError::Spawn {
                        rank,
                        error: source,
                    });
                }
            }
        }
        Ok((children, port))
    }
}

/// Makes the process `cmd` starts inherit `listener` (and only that
/// process: the descriptor stays close-on-exec here) and names it in
/// [`STORE_FD_VAR`], so that as rank 0 it serves the job's store on that
/// socket instead of binding the port again.
pub fn hand_store_listener(cmd: &mut Command, listener: &std::net::TcpListener) {
    let fd = listener.as_raw_fd();
    cmd.env(STORE_FD_VAR, fd.to_string());
    // SAFETY: the closure runs in the child between fork and exec and calls
    // only fcntl, which is async-signal-safe; `fd` is open there (forked).
    unsafe {
        cmd.pre_exec(move || {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
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
    crate::files::random_hex(16)
}

/// The children's pids while they can still be signalled: a rank's entry
/// is cleared before it is reaped, so a pid is never signalled after the
/// kernel may have given it to another process.
type Pids = Arc<Mutex<Vec<Option<libc::pid_t>>>>;

/// Sends `sig` to every rank not yet reaped.
fn signal_all(pids: &Pids, sig: i32) {
    if let Ok(p) = pids.lock() {
        for pid in p.iter().flatten() {
            // SAFETY: a child of this process that has not been reaped.
            unsafe { libc::kill(*pid, sig) };
        }
    }
}

/// Stops every rank still running: `first` (SIGTERM), and after
/// [`STOP_GRACE`] SIGKILL for those that have not ended. With `why` (a rank
/// that failed first, and how), `first` carries it
/// ([`super::interrupt::stop_value`]), so that each rank records that as
/// its run's cause rather than the signal.
fn stop_gently(pids: &Pids, exited: &[AtomicBool], first: i32, why: Option<(usize, ExitStatus)>) {
    match why.map(|(rank, st)| super::interrupt::stop_value(rank, st)) {
        Some(value) => {
            if let Ok(p) = pids.lock() {
                for pid in p.iter().flatten() {
                    let val = libc::sigval {
                        sival_ptr: value as usize as *mut libc::c_void,
                    };
                    // SAFETY: a child of this process that has not been reaped.
                    unsafe { libc::sigqueue(*pid, first, val) };
                }
            }
        }
        None => signal_all(pids, first),
    }
    let until = Instant::now() + STOP_GRACE;
    while Instant::now() < until && !exited.iter().all(|e| e.load(Ordering::SeqCst)) {
        std::thread::sleep(Duration::from_millis(5));
    }
    signal_all(pids, libc::SIGKILL);
}

/// `waitid(2)` for child `pid` with `WEXITED | WNOWAIT | extra` (the child
/// is left to be reaped later): the return code and what it filled in.
fn peek_exit(pid: libc::pid_t, extra: libc::c_int) -> (libc::c_int, libc::siginfo_t) {
    // SAFETY: siginfo_t is plain data; waitid fills it.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer; WNOWAIT leaves the child to be reaped later.
    let rc = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOWAIT | extra,
        )
    };
    (rc, info)
}

/// Blocks until process `pid` has ended, without reaping it (its pid stays
/// taken until the launcher reaps it).
fn wait_exit(pid: libc::pid_t) {
    loop {
        let (rc, _) = peek_exit(pid, 0);
        if rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}

/// How long the launcher waits, after a first failure, for ranks already
/// dying to become waitable: a rank killed outright may have closed its
/// sockets (and so made its peers fail) before the kernel lets its parent
/// see it end.
const SETTLE: Duration = Duration::from_millis(500);

/// The ranks of `pending` that have ended, or end within [`SETTLE`] of a
/// signal already on its way (a SIGKILL pending, or a thread-group leader
/// already a zombie): their statuses, without reaping them.
fn settle(pending: &[(usize, libc::pid_t)]) -> Vec<(usize, ExitStatus)> {
    let until = Instant::now() + SETTLE;
    let mut ended = Vec::new();
    let mut left: Vec<(usize, libc::pid_t)> = pending.to_vec();
    loop {
        left.retain(|&(r, pid)| match ended_already(pid) {
            Some(st) => {
                ended.push((r, st));
                false
            }
            None => dying(pid),
        });
        if left.is_empty() || Instant::now() >= until {
            return ended;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The first rank still running (`running(rank)`) that is stopped by a
/// signal, and a status that says so.
fn stopped_rank(
    children: &[Child],
    running: impl Fn(usize) -> bool,
) -> Option<(usize, ExitStatus)> {
    children.iter().enumerate().find_map(|(r, c)| {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", c.id())).ok()?;
        let state = stat.rsplit(')').next()?.trim_start().chars().next()?;
        // A wait(2) status word of a stopped process: 0x7f, the signal above.
        (running(r) && matches!(state, 'T' | 't'))
            .then(|| (r, ExitStatus::from_raw(0x7f | (libc::SIGSTOP << 8))))
    })
}

/// Whether process `pid` is on its way out: its leader thread already a
/// zombie, or a SIGKILL pending for it.
fn dying(pid: libc::pid_t) -> bool {
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with(['Z', 'X']))
    });
    let killed = std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
        s.lines()
            .filter_map(|l| {
                l.strip_prefix("ShdPnd:")
                    .or_else(|| l.strip_prefix("SigPnd:"))
            })
            .filter_map(|v| u64::from_str_radix(v.trim(), 16).ok())
            .any(|mask| mask & (1 << (libc::SIGKILL - 1)) != 0)
    });
    zombie || killed
}

/// The exit status of child `pid` if it has ended (it is not reaped).
fn ended_already(pid: libc::pid_t) -> Option<ExitStatus> {
    // WNOHANG: at once, ended or not.
    let (rc, info) = peek_exit(pid, libc::WNOHANG);
    // SAFETY: si_pid and si_status are set when waitid reports a child.
    let (who, code, status) = unsafe { (info.si_pid(), info.si_code, info.si_status()) };
    if rc != 0 || who == 0 {
        return None;
    }
    // Back to a wait(2) status word: the signal in the low bits, or the code.
    let raw = match code {
        libc::CLD_EXITED => (status & 0xff) << 8,
        libc::CLD_DUMPED => (status & 0x7f) | 0x80,
        _ => status & 0x7f,
    };
    Some(ExitStatus::from_raw(raw))
}

/// How a failed rank ended, in words: `exited with code 3`, `was killed by
/// signal 9 (SIGKILL)`.
pub fn how_it_ended(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(sig)) => format!("was killed by signal {sig} ({})", signal_name(sig)),
        (None, None) => match status.stopped_signal() {
            Some(sig) => format!(
                "was stopped by signal {sig} ({}) and answered no one",
                signal_name(sig)
            ),
            None => format!("ended ({status})"),
        },
    }
}

fn supervise(
    mut children: Vec<Child>,
    launched: Instant,
    label: &str,
) -> Result<ExitStatus, LaunchError> {
    let n = children.len();
    let pids: Pids = Arc::new(Mutex::new(
        children
            .iter()
            .map(|c| Some(c.id() as libc::pid_t))
            .collect(),
    ));
    let exited: Arc<Vec<AtomicBool>> = Arc::new((0..n).map(|_| AtomicBool::new(false)).collect());
    let (tx, rx) = mpsc::channel::<usize>();
    let mut waiters = Vec::with_capacity(n);
    for (rank, c) in children.iter().enumerate() {
        let (tx, done, pid) = (tx.clone(), exited.clone(), c.id() as libc::pid_t);
        let spawned = std::thread::Builder::new()
            .name(format!("parbench-rank{rank}-wait"))
            .stack_size(64 * 1024)
            .spawn(move || {
                wait_exit(pid);
                done[rank].store(true, Ordering::SeqCst);
                let _ = tx.send(rank);
            });
        match spawned {
            Ok(h) => waiters.push(h),
            Err(source) => {
                stop_gently(&pids, &exited, libc::SIGKILL, None);
                reap_all(&mut children, &pids);
                return Err(LaunchError::Spawn {
                    rank,
                    error: source,
                });
            }
        }
    }
    drop(tx);
    // A signal to the launcher goes on to the ranks (when the process
    // installed the watcher; otherwise the hook never runs).
    let hook = {
        let (pids, exited) = (pids.clone(), exited.clone());
        super::interrupt::on_interrupt(move |sig| stop_gently(&pids, &exited, sig, None))
    };
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; n];
    let mut failure = None;
    // The ranks in the order they ended: the first failure is the cause.
    while let Ok(rank) = rx.recv() {
        let at = launched.elapsed();
        let status = reap(&mut children[rank], rank, &pids);
        statuses[rank] = Some(status);
        if status.success() {
            continue;
        }
        // Ranks that ended by now, though their waiters have not run yet
        // (on a loaded machine a woken thread may wait milliseconds for a
        // core): a rank a signal killed outright goes first, since a rank
        // that exits on an error because it lost a peer does so after the
        // peer died.
        let pending: Vec<(usize, libc::pid_t)> = children
            .iter()
            .enumerate()
            .filter(|(r, _)| statuses[*r].is_none())
            .map(|(r, c)| (r, c.id() as libc::pid_t))
            .collect();
        let mut ended: Vec<(usize, ExitStatus)> = vec![(rank, status)];
        ended.extend(settle(&pending));
        let killed = ended.iter().position(|(_, st)| st.signal().is_some());
        // A rank that exited on its own error while another is stopped
        // (SIGSTOP: frozen, answering no one) exited because of it: the
        // stopped one is the cause, not the first to leave.
        let frozen = killed.is_none().then(|| {
            let done: Vec<usize> = ended.iter().map(|(r, _)| *r).collect();
            stopped_rank(&children, |r| statuses[r].is_none() && !done.contains(&r))
        });
        let (culprit, rank, status) = match (killed, frozen.flatten()) {
            (Some(i), _) => (Some(i), ended[i].0, ended[i].1),
            (None, Some((r, st))) => (None, r, st),
            (None, None) => (Some(0), ended[0].0, ended[0].1),
        };
        let also: Vec<String> = ended
            .iter()
            .enumerate()
            .filter(|(i, (_, st))| Some(*i) != culprit && !st.success())
            .map(|(_, (r, st))| format!("rank {r} {}", how_it_ended(*st)))
            .collect();
        for (r, _) in &ended {
            statuses[*r] = Some(reap(&mut children[*r], *r, &pids));
        }
        let others = statuses.iter().filter(|s| s.is_none()).count();
        if super::interrupt::received().is_none() {
            let stopping = match others {
                0 => "no other rank is running".to_string(),
                1 => "stopping the other rank".to_string(),
                n => format!("stopping the other {n} ranks"),
            };
            let also = if also.is_empty() {
                String::new()
            } else {
                format!(" (then {})", also.join(", "))
            };
            eprint_line(&format!(
                "{label}: rank {rank} {} {} after launch{also}; {stopping}",
                how_it_ended(status),
                duration_text(at),
            ));
        }
        failure = Some((rank, status, at));
        stop_gently(&pids, &exited, libc::SIGTERM, Some((rank, status)));
        break;
    }
    drop(hook);
    reap_all(&mut children, &pids);
    for w in waiters {
        let _ = w.join();
    }
    if let Some((rank, status, after)) = failure {
        return Err(LaunchError::RankFailed {
            rank,
            status,
            after,
        });
    }
    statuses
        .first()
        .copied()
        .flatten()
        .ok_or_else(|| LaunchError::Invalid("no rank was started".into()))
}

/// Reaps one rank that has ended (its pid is cleared first).
fn reap(child: &mut Child, rank: usize, pids: &Pids) -> ExitStatus {
    if let Ok(mut p) = pids.lock() {
        p[rank] = None;
    }
    match child.wait() {
        Ok(s) => s,
        // Reaped elsewhere: report it as a failure of unknown cause.
        Err(_) => ExitStatus::from_raw(1 << 8),
    }
}

/// Reaps every rank, killing those still running.
fn reap_all(children: &mut [Child], pids: &Pids) {
    signal_all(pids, libc::SIGKILL);
    for (rank, c) in children.iter_mut().enumerate() {
        reap(c, rank, pids);
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
