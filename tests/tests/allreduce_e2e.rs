//! The allreduce API end to end: ranks in namespaces, `innet daemon` on every switch, the
//! control-plane handshake, Node and Socket mode through XDP, the host algorithms, and the
//! fallbacks (no switch daemon, an op the switches do not offer, lost results). Every result
//! is checked against the host reference on every rank.

use std::time::Duration;

use innet::{group_maps::GroupMaps, loader::XdpMode};
use innet_client::{Fallback, Grouping, Layout, Mode, Path, Report};
use innet_common::fail::FAIL_GROUP_LOST;
use innet_common::proto::{
    DEFAULT_PAYLOAD_BYTES, Dtype, JUMBO_MTU, MAX_PAYLOAD_BYTES, Op, element_bytes,
};
use innet_lab::{
    daemons::{daemons_on, learn_hosts},
    job::{self, BYTES, all_cases, checked_allreduce, run_job},
    topology::{Options, Shape, Topology},
};

fn fabric(tors: usize, nodes_per_tor: usize, spines: usize) -> Topology {
    // A failing test shows what the client library logged.
    let _ = tracing_subscriber::fmt()
        .with_env_filter("innet_client=debug")
        .with_test_writer()
        .try_init();
    let topo = Topology::new(Shape {
        tors,
        hosts_per_tor: nodes_per_tor,
        sockets: 2,
        spines,
        mode: XdpMode::Native,
        ..Shape::small()
    });
    learn_hosts(&topo);
    topo
}

/// Runs `cases` (op, type) at every size in `mode`; returns each rank's reports.
fn sweep(topo: &Topology, layout: Layout, mode: Mode, cases: &[(Op, Dtype)]) -> Vec<Vec<Report>> {
    job::sweep(topo, layout, mode, |_| {}, cases)
}

/// Every op on a few types (the larger fabrics).
fn some_cases() -> Vec<(Op, Dtype)> {
    Op::ALL
        .into_iter()
        .zip(
            [Dtype::I32, Dtype::U64, Dtype::I16, Dtype::U8]
                .into_iter()
                .cycle(),
        )
        .collect()
}

fn assert_paths(reports: &[Vec<Report>], want: Path, mode: Mode) {
    for (rank, rs) in reports.iter().enumerate() {
        for r in rs {
            assert_eq!(r.path, want, "{mode}: rank {rank}: {r:?}");
            assert_eq!(r.fallback, None, "{mode}: rank {rank}: {r:?}");
        }
    }
}

/// Every mode, every op and integer type, 4 B to several packets.
fn every_mode(topo: &Topology, nodes: usize, ranks_per_node: usize, cases: &[(Op, Dtype)]) {
    let layout = Layout::new(nodes * ranks_per_node, ranks_per_node, 2).expect("layout");
    for (mode, want) in [
        (Mode::IncNode, Path::Network(Grouping::Node)),
        (Mode::IncSocket, Path::Network(Grouping::Socket)),
        (Mode::Auto, Path::Network(Grouping::Socket)),
        (
            Mode::HostRd,
            Path::Host(innet_client::Algorithm::RecursiveDoubling),
        ),
        (Mode::HostRing, Path::Host(innet_client::Algorithm::Ring)),
    ] {
        let reports = sweep(topo, layout, mode, cases);
        assert_paths(&reports, want, mode);
    }
}

#[test]
fn four_nodes_every_mode_every_op_and_type() {
    let topo = fabric(2, 2, 1);
    let _daemons = daemons_on(&topo, &[]);
    every_mode(&topo, 4, 4, &all_cases());
}

#[test]
fn nine_nodes_as_in_fig8_two_spines() {
    let topo = fabric(3, 3, 2);
    let _daemons = daemons_on(&topo, &[]);
    every_mode(&topo, 9, 4, &some_cases());
}

#[test]
fn sixteen_nodes_sixty_four_ranks() {
    let topo = fabric(2, 8, 1);
    let _daemons = daemons_on(&topo, &[]);
    every_mode(&topo, 16, 4, &some_cases());
}

