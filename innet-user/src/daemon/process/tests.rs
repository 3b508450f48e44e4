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
    daemon::DaemonOptions,
    group::{ChildSpec, GroupSpec, Role},
    loader::AttachOptions,
    pins::PinLayout,
};

/// An in-memory group table: what [`crate::group::GroupMaps`] would hold.
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
    Packet {
        kind,
        src,
        dst,
        port,
        from_uplink: false,
        dst_is_local: true,
        body,
    }
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

/// Issue 44 item 3: a query under another high byte of the victim's wire id, then a notify
/// with a crafted path, made the attacker one of the group's MRRs (`extend` pushed it before
/// `add_children` failed), and its kill was then accepted.
#[test]
fn an_attacker_cannot_become_a_groups_mrr_and_kill_it() {
    let (opts, mut reg, mut table) = (tor(), Registry::default(), Fake::new(64));
    victim_setup(&mut reg, &opts, &mut table);
    for high in [0x22, 0x11] {
        let comm = high << 24 | WIRE;
        from_host(PacketKind::Query, EVE, EVE, 3, query(comm)).through(&mut reg, &opts, &mut table);
        // Eve's notify names as many members as the TOR saw queries.
        from_host(
            PacketKind::Notify,
            EVE,
            EVE,
            3,
            along(comm, &[(TOR, NONE, 3)], 0),
        )
        .through(&mut reg, &opts, &mut table);
        from_host(
            PacketKind::Kill,
            EVE,
            EVE,
            3,
            along(comm, &[(TOR, NONE, 1)], 0),
        )
        .through(&mut reg, &opts, &mut table);
        assert!(
            table.groups.contains_key(&WIRE),
            "high byte {high:#x}: the attacker's kill freed the victim's group"
        );
        let members: Vec<Ipv4Addr> = table.groups[&WIRE]
            .0
            .children
            .iter()
            .map(|c| c.ip)
            .collect();
        assert!(
            !members.contains(&EVE),
            "the attacker became a member: {members:?}"
        );
    }
    assert!(!reg.installed[&WIRE].mrrs.iter().any(|(ip, _)| *ip == EVE));
    assert!(reg.stats.refused_comm_clash > 0, "{:?}", reg.stats);
    // Eve, had she been one of the group's MRRs (Socket mode), still adds no branch from a
    // port that is none of the group's.
    reg.setups.get_mut(&WIRE).expect("set-up").mrrs.push(EVE);
    let (n, _) = from_host(
        PacketKind::Notify,
        EVE,
        EVE,
        3,
        along(VICTIM, &[(TOR, NONE, 3)], 0),
    )
    .through(&mut reg, &opts, &mut table)
    .expect("on");
    assert_eq!(n.fail_cause, FAIL_REFUSED);
    assert_eq!(reg.stats.refused_not_group_port, 1, "{:?}", reg.stats);
    assert!(!reg.installed[&WIRE].mrrs.iter().any(|(ip, _)| *ip == EVE));
    // The victim's own kill still frees it.
    from_host(
        PacketKind::Kill,
        MRR,
        NMRR,
        1,
        along(VICTIM, &[(TOR, NONE, 2)], 0),
    )
    .through(&mut reg, &opts, &mut table);
    assert!(!table.groups.contains_key(&WIRE));
}

/// The join-before-notify attack: Eve knows the victim's wire id (and its whole
/// `true_comm_id`) before the job sets its group up, and queries under it first. Without
/// the job's set-up key she is left out of the group the notify installs, and counted.
#[test]
fn a_query_without_the_set_up_key_makes_no_member() {
    const KEY: u64 = 0x005e_c2e7;
    let (opts, mut reg, mut table) = (tor(), Registry::default(), Fake::new(64));
    let keyed = |mut c: ControlPayload, key: u64| {
        c.set_job_id(key);
        c
    };
    from_host(
        PacketKind::Query,
        EVE,
        MRR,
        3,
        keyed(query(VICTIM), KEY ^ 1),
    )
    .through(&mut reg, &opts, &mut table)
    .expect("a query of its own is passed on: the key is judged at the notify");
    from_host(PacketKind::Query, MRR, NMRR, 1, keyed(climb(VICTIM), KEY))
        .through(&mut reg, &opts, &mut table);
    from_host(PacketKind::Query, NMRR, MRR, 2, keyed(query(VICTIM), KEY))
        .through(&mut reg, &opts, &mut table);
    let (n, _) = from_host(
        PacketKind::Notify,
        MRR,
        NMRR,
        1,
        keyed(along(VICTIM, &[(TOR, NONE, 2)], 0), KEY),
    )
    .through(&mut reg, &opts, &mut table)
    .expect("the notify goes on");
    assert_eq!(n.fail_cause, 0, "the job's group installs");
    let mut members: Vec<Ipv4Addr> = table.groups[&WIRE]
        .0
        .children
        .iter()
        .map(|c| c.ip)
        .collect();
    members.sort();
    assert_eq!(members, vec![MRR, NMRR], "only the keyed members");
    assert_eq!(reg.stats.refused_wrong_key, 1, "{:?}", reg.stats);
}

