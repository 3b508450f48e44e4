//! Building a fabric: namespaces, bridges and veths, cables between switches (through
//! fault-injection wires when asked), and the whole topology at 1, 2 or 3 levels.

use super::install::port_names;
use super::{
    DPU_HOST_PORT, DPU_UPLINK, Dir, Dpu, FaultInjector, FaultStats, Faults, Host, Ipv4Addr, Link,
    LinkRate, NetNs, Options, PinRoot, Port, Shape, Switch, Topology, Wires, ip, run, unique_id,
};
use crate::shaping;

pub(super) fn ifindex(ns: &NetNs, dev: &str) -> u32 {
    let out = ns.ip(&["-j", "link", "show", dev]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ip -j");
    v[0]["ifindex"].as_u64().expect("ifindex") as u32
}

pub(super) fn mac(ns: &NetNs, dev: &str) -> [u8; 6] {
    let out = ns.ip(&["-j", "link", "show", dev]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ip -j");
    let s = v[0]["address"].as_str().expect("address");
    let mut m = [0u8; 6];
    for (b, p) in m.iter_mut().zip(s.split(':')) {
        *b = u8::from_str_radix(p, 16).expect("hex");
    }
    m
}

pub(super) fn bridge(ns: &NetNs, addr: Ipv4Addr) {
    ns.ip(&["link", "add", "br0", "type", "bridge"]);
    ns.ip(&["addr", "add", &format!("{addr}/16"), "dev", "br0"]);
    ns.ip(&["link", "set", "br0", "up"]);
}

/// Makes `ns`'s bridge the fabric's IGMP querier, as a data centre's snooping switches have
/// one: every bridge snoops (the kernel's default), and a snooping bridge forwards a
/// group's traffic only to member ports and its router ports once it knows a querier;
/// without one it floods. The querier's queries make each bridge's port towards it a
/// router port, so members' reports climb to the top and traffic from any port reaches
/// every member. Queries come from the bridge's address (a querier from 0.0.0.0 does not
/// count) and ask for answers within 1 s: bridges filter only that long after the first
/// query (the kernel's default, 10 s, would flood a fresh fabric's first jobs).
pub(super) fn igmp_querier(ns: &NetNs) {
    ns.ip(&[
        "link",
        "set",
        "br0",
        "type",
        "bridge",
        "mcast_query_use_ifaddr",
        "1",
        "mcast_query_response_interval",
        "100",
    ]);
    ns.ip(&["link", "set", "br0", "type", "bridge", "mcast_querier", "1"]);
}

pub(super) fn veth(a: &NetNs, a_dev: &str, b: &NetNs, b_dev: &str, mtu: Option<usize>) {
    ip(&[
        "link", "add", a_dev, "netns", &a.name, "type", "veth", "peer", "name", b_dev, "netns",
        &b.name,
    ]);
    if let Some(mtu) = mtu {
        for (ns, dev) in [(a, a_dev), (b, b_dev)] {
            ns.ip(&["link", "set", dev, "mtu", &mtu.to_string()]);
        }
    }
    // Native XDP_REDIRECT/TX into a veth needs NAPI on the receiving side.
    for (ns, dev) in [(a, a_dev), (b, b_dev)] {
        run(ns
            .command("ethtool")
            .args(["-K", dev, "gro", "on", "tx", "off"]));
    }
}

/// Connects `a_dev` (the lower end: host or switch) to `b_dev`: directly, or through a wire.
pub(super) fn link(
    wires: Option<&mut Wires>,
    id: Link,
    (a, a_dev): (&NetNs, &str),
    (b, b_dev): (&NetNs, &str),
    mtu: Option<usize>,
) {
    let Some(w) = wires else {
        veth(a, a_dev, b, b_dev, mtu);
        return;
    };
    let (up, down) = (format!("w{}a", w.next), format!("w{}b", w.next));
    w.next += 1;
    veth(a, a_dev, &w.ns, &up, mtu);
    veth(&w.ns, &down, b, b_dev, mtu);
    for dev in [&up, &down] {
        w.ns.ip(&["link", "set", dev, "up"]);
        // Each direction leaves the wire through one of its veths.
        if let Some(rate) = w.rate {
            shaping::shape(&w.ns, dev, rate, mtu.unwrap_or(1500));
        }
    }
    let injector = &mut w.injector;
    let (iu, id_) =
        w.ns.run(|| injector.wire(&up, &down))
            .unwrap_or_else(|e| panic!("wire {up} {down}: {e}"));
    w.ports.insert((id, Dir::Up), iu);
    w.ports.insert((id, Dir::Down), id_);
}

/// Cables switch `lower` to its next parent `upper` (through a wire when there are wires):
/// `u<k>` on the lower end, `d<k>` on the upper; the first parent's link joins the bridged
/// tree.
pub(super) fn cable(
    patch: Option<&mut Wires>,
    id: &str,
    mtu: Option<usize>,
    l: Link,
    lower: &mut Switch,
    upper: &mut Switch,
) {
    let up = format!("u{}x{id}", lower.uplinks.len());
    let down = format!("d{}x{id}", upper.downlinks.len());
    link(patch, l, (&lower.ns, &up), (&upper.ns, &down), mtu);
    let bridged = lower.uplinks.is_empty();
    for (ns, dev) in [(&lower.ns, &up), (&upper.ns, &down)] {
        ns.ip(&["link", "set", dev, "up"]);
        if bridged {
            ns.ip(&["link", "set", dev, "master", "br0"]);
        }
    }
    let (up_mac, down_mac) = (mac(&lower.ns, &up), mac(&upper.ns, &down));
    lower.uplinks.push(Port {
        ifindex: ifindex(&lower.ns, &up),
        peer_mac: down_mac,
        peer: upper.ip,
        bridged,
        name: up,
    });
    upper.downlinks.push(Port {
        ifindex: ifindex(&upper.ns, &down),
        peer_mac: up_mac,
        peer: lower.ip,
        bridged,
        name: down,
    });
}

impl Wires {
    fn new(rate: Option<LinkRate>) -> Self {
        let ns = NetNs::new("w");
        let injector = ns
            .run(FaultInjector::load)
            .unwrap_or_else(|e| panic!("fault injector: {e:?}"));
        Self {
            injector,
            ns,
            ports: std::collections::HashMap::new(),
            next: 0,
            rate,
        }
    }

    /// The wire port the frames of `link` going `dir` enter.
    fn port(&self, link: Link, dir: Dir) -> u32 {
        *self
            .ports
            .get(&(link, dir))
            .unwrap_or_else(|| panic!("no wire on {link:?}"))
    }

    /// Sets what happens to the INC packets of `link` going `dir`.
    pub fn set(&self, link: Link, dir: Dir, faults: Faults) {
        let port = self.port(link, dir);
        self.injector
            .set(port, faults)
            .unwrap_or_else(|e| panic!("faults on {link:?} {dir:?}: {e}"));
    }

    /// What the wire did to `link`'s frames going `dir`.
    #[must_use]
    pub fn stats(&self, link: Link, dir: Dir) -> FaultStats {
        self.injector
            .stats(self.port(link, dir))
            .unwrap_or_else(|e| panic!("fault stats: {e}"))
    }

    /// Every wired link.
    pub fn links(&self) -> impl Iterator<Item = Link> + '_ {
        self.ports
            .keys()
            .filter(|(_, d)| *d == Dir::Up)
            .map(|(l, _)| *l)
    }
}

impl Topology {
    #[expect(
        clippy::too_many_lines,
        reason = "the fabric reads top down: cores, pods, TORs, hosts"
    )]
    pub(super) fn bridges(shape: Shape, options: Options) -> Self {
        let id = unique_id();
        let wired = options.wires || options.link_rate.is_some();
        let mut patch = wired.then(|| Wires::new(options.link_rate));
        let mtu = options.mtu;
        let mut spines: Vec<Switch> = (0..shape.spines)
            .map(|s| {
                let name = if shape.levels == 3 { "c" } else { "sp" };
                let ip = Ipv4Addr::new(10, 77, 250, s as u8 + 1);
                Switch::new(&format!("{name}{s}"), ip, shape.levels, None)
            })
            .collect();
        let mut aggs: Vec<Switch> = vec![];
        if shape.levels == 3 {
            for p in 0..shape.pods {
                for a in 0..shape.aggs {
                    let g = aggs.len();
                    let ip = Ipv4Addr::new(10, 77, 220, g as u8 + 1);
                    let mut agg = Switch::new(&format!("a{p}-{a}"), ip, 2, Some(p));
                    for (c, core) in spines.iter_mut().enumerate() {
                        let l = Link::Uplink {
                            level: 2,
                            lower: g,
                            upper: c,
                        };
                        cable(patch.as_mut(), &id, mtu, l, &mut agg, core);
                    }
                    aggs.push(agg);
                }
            }
        }
        let mut tors = vec![];
        let mut hosts = vec![];
        for t in 0..shape.tors {
            let ip = Ipv4Addr::new(10, 77, 200, t as u8 + 1);
            let pod = (shape.levels == 3).then(|| shape.pod_of(t));
            let mut tor = Switch::new(&format!("t{t}"), ip, 1, pod);
            let parents = match pod {
                Some(p) => &mut aggs[p * shape.aggs..(p + 1) * shape.aggs],
                None => &mut spines[..],
            };
            let first = pod.map_or(0, |p| p * shape.aggs);
            for (k, parent) in parents.iter_mut().enumerate() {
                let l = Link::tor_up(t, first + k);
                cable(patch.as_mut(), &id, mtu, l, &mut tor, parent);
            }
            for h in 0..shape.hosts_per_tor * shape.sockets {
                let host_ns = NetNs::new(&format!("h{t}-{h}"));
                let port = format!("p{h}x{id}");
                let dpu = options.dpus.then(|| {
                    let ns = NetNs::new(&format!("dpu{t}-{h}"));
                    let ip = Ipv4Addr::new(10, 77, 100 + t as u8, h as u8 + 1);
                    bridge(&ns, ip);
                    veth(&host_ns, "eth0", &ns, DPU_HOST_PORT, options.mtu);
                    Dpu {
                        pins: PinRoot::new(),
                        ns,
                        ip,
                    }
                });
                // The cable to the TOR starts at the DPU's uplink, or at the host.
                let (lower, lower_dev) = match &dpu {
                    Some(d) => (&d.ns, DPU_UPLINK),
                    None => (&host_ns, "eth0"),
                };
                link(
                    patch.as_mut(),
                    Link::Host(hosts.len()),
                    (lower, lower_dev),
                    (&tor.ns, &port),
                    options.mtu,
                );
                if let Some(d) = &dpu {
                    for rep in [DPU_HOST_PORT, DPU_UPLINK] {
                        d.ns.ip(&["link", "set", rep, "master", "br0"]);
                        d.ns.ip(&["link", "set", rep, "up"]);
                    }
                }
                // The host's own port sends at the link's rate, as its NIC would.
                if let Some(rate) = patch.as_ref().and_then(|w| w.rate) {
                    shaping::pace_sender(&host_ns, "eth0", rate, options.mtu.unwrap_or(1500));
                }
                let host_ip = Ipv4Addr::new(10, 77, t as u8, h as u8 + 1);
                host_ns.ip(&["addr", "add", &format!("{host_ip}/16"), "dev", "eth0"]);
                host_ns.ip(&["link", "set", "eth0", "up"]);
                tor.ns.ip(&["link", "set", &port, "master", "br0"]);
                tor.ns.ip(&["link", "set", &port, "up"]);
                hosts.push(Host {
                    dpu,
                    pins: PinRoot::new(),
                    tor_port: ifindex(&tor.ns, &port),
                    ns: host_ns,
                    ip: host_ip,
                    tor: t,
                    node: t * shape.hosts_per_tor + h / shape.sockets,
                    socket: h % shape.sockets,
                });
            }
            tors.push(tor);
        }
        for sw in tors.iter_mut().chain(&mut aggs).chain(&mut spines) {
            sw.ports = port_names(&sw.ns);
        }
        // The top of the bridged tree queries; each TOR when there is no top.
        let top = if spines.is_empty() {
            &tors[..]
        } else {
            &spines[..1]
        };
        for sw in top {
            igmp_querier(&sw.ns);
        }
        Self {
            shape,
            tors,
            aggs,
            spines,
            hosts,
            wires: patch,
        }
    }
}