#[test]
fn fallbacks_give_correct_results_and_say_why() {
    let topo = fabric(2, 2, 1);
    let layout = Layout::new(16, 4, 2).expect("layout");
    let cases = [(Op::Sum, Dtype::I32), (Op::Bxor, Dtype::U16)];

    // No daemon on the switches: the queries cross no innet switch, so the MRR says so
    // and every collective runs on the hosts.
    let reports = sweep(&topo, layout, Mode::IncNode, &cases);
    for r in reports.iter().flatten() {
        assert_eq!(
            r.fallback,
            Some(Fallback::NoNetwork { fail_cause: 5 }),
            "{r:?}"
        );
        assert!(matches!(r.path, Path::Host(_)), "{r:?}");
    }

    // Switches that offer SUM but not BXOR: SUM goes through the network, BXOR does not.
    let daemons = daemons_on(&topo, &["--ops", "sum,min,max"]);
    let reports = sweep(&topo, layout, Mode::IncSocket, &cases);
    for rs in &reports {
        for (i, r) in rs.iter().enumerate() {
            if i < BYTES.len() {
                assert_eq!(r.path, Path::Network(Grouping::Socket), "{r:?}");
            } else {
                assert_eq!(r.fallback, Some(Fallback::Unsupported), "{r:?}");
            }
        }
    }
    drop(daemons);

    // Lost results: one leader drops every third result it receives; it sends its
    // contribution again and the switch answers from the slot's saved result.
    let _daemons = daemons_on(&topo, &[]);
    let tor = &topo.tors[0];
    let out = run_job(
        &topo,
        layout,
        Mode::IncNode,
        |cfg| {
            if cfg.rank == 4 {
                cfg.drop_results_every = 3;
            }
        },
        |comm| {
            // What leader 4's TOR answered from saved results, read while a group is up.
            let mut replies = 0u64;
            let mut reports: Vec<Report> = vec![];
            for case in 0..30 {
                reports.push(checked_allreduce(comm, case, Op::Sum, Dtype::U32, 900));
                let now = GroupMaps::open(&tor.pins.layout)
                    .and_then(|m| m.list())
                    .map_or(0, |l| l.iter().map(|g| g.stats.replies).sum());
                replies = replies.max(now);
            }
            (reports, replies)
        },
    );
    // Every result was right (checked above); a collective either stayed on the network or
    // says why it left it.
    for (rank, (rs, _)) in out.iter().enumerate() {
        for (case, r) in rs.iter().enumerate() {
            assert!(
                r.path == Path::Network(Grouping::Node) || r.fallback.is_some(),
                "rank {rank}, case {case}: {r:?}"
            );
        }
    }
    let replies = out.iter().map(|(_, r)| *r).max().unwrap_or(0);
    assert!(
        replies > 0,
        "leader 4's TOR answered its repeated contributions from the saved results: {:?}",
        out[4].0
    );

    results_that_never_come(&topo, layout);
}

/// Results that never arrive: the leader gives up after its tries and its patience and runs
/// the collective on the hosts; the peers that got the network's result hand it over.
fn results_that_never_come(topo: &Topology, layout: Layout) {
    let reports = run_job(
        topo,
        layout,
        Mode::IncNode,
        |cfg| {
            cfg.retry = Duration::from_millis(5);
            cfg.max_tries = 3;
            if cfg.rank == 8 {
                cfg.drop_results_every = 1;
            }
        },
        |comm| {
            // Loss, two calls on the hosts, the set-up again, loss again, two calls on the
            // hosts, the pause: the first loss comes at the first or the second call
            // (whether the peers had the first result before leader 8 gave up).
            (0..8)
                .map(|case| checked_allreduce(comm, case, Op::Max, Dtype::I64, 300))
                .collect::<Vec<_>>()
        },
    );
    // Its peers, waiting for its next contribution, may give up first (the same patience
    // runs on every leader): then it joins them.
    assert!(
        reports[8].iter().any(|r| matches!(
            r.fallback,
            Some(Fallback::Timeout { tries }) if tries >= 3
        ) || r.fallback == Some(Fallback::PeerFellBack)),
        "leader 8 left the network: {:?}",
        reports[8]
    );
    assert!(
        reports
            .iter()
            .flatten()
            .any(|r| matches!(r.fallback, Some(Fallback::Timeout { .. }))),
        "a leader gave up on the network after its tries: {reports:?}"
    );
    // The leaders set the group up again; lost again at once, they leave the network
    // alone for a while (QUICK_LOSS_CALLS collectives) and say why, instead of paying the
    // tries on every call.
    for (rank, rs) in reports.iter().enumerate() {
        let gave_up = rs
            .iter()
            .position(|r| r.regrouped == Some(FAIL_GROUP_LOST))
            .unwrap_or_else(|| panic!("rank {rank} left the network alone: {rs:?}"));
        assert!(
            rs[..gave_up].iter().any(|r| r.regrouped == Some(0)),
            "rank {rank} set the group up again first: {rs:?}"
        );
        for r in &rs[gave_up..] {
            assert!(matches!(r.path, Path::Host(_)), "rank {rank}: {r:?}");
            assert_eq!(
                r.fallback,
                Some(Fallback::NoNetwork {
                    fail_cause: FAIL_GROUP_LOST
                }),
                "rank {rank}: {r:?}"
            );
        }
    }
}

