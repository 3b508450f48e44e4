//! Fabrics of switches in network namespaces, one to three levels deep, innet attached to
//! every switch port:
//!
//! - 1 level: a single TOR bridge host with its hosts;
//! - 2 levels: hosts under TORs, every TOR cabled to every SPINE;
//! - 3 levels (a Clos): `pods` pods, each with its TORs and its aggregation switches; every
//!   TOR cabled to every aggregation switch of its pod, every aggregation switch to every
//!   top (core) switch. The top level is `spines` at 2 and 3 levels.
//!
//! Ordinary traffic is bridged along a loop-free tree: each switch's uplink to its *first*
//! parent (SPINE 0, aggregation switch 0 of the pod, core 0) is a bridge port at both ends;
//! every other switch-to-switch link carries INC traffic only (XDP redirects). So ARP, ping
//! and MPI's TCP reach every host, while INC traffic is aggregated by XDP at every level.
//!
//! Addresses: host `h` of TOR `t` is 10.77.`t`.`h+1`, TORs 10.77.200.x, aggregation
//! switches 10.77.220.x, top switches 10.77.250.x (x = index + 1). Each [`Switch`] lists its
//! [`Port`]s up and down with the peer's address and MAC ([`Switch::port_to`]); every link
//! can run through a fault-injection wire ([`Options::wires`], [`Link`]).

use std::{
    net::{Ipv4Addr, UdpSocket},
    process::Command,
    time::Duration,
};

use innet::{
    group_maps::{ChildSpec, GroupMaps, GroupSpec, ParentSpec, Role},
    loader::{self, AttachOptions, Sizing, XdpMode},
};
use innet_common::{
    codec::{Addressing, data_header, encode},
    fault::FaultStats,
    group::DEFAULT_WINDOW,
    proto::{Dtype, Op, element_bytes},
    wire::{BTH_LEN, DETH_LEN, ETH_LEN, INC_LEN, IPV4_LEN, UDP_LEN},
};

use crate::{
    NetNs, PinRoot,
    wire_faults::{FaultInjector, Faults},
    ip, run, unique_id,
};

/// Shape of the fabric. Build it with a constructor ([`Shape::small`],
/// [`Shape::one_level`], [`Shape::two_level`], [`Shape::three_level`]) or a struct literal
/// ending in `..Shape::small()`; [`Topology`] checks it ([`Shape::check`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Switch levels: 1 (one TOR), 2 (TORs under SPINEs) or 3 (TORs under aggregation
    /// switches in pods, aggregation switches under cores).
    pub levels: usize,
    /// Pods (3 levels; 1 otherwise): the TORs are split evenly into them, in order.
    pub pods: usize,
    /// TORs in all (1 at 1 level).
    pub tors: usize,
    /// Nodes under each TOR.
    pub hosts_per_tor: usize,
    /// Ports per node: a node with one NIC per CPU socket is one namespace per socket,
    /// each plugged into the TOR (Socket mode). 1 for plain hosts.
    pub sockets: usize,
    /// Aggregation switches per pod (3 levels; 0 otherwise).
    pub aggs: usize,
    /// Top-level switches: SPINEs at 2 levels, cores at 3; 0 at 1 level.
    pub spines: usize,
    pub mode: XdpMode,
}

impl Shape {
    /// Two TORs of two single-port nodes under one SPINE, native XDP: the small fabric of
    /// the feature tests.
    #[must_use]
    pub const fn small() -> Self {
        Self::two_level(2, 2, 1)
    }

    /// One TOR with `hosts_per_tor` single-port nodes, no SPINE.
    #[must_use]
    pub const fn one_level(hosts_per_tor: usize) -> Self {
        Self {
            levels: 1,
            tors: 1,
            spines: 0,
            ..Self::two_level(1, hosts_per_tor, 0)
        }
    }

    /// `tors` TORs of `hosts_per_tor` single-port nodes, each TOR cabled to every one of
    /// `spines` SPINEs.
    #[must_use]
    pub const fn two_level(tors: usize, hosts_per_tor: usize, spines: usize) -> Self {
        Self {
            levels: 2,
            pods: 1,
            tors,
            hosts_per_tor,
            sockets: 1,
            aggs: 0,
            spines,
            mode: XdpMode::Native,
        }
    }

