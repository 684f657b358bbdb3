//! One exit-code convention for every binary:
//!
//! | code | meaning |
//! |---|---|
//! | 0 | the run measured what it was asked, and its checks passed |
//! | 1 | a fault while measuring, or wrong results ([`EXIT_FAULT`]) |
//! | 2 | bad input: a flag, an output folder, a machine without what the flags ask for ([`EXIT_USAGE`]), found before anything is measured |
//! | N | a spawned rank failed with code N ([`Reported`]): the launcher already named it |
//!
//! A binary returns its errors as `anyhow::Error` (or any error) and ends
//! with [`end_on_error`]: the first [`UsageError`] or [`Reported`] in the
//! error's chain decides, anything else is a fault.

/// Exit code of a fault while measuring (or wrong results).
pub const EXIT_FAULT: i32 = 1;
/// Exit code of bad input.
pub const EXIT_USAGE: i32 = 2;

/// Bad input, found before anything is measured: printed as one line, exit
/// code [`EXIT_USAGE`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

impl From<crate::limits::LimitError> for UsageError {
    fn from(e: crate::limits::LimitError) -> Self {
        UsageError(e.0)
    }
}

/// Checks the settings every binary reads from the environment
/// (`PARBENCH_BIND`, the launch variables set by hand: `MASTER_ADDR`,
/// `MASTER_PORT`, `PARBENCH_JOB_TOKEN`; the tcp backend's `PARBENCH_TCP_*` and
/// `PARBENCH_IFADDR`) before anything starts: a bad value is bad input,
/// one line and exit 2, not a setup error in every rank.
pub fn check_env_settings() -> Result<(), UsageError> {
    crate::measure::placement::BindRequest::from_env().map_err(UsageError)?;
    crate::rendezvous::check_launch_vars(&|k| std::env::var(k).ok())
        .map_err(|e| UsageError(e.to_string()))?;
    crate::comm::tcp::check_env().map_err(UsageError)
}

/// A failure a spawning launcher already named on stderr: exit with its
/// code, print nothing more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a rank failed (exit code {0})")]
pub struct Reported(pub i32);

/// How an error ends the process: whether it is bad input, already
/// reported, or a fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// Bad input: print this line, exit [`EXIT_USAGE`].
    Usage(String),
    /// Named by the launcher: exit with this code, print nothing.
    Reported(i32),
    /// A fault: record the run as cut short, print the line, exit [`EXIT_FAULT`].
    Fault,
}

impl Ending {
    /// The exit code of this ending.
    pub fn code(&self) -> i32 {
        match self {
            Ending::Usage(_) => EXIT_USAGE,
            Ending::Reported(c) => *c,
            Ending::Fault => EXIT_FAULT,
        }
    }
}

/// How `err` ends the process: the first [`UsageError`] or [`Reported`]
/// along its chain of sources (context wrapped around it does not hide it).
pub fn ending_of(err: &(dyn std::error::Error + 'static)) -> Ending {
    let mut at = Some(err);
    while let Some(e) = at {
        if let Some(UsageError(line)) = e.downcast_ref::<UsageError>() {
            return Ending::Usage(line.clone());
        }
        if let Some(Reported(code)) = e.downcast_ref::<Reported>() {
            return Ending::Reported(*code);
        }
        at = e.source();
    }
    Ending::Fault
}

/// Ends a binary's run on `err` and returns the exit code: bad input is
/// its one line on stderr (`program: line`), nothing else; a failure the
/// launcher named, or a fault, records the run in progress as cut short
/// (what was measured stays) and lets no other write start; a fault is
/// then `program: line` on stderr. `line` is the whole error as one line
/// (anyhow's `{:#}`).
pub fn end_on_error(program: &str, err: &(dyn std::error::Error + 'static), line: &str) -> i32 {
    let ending = ending_of(err);
    if let Ending::Usage(msg) = &ending {
        super::eprint_line(&format!("{program}: {msg}"));
        return EXIT_USAGE;
    }
    // A signal that arrived first is the cause, and the fault its effect (a
    // peer the same signal stopped): its watcher records the run with the
    // cause it carries and ends the process; this waits for that, a while.
    if super::interrupt::arrived().is_some() {
        super::interrupt::await_wind_down(std::time::Duration::from_secs(5));
    }
    let _ = crate::results::record_cut_short(line);
    crate::results::finish_writes();
    if ending == Ending::Fault {
        super::eprint_line(&format!("{program}: {line}"));
    }
    ending.code()
}

/// The exit code `err` ends the process with (see the module table).
pub fn exit_code_of(err: &(dyn std::error::Error + 'static)) -> i32 {
    ending_of(err).code()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("while sweeping")]
    struct Wrapped(#[source] UsageError);

    #[test]
    fn the_chain_decides_the_code() {
        assert_eq!(exit_code_of(&UsageError("bad".into())), EXIT_USAGE);
        assert_eq!(exit_code_of(&Wrapped(UsageError("bad".into()))), EXIT_USAGE);
        assert_eq!(exit_code_of(&Reported(7)), 7);
        assert_eq!(exit_code_of(&std::io::Error::other("x")), EXIT_FAULT);
    }
}
