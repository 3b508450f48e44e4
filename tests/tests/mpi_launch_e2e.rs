//! The multi-node launch, as users run MPI: plain OpenMPI (no interposer) on a fabric of 2
//! TORs × 2 nodes and a SPINE, `mpirun` on node 0 and one `orted` per other node, started
//! through `innet-node-agent`. Every rank says where it runs (hostname, local rank, network
//! namespace, the scheduler's autogroup setting) before `mpi_check` checks the collectives;
//! the placements by slot, by node and on uneven nodes must be what `Nodes` says, and the
//! autogroup setting must be back afterwards.

use std::{collections::BTreeMap, ffi::OsString};

use innet::loader::XdpMode;
use innet_lab::{
    mpi::{Flavour, MpiRun, Nodes, autogroup},
    topology::{Shape, Topology},
};

/// Where a rank found itself.
#[derive(Debug)]
struct Placed {
    local: usize,
    host: String,
    netns: String,
    autogroup: String,
}

fn fabric() -> Topology {
    // Plain bridges: MPI alone, no innet on the switches.
    Topology::plain(Shape {
        tors: 2,
        hosts_per_tor: 2,
        sockets: 1,
        spines: 1,
        mode: XdpMode::Native,
        ..Shape::small()
    })
}

/// Each rank prints one `placed …` line, then becomes `mpi_check`.
fn program(flavour: Flavour) -> Vec<OsString> {
    let report = "printf 'placed %s %s %s %s %s\\n' \"${OMPI_COMM_WORLD_RANK:-$PMI_RANK}\" \
                  \"${OMPI_COMM_WORLD_LOCAL_RANK:-$MPI_LOCALRANKID}\" \"$(hostname)\" \"$(ip netns identify $$)\" \
                  \"$(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null || echo none)\"; \
                  exec \"$0\"";
    vec![
        "/bin/sh".into(),
        "-c".into(),
        report.into(),
        flavour.program("mpi_check").into(),
    ]
}

/// Runs `ranks` ranks over `nodes` and checks that rank r sits on node `expect[r]`: its
/// hostname and namespace are the node's, its local rank counts the node's ranks before it,
/// and autogroups were off.
fn assert_placed(flavour: Flavour, nodes: Nodes, expect: &[usize]) {
    let ranks = expect.len();
    let hosts: Vec<String> = (0..ranks)
        .map(|r| {
            assert_eq!(nodes.node_of(r), expect[r], "rank {r}: Nodes::node_of");
            nodes.hostname(expect[r]).to_owned()
        })
        .collect();
    let out = MpiRun::new(flavour, ranks, &program(flavour))
        .without_interposer()
        .multi_node(nodes)
        .run();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("checks passed on {ranks} ranks")),
        "{stdout}"
    );
    let placed = stdout
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.strip_prefix("placed ")?.split(' ').collect();
            let [rank, local, host, netns, autogroup] = f.as_slice() else {
                panic!("a rank's line: {l:?}");
            };
            Some((
                rank.parse().expect("rank"),
                Placed {
                    local: local.parse().expect("local rank"),
                    host: (*host).to_owned(),
                    netns: (*netns).to_owned(),
                    autogroup: (*autogroup).to_owned(),
                },
            ))
        })
        .collect::<BTreeMap<usize, Placed>>();
    assert_eq!(placed.len(), ranks, "{stdout}");
    let mut locals: BTreeMap<usize, usize> = BTreeMap::new();
    for (&rank, p) in &placed {
        let name = &hosts[rank];
        assert_eq!(
            &p.host, name,
            "{flavour:?} rank {rank}'s hostname: {placed:#?}"
        );
        assert_eq!(&p.netns, name, "rank {rank}'s namespace: {placed:#?}");
        let local = locals.entry(expect[rank]).or_default();
        assert_eq!(p.local, *local, "rank {rank}'s local rank: {placed:#?}");
        *local += 1;
        if autogroup::current().is_some() {
            assert_eq!(
                p.autogroup, "0",
                "rank {rank}: autogroups on during the run"
            );
        }
    }
}

#[test]
fn multi_node_launch_places_ranks_by_slot_by_node_and_unevenly() {
    let before = autogroup::current();
    let topo = fabric();

    // By slot: ranks 0, 1 on node 0, 2, 3 on node 1, …
    assert_placed(
        Flavour::OpenMpi,
        Nodes::even(&topo, 2),
        &[0, 0, 1, 1, 2, 2, 3, 3],
    );

    // By node: round-robin.
    assert_placed(
        Flavour::OpenMpi,
        Nodes::even(&topo, 2).by_node(),
        &[0, 1, 2, 3, 0, 1, 2, 3],
    );

    // Uneven nodes, by slot: 3 + 1 + 2 on the first three nodes.
    assert_placed(
        Flavour::OpenMpi,
        Nodes::uneven(&topo, &[3, 1, 2]),
        &[0, 0, 0, 1, 2, 2],
    );
    // … and by node: a full node drops out of the later rounds.
    assert_placed(
        Flavour::OpenMpi,
        Nodes::uneven(&topo, &[1, 3, 2]).by_node(),
        &[0, 1, 2, 1, 2, 1],
    );

    // MPICH's hydra the same way, by slot and by node (4 ranks: its ranks poll without
    // yielding, so more than the 2 CPUs crawl).
    assert_placed(Flavour::Mpich, Nodes::uneven(&topo, &[2, 2]), &[0, 0, 1, 1]);
    assert_placed(
        Flavour::Mpich,
        Nodes::uneven(&topo, &[2, 2]).by_node(),
        &[0, 1, 0, 1],
    );

    assert_eq!(
        autogroup::current(),
        before,
        "the scheduler's autogroup setting after the runs"
    );
}
