//! Unmodified MPI programs under `mpirun` with the interposer preloaded: Debian's OpenMPI and
//! MPICH, 4 ranks on a fabric of 2 TORs × 2 nodes and a SPINE, each rank's INC sockets in its
//! node's namespace. Results are checked by the programs themselves (`mpi_check`) or by
//! mpi4py's own test suite; the interposer's per-rank reports and the switches' port counters
//! show innet did the work. Most runs turn the learned cutover off (`INNET_MPI_LEARN=0`):
//! they check that innet serves every call it can (mpi_discover_e2e checks the learning).

use std::ffi::OsString;

use innet::{loader::XdpMode, stats};
use innet_lab::{
    daemons::{dpu_daemons_on, learn_hosts},
    mpi::{Flavour, MpiRun, Nodes, Scratch, mpi_fabric, mpi4py_tests, reports},
    topology::{Options, Shape, Topology},
};
use innet_mpi::{rank_report::Summary, session::LEARN_VAR};
use innet_tools::bench::mpi::osu_allreduce;

const RANKS: usize = 4;

/// Frames the switches' XDP programs redirected (aggregation results fanned out).
fn redirected(topo: &Topology) -> u64 {
    topo.tors
        .iter()
        .chain(&topo.spines)
        .flat_map(|sw| stats::read(&sw.pins.layout).expect("port stats"))
        .map(|p| p.total.xdp_redirect)
        .sum()
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn mpi_check(flavour: Flavour) -> Vec<OsString> {
    vec![flavour.program("mpi_check").into()]
}

/// Every rank's report shows collectives served through the switches, and the calls innet
/// cannot serve handed to MPI.
fn assert_served_by_the_network(reports: &[Summary]) {
    for r in reports {
        for kind in [
            "allreduce",
            "reduce",
            "bcast",
            "barrier",
            "allgather",
            "reduce_scatter_block",
            "reduce_scatter",
        ] {
            assert!(
                r.served(kind) > 0,
                "rank {}: no {kind} through innet: {r:?}",
                r.rank
            );
        }
        assert_eq!(r.host + r.local + r.nic_tree, 0, "rank {}: {r:?}", r.rank);
        assert_eq!(r.fallbacks, 0, "rank {}: {r:?}", r.rank);
        assert!(r.network > 300, "rank {}: {r:?}", r.rank);
        assert_eq!(r.passed("allreduce/op"), 1, "the user-defined op: {r:?}");
        assert_eq!(r.passed("allreduce/datatype"), 1, "long double: {r:?}");
        assert_eq!(r.passed("allreduce/error"), 0, "{r:?}");
        // The strided type's allgathers, on MPI_COMM_WORLD and the split half.
        assert_eq!(r.passed("allgather/datatype"), 2, "{r:?}");
        // MPI_COMM_WORLD, its duplicate and the half it was split into, alive at the same
        // time, each get a group; their leaders share the node's INC address.
        assert_eq!(
            (r.groups_opened, r.groups_closed, r.groups_refused),
            (3, 3, 0),
            "{r:?}"
        );
        assert_eq!(r.passed("allreduce/communicator"), 0, "{r:?}");
    }
}

#[test]
fn mpi_programs_run_their_collectives_through_innet_under_openmpi_and_mpich() {
    let (topo, _daemons) = mpi_fabric(true);
    for flavour in Flavour::ALL {
        let dir = Scratch::new(flavour.name());
        let before = redirected(&topo);
        let out = MpiRun::new(flavour, RANKS, &mpi_check(flavour))
            .env(LEARN_VAR, "0")
            .innet(&topo, 1, &dir.0, &dir.reports())
            .run();
        assert!(
            stdout(&out).contains("checks passed on 4 ranks"),
            "{flavour:?}: {}",
            stdout(&out)
        );
        assert_served_by_the_network(&reports(&dir.reports(), RANKS));
        let frames = redirected(&topo) - before;
        assert!(
            frames > 300,
            "{flavour:?}: the switches redirected {frames} frames"
        );
    }
}

/// Two ranks per node: a node's ranks meet in shared memory and its leader joins the
/// switches; the halves `mpi_check` splits off have their leaders in different processes of
/// one node, sharing its INC address.
#[test]
fn two_ranks_per_node_share_the_node_and_its_address() {
    let (topo, _daemons) = mpi_fabric(true);
    let dir = Scratch::new("mpi-ppn2");
    let ranks = 2 * RANKS;
    let before = redirected(&topo);
    let out = MpiRun::new(Flavour::OpenMpi, ranks, &mpi_check(Flavour::OpenMpi))
        .env(LEARN_VAR, "0")
        .innet(&topo, 2, &dir.0, &dir.reports())
        .run();
    assert!(
        stdout(&out).contains(&format!("checks passed on {ranks} ranks")),
        "{}",
        stdout(&out)
    );
    for r in reports(&dir.reports(), ranks) {
        assert_eq!(r.fallbacks, 0, "rank {}: {r:?}", r.rank);
        assert_eq!(
            (r.groups_opened, r.groups_closed, r.groups_refused),
            (3, 3, 0),
            "{r:?}"
        );
        assert!(r.served("allreduce") > 300, "rank {}: {r:?}", r.rank);
    }
    assert!(redirected(&topo) - before > 300);
}

#[test]
fn without_innet_the_calls_go_to_mpi() {
    let (topo, _none) = mpi_fabric(false);
    for flavour in Flavour::ALL {
        // Preloaded, nothing set: the interposer finds the placement itself. Every rank
        // sits in the root namespace under one host name, so MPI sees one node: innet
        // serves its collectives in shared memory where that beats MPI (learned), never
        // through the network.
        let dir = Scratch::new(&format!("{}-unset", flavour.name()));
        let out = MpiRun::new(flavour, RANKS, &mpi_check(flavour))
            .env("INNET_MPI_REPORT", dir.reports())
            .run();
        assert!(stdout(&out).contains("checks passed"), "{}", stdout(&out));
        for r in reports(&dir.reports(), RANKS) {
            let p = r.placement.as_ref().expect("placed");
            assert_eq!(
                (p.by.as_str(), p.nodes, p.node),
                ("discovered", 1, 0),
                "{r:?}"
            );
            assert_eq!(r.network + r.host, 0, "{r:?}");
            assert!(!r.cutover.is_empty(), "the cutover was learned: {r:?}");
            let to_mpi = r.passed("allreduce/learning") + r.passed("allreduce/cutover");
            assert!(r.local + to_mpi > 500, "{r:?}");
        }
        // Switched off: the same, without a word.
        let dir = Scratch::new(&format!("{}-off", flavour.name()));
        let out = MpiRun::new(flavour, RANKS, &mpi_check(flavour))
            .env("INNET_MPI", "0")
            .env(LEARN_VAR, "0")
            .innet(&topo, 1, &dir.0, &dir.reports())
            .run();
        assert!(!String::from_utf8_lossy(&out.stderr).contains("innet-mpi"));
        for r in reports(&dir.reports(), RANKS) {
            assert_eq!(r.served.values().sum::<u64>(), 0, "{r:?}");
        }
    }
    // Configured, but the switches run no innet daemon: the handshake gets no answer and
    // innet runs the collectives on the hosts, still correct.
    let dir = Scratch::new("mpi-no-daemons");
    let out = MpiRun::new(Flavour::OpenMpi, RANKS, &mpi_check(Flavour::OpenMpi))
        .env(LEARN_VAR, "0")
        .innet(&topo, 1, &dir.0, &dir.reports())
        .run();
    assert!(stdout(&out).contains("checks passed"), "{}", stdout(&out));
    for r in reports(&dir.reports(), RANKS) {
        assert_eq!(r.network, 0, "{r:?}");
        assert!(r.host > 300 && r.fallbacks == r.host, "{r:?}");
    }
}

#[test]
fn mpi4py_collective_tests_pass_with_no_placement_file() {
    let (topo, _daemons) = mpi_fabric(true);
    let dir = Scratch::new("mpi-mpi4py");
    let tests = mpi4py_tests();
    // Each rank's stderr in a file of its own: the ranks' unittest summaries, written to one
    // pipe, interleave mid-line.
    let suite = [
        "test_cco_buf",
        "test_cco_nb_buf",
        "test_cco_obj",
        "test_cco_vec",
        "test_comm",
        "test_op",
    ]
    .map(|t| format!(" -i {t}"))
    .concat();
    let program: Vec<OsString> = vec![
        "/bin/sh".into(),
        "-c".into(),
        format!(
            "exec /usr/bin/python3 \"$1\" --no-builddir -q{suite} 2>\"$0/stderr-$OMPI_COMM_WORLD_RANK\""
        )
        .into(),
        dir.0.clone().into_os_string(),
        tests.join("runtests.py").into_os_string(),
    ];
    let before = redirected(&topo);
    // `run` fails unless every rank exits 0; the summaries are in the files.
    // A multi-node launch, nothing set but the report: the interposer finds the placement
    // and learns the cutover.
    let _ = MpiRun::new(Flavour::OpenMpi, RANKS, &program)
        .multi_node(Nodes::even(&topo, 1))
        .without_placement_file()
        .env("INNET_MPI_REPORT", dir.reports())
        .run();
    // unittest's summary on every rank: "Ran N tests in …" then "OK".
    for rank in 0..RANKS {
        let path = dir.0.join(format!("stderr-{rank}"));
        let err =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let ran: Vec<u64> = err
            .lines()
            .filter_map(|l| {
                l.strip_prefix("Ran ")?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .collect();
        assert_eq!(ran.len(), 1, "rank {rank}: mpi4py's summary: {err}");
        assert!(ran[0] >= 300, "rank {rank}: tests run: {ran:?}");
        assert_eq!(
            err.lines().filter(|l| *l == "OK").count(),
            1,
            "rank {rank}: {err}"
        );
        assert!(!err.contains("FAILED"), "rank {rank}: {err}");
    }
    let all = reports(&dir.reports(), RANKS);
    for r in &all {
        let p = r.placement.as_ref().expect("placed");
        assert_eq!((p.by.as_str(), p.nodes), ("discovered", RANKS), "{r:?}");
        // Every trial ran its five network calls through the switches.
        assert!(!r.cutover.is_empty(), "{r:?}");
        assert!(
            r.network >= 5 * r.cutover.len() as u64,
            "rank {}: {r:?}",
            r.rank
        );
        assert_eq!((r.fallbacks, r.passed("allreduce/error")), (0, 0), "{r:?}");
    }
    assert!(redirected(&topo) - before > 100);
}

/// `INNET_MPI_MODE=inc-dpu` on a fabric of plain bridges whose nodes sit behind DPUs: an
/// unmodified MPI program's collectives run through the DPUs' tree, and every communicator's
/// members are released on the DPUs when it is freed.
#[test]
fn mpi_collectives_run_through_the_dpus() {
    let topo = Topology::with(
        Shape {
            tors: 2,
            hosts_per_tor: 2,
            sockets: 1,
            spines: 1,
            mode: XdpMode::Native,
            ..Shape::small()
        },
        Options {
            dpus: true,
            ..Options::default()
        },
    );
    learn_hosts(&topo);
    let _daemons = dpu_daemons_on(&topo, &[]);
    let dir = Scratch::new("mpi-dpu");
    let out = MpiRun::new(Flavour::OpenMpi, RANKS, &mpi_check(Flavour::OpenMpi))
        .env(LEARN_VAR, "0")
        .innet(&topo, 1, &dir.0, &dir.reports())
        .env("INNET_MPI_MODE", "inc-dpu")
        .run();
    assert!(
        stdout(&out).contains("checks passed on 4 ranks"),
        "{}",
        stdout(&out)
    );
    for r in reports(&dir.reports(), RANKS) {
        assert!(r.nic_tree > 300, "rank {}: {r:?}", r.rank);
        assert_eq!(r.host + r.network, 0, "rank {}: {r:?}", r.rank);
        assert_eq!(r.fallbacks, 0, "rank {}: {r:?}", r.rank);
        assert_eq!(
            (r.groups_opened, r.groups_closed, r.groups_refused),
            (3, 3, 0),
            "{r:?}"
        );
    }
    for h in &topo.hosts {
        let dpu = h.dpu.as_ref().expect("a DPU");
        let left = innet::group_maps::GroupMaps::open(&dpu.pins.layout)
            .and_then(|g| g.list())
            .expect("DPU groups");
        assert!(left.is_empty(), "DPU of {}: members left: {left:?}", h.ip);
        let daemon = stats::read_daemon(&dpu.pins.layout).expect("DPU daemon counters");
        assert!(
            daemon.groups_installed >= 2 && daemon.groups_killed == daemon.groups_installed,
            "DPU of {}: {daemon:?}",
            h.ip
        );
    }
}

/// The address and TOR index each node of `topo` should be found at: nodes in order, TORs
/// numbered by address (the interposer orders them so).
fn expected_nodes(topo: &Topology) -> Vec<(String, usize)> {
    let mut tor_ips: Vec<std::net::Ipv4Addr> = topo.tors.iter().map(|t| t.ip).collect();
    tor_ips.sort_unstable();
    topo.hosts
        .iter()
        .filter(|h| h.socket == 0)
        .map(|h| {
            let tor = tor_ips.iter().position(|ip| *ip == topo.tors[h.tor].ip);
            (h.ip.to_string(), tor.expect("a TOR"))
        })
        .collect()
}

/// A multi-node launch of `mpi_check` with no placement file, the learned cutover off:
/// returns stdout, stderr and the reports.
fn discovered_run(nodes: Nodes, ranks: usize, dir: &Scratch) -> (String, String, Vec<Summary>) {
    let flavour = Flavour::OpenMpi;
    let out = MpiRun::new(flavour, ranks, &mpi_check(flavour))
        .multi_node(nodes)
        .without_placement_file()
        .env(LEARN_VAR, "0")
        .env("INNET_MPI_REPORT", dir.reports())
        .run();
    let stdout = stdout(&out);
    assert!(
        stdout.contains(&format!("checks passed on {ranks} ranks")),
        "{stdout}"
    );
    (
        stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
        reports(&dir.reports(), ranks),
    )
}

/// No placement file: a multi-node OpenMPI launch by slot, by node (round-robin) and on
/// uneven nodes. The interposer finds each rank's node, address and TOR (the TOR answers
/// its probe); even placements are served through the switches whatever the rank order,
/// the uneven world goes to MPI with the reason said (its even halves stay on innet).
#[test]
fn no_placement_file_by_slot_by_node_and_unevenly() {
    let (topo, _daemons) = mpi_fabric(true);
    let expected = expected_nodes(&topo);
    for (what, nodes, node_of) in [
        ("by slot", Nodes::even(&topo, 2), [0, 0, 1, 1, 2, 2, 3, 3]),
        (
            "by node",
            Nodes::even(&topo, 2).by_node(),
            [0, 1, 2, 3, 0, 1, 2, 3],
        ),
    ] {
        let dir = Scratch::new(&format!("discover-{}", what.replace(' ', "-")));
        let before = redirected(&topo);
        let (_, _, all) = discovered_run(nodes, node_of.len(), &dir);
        for r in &all {
            let p = r.placement.as_ref().expect("placed");
            let (address, tor) = &expected[node_of[r.rank]];
            assert_eq!(
                (p.by.as_str(), p.nodes, &p.address, p.tor),
                ("discovered", 4, address, *tor),
                "{what}, rank {}: {r:?}",
                r.rank
            );
            assert!(r.network > 300, "{what}: {r:?}");
            assert_eq!(
                (r.host, r.fallbacks, r.groups_refused),
                (0, 0, 0),
                "{what}: {r:?}"
            );
            assert_eq!(r.passed("allreduce/communicator"), 0, "{what}: {r:?}");
        }
        assert!(
            redirected(&topo) - before > 300,
            "{what}: the switches did the work"
        );
    }
    // 1 + 2 + 2 ranks: MPI_COMM_WORLD sits unevenly and goes to MPI, with the reason in
    // every report and a line from rank 0; mpi_check's halves (even and odd ranks) hold one
    // rank per node and run through innet.
    let dir = Scratch::new("mpi-discover-uneven");
    let (_, stderr, all) = discovered_run(Nodes::uneven(&topo, &[1, 2, 2]), 5, &dir);
    assert!(
        stderr.contains("sit unevenly on its nodes ([1, 2, 2]"),
        "{stderr}"
    );
    for r in &all {
        let why = r.not_served.as_deref().unwrap_or_default();
        assert!(why.contains("unevenly"), "rank {}: {r:?}", r.rank);
        assert!(r.passed("allreduce/communicator") > 0, "{r:?}");
        assert!(r.groups_refused >= 2 && r.groups_opened >= 1, "{r:?}");
        assert!(r.network > 0 && r.fallbacks == 0, "the halves: {r:?}");
    }
}

/// The learned cutover: every rank takes the same way for every size class (the ranks'
/// mean times decide), whatever each rank measured; the barrier between the calls decides
/// per size of the call it spans.
#[test]
fn the_learned_cutover_decides_alike_on_every_rank() {
    let (topo, _daemons) = mpi_fabric(true);
    let dir = Scratch::new("mpi-learned");
    let flavour = Flavour::OpenMpi;
    let program = osu_allreduce(flavour, 200, false, &[4, 256, 65536]);
    let _ = MpiRun::new(flavour, RANKS, &program)
        .multi_node(Nodes::even(&topo, 1))
        .without_placement_file()
        .env("INNET_MPI_REPORT", dir.reports())
        .run();
    let all = reports(&dir.reports(), RANKS);
    let decisions = |r: &Summary| -> Vec<(u64, String, u64, innet_client::policy::Way)> {
        let mut d: Vec<_> = r
            .cutover
            .iter()
            .map(|d| (d.communicator, d.collective.clone(), d.max_bytes, d.way))
            .collect();
        d.sort_by(|a, b| (a.0, &a.1, a.2).cmp(&(b.0, &b.1, b.2)));
        d
    };
    let first = decisions(&all[0]);
    for class in [4, 256, 65536] {
        assert!(
            first.iter().any(|d| d.1 == "allreduce" && d.2 == class),
            "no decision for {class} B: {:?}",
            all[0]
        );
        // OSU's barrier between the calls learns its way per size of the call it spans
        // (64 KiB runs too few calls to finish the barrier's trial after the allreduce's).
        assert!(
            class == 65536 || first.iter().any(|d| d.1 == "barrier" && d.2 == class),
            "no barrier decision around {class} B calls: {:?}",
            all[0]
        );
    }
    for r in &all {
        assert_eq!(decisions(r), first, "rank {}: {r:?}", r.rank);
        assert_eq!(r.served("allreduce"), all[0].served("allreduce"), "{r:?}");
        assert!(
            r.passed("allreduce/learning") >= 3 * 5,
            "every class's trial: {r:?}"
        );
        for d in &r.cutover {
            assert!(d.network_us.is_finite() && d.mpi_us.is_finite(), "{d:?}");
        }
    }
}

/// `INNET_MPI_LEARNED`: the first run learns and world rank 0 saves its decisions at
/// `MPI_Finalize`; the second run of the same shape starts from them: no trial of the
/// allreduce classes before their re-check (2,400 calls later), every rank alike.
#[test]
fn the_learned_cutover_is_saved_and_reused() {
    let (topo, _daemons) = mpi_fabric(true);
    let dir = Scratch::new("mpi-saved");
    let file = dir.0.join("learned.toml");
    let flavour = Flavour::OpenMpi;
    let program = osu_allreduce(flavour, 100, false, &[4, 256]);
    let run = |into: &std::path::Path| {
        std::fs::create_dir_all(into).expect("reports dir");
        let _ = MpiRun::new(flavour, RANKS, &program)
            .multi_node(Nodes::even(&topo, 1))
            .without_placement_file()
            .env("INNET_MPI_REPORT", into)
            .env(innet_mpi::saved::SAVED_VAR, &file)
            .run();
        reports(into, RANKS)
    };
    let first = run(&dir.0.join("first"));
    assert!(
        first[0].passed("allreduce/learning") > 0,
        "the first run learns"
    );
    let saved = innet_mpi::saved::read(&file).expect("the saved file parses");
    for class in [4, 256] {
        assert!(
            saved
                .decisions
                .iter()
                .any(|d| (d.nodes, d.ppn, d.collective.as_str(), d.max_bytes)
                    == (RANKS, 1, "allreduce", class)),
            "no saved decision for {class} B: {saved:?}"
        );
    }
    let second = run(&dir.0.join("second"));
    for r in &second {
        assert_eq!(r.passed("allreduce/learning"), 0, "no trial: {r:?}");
        assert!(
            !r.cutover.iter().any(|d| d.collective == "allreduce"),
            "no new allreduce decision before the re-check: {r:?}"
        );
        assert_eq!(
            r.served("allreduce"),
            second[0].served("allreduce"),
            "{r:?}"
        );
    }
}
