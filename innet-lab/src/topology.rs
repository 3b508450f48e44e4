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
    NetNs, PinRoot, ip, run,
    shaping::LinkRate,
    unique_id,
    wire_faults::{FaultInjector, Faults},
};

mod cabling;
mod install;

use cabling::bridge;
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
    /// The rate every link is shaped to, if any.
    pub rate: Option<LinkRate>,
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
    /// Every link shaped to this rate in both directions (`None`: as fast as the CPUs go).
    /// Shaping needs a wire on every link ([`crate::shaping`]), so it implies `wires`.
    pub link_rate: Option<LinkRate>,
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
