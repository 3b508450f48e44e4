//! Which lab process owns what, and the sweep of runs whose process is gone.
//!
//! Every name a lab process gives (namespaces, pin roots, daemon logs) starts with
//! [`run_prefix`](crate::run_prefix) of its pid. Before it creates anything, the process records itself in
//! `/run/innet-lab/<pid>` with its start time, so that a later run can tell it from a new
//! process that got the same pid. Registering also sweeps: every recorded run whose process
//! is gone (SIGKILL, a crash, a power cut of the tool) has its daemons killed and its
//! namespaces, pin roots, sockets and logs removed ([`crate::teardown::remove_run_objects`]).
//! A live run's objects are never touched: liveness is checked on the record, and the names
//! carry the whole pid, so no two live processes share a prefix. One file lock serialises
//! registering and sweeping across processes (tests run in several at once).

use std::{
    fs::{self, File},
    io,
    path::{Path, PathBuf},
    sync::Once,
};

/// Where the runs' records live (a tmpfs: a reboot forgets them with the namespaces).
pub const RUNS_DIR: &str = "/run/innet-lab";

/// Records this process as a run and sweeps the runs whose process is gone, once per
/// process (at its first namespace or pin root); also installs the signal teardown. A
/// failure is logged: the run goes on, unrecorded (a later run cannot sweep it).
pub(crate) fn register() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        crate::signals::install();
        match register_and_sweep() {
            Ok(swept) if !swept.is_empty() => {
                tracing::info!(
                    ?swept,
                    "removed what runs whose process is gone left behind"
                );
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("cannot record this run in {RUNS_DIR}: {e}"),
        }
        // SAFETY: registers a plain `extern "C" fn` to run at exit.
        unsafe { libc::atexit(forget_at_exit) };
    });
}

/// Removes this process's record when it leaves nothing behind: a run that exits cleanly
/// is no work for the next one's sweep.
pub(crate) fn forget_if_clean() {
    let me = std::process::id();
    if crate::teardown::run_objects_left(me).is_empty() {
        let _ = fs::remove_file(record_path(me));
    }
}

extern "C" fn forget_at_exit() {
    forget_if_clean();
}

fn record_path(pid: u32) -> PathBuf {
    Path::new(RUNS_DIR).join(pid.to_string())
}

fn register_and_sweep() -> io::Result<Vec<u32>> {
    fs::create_dir_all(RUNS_DIR)?;
    let lock = File::create(Path::new(RUNS_DIR).join("lock"))?;
    lock.lock()?;
    let me = std::process::id();
    let start = start_time(me).ok_or_else(|| io::Error::other("no start time in /proc/self"))?;
    let mut swept = vec![];
    // Nothing of this process exists yet: whatever carries its prefix is an earlier
    // process's that had the same pid.
    if !crate::teardown::run_objects_left(me).is_empty() {
        crate::teardown::remove_run_objects(me);
        swept.push(me);
    }
    // Written whole, then renamed: a sweeper never reads half a record.
    let tmp = Path::new(RUNS_DIR).join(format!(".{me}.tmp"));
    fs::write(&tmp, format!("start={start}\n"))?;
    fs::rename(&tmp, record_path(me))?;
    for e in fs::read_dir(RUNS_DIR)?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me || alive(pid, recorded_start(&e.path())) {
            continue;
        }
        crate::teardown::remove_run_objects(pid);
        fs::remove_file(e.path())?;
        swept.push(pid);
    }
    Ok(swept)
}

fn recorded_start(record: &Path) -> Option<u64> {
    fs::read_to_string(record)
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("start="))?
        .trim()
        .parse()
        .ok()
}

/// Whether the run recorded as `pid`, started at `start` (clock ticks after boot), still
/// runs: the pid exists, is not a zombie, and started then (not a reused pid). A record
/// without a start time counts as alive while its pid is.
fn alive(pid: u32, start: Option<u64>) -> bool {
    let Some((state, started)) = stat(pid) else {
        return false;
    };
    state != 'Z' && state != 'X' && start.is_none_or(|s| s == started)
}

/// Start time of process `pid` in clock ticks after boot (field 22 of `/proc/PID/stat`).
#[must_use]
pub fn start_time(pid: u32) -> Option<u64> {
    stat(pid).map(|(_, start)| start)
}

/// `(state, start time)` of process `pid`: fields 3 and 22 of `/proc/PID/stat`, counted
/// after the parenthesised command name (which may hold spaces).
fn stat(pid: u32) -> Option<(char, u64)> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut rest = s.rsplit_once(')')?.1.split_whitespace();
    let state = rest.next()?.chars().next()?;
    let start = rest.nth(18)?.parse().ok()?;
    Some((state, start))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run_prefix;

    #[test]
    fn prefixes_of_different_pids_never_start_one_another() {
        assert_eq!(run_prefix(0x1a2b), "innet-test-1a2bx");
        assert!(!run_prefix(0x1a2b).starts_with(&run_prefix(0x1a)));
        assert!(!run_prefix(0x1a).starts_with(&run_prefix(0x1a2b)));
    }

    #[test]
    fn this_process_is_alive_and_a_reused_pid_is_not() {
        let me = std::process::id();
        let start = start_time(me).expect("own start time");
        assert!(alive(me, Some(start)));
        assert!(alive(me, None));
        assert!(!alive(me, Some(start + 1)), "same pid, other start: reused");
        assert!(!alive(u32::MAX, None), "no such pid");
    }
}