/// Jumbo frames: on links of MTU 9000 the switches offer, and the leaders settle on, 8 KiB
/// payloads, whose frames span several XDP buffers (aggregated with `bpf_xdp_load_bytes`,
/// results fanned out on tc: a devmap broadcast refuses them), and every op goes through
/// the switches in them, every result checked; with one host's link back at 1500 B, every
/// leader settles on 1408 B (the handshake takes the smallest link of the group). The
/// switches are attached with `--window 64`: the handshake tells every leader so (and it
/// keeps 32 rounds in flight).
#[test]
fn jumbo_links_carry_jumbo_packets_and_one_standard_link_sets_the_size_for_all() {
    let topo = Topology::with(
        Shape::small(),
        Options {
            innet: true,
            mtu: Some(JUMBO_MTU),
            window: Some(64),
            ..Options::default()
        },
    );
    learn_hosts(&topo);
    let _daemons = daemons_on(&topo, &[]);
    let layout = Layout::new(8, 2, 1).expect("layout");
    let cases = some_cases();
    let run = |payload: u16| {
        let sizes = job::run_job(
            &topo,
            layout,
            Mode::IncNode,
            |_| {},
            |comm| {
                for (k, &(op, dtype)) in cases.iter().enumerate() {
                    // Three full jumbo packets and a partial one.
                    let count = (3 * MAX_PAYLOAD_BYTES + 200) / element_bytes(op, dtype);
                    let r = checked_allreduce(comm, k, op, dtype, count);
                    assert_eq!(
                        r.path,
                        Path::Network(Grouping::Node),
                        "{op:?}/{dtype:?}: {r:?}"
                    );
                }
                // The first TOR's copies to its hosts, read while the group is up.
                let down = GroupMaps::open(&topo.tors[0].pins.layout)
                    .and_then(|m| m.list())
                    .map_or((0, 0), |l| {
                        l.iter()
                            .map(|g| (g.stats.sent_down, g.stats.fanout_errors))
                            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
                    });
                // One more collective: no leader leaves (and its MRR frees the group)
                // before every rank has read the TOR's counters.
                checked_allreduce(comm, 0, Op::Sum, Dtype::I32, 1);
                (comm.group().map(|g| (g.max_data_size, g.window)), down)
            },
        );
        for (size, (sent_down, fanout_errors)) in sizes {
            assert_eq!(size, Some((payload, 64)));
            assert!(sent_down > 0, "the TOR sent results down");
            assert_eq!(fanout_errors, 0, "every fanned-out copy was sent");
        }
    };
    run(MAX_PAYLOAD_BYTES as u16);
    topo.hosts[3].ns.ip(&["link", "set", "eth0", "mtu", "1500"]);
    run(DEFAULT_PAYLOAD_BYTES as u16);
}

/// Messages longer than a shared-memory slot on nodes of 4 ranks, pipelined
/// (`Config::pipeline`): each leader folds its ranks' parts in as they come while the
/// first rounds are in flight (`comm::pipeline`). Every result is checked, in both modes
/// that reach the switches and on the hosts: a length that is no multiple of the local
/// channel's pieces, and MINLOC's 12-byte pairs, which pieces of 32 KiB cut in the middle.
#[test]
fn long_messages_overlap_the_node_stage_with_the_network() {
    let topo = fabric(2, 2, 1);
    let layout = Layout::new(16, 4, 2).expect("layout");
    let cases = [
        (Op::Sum, Dtype::F64, 131_075),
        (Op::Minloc, Dtype::F64, 90_001),
        (Op::Bxor, Dtype::U8, 70_001),
    ];
    let run = |mode: Mode| {
        run_job(
            &topo,
            layout,
            mode,
            |cfg| cfg.pipeline = true,
            |comm| {
                cases
                    .iter()
                    .enumerate()
                    .map(|(case, &(op, dtype, count))| {
                        checked_allreduce(comm, case, op, dtype, count)
                    })
                    .collect::<Vec<_>>()
            },
        )
    };
    // No daemon yet: the hosts reduce, after the whole parts are in.
    for (rank, rs) in run(Mode::IncNode).iter().enumerate() {
        for r in rs {
            assert!(matches!(r.path, Path::Host(_)), "rank {rank}: {r:?}");
        }
    }
    let _daemons = daemons_on(&topo, &[]);
    for (mode, want) in [
        (Mode::IncNode, Path::Network(Grouping::Node)),
        (Mode::IncSocket, Path::Network(Grouping::Socket)),
    ] {
        for (rank, rs) in run(mode).iter().enumerate() {
            for r in rs {
                assert_eq!(r.path, want, "{mode:?}, rank {rank}: {r:?}");
            }
        }
    }
}
