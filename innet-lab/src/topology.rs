//! A two-level fabric in network namespaces: hosts under TOR bridge hosts, TORs under
//! SPINE bridge hosts, innet attached to every switch port. Ordinary traffic is bridged
//! (hosts → TOR bridge → uplink to SPINE 0 → other TORs); INC traffic is aggregated by XDP.
//!
//! Only each TOR's uplink to SPINE 0 is a bridge port: uplinks to further SPINEs carry INC
//! traffic only (XDP redirects), so the bridged fabric has no loop.

use std::{
    net::{Ipv4Addr, UdpSocket},
    process::Command,
    time::Duration,
};

use innet::{
    fault::{FaultInjector, Faults},
    group::{ChildSpec, GroupMaps, GroupSpec, ParentSpec, Role},
    loader::{self, AttachOptions, Mode, Sizing},
};
use innet_common::{
    codec::{Addressing, data_header, encode},
    fault::FaultStats,
    group::DEFAULT_WINDOW,
    proto::{Dtype, Op, element_bytes},
    wire::{BTH_LEN, DETH_LEN, ETH_LEN, INC_LEN, IPV4_LEN, UDP_LEN},
};

use crate::{NetNs, PinRoot, ip, run, unique_id};

/// Shape of the fabric.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub tors: usize,
    /// Nodes under each TOR.
    pub hosts_per_tor: usize,
    /// Ports per node: a node with one NIC per CPU socket is one namespace per socket,
    /// each plugged into the TOR (Socket mode). 1 for plain hosts.
    pub sockets: usize,
    pub spines: usize,
    pub mode: Mode,
}

