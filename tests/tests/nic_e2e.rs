//! NIC-triggered reduction end to end: 16 hosts under plain bridges (no switch runs innet),
//! `innet daemon --role nic` on every host, ranks in `inc-nic` mode. Trees of degree 2, 4
//! and 15, every op × integer type, one element to several packets; lost results recovered;
//! a host without a daemon makes the whole group fall back. Every result is checked against
//! the host reference on every rank, and against `host-rd` on the same inputs.

use std::time::Duration;

use innet::loader::XdpMode;
use innet_client::{Fallback, Layout, Mode, Path, Report};
use innet_common::fail::FAIL_NO_NIC;
use innet_common::{
    fault::{KIND_CONTRIBUTION, KIND_RESULT},
    proto::{Dtype, Op},
};
use innet_lab::wire_faults::Faults;
use innet_lab::{
    daemons::{learn_hosts, nic_daemons_on},
    job::{self, all_cases, checked_allreduce, input, run_job},
    topology::{Dir, Link, Options, Shape, Topology},
};

/// `hosts` hosts under two plain TOR bridges and a SPINE bridge, every link through a wire.
fn plain_fabric(hosts: usize) -> Topology {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("innet_client=debug")
        .with_test_writer()
        .try_init();
    let topo = Topology::with(
        Shape {
            tors: 2,
            hosts_per_tor: hosts / 2,
            sockets: 1,
            spines: 1,
            mode: XdpMode::Native,
            ..Shape::small()
        },
        Options {
            innet: false,
            wires: true,
            mtu: None,
            window: None,
            dpus: false,
            link_rate: None,
        },
    );
    learn_hosts(&topo);
    topo
}

/// Every case at every size, through trees of `degree`; returns each rank's reports.
fn sweep(
    topo: &Topology,
    layout: Layout,
    degree: usize,
    cases: &[(Op, Dtype)],
) -> Vec<Vec<Report>> {
    job::sweep(
        topo,
        layout,
        Mode::IncNic,
        |c| c.branch_degree = degree,
        cases,
    )
}

fn assert_all_through_nics(reports: &[Vec<Report>], what: &str) {
    for (rank, rs) in reports.iter().enumerate() {
        for r in rs {
            assert_eq!(r.path, Path::NicTree, "{what}: rank {rank}: {r:?}");
            assert_eq!(r.fallback, None, "{what}: rank {rank}");
        }
    }
}

#[test]
fn sixteen_hosts_reduce_in_their_nics_at_degrees_two_four_and_fifteen() {
    let topo = plain_fabric(16);
    let _daemons = nic_daemons_on(&topo, &[]);
    let layout = Layout::new(16, 1, 1).unwrap();
    let cases = all_cases();
    for degree in [2, 4, 15] {
        let reports = sweep(&topo, layout, degree, &cases);
        assert_all_through_nics(&reports, &format!("degree {degree}"));
    }
    // Two ranks per node: the node's leader reduces locally first.
    let two_per_node = Layout::new(32, 2, 1).unwrap();
    let reports = sweep(
        &topo,
        two_per_node,
        0,
        &[(Op::Sum, Dtype::I64), (Op::Maxloc, Dtype::U32)],
    );
    assert_all_through_nics(&reports, "two ranks per node");

    same_bytes_as_the_hosts(&topo, layout);
    lost_results_are_recovered(&topo, layout);
    loss_on_the_wire_is_recovered(&topo, layout);
}

/// The same inputs on the hosts give the very same bytes.
fn same_bytes_as_the_hosts(topo: &Topology, layout: Layout) {
    let results = |mode: Mode| {
        run_job(
            topo,
            layout,
            mode,
            |_| {},
            |comm| {
                [
                    (Op::Sum, Dtype::U64),
                    (Op::Minloc, Dtype::I16),
                    (Op::Bxor, Dtype::U8),
                ]
                .iter()
                .enumerate()
                .map(|(case, &(op, dtype))| {
                    let send = input(comm.rank(), case, op, dtype, 700);
                    let mut recv = vec![0u8; send.len()];
                    let r = comm
                        .allreduce_bytes(&send, &mut recv, op, dtype)
                        .expect("allreduce");
                    (r.path, recv)
                })
                .collect::<Vec<_>>()
            },
        )
    };
    let nic = results(Mode::IncNic);
    let host = results(Mode::HostRd);
    for (rank, (n, h)) in nic.iter().zip(&host).enumerate() {
        for ((np, nb), (hp, hb)) in n.iter().zip(h) {
            assert_eq!(*np, Path::NicTree, "rank {rank}");
            assert!(matches!(hp, Path::Host(_)), "rank {rank}");
            assert_eq!(nb, hb, "rank {rank}: inc-nic and host-rd differ");
        }
    }
}