/// One port cannot fill a set-up's members with spoofed addresses before the job's own
/// queries come: past its share they are refused, and the job's members still fit.
#[test]
fn one_port_holds_at_most_its_share_of_a_set_ups_members() {
    let (opts, mut reg, mut table) = (tor(), Registry::default(), Fake::new(64));
    let share = super::MAX_PENDING_PER_PORT;
    for i in 0..2 * share as u8 {
        let mut q = query(VICTIM);
        q.set_job_id(7);
        from_host(PacketKind::Query, Ipv4Addr::new(10, 0, 3, i + 1), MRR, 3, q)
            .through(&mut reg, &opts, &mut table);
    }
    assert_eq!(
        reg.stats.refused_extra_members, share as u64,
        "{:?}",
        reg.stats
    );
    victim_setup(&mut reg, &opts, &mut table);
    let members = &table.groups[&WIRE].0.children;
    assert_eq!(members.len(), 2, "the job's two members: {members:?}");
    assert_eq!(reg.stats.refused_wrong_key, share as u64, "{:?}", reg.stats);
}

/// Issue 44 item 6: `SETTING_UP` was marked before any check, so a refused packet silenced
/// the group's lost notices for 2 s.
#[test]
fn refused_packets_do_not_mark_a_group_setting_up() {
    let (opts, mut reg, mut table) = (tor(), Registry::default(), Fake::new(64));
    // A notify from a host no query went to.
    from_host(
        PacketKind::Notify,
        EVE,
        NMRR,
        3,
        along(VICTIM, &[(TOR, NONE, 2)], 0),
    )
    .through(&mut reg, &opts, &mut table);
    // A query from an address bound to another port.
    from_host(PacketKind::Query, NMRR, MRR, 2, query(0x0100_0001))
        .through(&mut reg, &opts, &mut table);
    table.marked.clear();
    from_host(PacketKind::Query, NMRR, MRR, 3, query(VICTIM)).through(&mut reg, &opts, &mut table);
    from_host(PacketKind::Query, EVE, MRR, 3, climb(VICTIM | 0x77))
        .through(&mut reg, &opts, &mut table);
    let mut prefilled = climb(0x0500_0005);
    prefilled.path.push(PathHop::seen(u32::from(SPINE), 1, 0));
    from_host(PacketKind::Query, EVE, MRR, 3, prefilled).through(&mut reg, &opts, &mut table);
    assert_eq!(
        table.marked,
        vec![VICTIM & 0xff_ffff | 0x77],
        "only the accepted climb"
    );
    // An accepted set-up marks its group.
    table.marked.clear();
    victim_setup(&mut Registry::default(), &opts, &mut table);
    assert!(table.marked.contains(&WIRE));
}

/// Issue 44 item 6: one host's queries flushed the 4096-entry `queried` list for everybody;
/// now a port that floods forgets its own set-ups only.
#[test]
fn a_query_flood_from_one_port_forgets_only_its_own_set_ups() {
    let (opts, mut reg, mut table) = (tor(), Registry::default(), Fake::new(64));
    from_host(PacketKind::Query, MRR, NMRR, 1, climb(VICTIM)).through(&mut reg, &opts, &mut table);
    from_host(PacketKind::Query, NMRR, MRR, 2, query(VICTIM)).through(&mut reg, &opts, &mut table);
    for i in 0..2 * super::MAX_QUERIED as u32 {
        let comm = 0x0100_0000 | (0x1000 + i) << 8 | 1;
        from_host(PacketKind::Query, EVE, EVE, 3, query(comm)).through(&mut reg, &opts, &mut table);
    }
    assert!(reg.setups.len() <= super::MAX_QUERIED);
    let (n, _) = from_host(
        PacketKind::Notify,
        MRR,
        NMRR,
        1,
        along(VICTIM, &[(TOR, NONE, 2)], 0),
    )
    .through(&mut reg, &opts, &mut table)
    .expect("the victim's notify is still from its MRR");
    assert_eq!(n.fail_cause, 0);
    assert!(table.groups.contains_key(&WIRE));
    assert!(reg.stats.queries_forgotten > 0);
}