impl Shape {
    /// Two TORs of two single-port nodes under one SPINE, native XDP: the small fabric of
    /// the feature tests.
    #[must_use]
    pub const fn small() -> Self {
        Self {
            tors: 2,
            hosts_per_tor: 2,
            sockets: 1,
            spines: 1,
            mode: Mode::Native,
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

/// A bridge host acting as a switch, innet attached to every port.
pub struct Switch {
    // Pins drop first: links are detached while the interfaces still exist.
    pub pins: PinRoot,
    pub ns: NetNs,
    pub ip: Ipv4Addr,
    /// `uplinks[s]`: (ifindex here, MAC of the SPINE-side port) towards SPINE `s` (TORs).
    pub uplinks: Vec<(u32, [u8; 6])>,
    /// `downlinks[t]`: ifindex here of the port to TOR `t` (SPINEs).
    pub downlinks: Vec<u32>,
    /// Names of every port innet is attached to.
    pub ports: Vec<String>,
}

impl Switch {
    fn new(ns: NetNs, ip: Ipv4Addr) -> Self {
        Self {
            pins: PinRoot::new(),
            ns,
            ip,
            uplinks: vec![],
            downlinks: vec![],
            ports: vec![],
        }
    }
}

/// A link of the fabric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Link {
    /// Host port `hosts[i]` to its TOR.
    Host(usize),
    /// TOR `tor` to SPINE `spine`.
    Uplink { tor: usize, spine: usize },
}

/// A direction on a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dir {
    /// Host → TOR, TOR → SPINE.
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

/// Connects `a_dev` (the lower end: host or TOR) to `b_dev`: directly, or through a wire.
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
    #[must_use]
    pub fn with(shape: Shape, options: Options) -> Self {
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
        for sw in topo.tors.iter().chain(&topo.spines) {
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

    fn bridges(shape: Shape, options: Options) -> Self {
        let id = unique_id();
        let mut patch = options.wires.then(Wires::new);
        let mut spines: Vec<Switch> = (0..shape.spines)
            .map(|s| {
                let ns = NetNs::new(&format!("sp{s}"));
                let ip = Ipv4Addr::new(10, 77, 250, s as u8 + 1);
                bridge(&ns, ip);
                Switch::new(ns, ip)
            })
            .collect();
        let mut tors = vec![];
        let mut hosts = vec![];
        for t in 0..shape.tors {
            let ns = NetNs::new(&format!("t{t}"));
            let ip = Ipv4Addr::new(10, 77, 200, t as u8 + 1);
            bridge(&ns, ip);
            let mut tor = Switch::new(ns, ip);
            for (s, spine) in spines.iter().enumerate() {
                let (up, down) = (format!("u{s}x{id}"), format!("d{t}x{id}"));
                link(
                    patch.as_mut(),
                    Link::Uplink { tor: t, spine: s },
                    (&tor.ns, &up),
                    (&spine.ns, &down),
                    options.mtu,
                );
                tor.ns.ip(&["link", "set", &up, "up"]);
                spine.ns.ip(&["link", "set", &down, "up"]);
                if s == 0 {
                    tor.ns.ip(&["link", "set", &up, "master", "br0"]);
                    spine.ns.ip(&["link", "set", &down, "master", "br0"]);
                }
                tor.uplinks
                    .push((ifindex(&tor.ns, &up), mac(&spine.ns, &down)));
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
        for spine in &mut spines {
            spine.downlinks = (0..shape.tors)
                .map(|t| ifindex(&spine.ns, &format!("d{t}x{id}")))
                .collect();
        }
        for sw in tors.iter_mut().chain(&mut spines) {
            sw.ports = port_names(&sw.ns);
        }
        Self {
            shape,
            tors,
            spines,
            hosts,
            wires: patch,
        }
    }

    /// Hosts under TOR `t`, in rank order.
    pub fn hosts_of(&self, t: usize) -> impl Iterator<Item = (usize, &Host)> {
        self.hosts
            .iter()
            .enumerate()
            .filter(move |(_, h)| h.tor == t)
    }

    /// Installs group `id` on every switch of the tree: the TORs of `tors` under SPINE
    /// `spine` (a single TOR is the root itself and needs no SPINE).
    pub fn install(&self, id: u32, tors: &[usize], spine: usize) {
        let root_tor = tors.len() == 1;
        for &t in tors {
            let tor = &self.tors[t];
            let children = self
                .hosts_of(t)
                .map(|(rank, h)| ChildSpec {
                    ip: h.ip,
                    ifindex: h.tor_port,
                    rank: rank as u32,
                })
                .collect();
            let parent = (!root_tor).then(|| ParentSpec {
                ifindex: tor.uplinks[spine].0,
                own_mac: [2, 0, 0, 0xaa, t as u8, spine as u8],
                own_ip: tor.ip,
                mac: tor.uplinks[spine].1,
                ip: self.spines[spine].ip,
            });
            let spec = GroupSpec {
                id,
                role: Role::Tor,
                parent,
                own_rank: t as u32,
                mrr: None,
                children,
            };
            GroupMaps::open(&tor.pins.layout)
                .expect("TOR maps")
                .install(&spec)
                .expect("install on TOR");
        }
        if !root_tor {
            let sp = &self.spines[spine];
            let children = tors
                .iter()
                .map(|&t| ChildSpec {
                    ip: self.tors[t].ip,
                    ifindex: sp.downlinks[t],
                    rank: t as u32,
                })
                .collect();
            let spec = GroupSpec {
                id,
                role: Role::Spine,
                parent: None,
                own_rank: 0,
                mrr: None,
                children,
            };
            GroupMaps::open(&sp.pins.layout)
                .expect("SPINE maps")
                .install(&spec)
                .expect("install on SPINE");
        }
    }

    /// Removes group `id` from every switch that holds it.
    pub fn uninstall(&self, id: u32) {
        for sw in self.tors.iter().chain(&self.spines) {
            let _ = GroupMaps::open(&sw.pins.layout).expect("maps").remove(id);
        }
    }

    /// Where the nodes sit, for `innet_client::Config`: each node's TOR and NIC addresses.
    #[must_use]
    pub fn placement(&self) -> Vec<innet_client::NodePlacement> {
        let mut nodes: Vec<innet_client::NodePlacement> = vec![];
        for h in &self.hosts {
            if h.socket == 0 {
                nodes.push(innet_client::NodePlacement {
                    tor: h.tor,
                    nics: vec![],
                });
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
pub fn contribution(id: u32, rank: u32, round: u8, op: Op, dtype: Dtype, body: &[u8]) -> Vec<u8> {
    let count = (body.len() / element_bytes(op, dtype)) as u16;
    let frame = encode(
        &Addressing::default(),
        &data_header(id, rank, op, dtype, round, 0, count),
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
