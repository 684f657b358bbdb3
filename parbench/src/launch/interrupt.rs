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

use super::report::{eprint_line, signal_name};
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
            let mut sig: libc::c_int = 0;
            // SAFETY: the set is valid and blocked in every thread.
            if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
                wind_down(sig);
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

fn wind_down(sig: i32) -> ! {
    RECEIVED.store(sig, Ordering::SeqCst);
    if let Ok(hooks) = HOOKS.lock() {
        for (_, h) in hooks.iter() {
            h(sig);
        }
    }
    let program = PROGRAM.get().map_or("parbench", String::as_str);
    let name = signal_name(sig);
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