/// Issue 44 item 6: no per-port quota on a switch's groups: one host port installing its own
/// groups could take all of them.
#[test]
fn one_port_cannot_take_every_group_of_the_switch() {
    let (opts, mut reg, mut table) = (tor(), Registry::default(), Fake::new(8));
    let mut refused = 0;
    for i in 0..8u32 {
        let comm = 0x0300_0000 | (0x100 + i) << 8 | 1;
        from_host(PacketKind::Query, EVE, EVE, 3, climb(comm)).through(&mut reg, &opts, &mut table);
        let (n, _) = from_host(
            PacketKind::Notify,
            EVE,
            EVE,
            3,
            along(comm, &[(TOR, NONE, 1)], 0),
        )
        .through(&mut reg, &opts, &mut table)
        .expect("on");
        if n.fail_cause == FAIL_CAPACITY {
            refused += 1;
        }
    }
    assert!(refused > 0, "one port took all {} groups", table.capacity);
    assert!(reg.stats.refused_port_groups > 0);
    victim_setup(&mut reg, &opts, &mut table);
}

/// Issue 44 item 6: a full `bound` map made every control packet scan its 65,536 entries.
#[test]
fn a_full_binding_table_is_not_swept_on_every_packet() {
    let (opts, mut reg, mut table) = (tor(), Registry::default(), Fake::new(64));
    reg.ports(&opts);
    let now = std::time::Instant::now();
    for i in 0..super::MAX_BOUND_ADDRESSES as u32 {
        reg.bound
            .insert(Ipv4Addr::from(0x0a10_0000 + i), (1 + i % 3, now));
    }
    reg.bound_per_port.clear();
    for (port, _) in reg.bound.values() {
        *reg.bound_per_port.entry(*port).or_default() += 1;
    }
    for i in 0..200u32 {
        from_host(
            PacketKind::Query,
            Ipv4Addr::from(0x0a20_0000 + i),
            MRR,
            1 + i % 3,
            query(VICTIM),
        )
        .through(&mut reg, &opts, &mut table);
    }
    assert!(
        reg.stats.table_sweeps <= 1,
        "{} sweeps",
        reg.stats.table_sweeps
    );
}

/// A host's query or climb arrives with an empty path: a pre-filled one would make the TOR
/// learn a wrong uplink for a switch above when it comes back down.
#[test]
fn a_climb_with_a_pre_filled_path_cannot_poison_the_uplink_map() {
    let (opts, mut reg, mut table) = (tor(), Registry::default(), Fake::new(64));
    // The real SPINE2 sits behind uplink 8: a climb came back through it.
    let mut legit = climb(VICTIM);
    legit.path.push(PathHop::seen(u32::from(TOR), 1, 2));
    legit.path.push(PathHop::seen(u32::from(SPINE2), 1, 0));
    Packet {
        kind: PacketKind::Query,
        src: NMRR,
        dst: MRR,
        port: UP2,
        from_uplink: true,
        dst_is_local: true,
        body: legit,
    }
    .through(&mut reg, &opts, &mut table);
    assert_eq!(reg.above.get(&SPINE2), Some(&UP2));
    // Eve's climb names SPINE2 above this TOR before the TOR appends itself.
    let mut forged = climb(0x0200_0007);
    forged.path.push(PathHop::seen(u32::from(TOR), 1, 2));
    forged.path.push(PathHop::seen(u32::from(SPINE2), 1, 0));
    let up =
        from_host(PacketKind::Query, EVE, NMRR, 3, forged).through(&mut reg, &opts, &mut table);
    assert!(up.is_none(), "a host's climb with a path is refused");
    // What SPINE (behind uplink 9) would send back down had it gone up.
    forged.path.push(PathHop::seen(u32::from(TOR), 1, 2));
    forged.path.push(PathHop::seen(u32::from(SPINE), 1, 0));
    Packet {
        kind: PacketKind::Query,
        src: NMRR,
        dst: EVE,
        port: UP,
        from_uplink: true,
        dst_is_local: true,
        body: forged,
    }
    .through(&mut reg, &opts, &mut table);
    assert_eq!(
        reg.above.get(&SPINE2),
        Some(&UP2),
        "the uplink map was poisoned"
    );
    assert!(reg.stats.refused_bad_path > 0);
}