    /// A three-tier Clos: `pods` pods of `tors_per_pod` TORs (of `hosts_per_tor`
    /// single-port nodes each) and `aggs` aggregation switches; every TOR cabled to every
    /// aggregation switch of its pod, every aggregation switch to every one of `cores`.
    #[must_use]
    pub const fn three_level(
        pods: usize,
        tors_per_pod: usize,
        hosts_per_tor: usize,
        aggs: usize,
        cores: usize,
    ) -> Self {
        Self {
            levels: 3,
            pods,
            tors: pods * tors_per_pod,
            hosts_per_tor,
            sockets: 1,
            aggs,
            spines: cores,
            mode: XdpMode::Native,
        }
    }

    /// The same fabric with `sockets` ports per node.
    #[must_use]
    pub const fn with_sockets(self, sockets: usize) -> Self {
        Self { sockets, ..self }
    }

    /// The same fabric with the switches' programs attached in `mode`.
    #[must_use]
    pub const fn with_mode(self, mode: XdpMode) -> Self {
        Self { mode, ..self }
    }

    /// Nodes in all.
    #[must_use]
    pub const fn nodes(&self) -> usize {
        self.tors * self.hosts_per_tor
    }

    /// TORs in each pod.
    #[must_use]
    pub const fn tors_per_pod(&self) -> usize {
        self.tors / self.pods
    }

    /// The pod TOR `t` is in.
    #[must_use]
    pub const fn pod_of(&self, t: usize) -> usize {
        t / self.tors_per_pod()
    }

    /// Whether the shape can be built; the error says what is wrong.
    ///
    /// # Errors
    /// A level count other than 1–3, or counts that do not fit the levels.
    pub fn check(&self) -> Result<(), String> {
        let bad = |why: &str| Err(format!("bad fabric shape {self:?}: {why}"));
        if self.hosts_per_tor == 0 || self.sockets == 0 {
            return bad("every TOR needs hosts and every node a port");
        }
        // Host addresses are 10.77.<tor>.<port + 1>, DPUs' 10.77.<100 + tor>.<port + 1>.
        if self.hosts_per_tor * self.sockets > 250 || self.tors > 100 {
            return bad("at most 100 TORs of 250 ports each");
        }
        match self.levels {
            1 if self.tors != 1 || self.spines != 0 || self.aggs != 0 || self.pods != 1 => {
                bad("1 level is one TOR: tors 1, pods 1, aggs 0, spines 0")
            }
            // No SPINE is allowed: the older tests' one TOR as a 2-level shape.
            2 if self.tors == 0 || self.aggs != 0 || self.pods != 1 => {
                bad("2 levels need TORs, with pods 1 and aggs 0")
            }
            3 if self.pods == 0 || self.aggs == 0 || self.spines == 0 => {
                bad("3 levels need pods, aggregation switches and cores")
            }
            3 if self.tors == 0 || !self.tors.is_multiple_of(self.pods) => {
                bad("3 levels split the TORs evenly into the pods")
            }
            3 if self.pods * self.aggs > 250 => bad("at most 250 aggregation switches"),
            1..=3 if self.spines > 250 => bad("at most 250 top switches"),
            1..=3 => Ok(()),
            _ => bad("levels must be 1, 2 or 3"),
        }
    }
}

/// A host port: a namespace with one port `eth0` towards its TOR (a whole node, or one CPU
/// socket of a node with a NIC per socket).
pub struct Host {
    /// The host's emulated DPU (fabrics built with [`Options::dpus`]); it goes first.
    pub dpu: Option<Dpu>,
    // Pins drop first: a NIC daemon's links go while the interface still exists.
    /// Pin root of the host's NIC daemon (NIC-tree fabrics).
    pub pins: PinRoot,
    pub ns: NetNs,
    pub ip: Ipv4Addr,
    pub tor: usize,
    /// The node it belongs to, and its socket there.
    pub node: usize,
    pub socket: usize,
    /// The TOR port it is plugged into (ifindex inside the TOR's namespace).
    pub tor_port: u32,
}

/// An emulated BlueField-style DPU between a host and its TOR: its own namespace holding the
/// representors `pf0hpf` (the host's PF: the other end of the host's `eth0`) and `p0` (the
/// uplink, cabled to the TOR), and the eswitch between them (a bridge, `br0`, with the
/// DPU's own address). The host sees only `eth0`.
pub struct Dpu {
    // Pins drop first: a DPU daemon's links go while the representors still exist.
    pub pins: PinRoot,
    pub ns: NetNs,
    pub ip: Ipv4Addr,
}

