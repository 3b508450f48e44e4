//! Opening a rank's INC sockets inside its node's network namespace while the rank itself
//! (and MPI's own sockets) stays where `mpirun` started it: `setns` affects only the calling
//! thread, a socket keeps the namespace it was created in, and threads spawned meanwhile
//! inherit it. Needs CAP_SYS_ADMIN.

use std::{fs::File, io, os::fd::AsRawFd as _};

/// Runs `f` with this thread in network namespace `netns` (a name under /run/netns, or a
/// path), then returns the thread to its own namespace.
pub fn within<T>(netns: &str, f: impl FnOnce() -> T) -> io::Result<T> {
    let path = if netns.contains('/') {
        netns.to_owned()
    } else {
        format!("/run/netns/{netns}")
    };
    let target = File::open(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("network namespace {path}: {e}")))?;
    let home = File::open("/proc/thread-self/ns/net")?;
    enter(&target).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("entering {path}: {e} (opening a node's sockets in its namespace needs CAP_SYS_ADMIN)"),
        )
    })?;
    let out = f();
    // Staying in the node's namespace would put MPI's later sockets there: fail loudly.
    enter(&home).expect("returning to this thread's network namespace");
    Ok(out)
}

fn enter(ns: &File) -> io::Result<()> {
    // SAFETY: a valid namespace fd; CLONE_NEWNET moves only this thread.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