/// A notify's path must be one of a tree through this switch: a hop's parent is the next
/// hop up on the MRR's branch, the TOR is at an end, the path is symmetric.
#[test]
fn a_notify_path_that_is_no_tree_is_refused() {
    let (opts, mut reg, mut table) = (tor(), Registry::default(), Fake::new(64));
    // SPINE2 behind uplink 8, SPINE behind 9.
    for (spine, port) in [(SPINE2, UP2), (SPINE, UP)] {
        let mut back = climb(0x0200_0001);
        back.path.push(PathHop::seen(u32::from(TOR), 1, 2));
        back.path.push(PathHop::seen(u32::from(spine), 1, 0));
        Packet {
            kind: PacketKind::Query,
            src: NMRR,
            dst: EVE,
            port,
            from_uplink: true,
            dst_is_local: true,
            body: back,
        }
        .through(&mut reg, &opts, &mut table);
    }
    from_host(PacketKind::Query, EVE, TOR2, 3, climb(0x0200_0001))
        .through(&mut reg, &opts, &mut table);
    // Up to SPINE, but naming SPINE2 as the TOR's parent.
    let crafted = along(
        0x0200_0001,
        &[(TOR, SPINE2, 1), (SPINE, NONE, 2), (TOR2, SPINE, 1)],
        1,
    );
    let out =
        from_host(PacketKind::Notify, EVE, TOR2, 3, crafted).through(&mut reg, &opts, &mut table);
    assert!(out.is_none(), "{out:?}");
    assert!(!table.groups.contains_key(&0x01));
    assert_eq!(reg.stats.refused_bad_path, 1);
}

/// Issue 44 item 8: a spoofed query made a SPINE send a host's frames down another TOR.
#[test]
fn a_spoofed_query_cannot_move_a_host_at_a_spine() {
    let (opts, mut reg, mut table) = (spine(), Registry::default(), Fake::new(64));
    let up = |tor: Ipv4Addr, port: u32, src: Ipv4Addr, comm: u32| {
        let mut q = query(comm);
        q.path.push(PathHop::seen(u32::from(tor), 1, 1));
        q.set_tor1_ip(u32::from(tor));
        Packet {
            kind: PacketKind::Query,
            src,
            dst: MRR,
            port,
            from_uplink: false,
            dst_is_local: false,
            body: q,
        }
    };
    up(TOR, 1, NMRR, VICTIM).through(&mut reg, &opts, &mut table);
    assert_eq!(reg.down_to(NMRR), Route::Port(1));
    // Eve, under TOR2, with the NMRR's address.
    up(TOR2, 2, NMRR, 0x0200_0009).through(&mut reg, &opts, &mut table);
    assert_ne!(
        reg.down_to(NMRR),
        Route::Port(2),
        "the host was moved to Eve's TOR"
    );
    assert!(reg.stats.host_port_contested > 0);
}

/// A set-up that plays by the rules, over two levels: the MRR under TOR, the NMRR under
/// TOR2, SPINE above both (TORs on its ports 1 and 2, each TOR's uplink on its port 9).
/// Every guard lets it through, and its kill frees it everywhere.
/// Refusals of the guards against hosts outside a job, all kinds together.
fn guards_fired(s: &innet_common::stats::DaemonStats) -> u64 {
    s.refused_comm_clash
        + s.refused_not_group_port
        + s.refused_extra_members
        + s.refused_port_groups
        + s.refused_port_bindings
        + s.refused_bad_path
        + s.host_port_contested
}

