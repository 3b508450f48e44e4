//! Children that die with the lab process: daemons and helpers get SIGTERM from the kernel
//! when it ends, even by SIGKILL (`PR_SET_PDEATHSIG`), so none keeps polling a fabric
//! nobody owns. SIGTERM lets a daemon detach and unpin; the next run's sweep removes the
//! namespaces ([`crate::runs`]).
//!
//! The kernel sends the signal when the *thread* that forked the child ends, not the
//! process. [`die_with_parent`] is for children the calling thread outlives (it waits for
//! them); [`spawn_tied`] forks from a thread that lives as long as the process, for children
//! held by guards that may outlive the thread that started them.

use std::{
    io,
    os::unix::process::CommandExt as _,
    process::{Child, Command},
    sync::{OnceLock, mpsc},
};

/// Makes the child get SIGTERM when the calling thread ends (or the process, however it
/// ends). For children the calling thread waits for; see [`spawn_tied`] otherwise.
pub fn die_with_parent(cmd: &mut Command) -> &mut Command {
    // SAFETY: getpid is async-signal-safe.
    let parent = unsafe { libc::getpid() };
    // SAFETY: prctl and getppid are async-signal-safe, as pre_exec requires.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before the prctl: then the signal never comes.
            if libc::getppid() != parent {
                return Err(io::Error::other("the lab process is gone"));
            }
            Ok(())
        })
    }
}

type Request = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns `cmd` from the lab's spawner thread, which lives as long as the process, with
/// [`die_with_parent`]: the child ends with the process, not with the calling thread. It
/// starts in the spawner's network namespace (that of the thread that first spawned), so a
/// command for a namespace enters it itself ([`crate::NetNs::command`]).
///
/// # Errors
/// The spawn's.
pub fn spawn_tied(mut cmd: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<mpsc::Sender<Request>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("innet-lab-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("spawn the spawner thread");
        tx
    });
    die_with_parent(&mut cmd);
    let (tx, rx) = mpsc::channel();
    spawner
        .send((cmd, tx))
        .map_err(|_| io::Error::other("the spawner thread is gone"))?;
    rx.recv()
        .map_err(|_| io::Error::other("the spawner thread is gone"))?
}
