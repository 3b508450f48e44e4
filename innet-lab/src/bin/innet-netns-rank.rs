//! `mpirun … innet-netns-rank --netns NS0,NS1,… [--ppn P] -- PROGRAM ARGS…`: runs one MPI
//! rank inside its node's network namespace, so MPI's own traffic (TCP between ranks)
//! crosses the emulated fabric the way it crosses a real one, instead of this machine's
//! shared memory or loopback.
//!
//! OpenMPI's launcher serves PMIx on its own loopback (`PMIX_SERVER_URI*` =
//! `…;tcp4://127.0.0.1:PORT`), which a process in another namespace cannot reach. Before
//! it enters the node's namespace, the rank forks a forwarder: it listens on a fresh port
//! of the node namespace's loopback (a socket keeps the namespace it was made in), connects
//! each client to the launcher's port from the launcher's namespace, and copies bytes both
//! ways; the rank's PMIx variables are rewritten to the fresh port. The forwarder dies with
//! the rank. MPICH's launcher hands its ranks a socket (`PMI_FD`), which needs no help.

use std::{
    env,
    ffi::OsString,
    fs::File,
    io,
    net::{Ipv4Addr, Shutdown, TcpListener, TcpStream},
    os::unix::process::CommandExt as _,
    process::Command,
    thread,
};

use anyhow::{Context as _, Result, bail, ensure};
use clap::Parser;
use innet_lab::set_netns;

#[derive(Parser)]
#[command(
    name = "innet-netns-rank",
    about = "Run an MPI rank inside its node's network namespace (under mpirun)"
)]
struct Cli {
    /// The nodes' network namespaces (names under /run/netns), in node order
    #[arg(long, value_delimiter = ',', required = true)]
    netns: Vec<String>,
    /// Ranks per node: rank r runs on node r / ppn
    #[arg(long, default_value_t = 1)]
    ppn: usize,
    /// The program and its arguments
    #[arg(last = true, required = true)]
    program: Vec<OsString>,
}

/// The launcher's variables that carry a rank's rank, in the order they are tried.
const RANK_VARS: [&str; 3] = ["OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"];

fn main() -> Result<()> {
    let cli = Cli::parse();
    ensure!(cli.ppn > 0, "--ppn must be at least 1");
    let rank: usize = RANK_VARS
        .iter()
        .find_map(|v| env::var(v).ok())
        .context("no rank in the environment (OMPI_COMM_WORLD_RANK, PMI_RANK or PMIX_RANK): run this under mpirun")?
        .parse()
        .context("the launcher's rank variable is not a number")?;
    let node = rank / cli.ppn;
    let Some(netns) = cli.netns.get(node) else {
        bail!(
            "rank {rank} belongs on node {node} ({} ranks per node), but only {} namespaces were given",
            cli.ppn,
            cli.netns.len()
        );
    };
    let target = File::open(format!("/run/netns/{netns}"))
        .with_context(|| format!("network namespace {netns}"))?;
    let home = File::open("/proc/self/ns/net")?;

    // Every PMIx URI on the launcher's loopback gets a listener in the node's namespace.
    let mut forwards: Vec<(TcpListener, u16)> = vec![];
    let mut rewritten: Vec<(String, String)> = vec![];
    for (key, value) in env::vars().filter(|(k, _)| k.starts_with("PMIX_SERVER_URI")) {
        let Some((head, port)) = loopback_uri(&value) else {
            continue;
        };
        let local = if let Some((l, _)) = forwards.iter().find(|(_, up)| *up == port) {
            l.local_addr()?.port()
        } else {
            set_netns(&target).context("entering the node's namespace (needs CAP_SYS_ADMIN)")?;
            let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0));
            set_netns(&home).context("returning to the launcher's namespace")?;
            let l = l.context("listening on the node namespace's loopback")?;
            let p = l.local_addr()?.port();
            forwards.push((l, port));
            p
        };
        rewritten.push((key, format!("{head}tcp4://127.0.0.1:{local}")));
    }
    if !forwards.is_empty() {
        // SAFETY: single-threaded here; the child only runs the forwarder and exits.
        match unsafe { libc::fork() } {
            -1 => return Err(io::Error::last_os_error()).context("forking the PMIx forwarder"),
            0 => forwarder(forwards),
            _ => {}
        }
    }
    set_netns(&target).context("entering the node's namespace")?;
    let err = Command::new(&cli.program[0])
        .args(&cli.program[1..])
        .envs(rewritten)
        .exec();
    Err(err).with_context(|| format!("running {}", cli.program[0].to_string_lossy()))
}

/// `(everything before the address, port)` of a `…;tcp4://127.0.0.1:PORT` URI.
fn loopback_uri(uri: &str) -> Option<(&str, u16)> {
    let at = uri.find("tcp4://127.0.0.1:")?;
    let port = uri[at + "tcp4://127.0.0.1:".len()..].parse().ok()?;
    Some((&uri[..at], port))
}

/// The forwarder process: accepts on each listener and relays to the launcher's port.
fn forwarder(forwards: Vec<(TcpListener, u16)>) -> ! {
    // Dies with the rank (the parent execs the program, which keeps its pid).
    // SAFETY: plain prctl.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let handles: Vec<_> = forwards
        .into_iter()
        .map(|(listener, port)| thread::spawn(move || accept_loop(&listener, port)))
        .collect();
    for h in handles {
        let _ = h.join();
    }
    std::process::exit(0)
}

fn accept_loop(listener: &TcpListener, port: u16) {
    for client in listener.incoming().flatten() {
        let Ok(server) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        let _ = (client.set_nodelay(true), server.set_nodelay(true));
        relay(client, server);
    }
}

/// Copies bytes both ways until either side closes.
fn relay(a: TcpStream, b: TcpStream) {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    thread::spawn(move || pipe(a, b2));
    thread::spawn(move || pipe(b, a2));
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    let _ = io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
}

#[cfg(test)]
mod tests {
    use super::loopback_uri;

    #[test]
    fn finds_the_loopback_port_of_a_pmix_uri() {
        assert_eq!(
            loopback_uri("1211236352.0;tcp4://127.0.0.1:42995"),
            Some(("1211236352.0;", 42995))
        );
        assert_eq!(loopback_uri("1.0;tcp://192.0.2.2:45699"), None);
    }
}