/// Every fifth result a leader sees is dropped; its repost recovers it.
fn lost_results_are_recovered(topo: &Topology, layout: Layout) {
    let reports = run_job(
        topo,
        layout,
        Mode::IncNic,
        |c| {
            c.drop_results_every = 5;
            c.branch_degree = 4;
        },
        |comm| {
            (0..40)
                .map(|case| checked_allreduce(comm, case, Op::Sum, Dtype::U32, 1000))
                .collect::<Vec<_>>()
        },
    );
    let resent: u32 = reports.iter().flatten().map(|r| r.retransmissions).sum();
    assert_all_through_nics(&reports, "dropped results");
    assert!(resent > 0, "dropping results must cause reposts");
}

/// Loss on the wire: a leaf's and an inner member's partials, and the root's results (its
/// multicasts and its answers), dropped at random on their way up to the TOR.
fn loss_on_the_wire_is_recovered(topo: &Topology, layout: Layout) {
    let wires = topo.wires.as_ref().expect("a wired fabric");
    let lossy = |host: usize, kinds: u32, drop: f64| {
        let faults = Faults {
            kinds,
            drop,
            ..Faults::default()
        };
        wires.set(Link::Host(host), Dir::Up, faults);
    };
    lossy(5, KIND_CONTRIBUTION, 0.25);
    lossy(1, KIND_CONTRIBUTION, 0.25);
    lossy(0, KIND_RESULT, 0.15);
    for degree in [2, 4, 15] {
        let reports = run_job(
            topo,
            layout,
            Mode::IncNic,
            |c| {
                c.branch_degree = degree;
                // A packet may be lost several times in a row here: allow more tries.
                c.max_tries = 16;
            },
            |comm| {
                (0..30)
                    .map(|case| checked_allreduce(comm, case, Op::Max, Dtype::I64, 300))
                    .collect::<Vec<_>>()
            },
        );
        assert_all_through_nics(&reports, &format!("loss on the wire, degree {degree}"));
        let resent: u32 = reports.iter().flatten().map(|r| r.retransmissions).sum();
        assert!(
            resent > 0,
            "degree {degree}: lost packets must cause reposts"
        );
    }
    let dropped = [5, 1, 0].map(|h| wires.stats(Link::Host(h), Dir::Up));
    for (h, s) in [5, 1, 0].iter().zip(&dropped) {
        assert!(s.dropped > 0, "host {h}: {s:?}");
    }
    assert!(
        dropped[0].contributions > 0 && dropped[2].results > 0,
        "{dropped:?}"
    );
    for h in [5, 1, 0] {
        wires.set(Link::Host(h), Dir::Up, Faults::default());
    }
}

#[test]
fn a_host_without_a_nic_daemon_makes_the_group_fall_back() {
    let topo = plain_fabric(4);
    let mut daemons = nic_daemons_on(&topo, &[]);
    // Host 2's daemon goes away: its leader reports it, and every leader runs on the hosts.
    drop(daemons.remove(2));
    let layout = Layout::new(4, 1, 1).unwrap();
    let reports = run_job(
        &topo,
        layout,
        Mode::IncNic,
        |c| c.timeout = Duration::from_secs(5),
        |comm| checked_allreduce(comm, 0, Op::Max, Dtype::I32, 10),
    );
    for (rank, r) in reports.iter().enumerate() {
        assert!(matches!(r.path, Path::Host(_)), "rank {rank}: {r:?}");
        assert_eq!(
            r.fallback,
            Some(Fallback::NoNetwork {
                fail_cause: FAIL_NO_NIC
            }),
            "rank {rank}"
        );
    }
}
