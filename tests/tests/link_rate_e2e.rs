//! A fabric whose links bind (`Options::link_rate`): every link shaped to one rate in both
//! directions, whatever sends the frame. Two TORs of two hosts under a SPINE, innet on
//! every switch port, every link at 100 Mbit/s:
//! - TCP (iperf3, `link_checks::check_links`, as the benchmark checks its fabrics) from a host
//!   to a host under the other TOR, both ways, crossing four links each way, gets the rate
//!   and no more; so does TCP between a TOR and the SPINE, both ways, on the link between
//!   them;
//! - innet's own traffic through the switches (4 ranks in `inc-node`, 2 MiB float64 SUM,
//!   every result checked) takes at least the time its bytes need on a host's link.

use std::time::Instant;

use innet_client::{Dtype, Layout, Mode, Op};
use innet_lab::{
    daemons::{daemons_on, learn_hosts},
    job::{checked_allreduce, run_job},
    link_checks::check_links,
    shaping::LinkRate,
    topology::{Options, Shape, Topology},
};

const RATE: LinkRate = LinkRate(100_000_000);

fn fabric() -> Topology {
    let topo = Topology::with(
        Shape::small(),
        Options {
            innet: true,
            link_rate: Some(RATE),
            ..Options::default()
        },
    );
    learn_hosts(&topo);
    topo
}

/// A TCP flow's rate against the links': within a few percent below it (TCP's headers and
/// its ramp), never above.
fn assert_binds(what: &str, bits_per_second: f64) {
    let share = bits_per_second / RATE.0 as f64;
    eprintln!(
        "{what}: {:.1} Mbit/s ({share:.3} of the links' rate)",
        bits_per_second / 1e6
    );
    assert!(
        (0.85..=1.02).contains(&share),
        "{what}: {:.1} Mbit/s on links of {RATE}",
        bits_per_second / 1e6
    );
}

#[test]
fn every_link_binds_at_its_rate_both_ways_for_tcp_and_innet() {
    let topo = fabric();
    // Host 0 (TOR 0) and host 3 (TOR 1): host link, TOR up, SPINE down, host link; and
    // the TOR-SPINE link alone, between the switches' own addresses; both ways each.
    let checks = check_links(&topo, 3);
    let paths: Vec<&str> = checks.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "host 0 -> host 3",
            "host 3 -> host 0",
            "TOR 0 -> SPINE 0",
            "SPINE 0 -> TOR 0"
        ]
    );
    for c in &checks {
        assert_binds(&c.path, c.bps);
    }

    // innet's own traffic: each leader sends its 2 MiB once and receives the result once on
    // its host link, so no call can be faster than 2 MiB at the rate.
    let _daemons = daemons_on(&topo, &[]);
    let count = (2 << 20) / 8;
    let took = run_job(
        &topo,
        Layout::new(4, 1, 1).expect("layout"),
        Mode::IncNode,
        |_| {},
        |comm| {
            checked_allreduce(comm, 0, Op::Sum, Dtype::F64, count);
            let start = Instant::now();
            for case in 1..=3 {
                let r = checked_allreduce(comm, case, Op::Sum, Dtype::F64, count);
                assert!(r.fallback.is_none(), "{r:?}");
            }
            start.elapsed() / 3
        },
    );
    let floor = RATE.time_for(2 << 20);
    for (rank, t) in took.iter().enumerate() {
        eprintln!("rank {rank}: {t:?} a call (the link's floor {floor:?})");
        assert!(
            *t >= floor.mul_f64(0.98),
            "rank {rank}: {t:?} beat the link ({floor:?})"
        );
    }
}
