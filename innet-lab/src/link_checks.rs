//! TCP across a shaped fabric, both ways ([`check_links`]): the links' rate as a flow sees
//! it, which the benchmark commits with its runs and the tests hold to the rate.

use crate::{NetNs, shaping::tcp_rate, topology::Topology};

/// One direction of one link, measured with one TCP flow.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LinkCheck {
    /// From where to where, e.g. `host 0 -> host 7` or `TOR 0 -> SPINE 0`.
    pub path: String,
    /// What iperf3 received, bits per second.
    pub bps: f64,
}

/// TCP (iperf3, `secs` each) across the fabric both ways: from the first host to the last
/// (through the top of the fabric when they hang off different TORs), and between the
/// first TOR and the switch above it (none at one level).
#[must_use]
pub fn check_links(topo: &Topology, secs: u32) -> Vec<LinkCheck> {
    let mut checks = vec![];
    let mut pair = |(a, a_name): (&NetNs, String), (b, b_name): (&NetNs, String), ips| {
        let (a_ip, b_ip): (std::net::Ipv4Addr, std::net::Ipv4Addr) = ips;
        checks.push(LinkCheck {
            path: format!("{a_name} -> {b_name}"),
            bps: tcp_rate(a, b, b_ip, secs),
        });
        checks.push(LinkCheck {
            path: format!("{b_name} -> {a_name}"),
            bps: tcp_rate(b, a, a_ip, secs),
        });
    };
    if let (Some(first), Some(last)) = (topo.hosts.first(), topo.hosts.last()) {
        let last_name = format!("host {}", topo.hosts.len() - 1);
        pair(
            (&first.ns, "host 0".into()),
            (&last.ns, last_name),
            (first.ip, last.ip),
        );
    }
    let above = if topo.shape.levels == 3 {
        topo.aggs.first().map(|s| (s, "AGG 0"))
    } else {
        topo.spines.first().map(|s| (s, "SPINE 0"))
    };
    if let (Some(tor), Some((up, up_name))) = (topo.tors.first(), above) {
        pair(
            (&tor.ns, "TOR 0".into()),
            (&up.ns, up_name.into()),
            (tor.ip, up.ip),
        );
    }
    checks
}
