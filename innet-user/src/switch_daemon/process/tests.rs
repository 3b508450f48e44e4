//! The handlers driven with crafted control packets, on an in-memory group table: each
//! attack of issue 44 on the control plane, tried from a host port, and what a set-up
//! that plays by the rules still gets.

use std::{collections::HashMap, net::Ipv4Addr};

use innet_common::{
    capabilities::Capabilities,
    codec::{Addressing, encode_control, parse_unverified},
    fail::{FAIL_CAPACITY, FAIL_REFUSED},
    proto::{COMM_TYPE_ALLREDUCE, COMM_TYPE_CLIMB, PacketKind, QNH_RESPONSE},
    wire::{ControlPath, ControlPayload, PathHop},
};

use super::{Registry, Route, Seen, Table};
use crate::{
    group_maps::{ChildSpec, GroupSpec, Role},
    loader::AttachOptions,
    pins::PinLayout,
    switch_daemon::DaemonOptions,
};

/// An in-memory group table: what [`crate::group_maps::GroupMaps`] would hold.
#[derive(Default)]
struct Fake {
    /// Per wire id: the spec and its number of child entries.
    groups: HashMap<u32, (GroupSpec, usize)>,
    capacity: u32,
    /// Every `mark_setting_up`, in order.
    marked: Vec<u32>,
}

impl Fake {
    fn new(capacity: u32) -> Self {
        Self {
            capacity,
            ..Self::default()
        }
    }
}

impl Table for Fake {
    fn mark_setting_up(&mut self, wire_id: u32) {
        self.marked.push(wire_id);
    }
    fn install_expecting(
        &mut self,
        spec: &GroupSpec,
        expected: usize,
    ) -> crate::error::Result<u32> {
        if self.groups.contains_key(&spec.id) {
            return Err(crate::Error::GroupExists { id: spec.id });
        }
        if self.groups.len() as u32 >= self.capacity {
            return Err(crate::Error::CapacityFull {
                capacity: self.capacity,
            });
        }
        let entries = expected.max(spec.children.len());
        self.groups.insert(spec.id, (spec.clone(), entries));
        Ok(self.groups.len() as u32 - 1)
    }
    fn add_children(&mut self, id: u32, children: &[ChildSpec]) -> crate::error::Result<usize> {
        let (spec, entries) = self
            .groups
            .get_mut(&id)
            .ok_or(crate::Error::NoSuchGroup { id })?;
        let new: Vec<ChildSpec> = children
            .iter()
            .filter(|c| !spec.children.iter().any(|k| k.ip == c.ip))
            .copied()
            .collect();
        if spec.children.len() + new.len() > *entries {
            return Err(crate::Error::BadGroup {
                id,
                why: "no room".into(),
            });
        }
        spec.children.extend(&new);
        Ok(new.len())
    }
    fn remove(&mut self, id: u32) -> crate::error::Result<()> {
        self.groups
            .remove(&id)
            .map(|_| ())
            .ok_or(crate::Error::NoSuchGroup { id })
    }
    fn used(&self) -> u32 {
        self.groups.len() as u32
    }
    fn capacity(&self) -> u32 {
        self.capacity
    }
}

const TOR: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 1);
const TOR2: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 2);
const SPINE: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 1);
const SPINE2: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);
/// The victim job's MRR and NMRR, on host ports 1 and 2.
const MRR: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const NMRR: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
/// The attacker, on host port 3.
const EVE: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 3);
const UP: u32 = 9;
const UP2: u32 = 8;

/// The victim's group: its `true_comm_id` and wire id.
const VICTIM: u32 = 0x1100_0042;
const WIRE: u32 = 0x42;

/// A TOR with hosts on ports 1 to 3 and uplinks on 8 and 9.
fn tor() -> DaemonOptions {
    DaemonOptions {
        pins: PinLayout::new("/nonexistent/innet-process-test"),
        ifaces: ["h1", "h2", "h3", "up2", "up"].map(String::from).to_vec(),
        uplinks: ["up2", "up"].map(String::from).to_vec(),
        role: Role::Tor,
        ip: TOR,
        attach: AttachOptions::default(),
        keep_state: false,
        idle_timeout: None,
        capabilities: Capabilities::default(),
    }
}

/// A SPINE at the top with TORs on ports 1 and 2.
fn spine() -> DaemonOptions {
    DaemonOptions {
        ifaces: ["t1", "t2"].map(String::from).to_vec(),
        uplinks: vec![],
        role: Role::Spine,
        ip: SPINE,
        ..tor()
    }
}

