//! SIGINT, SIGTERM, SIGHUP and every other signal a process can catch
//! whose default would end it ([`SIGNALS`]): what a bench does when it is
//! stopped.
//!
//! [`install`] (first thing in `main`, before any thread starts) blocks the
//! signals in every thread and leaves them to one watcher thread
//! that waits for them with `sigwait`, so that what happens next is plain
//! code, not a signal handler: the hooks registered with [`on_interrupt`]
//! run (a launcher passes the signal on to its ranks and waits for them),
//! the run a writer started is recorded in run.json as cut short
//! ([`crate::results::record_cut_short`]; its rows are already on disk,
//! appended as each one was measured), one line says so, and the process
//! exits with `128 + signal`, as a shell reports a process the signal ended.
//!
//! Spawned processes start with no signal blocked (the standard library
//! clears the mask before `exec`).

use crate::error_line::{eprint_line, signal_name};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

type Hook = Box<dyn Fn(i32) + Send + Sync>;

static RECEIVED: AtomicI32 = AtomicI32::new(0);
static NEXT_HOOK: AtomicU64 = AtomicU64::new(0);
static HOOKS: Mutex<Vec<(u64, Hook)>> = Mutex::new(Vec::new());
static PROGRAM: OnceLock<String> = OnceLock::new();

/// The signals a bench winds down on: each one that ends a process by
/// default and that a process can catch (sent by a user, `timeout -s`, a
/// batch system's time or CPU limit, `alarm`). SIGKILL and SIGSTOP cannot be
/// caught: run.json's entry from the run's start stays for those
/// ([`crate::results::NOT_ENDED`]). SIGPIPE stays ignored (a closed pipe
/// ends a write, see `term`), and SIGXFSZ goes to the writing thread,
/// whose write then fails as an error.
pub const SIGNALS: [i32; 10] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
    libc::SIGXCPU,
    libc::SIGVTALRM,
    libc::SIGPROF,
];

fn signal_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it and
    // sigaddset adds valid signal numbers.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in SIGNALS {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Blocks [`SIGNALS`] in the calling thread (and so in every
/// thread it starts later) and starts the watcher. `program` prefixes the
/// line printed when a signal arrives. Call it once, before any other
/// thread starts; later calls do nothing.
pub fn install(program: &str) -> std::io::Result<()> {
    if PROGRAM.set(program.to_string()).is_err() {
        return Ok(());
    }
    let set = signal_set();
    // SAFETY: a valid, initialised set; the old mask is not needed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    std::thread::Builder::new()
        .name("parbench-signals".into())
        .stack_size(256 * 1024)
        .spawn(move || loop {
            // SAFETY: siginfo_t is plain data that sigwaitinfo fills.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: the set is valid and blocked in every thread.
            let sig = unsafe { libc::sigwaitinfo(&set, &mut info) };
            if sig > 0 {
                wind_down(sig, launcher_cause(&info));
            }
        })?;
    Ok(())
}

/// The signal that stopped the process, once one arrived.
pub fn received() -> Option<i32> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Removes its hook when dropped.
pub struct HookGuard(u64);

impl Drop for HookGuard {
    fn drop(&mut self) {
        if let Ok(mut hooks) = HOOKS.lock() {
            hooks.retain(|(id, _)| *id != self.0);
        }
    }
}

/// Runs `hook` (with the signal) when a signal stops the process, before
/// the cut-short record is written; for as long as the guard lives.
pub fn on_interrupt(hook: impl Fn(i32) + Send + Sync + 'static) -> HookGuard {
    let id = NEXT_HOOK.fetch_add(1, Ordering::SeqCst);
    if let Ok(mut hooks) = HOOKS.lock() {
        hooks.push((id, Box::new(hook)));
    }
    HookGuard(id)
}

/// What a launcher's stop signal carries (read by `launcher_cause`): the
/// rank that failed first, and how it ended.
pub fn stop_value(rank: usize, status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    let how = match (status.code(), status.signal(), status.stopped_signal()) {
        (_, Some(sig), _) => 0x100 | (sig & 0xff),
        (_, _, Some(sig)) => 0x200 | (sig & 0xff),
        (Some(c), None, None) => c & 0xff,
        (None, None, None) => 0xff,
    };
    (((rank as i32) + 1) << 10) | how
}

/// The cause a stop signal from this process's launcher carries, in the
/// launcher's own words (`rank 1 was killed by signal 9 (SIGKILL)`): the
/// rank that failed first is the run's cause, not the signal that stopped
/// this one. `None` for any other signal (a user's, forwarded or not).
fn launcher_cause(info: &libc::siginfo_t) -> Option<String> {
    use std::os::unix::process::ExitStatusExt;
    // SAFETY: getppid cannot fail; the union's fields are read only for a
    // signal sent with sigqueue, which fills them.
    let (from_parent, value) = unsafe {
        if info.si_code != libc::SI_QUEUE {
            return None;
        }
        (
            info.si_pid() == libc::getppid(),
            info.si_value().sival_ptr as usize as i32,
        )
    };
    let rank = (value >> 10) - 1;
    if !from_parent || rank < 0 {
        return None;
    }
    // Back to a wait(2) status word, for the launcher's own words.
    let sig = value & 0xff;
    let raw = match value & 0x300 {
        0x100 => sig,
        0x200 => 0x7f | (sig << 8),
        _ => sig << 8,
    };
    let ended = super::how_it_ended(std::process::ExitStatus::from_raw(raw));
    Some(format!(
        "rank {rank} {ended}; its launcher stopped the others"
    ))
}

/// Whether one of [`SIGNALS`] has arrived (being handled, or pending): a
/// fault seen now (a peer that the same signal stopped) is its effect, and
/// the run's cause is the signal's.
pub fn arrived() -> Option<i32> {
    if let Some(s) = received() {
        return Some(s);
    }
    // SAFETY: sigset_t is plain data that sigpending fills.
    let mut pending: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: a valid set to fill.
    if unsafe { libc::sigpending(&mut pending) } != 0 {
        return None;
    }
    // SAFETY: a set sigpending filled, and valid signal numbers.
    SIGNALS
        .into_iter()
        .find(|&s| unsafe { libc::sigismember(&pending, s) } == 1)
}

/// Waits at most `limit` for the signal watcher to end the process (it
/// exits when its wind-down is done); returns if it has not by then.
pub fn await_wind_down(limit: std::time::Duration) {
    let until = std::time::Instant::now() + limit;
    while std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

fn wind_down(sig: i32, cause: Option<String>) -> ! {
    RECEIVED.store(sig, Ordering::SeqCst);
    if let Ok(hooks) = HOOKS.lock() {
        for (_, h) in hooks.iter() {
            h(sig);
        }
    }
    let program = PROGRAM.get().map_or("parbench", String::as_str);
    let name = signal_name(sig);
    if let Some(cause) = cause {
        // The launcher named the cause on its own line: record it, quietly.
        let _ = crate::results::record_cut_short(&cause);
        crate::results::finish_writes();
        std::process::exit(128 + sig)
    }
    match crate::results::record_cut_short(&format!("interrupted by {name}")) {
        Some(Ok(path)) => eprint_line(&format!(
            "{program}: interrupted by {name}: the rows measured so far are kept; {} records the run as cut short",
            path.display()
        )),
        Some(Err(e)) => eprint_line(&format!(
            "{program}: interrupted by {name}; recording the cut-short run failed: {e}"
        )),
        None => {}
    }
    // A row or record this process is writing right now is finished first.
    crate::results::finish_writes();
    std::process::exit(128 + sig)
}