/// The DPU's representor of the host's PF, and its uplink.
pub const DPU_HOST_PORT: &str = "pf0hpf";
pub const DPU_UPLINK: &str = "p0";

/// A switch's port towards another switch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Port {
    /// Interface name and ifindex here.
    pub name: String,
    pub ifindex: u32,
    /// MAC of the port at the other end of the cable.
    pub peer_mac: [u8; 6],
    /// Address of the switch at the other end.
    pub peer: Ipv4Addr,
    /// Whether the link is a bridge port at both ends (part of the bridged tree); the
    /// others carry INC traffic only.
    pub bridged: bool,
}

/// A bridge host acting as a switch, innet attached to every port.
pub struct Switch {
    // Pins drop first: links are detached while the interfaces still exist.
    pub pins: PinRoot,
    pub ns: NetNs,
    pub ip: Ipv4Addr,
    /// 1 for TORs, 2 for SPINEs and aggregation switches, 3 for cores.
    pub level: usize,
    /// The pod of a TOR or aggregation switch of a 3-level fabric.
    pub pod: Option<usize>,
    /// Ports towards the level above, one per parent in order: SPINE `s` (TORs, 2
    /// levels), aggregation switch `a` of the pod (TORs, 3 levels), core `c` (aggregation
    /// switches). `uplinks[0]` is the bridged one.
    pub uplinks: Vec<Port>,
    /// Ports towards the switches below, in order: TOR `t` (SPINEs), the pod's TOR `i`
    /// (aggregation switches), aggregation switch `pod × aggs + a` (cores). Empty on TORs:
    /// a host's port is [`Host::tor_port`].
    pub downlinks: Vec<Port>,
    /// Names of every port innet is attached to.
    pub ports: Vec<String>,
}

impl Switch {
    fn new(name: &str, ip: Ipv4Addr, level: usize, pod: Option<usize>) -> Self {
        let ns = NetNs::new(name);
        bridge(&ns, ip);
        Self {
            pins: PinRoot::new(),
            ns,
            ip,
            level,
            pod,
            uplinks: vec![],
            downlinks: vec![],
            ports: vec![],
        }
    }

    /// The port from here to the switch with address `peer`, up or down.
    #[must_use]
    pub fn port_to(&self, peer: Ipv4Addr) -> Option<&Port> {
        self.uplinks
            .iter()
            .chain(&self.downlinks)
            .find(|p| p.peer == peer)
    }

    /// The uplink towards the parent with address `peer`.
    #[must_use]
    pub fn uplink_to(&self, peer: Ipv4Addr) -> Option<&Port> {
        self.uplinks.iter().find(|p| p.peer == peer)
    }
}

/// A link of the fabric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Link {
    /// Host port `hosts[i]` to its TOR.
    Host(usize),
    /// A switch-to-switch link: at `level` 1 from TOR `lower` to `upper`, a SPINE (2
    /// levels) or an aggregation switch (3 levels, its index in [`Topology::aggs`]); at
    /// `level` 2 from aggregation switch `lower` to core `upper`.
    Uplink {
        level: usize,
        lower: usize,
        upper: usize,
    },
}

impl Link {
    /// The link from TOR `tor` to SPINE `spine` of a 2-level fabric (or to aggregation
    /// switch `spine` of a 3-level one).
    #[must_use]
    pub const fn tor_up(tor: usize, spine: usize) -> Self {
        Self::Uplink {
            level: 1,
            lower: tor,
            upper: spine,
        }
    }
}

/// A direction on a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dir {
    /// Towards the top: host → TOR, TOR → SPINE …
    Up,
    /// The other way.
    Down,
}

/// Every link runs through a wire namespace, where the fault injector can drop, duplicate
/// and delay INC packets in either direction.
pub struct Wires {
    // Detached before the namespace goes.
    pub injector: FaultInjector,
    pub ns: NetNs,
    /// (link, direction) → the wire port those frames enter.
    ports: std::collections::HashMap<(Link, Dir), u32>,
    next: usize,
}