#[test]
fn a_two_level_set_up_installs_and_its_kill_frees_it() {
    let (t1, sp) = (tor(), spine());
    let t2 = DaemonOptions { ip: TOR2, ..tor() };
    let (mut r1, mut rs, mut r2) = (
        Registry::default(),
        Registry::default(),
        Registry::default(),
    );
    let (mut f1, mut fs, mut f2) = (Fake::new(64), Fake::new(64), Fake::new(64));
    let pkt = |kind, src, dst, port, from_uplink, body| Packet {
        kind,
        src,
        dst,
        port,
        from_uplink,
        dst_is_local: true,
        body,
    };
    // The MRR's climb: up through TOR to SPINE, the top, and back down.
    let (c, route) = pkt(PacketKind::Query, MRR, NMRR, 1, false, climb(VICTIM))
        .through(&mut r1, &t1, &mut f1)
        .expect("up");
    assert_eq!(route, Route::Uplinks);
    let (c, route) = pkt(PacketKind::Query, MRR, NMRR, 1, false, c)
        .through(&mut rs, &sp, &mut fs)
        .expect("returned");
    assert_eq!(route, Route::Return);
    let (_, route) = pkt(PacketKind::Query, NMRR, MRR, UP, true, c)
        .through(&mut r1, &t1, &mut f1)
        .expect("down to the MRR");
    assert_eq!(route, Route::Port(1));
    assert_eq!(r1.above.get(&SPINE), Some(&UP));
    // The NMRR's query: up through TOR2 and SPINE, down to the MRR.
    let (q, _) = pkt(PacketKind::Query, NMRR, MRR, 1, false, query(VICTIM))
        .through(&mut r2, &t2, &mut f2)
        .expect("up");
    let (q, route) = pkt(PacketKind::Query, NMRR, MRR, 2, false, q)
        .through(&mut rs, &sp, &mut fs)
        .expect("down");
    assert_eq!(route, Route::Port(1));
    let (q, _) = pkt(PacketKind::Query, NMRR, MRR, UP, true, q)
        .through(&mut r1, &t1, &mut f1)
        .expect("to the MRR");
    assert_eq!(
        q.path
            .hops()
            .iter()
            .map(|h| Ipv4Addr::from(h.ip()))
            .collect::<Vec<_>>(),
        [TOR2, SPINE]
    );
    // The notify: up the MRR's branch to SPINE, down to TOR2.
    let path = [(TOR, SPINE, 1), (SPINE, NONE, 2), (TOR2, SPINE, 1)];
    let (n, route) = pkt(
        PacketKind::Notify,
        MRR,
        NMRR,
        1,
        false,
        along(VICTIM, &path, 1),
    )
    .through(&mut r1, &t1, &mut f1)
    .expect("up");
    assert_eq!((n.fail_cause, route), (0, Route::Port(UP)));
    let (n, route) = pkt(PacketKind::Notify, MRR, NMRR, 1, false, n)
        .through(&mut rs, &sp, &mut fs)
        .expect("down");
    assert_eq!((n.fail_cause, route), (0, Route::Port(2)));
    let (n, route) = pkt(PacketKind::Notify, MRR, NMRR, UP, true, n)
        .through(&mut r2, &t2, &mut f2)
        .expect("to the NMRR");
    assert_eq!((n.fail_cause, route), (0, Route::Below));
    for f in [&f1, &fs, &f2] {
        assert!(f.groups.contains_key(&WIRE));
    }
    assert_eq!(fs.groups[&WIRE].0.children.len(), 2);
    for r in [&r1, &rs, &r2] {
        assert_eq!(guards_fired(&r.stats), 0, "{:?}", r.stats);
    }
    // The kill follows the same path.
    let (k, _) = pkt(
        PacketKind::Kill,
        MRR,
        NMRR,
        1,
        false,
        along(VICTIM, &path, 1),
    )
    .through(&mut r1, &t1, &mut f1)
    .expect("up");
    let (k, _) = pkt(PacketKind::Kill, MRR, NMRR, 1, false, k)
        .through(&mut rs, &sp, &mut fs)
        .expect("down");
    pkt(PacketKind::Kill, MRR, NMRR, UP, true, k).through(&mut r2, &t2, &mut f2);
    for f in [&f1, &fs, &f2] {
        assert!(f.groups.is_empty());
    }
}

/// The data path's copy of the bindings (`HOST_PORTS`) learns every binding the control path
/// makes, and nothing it refuses: a spoofer's control packet from another port moves no one.
#[test]
fn bindings_are_handed_to_the_data_path_as_they_are_made() {
    let (opts, mut reg, mut table) = (tor(), Registry::default(), Fake::new(64));
    assert!(reg.take_binding_changes().is_empty());
    from_host(PacketKind::Query, EVE, EVE, 3, query(0x33 << 24 | 0x0abc))
        .through(&mut reg, &opts, &mut table);
    assert_eq!(reg.take_binding_changes(), vec![(EVE, Some(3))]);
    // The same address from another port: refused, the binding stays.
    from_host(PacketKind::Query, EVE, EVE, 4, query(0x33 << 24 | 0x0abd))
        .through(&mut reg, &opts, &mut table);
    assert!(reg.take_binding_changes().is_empty());
    assert!(reg.stats.refused_wrong_port > 0);
}
