//! A lab fabric in a process of its own, built as a test builds one, for the tests that
//! signal or kill it (`lab_signals.rs`): one TOR with two nodes and innet's XDP on its
//! ports, the TOR's daemon, a NIC daemon per node, and a helper (`sleep`) in node 0's
//! namespace. Prints `ready` once all of them run, then waits to be ended.

use std::{
    io::Write as _,
    os::unix::fs::MetadataExt as _,
    process::Stdio,
    time::{Duration, Instant},
};

use innet_lab::{
    daemons::{daemons_on, nic_daemons_on},
    die_with_parent,
    topology::{Shape, Topology},
};

fn main() {
    let topo = Topology::new(Shape::one_level(2));
    let _daemons = daemons_on(&topo, &[]);
    let _nic_daemons = nic_daemons_on(&topo, &[]);
    let mut helper = topo.hosts[0].ns.command("sleep");
    // This thread parks below for good: the helper dies with the process.
    #[expect(
        clippy::zombie_processes,
        reason = "the helper runs until this process ends"
    )]
    let child = die_with_parent(&mut helper)
        .arg("1000")
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn the helper");
    // Ready once it sits in the namespace (nsenter moves it there after the fork).
    let netns = |path: String| std::fs::metadata(path).map(|m| m.ino()).ok();
    let want = netns(format!("/run/netns/{}", topo.hosts[0].ns.name));
    let start = Instant::now();
    while netns(format!("/proc/{}/ns/net", child.id())) != want {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the helper did not enter its namespace"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut out = std::io::stdout();
    writeln!(out, "ready").expect("stdout");
    out.flush().expect("stdout");
    loop {
        std::thread::park();
    }
}