/// What to build beside the bridges.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Attach innet to every switch port.
    pub innet: bool,
    /// Run every link through a wire (fault injection).
    pub wires: bool,
    /// MTU of every link (`None`: the kernel's 1500 B); any jumbo MTU (the programs declare
    /// `xdp.frags`), though INC packets carry at most 2944 B, which 3018 B already fits.
    pub mtu: Option<usize>,
    /// Slots per group on every switch (`None`: the default window).
    pub window: Option<u32>,
    /// An emulated DPU per host between it and its TOR ([`Dpu`]): the TOR link (and its
    /// wire) starts at the DPU's `p0`.
    pub dpus: bool,
}

pub struct Topology {
    pub shape: Shape,
    // Field order is teardown order: pins are detached before namespaces go.
    pub tors: Vec<Switch>,
    /// Aggregation switches of a 3-level fabric, pod by pod: aggregation switch `a` of pod
    /// `p` is `aggs[p × shape.aggs + a]` ([`Topology::agg`]). Empty otherwise.
    pub aggs: Vec<Switch>,
    /// The top level: SPINEs (2 levels) or cores (3 levels); empty at 1 level.
    pub spines: Vec<Switch>,
    pub hosts: Vec<Host>,
    pub wires: Option<Wires>,
}

fn ifindex(ns: &NetNs, dev: &str) -> u32 {
    let out = ns.ip(&["-j", "link", "show", dev]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ip -j");
    v[0]["ifindex"].as_u64().expect("ifindex") as u32
}

fn mac(ns: &NetNs, dev: &str) -> [u8; 6] {
    let out = ns.ip(&["-j", "link", "show", dev]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ip -j");
    let s = v[0]["address"].as_str().expect("address");
    let mut m = [0u8; 6];
    for (b, p) in m.iter_mut().zip(s.split(':')) {
        *b = u8::from_str_radix(p, 16).expect("hex");
    }
    m
}

fn bridge(ns: &NetNs, addr: Ipv4Addr) {
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
fn igmp_querier(ns: &NetNs) {
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

fn veth(a: &NetNs, a_dev: &str, b: &NetNs, b_dev: &str, mtu: Option<usize>) {
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
fn link(
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
fn cable(
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
    fn new() -> Self {
        let ns = NetNs::new("w");
        let injector = ns
            .run(FaultInjector::load)
            .unwrap_or_else(|e| panic!("fault injector: {e:?}"));
        Self {
            injector,
            ns,
            ports: std::collections::HashMap::new(),
            next: 0,
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
    /// Builds the fabric and attaches innet to every switch port. Panics (with the failing
    /// command) on any error; every namespace and pin is removed when the value drops.
    #[must_use]
    pub fn new(shape: Shape) -> Self {
        Self::with(
            shape,
            Options {
                innet: true,
                ..Options::default()
            },
        )
    }

    /// The same fabric of plain bridges: no switch runs innet (NIC trees run on the hosts).
    #[must_use]
    pub fn plain(shape: Shape) -> Self {
        Self::with(shape, Options::default())
    }

    /// The fabric with the given options.
    ///
    /// # Panics
    /// On a shape [`Shape::check`] refuses, naming what is wrong.
    #[must_use]
    pub fn with(shape: Shape, options: Options) -> Self {
        if let Err(e) = shape.check() {
            panic!("{e}");
        }
        let topo = Self::bridges(shape, options);
        if !options.innet {
            return topo;
        }
        let opts = AttachOptions {
            mode: shape.mode,
            sizing: Sizing {
                capacity: 64,
                window: options.window.unwrap_or(DEFAULT_WINDOW),
            },
        };
        for sw in topo.switches() {
            let ports = &sw.ports;
            sw.ns.run(|| {
                for p in ports {
                    loader::attach(&sw.pins.layout, p, opts)
                        .unwrap_or_else(|e| panic!("attach {p}: {e}"));
                }
            });
        }
        topo
    }

    #[expect(
        clippy::too_many_lines,
        reason = "the fabric reads top down: cores, pods, TORs, hosts"
    )]
    fn bridges(shape: Shape, options: Options) -> Self {
        let id = unique_id();
        let mut patch = options.wires.then(Wires::new);
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

    /// Every switch: TORs, aggregation switches, top switches.
    pub fn switches(&self) -> impl Iterator<Item = &Switch> {
        self.tors.iter().chain(&self.aggs).chain(&self.spines)
    }

    /// Aggregation switch `a` of pod `pod` (3 levels).
    #[must_use]
    pub fn agg(&self, pod: usize, a: usize) -> &Switch {
        assert!(
            a < self.shape.aggs,
            "pod {pod} has no aggregation switch {a}"
        );
        &self.aggs[pod * self.shape.aggs + a]
    }

    /// Where host `i` sends its contribution to a hand-installed group: the next host under
    /// its TOR (the TOR consumes the packet), or the TOR itself when the host is alone there.
    #[must_use]
    pub fn next_under_tor(&self, i: usize) -> Ipv4Addr {
        let tor = self.hosts[i].tor;
        let peers: Vec<usize> = self.hosts_of(tor).map(|(j, _)| j).collect();
        let pos = peers
            .iter()
            .position(|&j| j == i)
            .expect("a host of its TOR");
        if peers.len() == 1 {
            self.tors[tor].ip
        } else {
            self.hosts[peers[(pos + 1) % peers.len()]].ip
        }
    }

    /// Hosts under TOR `t`, in rank order.
    pub fn hosts_of(&self, t: usize) -> impl Iterator<Item = (usize, &Host)> {
        self.hosts
            .iter()
            .enumerate()
            .filter(move |(_, h)| h.tor == t)
    }

    /// Installs group `id` on every switch of the tree over the TORs `tors`: a single TOR
    /// is the root itself; at 2 levels the TORs sit under SPINE `spine`; at 3 levels each
    /// pod's TORs under its aggregation switch 0, rooted there when the group stays in one
    /// pod and under core `spine` otherwise ([`Topology::install_via`] picks another
    /// aggregation switch).
    pub fn install(&self, id: u32, tors: &[usize], spine: usize) {
        self.install_via(id, tors, 0, spine);
    }

    /// [`Topology::install`] through aggregation switch `agg` of every pod (3 levels).
    ///
    /// # Panics
    /// When a map refuses the group, or `tors` is empty.
    pub fn install_via(&self, id: u32, tors: &[usize], agg: usize, spine: usize) {
        assert!(!tors.is_empty(), "group {id:#x} spans no TOR");
        let mut pods: Vec<usize> = tors.iter().map(|&t| self.shape.pod_of(t)).collect();
        pods.dedup();
        let three = self.shape.levels == 3;
        // The TORs' parent index, and whether the aggregation switches have one.
        let tor_parent = (tors.len() > 1).then_some(if three { agg } else { spine });
        let agg_parent = pods.len() > 1;
        for &t in tors {
            let children = self
                .hosts_of(t)
                .map(|(rank, h)| ChildSpec {
                    ip: h.ip,
                    ifindex: h.tor_port,
                    rank: rank as u32,
                })
                .collect();
            put(&self.tors[t], id, Role::Tor, tor_parent, t, children);
        }
        if tors.len() == 1 {
            return;
        }
        // The switches one level up: (switch, its TORs in the group).
        let below = |sw: &Switch, tors: &mut dyn Iterator<Item = usize>| -> Vec<ChildSpec> {
            tors.map(|t| {
                let tor = &self.tors[t];
                ChildSpec {
                    ip: tor.ip,
                    ifindex: sw.port_to(tor.ip).expect("a link to the TOR").ifindex,
                    rank: t as u32,
                }
            })
            .collect()
        };
        if !three {
            let sp = &self.spines[spine];
            put(
                sp,
                id,
                Role::Spine,
                None,
                0,
                below(sp, &mut tors.iter().copied()),
            );
            return;
        }
        for &p in &pods {
            let sw = self.agg(p, agg);
            let mut in_pod = tors.iter().copied().filter(|&t| self.shape.pod_of(t) == p);
            let children = below(sw, &mut in_pod);
            put(
                sw,
                id,
                Role::Spine,
                agg_parent.then_some(spine),
                p,
                children,
            );
        }
        if agg_parent {
            let core = &self.spines[spine];
            let children = pods
                .iter()
                .map(|&p| {
                    let sw = self.agg(p, agg);
                    ChildSpec {
                        ip: sw.ip,
                        ifindex: core.port_to(sw.ip).expect("a link to the agg").ifindex,
                        rank: p as u32,
                    }
                })
                .collect();
            put(core, id, Role::Spine, None, 0, children);
        }
    }

    /// Removes group `id` from every switch that holds it.
    pub fn uninstall(&self, id: u32) {
        for sw in self.switches() {
            let _ = GroupMaps::open(&sw.pins.layout).expect("maps").remove(id);
        }
    }

    /// Where the nodes sit, for `innet_client::Config`: each node's TOR and NIC addresses.
    #[must_use]
    pub fn placement(&self) -> Vec<innet_client::NodePlacement> {
        let mut nodes: Vec<innet_client::NodePlacement> = vec![];
        for h in &self.hosts {
            if h.socket == 0 {
                nodes.push(innet_client::NodePlacement::new(h.tor, vec![]));
            }
            nodes[h.node].nics.push(h.ip);
        }
        nodes
    }

    /// The port (namespace) of `node`'s socket `socket`.
    #[must_use]
    pub fn host(&self, node: usize, socket: usize) -> &Host {
        &self.hosts[node * self.shape.sockets + socket]
    }

    /// One UDP socket on port 4791 per host (in the host's namespace).
    #[must_use]
    pub fn sockets(&self) -> Vec<UdpSocket> {
        self.hosts
            .iter()
            .map(|h| {
                h.ns.run(|| {
                    let s = UdpSocket::bind((h.ip, 4791)).expect("bind 4791");
                    s.set_read_timeout(Some(Duration::from_secs(2)))
                        .expect("timeout");
                    s
                })
            })
            .collect()
    }
}

/// Installs group `id` on `sw` with `role`, its parent behind uplink `parent` (`None`: the
/// root), sending up as rank `own_rank`.
fn put(
    sw: &Switch,
    id: u32,
    role: Role,
    parent: Option<usize>,
    own_rank: usize,
    children: Vec<ChildSpec>,
) {
    let parent = parent.map(|k| {
        let up = &sw.uplinks[k];
        let [_, _, a, b] = sw.ip.octets();
        ParentSpec {
            ifindex: up.ifindex,
            own_mac: [2, 0xaa, a, b, 0, k as u8],
            own_ip: sw.ip,
            mac: up.peer_mac,
            ip: up.peer,
        }
    });
    let spec = GroupSpec {
        id,
        role,
        parent,
        own_rank: own_rank as u32,
        mrr: None,
        children,
    };
    GroupMaps::open(&sw.pins.layout)
        .unwrap_or_else(|e| panic!("maps of {}: {e}", sw.ip))
        .install(&spec)
        .unwrap_or_else(|e| panic!("install {id:#x} on {}: {e}", sw.ip));
}

fn port_names(ns: &NetNs) -> Vec<String> {
    let out = ns.ip(&["-j", "link", "show", "type", "veth"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ip -j");
    v.as_array()
        .expect("array")
        .iter()
        .map(|l| l["ifname"].as_str().expect("name").to_owned())
        .collect()
}

/// The UDP payload a host sends for its contribution (BTH … ICRC); the kernel adds the rest.
#[must_use]
pub fn contribution(id: u32, rank: u32, round: u32, op: Op, dtype: Dtype, body: &[u8]) -> Vec<u8> {
    let count = (body.len() / element_bytes(op, dtype)) as u16;
    // Hosts number rounds in the PSN too (its low byte is `req_id`): switches check it.
    let addr = Addressing {
        psn: round & 0x00ff_ffff,
        ..Addressing::default()
    };
    let frame = encode(
        &addr,
        &data_header(id, rank, op, dtype, round as u8, 0, count),
        body,
    );
    frame[ETH_LEN + IPV4_LEN + UDP_LEN..].to_vec()
}

/// The data body of a received UDP payload (after BTH, DETH and INC header, before pad
/// and ICRC), given the body length expected.
#[must_use]
pub fn body_of(udp_payload: &[u8], len: usize) -> &[u8] {
    let start = BTH_LEN + DETH_LEN + INC_LEN;
    &udp_payload[start..(start + len).min(udp_payload.len())]
}

/// Runs a command inside a namespace and returns stdout (for `innet` CLI calls in tests).
#[must_use]
pub fn output(cmd: &mut Command) -> String {
    String::from_utf8(run(cmd).stdout).expect("utf-8")
}
