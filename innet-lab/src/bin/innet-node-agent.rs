//! `innet-node-agent [ssh options] HOST COMMAND…`: "logs in" to an emulated node, as ssh
//! logs in to a real one, for MPI launchers (`mpirun.openmpi --mca plm_rsh_agent`,
//! `mpirun.mpich -launcher ssh -launcher-exec`). It enters HOST's network namespace
//! (`/run/netns/HOST`: a node's hostname is its namespace's name), unshares a UTS namespace
//! whose hostname is HOST, starts a session of its own (as sshd does for every login) and
//! runs COMMAND through `/bin/sh -c`, its words joined by spaces, as ssh does.
//!
//! The launcher itself starts through the agent too (`--no-shell`, on node 0), with
//! `--hosts FILE` bind-mounted over `/etc/hosts` in a private mount namespace, so the node
//! names resolve to their fabric addresses for it and for every daemon it starts (they
//! inherit the mount namespace); the machine's own `/etc/hosts` is never touched.

use std::{
    ffi::{CString, OsString},
    fs::File,
    io,
    os::unix::process::CommandExt as _,
    path::PathBuf,
    process::Command,
};

use anyhow::{Context as _, Result, ensure};
use clap::Parser;

#[derive(Parser)]
#[command(
    name = "innet-node-agent",
    about = "Run a command on an emulated node (its network namespace and hostname), as ssh would"
)]
struct Cli {
    /// Bind-mount FILE over /etc/hosts in a private mount namespace first
    #[arg(long, value_name = "FILE")]
    hosts: Option<PathBuf>,
    /// Run COMMAND as it is (no shell, no new session): for the launcher itself
    #[arg(long)]
    no_shell: bool,
    /// ssh's flags, accepted and ignored (hydra passes -x)
    #[arg(short = 'x', short_alias = 'T', hide = true)]
    _no_x11: bool,
    /// ssh's options with a value (-o, -p, -l), accepted and ignored
    #[arg(short = 'o', short_alias = 'p', short_alias = 'l', hide = true)]
    _ssh_option: Vec<String>,
    /// The node: the name of its network namespace, and its hostname
    host: String,
    /// The command and its arguments
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
    command: Vec<OsString>,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    if let Some(hosts) = &cli.hosts {
        private_hosts(hosts).context("mounting the nodes' hosts file (needs CAP_SYS_ADMIN)")?;
    }
    let netns = format!("/run/netns/{}", cli.host);
    let ns = File::open(&netns).with_context(|| format!("node {}: {netns}", cli.host))?;
    // Single-threaded: the whole process moves.
    innet_lab::set_netns(&ns).with_context(|| format!("entering {netns}"))?;
    // SAFETY: plain syscalls on a buffer that outlives them.
    check(unsafe { libc::unshare(libc::CLONE_NEWUTS) }).context("a UTS namespace")?;
    check(unsafe { libc::sethostname(cli.host.as_ptr().cast(), cli.host.len()) })
        .with_context(|| format!("hostname {}", cli.host))?;
    let err = if cli.no_shell {
        Command::new(&cli.command[0]).args(&cli.command[1..]).exec()
    } else {
        // A login's session: the daemon and its ranks are their own session, as on a real
        // node (the reason the launch turns the scheduler's autogroups off).
        // SAFETY: plain syscall; fails only if already a group leader, which is harmless.
        unsafe { libc::setsid() };
        let line = cli.command.join(&OsString::from(" "));
        Command::new("/bin/sh").arg("-c").arg(line).exec()
    };
    Err(err).with_context(|| format!("running {:?} on {}", cli.command, cli.host))
}

/// Unshares the mount namespace, keeps its mounts from propagating back, and bind-mounts
/// `file` over `/etc/hosts`.
fn private_hosts(file: &std::path::Path) -> Result<()> {
    let source = CString::new(file.as_os_str().as_encoded_bytes())?;
    ensure!(file.is_file(), "{} is not a file", file.display());
    // SAFETY: plain syscalls on NUL-terminated strings that outlive them.
    unsafe {
        check(libc::unshare(libc::CLONE_NEWNS)).context("a mount namespace")?;
        check(libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ))
        .context("making / private")?;
        check(libc::mount(
            source.as_ptr(),
            c"/etc/hosts".as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        ))
        .context("bind-mounting /etc/hosts")?;
    }
    Ok(())
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
