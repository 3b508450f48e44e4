//! SIGINT, SIGTERM and SIGHUP tear a lab process's fabric down, then end it as the
//! signal would (exit status 128 + the signal's number): Ctrl-C, `timeout`, `systemctl
//! stop`, a CI job's cancel and a closed terminal all leave nothing behind.
//!
//! The handler only writes the signal's number to a pipe (all a handler may safely do); a
//! thread of its own reads it and runs [`crate::exit_torn_down`]. A signal the process
//! started with ignored (`nohup`, a shell's background job) stays ignored.

use std::{
    os::raw::c_int,
    sync::{
        Once, OnceLock,
        atomic::{AtomicI32, Ordering},
    },
};

const SIGNALS: [c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// What the message on a signal calls this process.
static TOOL: OnceLock<String> = OnceLock::new();
/// The pipe's write end, for the handler.
static WAKE: AtomicI32 = AtomicI32::new(-1);

/// On SIGINT, SIGTERM or SIGHUP, tears down what this process built — its daemons, its
/// namespaces (and the INC-socket pins in them), its pin roots, its node-local sockets —
/// and exits with 128 + the signal's number. `tool` names the process in the one line it
/// prints. Fabrics install this themselves (tests' too), under the program's name; a tool
/// calls it first to be named. (Panics unwind through the fabric's guards instead.)
pub fn tear_down_on_signals(tool: &str) {
    let _ = TOOL.set(tool.to_owned());
    install();
}

/// Installs the handlers and the thread that tears down, once per process.
///
/// # Panics
/// The pipe, the thread or a handler cannot be set up.
pub(crate) fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills two fds; close-on-exec keeps them out of the children.
        let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
        assert_eq!(r, 0, "pipe2: {}", std::io::Error::last_os_error());
        WAKE.store(fds[1], Ordering::Relaxed);
        std::thread::Builder::new()
            .name("innet-lab-signals".into())
            .spawn(move || wait_for_signal(fds[0]))
            .expect("spawn the signal thread");
        for sig in SIGNALS {
            // SAFETY: zeroed sigaction structs are valid; sigaction only reads `act`.
            unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                libc::sigaction(sig, std::ptr::null(), &raw mut old);
                if old.sa_sigaction == libc::SIG_IGN {
                    continue;
                }
                let mut act: libc::sigaction = std::mem::zeroed();
                act.sa_sigaction = on_signal as *const () as libc::sighandler_t;
                act.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&raw mut act.sa_mask);
                let r = libc::sigaction(sig, &raw const act, std::ptr::null_mut());
                assert_eq!(
                    r,
                    0,
                    "sigaction({sig}): {}",
                    std::io::Error::last_os_error()
                );
            }
        }
    });
}

extern "C" fn on_signal(sig: c_int) {
    // Signal numbers are below 65.
    let byte = sig.cast_unsigned() as u8;
    // SAFETY: write(2) and errno are async-signal-safe; errno is put back for the code the
    // signal interrupted.
    unsafe {
        let errno = *libc::__errno_location();
        libc::write(WAKE.load(Ordering::Relaxed), (&raw const byte).cast(), 1);
        *libc::__errno_location() = errno;
    }
}

/// Waits for the first signal, then tears down and exits; later ones find it busy.
fn wait_for_signal(fd: c_int) {
    let mut byte = 0u8;
    loop {
        // SAFETY: reads one byte into a live buffer.
        match unsafe { libc::read(fd, (&raw mut byte).cast(), 1) } {
            1 => break,
            -1 if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            _ => return,
        }
    }
    let sig = c_int::from(byte);
    let tool = TOOL.get().cloned().unwrap_or_else(program_name);
    eprintln!("\n{tool}: {}, tearing its fabric down", name(sig));
    crate::exit_torn_down(128 + sig);
}

fn name(sig: c_int) -> &'static str {
    match sig {
        libc::SIGINT => "interrupted",
        libc::SIGTERM => "terminated",
        libc::SIGHUP => "hung up",
        _ => "signalled",
    }
}

fn program_name() -> String {
    std::env::args()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "the lab".into())
}
