//! Tearing a run's fabric down without its guards: this process's on a signal or a
//! watchdog ([`exit_torn_down`]), a dead run's in the sweep ([`remove_run_objects`]).
//!
//! A run's objects are found by name ([`crate::runs::run_prefix`]): its namespaces in
//! `/run/netns` (with every process inside them and the INC-socket pins of each), its pin
//! roots under `/sys/fs/bpf`, its node-local sockets and shared-memory segments, its daemon
//! logs. Removal is quiet: an object a guard removed meanwhile is no error.

use std::{
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    process::Command,
    sync::{PoisonError, RwLock, RwLockReadGuard},
    thread,
    time::{Duration, Instant},
};

use innet::{loader, pins::PinLayout};

/// How every name of the lab process `pid` begins: `innet-test-<pid in hex>x`. The `x`
/// ends the pid (no hex digit), so one run's prefix never starts another's.
#[must_use]
pub fn run_prefix(pid: u32) -> String {
    format!("innet-test-{pid:x}x")
}

/// Held (shared) while a guard creates or removes a namespace, and taken for good by the
/// teardown: nothing is created after it listed the objects, and no guard races it into
/// "Cannot remove namespace file" on a namespace already gone.
static GATE: RwLock<()> = RwLock::new(());

/// The gate, shared: blocks for good once the process is tearing down (it exits soon).
pub(crate) fn gate() -> RwLockReadGuard<'static, ()> {
    GATE.read().unwrap_or_else(PoisonError::into_inner)
}

/// Tears down what this process built — its daemons and other children, its namespaces
/// (with every process and INC-socket pin inside), its pin roots, its node-local sockets —
/// then exits with `code`: for a signal, or a tool that must stop without unwinding, such
/// as a watchdog that found a hang. Threads that lose their fabric meanwhile stay quiet.
pub fn exit_torn_down(code: i32) -> ! {
    std::mem::forget(GATE.write().unwrap_or_else(PoisonError::into_inner));
    std::panic::set_hook(Box::new(|_| {}));
    crate::mpi::autogroup::restore_now();
    crate::bpf_stats::restore_now();
    stop_children();
    remove_run_objects(std::process::id());
    // `exit` runs the atexit hook `runs::register` installed: it forgets this run's record
    // now that nothing is left.
    std::process::exit(code)
}

/// Removes every object of run `pid` (see the module's docs): the processes inside its
/// namespaces are killed first (a daemon holds its pins and namespace), then the
/// namespaces, pin roots and files go.
pub(crate) fn remove_run_objects(pid: u32) {
    let prefix = run_prefix(pid);
    let namespaces = entries(Path::new("/run/netns"), &prefix);
    let inodes: Vec<u64> = namespaces
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok().map(|m| m.ino()))
        .collect();
    kill_inside(&inodes);
    for (ns, ino) in namespaces.iter().zip(&inodes) {
        remove_selector_pins(*ino);
        if let Some(name) = ns.file_name().and_then(|n| n.to_str()) {
            // Quiet: a guard may have removed it since the listing.
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
    }
    for root in entries(Path::new("/sys/fs/bpf"), &prefix) {
        // Links pinned there keep programs attached: detach them, then unpin all.
        let _ = loader::detach_all(&PinLayout::new(&root), false);
        let _ = std::fs::remove_dir_all(&root);
    }
    for file in files_of(pid) {
        let _ = std::fs::remove_file(file);
    }
}

/// What run `pid` still has: namespaces, pin roots, node-local sockets, shared-memory
/// segments and daemon logs.
pub(crate) fn run_objects_left(pid: u32) -> Vec<PathBuf> {
    let prefix = run_prefix(pid);
    let mut left = entries(Path::new("/run/netns"), &prefix);
    left.extend(entries(Path::new("/sys/fs/bpf"), &prefix));
    left.extend(files_of(pid));
    left
}

/// Run `pid`'s files: node-local sockets and shared-memory segments (`innet-<job id>-…`,
/// whose first 6 hex digits are the pid, see `job::job_id`) and daemon logs
/// (`innet-daemon-<unique id>.log`).
fn files_of(pid: u32) -> Vec<PathBuf> {
    let tmp = std::env::temp_dir();
    let jobs = format!("innet-{pid:06x}");
    let logs = format!("innet-daemon-{pid:x}x");
    let mut files = entries(&tmp, &jobs);
    files.extend(entries(Path::new("/dev/shm"), &jobs));
    files.extend(entries(&tmp, &logs));
    files
}

/// The entries of `dir` whose names start with `prefix`.
fn entries(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path())
        .collect()
}

/// Removes the selector pins of the INC sockets bound in the namespace of inode `netns`
/// (a killed process leaves them behind).
pub(crate) fn remove_selector_pins(netns: u64) {
    let prefix = innet_client::inc_socket::netns_prefix(netns);
    for dir in entries(Path::new(innet_client::inc_socket::PIN_ROOT), &prefix) {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// SIGKILLs every process (but this one) whose network namespace is one of `inodes`, and
/// waits up to 3 s for them to go: a dead run's daemons, a job's stragglers.
fn kill_inside(inodes: &[u64]) {
    if inodes.is_empty() {
        return;
    }
    let me = std::process::id();
    let inside = || -> Vec<i32> {
        pids()
            .filter(|&pid| pid != me as i32)
            .filter(|pid| {
                std::fs::metadata(format!("/proc/{pid}/ns/net"))
                    .is_ok_and(|m| inodes.contains(&m.ino()))
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let left = inside();
        if left.is_empty() || Instant::now() > deadline {
            return;
        }
        for pid in left {
            // SAFETY: plain kill(2).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        reap();
        thread::sleep(Duration::from_millis(20));
    }
}

/// Every pid in /proc.
fn pids() -> impl Iterator<Item = i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
}

/// Reaps this process's children that exited.
fn reap() {
    // SAFETY: waitpid on any child without blocking.
    while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
}

/// Sends SIGINT to this process's children (the daemons: they detach and unpin on it) and
/// waits up to 3 s for them to go.
fn stop_children() {
    let me = std::process::id();
    let children = || -> Vec<i32> {
        pids()
            .filter(|pid| {
                // Field 4 of /proc/PID/stat, after the parenthesised command name.
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                    .and_then(|p| p.parse::<u32>().ok())
                    == Some(me)
            })
            .collect()
    };
    for pid in children() {
        // SAFETY: plain kill(2) on a child's pid.
        unsafe { libc::kill(pid, libc::SIGINT) };
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        reap();
        if children().is_empty() {
            break;
        }
        thread::sleep(Duration::from_millis(50));
    }
}