/// One control packet through the daemon: `src` → `dst`, in on `port`.
struct Packet {
    kind: PacketKind,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    port: u32,
    from_uplink: bool,
    dst_is_local: bool,
    body: ControlPayload,
}

impl Packet {
    fn through(
        &self,
        reg: &mut Registry,
        opts: &DaemonOptions,
        table: &mut Fake,
    ) -> Option<(ControlPayload, Route)> {
        let addr = Addressing {
            src_ip: self.src,
            dst_ip: self.dst,
            ..Addressing::default()
        };
        let frame = encode_control(&addr, self.kind, 0, &self.body);
        let parsed = parse_unverified(&frame).expect("a valid control frame");
        let seen = Seen {
            parsed: &parsed,
            ingress: self.port,
            from_uplink: self.from_uplink,
            dst_is_local: self.dst_is_local,
        };
        reg.process(opts, table, &seen)
    }
}

/// A packet `src` → `dst` in on `port` of a switch (from a switch above: `from_uplink`).
fn pkt(
    kind: PacketKind,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    port: u32,
    from_uplink: bool,
    body: ControlPayload,
) -> Packet {
    Packet {
        kind,
        src,
        dst,
        port,
        from_uplink,
        dst_is_local: true,
        body,
    }
}

/// A switch of a test fabric: its options, its daemon's registry, its group table.
struct Switch {
    opts: DaemonOptions,
    reg: Registry,
    table: Fake,
}

impl Switch {
    fn new(opts: DaemonOptions) -> Self {
        Self {
            opts,
            reg: Registry::default(),
            table: Fake::new(64),
        }
    }
}

/// TOR (the MRR on its port 1) and TOR2 (the NMRR on its port 1) under SPINE, the top (TOR
/// on its port 1, TOR2 on 2; each TOR's uplink on its port 9).
fn two_levels() -> [Switch; 3] {
    [tor(), spine(), DaemonOptions { ip: TOR2, ..tor() }].map(Switch::new)
}

impl Packet {
    /// This packet through `sw`'s daemon.
    fn at(&self, sw: &mut Switch) -> Option<(ControlPayload, Route)> {
        self.through(&mut sw.reg, &sw.opts, &mut sw.table)
    }
}

fn query(comm: u32) -> ControlPayload {
    let mut q = ControlPayload {
        sup_comm_type: COMM_TYPE_ALLREDUCE,
        ..ControlPayload::default()
    };
    q.set_true_comm_id(comm);
    q
}

fn climb(comm: u32) -> ControlPayload {
    ControlPayload {
        sup_comm_type: COMM_TYPE_CLIMB,
        ..query(comm)
    }
}

/// A notify (or kill) body along `hops` (ip, parent, children), turning at `turn`.
fn along(comm: u32, hops: &[(Ipv4Addr, Ipv4Addr, u8)], turn: u8) -> ControlPayload {
    let mut path = ControlPath {
        turn,
        ..ControlPath::default()
    };
    for &(ip, parent, children) in hops {
        assert!(path.push(PathHop::in_tree(u32::from(ip), u32::from(parent), children)));
    }
    ControlPayload {
        query_notify_hop: QNH_RESPONSE,
        path,
        ..query(comm)
    }
}

fn from_host(
    kind: PacketKind,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    port: u32,
    body: ControlPayload,
) -> Packet {
    pkt(kind, src, dst, port, false, body)
}

const NONE: Ipv4Addr = Ipv4Addr::UNSPECIFIED;

/// The victim's set-up on one TOR: the MRR climbs, the NMRR queries, the MRR notifies.
fn victim_setup(reg: &mut Registry, opts: &DaemonOptions, table: &mut Fake) -> ControlPayload {
    let mut packets = vec![
        from_host(PacketKind::Query, MRR, NMRR, 1, climb(VICTIM)),
        from_host(PacketKind::Query, NMRR, MRR, 2, query(VICTIM)),
    ];
    for p in packets.drain(..) {
        p.through(reg, opts, table);
    }
    let notify = from_host(
        PacketKind::Notify,
        MRR,
        NMRR,
        1,
        along(VICTIM, &[(TOR, NONE, 2)], 0),
    );
    let (n, _) = notify
        .through(reg, opts, table)
        .expect("the notify goes on");
    assert_eq!(n.fail_cause, 0, "the victim's group installs");
    assert!(table.groups.contains_key(&WIRE));
    n
}

mod attacks;
mod floods;
mod lifecycle;
