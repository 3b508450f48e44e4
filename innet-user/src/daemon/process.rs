//! What a switch does to a control packet on its way through: a query collects this
//! switch's capabilities, address and free capacity; notify and kill pass on (group
//! installation from notify comes with the next step of the control plane).

use std::{
    collections::{HashMap, HashSet, VecDeque, hash_map::Entry},
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use innet_client::netdev;
use innet_common::{
    codec::Parsed,
    fail::{FAIL_CAPACITY, FAIL_NO_ROUTE, FAIL_PORT_CONFLICT, FAIL_REFUSED},
    proto::{COMM_TYPE_PROBE, MASTER_NIC_MODE, PacketKind, QNH_HOPS_MASK, QNH_RESPONSE},
    stats::DaemonStats,
    validate::Verdict,
    wire::ControlPayload,
};

use tracing::{info, warn};

use super::DaemonOptions;
use crate::group::{ChildSpec, GroupMaps, GroupSpec, ParentSpec, Role};

/// Groups whose queries a daemon remembers before their notify (the oldest are forgotten:
/// their notify is then refused as not from the MRR, and the job falls back).
pub const MAX_QUERIED: usize = 4096;
/// Members a daemon remembers per queried group.
const MAX_PENDING_MEMBERS: usize = 256;
/// Addresses a daemon binds to the port they were first seen on (beyond: not bound).
const MAX_BOUND_ADDRESSES: usize = 1 << 16;
/// How long a binding outlives its address's last accepted control packet: longer than
/// any set-up, short enough that a host that moved (or an impostor that went quiet) does
/// not lock the address out.
pub const BINDING_TTL: Duration = Duration::from_mins(1);

/// An MRR's address and the port its kill must come in on.
type KillFrom = (Ipv4Addr, u32);

/// Where a processed control frame goes next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Along the bridge's forwarding path.
    Path,
    /// Out of this uplink (towards the group's chosen SPINE).
    Uplink(u32),
    /// Back to its sender, out of the port it came in on, as a notify (a probe's answer).
    Back,
}

/// What the daemon learns from control packets: group members seen in queries, which
/// uplink leads to which SPINE, and each installed group's MRR.
#[derive(Default)]
pub struct Registry {
    /// Members under this switch per `true_comm_id`, from queries (and the MRR's notify).
    pending: HashMap<u32, Vec<ChildSpec>>,
    /// The MRRs the group's queries were addressed to (per `true_comm_id`): only they may
    /// notify. Node mode has one MRR; Socket mode one per CPU socket of the first node.
    queried: HashMap<u32, Vec<Ipv4Addr>>,
    /// Uplink ifindex towards each SPINE, learned from query copies coming back down.
    uplink_to: HashMap<Ipv4Addr, u32>,
    /// Groups queried but not installed (yet), oldest first: at most `MAX_QUERIED` are
    /// remembered, so a flood of queries cannot grow the daemon without bound.
    queried_order: VecDeque<u32>,
    /// Every group this daemon installed (wire group id): its MRRs, each with the port its
    /// notify came in on (its kill must come the same way), and the uplink to its SPINE
    /// (TORs of multi-TOR groups).
    installed: HashMap<u32, (Vec<KillFrom>, Option<u32>)>,
    /// The port each host (TOR) or TOR (SPINE) address first sent a control packet on:
    /// its later control packets are accepted on that port only.
    bound: HashMap<Ipv4Addr, (u32, Instant)>,
    /// Groups in set-up whose member address came in on two ports (`true_comm_id`): their
    /// notify is answered with [`FAIL_PORT_CONFLICT`].
    conflicted: HashSet<u32>,
    /// What the daemon did, published in the pinned `DAEMON_STATS` map.
    pub stats: DaemonStats,
}

/// The packet as the daemon sees it.
pub struct Seen<'a> {
    pub parsed: &'a Parsed<'a>,
    pub ingress: u32,
    pub from_uplink: bool,
    /// Whether the destination host sits behind one of this switch's host ports.
    pub dst_is_local: bool,
}

impl Registry {
    /// Rebuilds what a restarted daemon needs from the pinned groups: each group's MRR and,
    /// on a TOR below a SPINE, its uplink.
    pub fn recover(groups: &GroupMaps) -> Self {
        let mut r = Self::default();
        for g in groups.list().unwrap_or_default() {
            let cfg = &g.config;
            if cfg.mrr_ip == [0; 4] {
                continue;
            }
            let uplink = (cfg.is_root == 0).then_some(cfg.parent_ifindex);
            let children = &cfg.children[..usize::from(cfg.n_children).min(cfg.children.len())];
            // The MRR's kill comes from its own port when it is a child here, else down
            // the uplink; a SPINE cannot tell which TOR leads to it: any of the group's.
            let ports: Vec<u32> = match children.iter().find(|c| c.ip == cfg.mrr_ip) {
                Some(c) => vec![c.ifindex],
                None => {
                    uplink.map_or_else(|| children.iter().map(|c| c.ifindex).collect(), |u| vec![u])
                }
            };
            let mrr = Ipv4Addr::from(cfg.mrr_ip);
            r.installed.insert(
                g.id,
                (ports.into_iter().map(|p| (mrr, p)).collect(), uplink),
            );
        }
        r
    }

    /// Frees a group the control plane installed (idle collection).
    pub fn forget(&mut self, wire_id: u32) {
        self.installed.remove(&wire_id);
        self.queried_order
            .retain(|comm| comm & 0x00ff_ffff != wire_id);
        self.pending.retain(|comm, _| comm & 0x00ff_ffff != wire_id);
        self.queried.retain(|comm, _| comm & 0x00ff_ffff != wire_id);
        self.conflicted.retain(|comm| comm & 0x00ff_ffff != wire_id);
    }

    /// Whether `addr` may send control packets on `port`: an address is bound to the port
    /// it is first seen on (up to [`MAX_BOUND_ADDRESSES`]); another port is refused and
    /// counted.
    fn on_its_port(&mut self, addr: Ipv4Addr, port: u32) -> bool {
        let now = Instant::now();
        if self.bound.len() >= MAX_BOUND_ADDRESSES {
            self.bound.retain(|_, (_, last)| now - *last < BINDING_TTL);
        }
        let room = self.bound.len() < MAX_BOUND_ADDRESSES;
        match self.bound.entry(addr) {
            Entry::Occupied(e) if e.get().0 != port && now - e.get().1 < BINDING_TTL => {
                self.stats.refused_wrong_port += 1;
                warn!(from = %addr, port, bound_to = e.get().0, "control packet from an address bound to another port: refused");
                false
            }
            Entry::Occupied(mut e) => {
                *e.get_mut() = (port, now);
                true
            }
            Entry::Vacant(e) => {
                if room {
                    e.insert((port, now));
                }
                true
            }
        }
    }

    /// The control payload to forward and its route, or `None` to consume the packet.
    pub fn process(
        &mut self,
        opts: &DaemonOptions,
        groups: &mut GroupMaps,
        seen: &Seen<'_>,
    ) -> Option<(ControlPayload, Route)> {
        let p = seen.parsed;
        let Verdict::Control(kind) = p.verdict else {
            return None;
        };
        let mut c = p.control()?;
        if c.master_num == MASTER_NIC_MODE {
            // A NIC tree's handshake: its members' NICs reduce, not the switches.
            return Some((c, Route::Path));
        }
        let hops = (c.query_notify_hop & QNH_HOPS_MASK)
            .saturating_add(1)
            .min(QNH_HOPS_MASK);
        let response = c.query_notify_hop & QNH_RESPONSE != 0;
        c.query_notify_hop = (c.query_notify_hop & QNH_RESPONSE) | hops;
        match (kind, response) {
            (PacketKind::Query, false) if c.sup_comm_type == COMM_TYPE_PROBE => {
                self.on_probe(opts, seen, c)
            }
            (PacketKind::Query, false) => self.on_query(opts, groups, seen, c),
            (PacketKind::Notify, true) => self.on_notify(opts, groups, seen, c),
            (PacketKind::Kill, _) => self.on_kill(opts, groups, seen, c),
            _ => Some((c, Route::Path)),
        }
    }

    /// A query collects this switch's capabilities, address and (SPINE) free capacity, and
    /// tells the switch who the group's members under it are. A member (TOR) or TOR
    /// (SPINE) address on another port than the one it is bound to is refused, and its
    /// group will not be installed ([`FAIL_PORT_CONFLICT`]).
    fn on_query(
        &mut self,
        opts: &DaemonOptions,
        groups: &mut GroupMaps,
        seen: &Seen<'_>,
        mut c: ControlPayload,
    ) -> Option<(ControlPayload, Route)> {
        let own = u32::from(opts.ip);
        let src = seen.parsed.addr.src_ip;
        let comm = c.true_comm_id();
        if let Some(addr) = port_bound_sender(opts.role, seen, &c)
            && !self.on_its_port(addr, seen.ingress)
        {
            self.conflicted.insert(comm);
            return None;
        }
        self.bound_queried(comm);
        let mrrs = self.queried.entry(comm).or_default();
        if !mrrs.contains(&seen.parsed.addr.dst_ip) && mrrs.len() < MAX_PENDING_MEMBERS {
            mrrs.push(seen.parsed.addr.dst_ip);
        }
        let caps = opts.capabilities;
        c.set_sup_allreduce_op(c.sup_allreduce_op() & caps.ops);
        c.set_sup_data_type(c.sup_data_type() & caps.dtypes);
        c.set_sup_max_data_size(c.sup_max_data_size().min(caps.max_data_size));
        c.set_sup_window(c.sup_window().min(caps.window));
        match opts.role {
            Role::Tor if seen.from_uplink => {
                c.set_tor2_ip(own);
                self.uplink_to
                    .insert(Ipv4Addr::from(c.spine_ip()), seen.ingress);
            }
            Role::Tor => {
                c.set_tor1_ip(own);
                self.remember(
                    comm,
                    ChildSpec {
                        ip: src,
                        ifindex: seen.ingress,
                        rank: c.world_rank(),
                    },
                );
            }
            Role::Spine => {
                c.set_spine_ip(own);
                let used = groups.list().map_or(0, |g| g.len() as u32);
                c.set_ava_grp_num(groups.capacity().saturating_sub(used));
                self.remember_tor(comm, &c, seen.ingress);
            }
        }
        Some((c, Route::Path))
    }

    /// A TOR answers a probe from one of its hosts with its own address; nothing is
    /// remembered or installed. A probe never goes past the first switch.
    fn on_probe(
        &mut self,
        opts: &DaemonOptions,
        seen: &Seen<'_>,
        mut c: ControlPayload,
    ) -> Option<(ControlPayload, Route)> {
        if opts.role != Role::Tor || seen.from_uplink {
            self.stats.probes_dropped += 1;
            return None;
        }
        self.stats.probes_answered += 1;
        c.set_tor1_ip(u32::from(opts.ip));
        c.query_notify_hop |= QNH_RESPONSE;
        Some((c, Route::Back))
    }

    /// A notify installs the group on every switch of its path (or records why not in
    /// `fail_cause`).
    fn on_notify(
        &mut self,
        opts: &DaemonOptions,
        groups: &mut GroupMaps,
        seen: &Seen<'_>,
        mut c: ControlPayload,
    ) -> Option<(ControlPayload, Route)> {
        let own = u32::from(opts.ip);
        let src = seen.parsed.addr.src_ip;
        let comm = c.true_comm_id();
        let wire_id = comm & 0x00ff_ffff;
        let spine = Ipv4Addr::from(c.spine_ip());
        if !self.queried.get(&comm).is_some_and(|m| m.contains(&src)) {
            // Not from the host the group's queries went to (or no query seen at all).
            self.stats.refused_not_mrr += 1;
            warn!(group = format_args!("{wire_id:#08x}"), from = %src, "notify from a host that is not the group's MRR: ignored");
            return None;
        }
        // The MRR's own notify comes in on its host port; one from another switch on the
        // uplink towards the group's SPINE (TOR) or on the MRR's TOR's port (SPINE).
        let port_ok = match port_bound_sender(opts.role, seen, &c) {
            Some(addr) => self.on_its_port(addr, seen.ingress),
            None if self
                .uplink_to
                .get(&spine)
                .is_some_and(|&up| up != seen.ingress) =>
            {
                self.stats.refused_wrong_port += 1;
                false
            }
            None => true,
        };
        if !port_ok {
            warn!(group = format_args!("{wire_id:#08x}"), from = %src, port = seen.ingress, "notify on a port it cannot come from: ignored");
            return None;
        }
        if self.conflicted.contains(&comm) && c.fail_cause == 0 {
            self.stats.refused_port_conflict += 1;
            warn!(
                group = format_args!("{wire_id:#08x}"),
                "a member's address came in on two ports during set-up: group refused"
            );
            c.fail_cause = FAIL_PORT_CONFLICT;
        }
        let mut route = Route::Path;
        if c.fail_cause != 0 {
            // The group will not use the network: install nothing, just let every NMRR know.
            return match (opts.role, seen.from_uplink, seen.dst_is_local) {
                (Role::Tor, true, false) => None,
                (Role::Tor, false, false) => Some((
                    c,
                    self.uplink_to
                        .get(&spine)
                        .map_or(Route::Path, |u| Route::Uplink(*u)),
                )),
                _ => Some((c, Route::Path)),
            };
        }
        match opts.role {
            Role::Tor if !seen.from_uplink => {
                // The MRR's TOR: the MRR is a member here too.
                c.set_tor1_ip(own);
                self.remember(
                    comm,
                    ChildSpec {
                        ip: src,
                        ifindex: seen.ingress,
                        rank: 0,
                    },
                );
                let members = self.pending.get(&comm).map_or(0, Vec::len);
                let root = members >= usize::from(c.global_group_size());
                let parent = if root {
                    None
                } else {
                    self.uplink_to.get(&spine).copied()
                };
                if !root && parent.is_none() {
                    c.fail_cause = c.fail_cause.max(FAIL_NO_ROUTE);
                } else {
                    let parent = parent.map(|u| (u, spine));
                    self.install(opts, groups, &mut c, (src, seen.ingress), parent);
                }
                if !seen.dst_is_local
                    && let Some(up) = parent
                {
                    route = Route::Uplink(up);
                }
            }
            Role::Tor => {
                // An NMRR's TOR: install only when the NMRR is one of ours.
                if !seen.dst_is_local {
                    return None;
                }
                let parent = Some((seen.ingress, spine));
                self.install(opts, groups, &mut c, (src, seen.ingress), parent);
            }
            Role::Spine => {
                if spine != opts.ip {
                    return None; // notify of a group another SPINE serves
                }
                self.remember_tor(comm, &c, seen.ingress);
                self.install(opts, groups, &mut c, (src, seen.ingress), None);
            }
        }
        Some((c, route))
    }

    /// A kill from the group's MRR, on the port its notify came in on, frees it; from anyone
    /// else, or another port, it is ignored and counted.
    fn on_kill(
        &mut self,
        opts: &DaemonOptions,
        groups: &mut GroupMaps,
        seen: &Seen<'_>,
        c: ControlPayload,
    ) -> Option<(ControlPayload, Route)> {
        let src = seen.parsed.addr.src_ip;
        let comm = c.true_comm_id();
        let wire_id = comm & 0x00ff_ffff;
        let mut uplink = None;
        match self.installed.get(&wire_id).cloned() {
            Some((mrrs, up)) if mrrs.contains(&(src, seen.ingress)) => {
                let _ = groups.remove(wire_id);
                self.installed.remove(&wire_id);
                self.pending.remove(&comm);
                self.queried.remove(&comm);
                self.queried_order.retain(|q| *q != comm);
                self.conflicted.remove(&comm);
                uplink = up;
                self.stats.groups_killed += 1;
                info!(group = format_args!("{wire_id:#08x}"), "killed by its MRR");
            }
            Some((mrrs, _)) if mrrs.iter().any(|(ip, _)| *ip == src) => {
                self.stats.refused_wrong_port += 1;
                warn!(group = format_args!("{wire_id:#08x}"), from = %src, port = seen.ingress, ?mrrs, "kill with the MRR's address on another port than its notify's: ignored");
                return None;
            }
            Some((mrrs, _)) => {
                self.stats.refused_not_mrr += 1;
                warn!(group = format_args!("{wire_id:#08x}"), from = %src, ?mrrs, "kill from a host that is not one of the group's MRRs: ignored");
                return None;
            }
            None => {}
        }
        let route = match (opts.role, seen.from_uplink, seen.dst_is_local) {
            (Role::Tor, true, false) => return None,
            (Role::Tor, false, false) => uplink.map_or(Route::Path, Route::Uplink),
            _ => Route::Path,
        };
        Some((c, route))
    }

    /// A SPINE's child is the TOR that stamped `tor1_ip` on the packet's first hop.
    fn remember_tor(&mut self, comm: u32, c: &ControlPayload, ingress: u32) {
        let tor = Ipv4Addr::from(c.tor1_ip());
        self.remember(
            comm,
            ChildSpec {
                ip: tor,
                ifindex: ingress,
                rank: 0,
            },
        );
    }

    /// Makes room for a newly queried group `comm`: forgets the oldest queried group that
    /// was never installed when `MAX_QUERIED` are remembered.
    fn bound_queried(&mut self, comm: u32) {
        if self.queried.contains_key(&comm) {
            return;
        }
        self.queried_order.push_back(comm);
        while self.queried_order.len() > MAX_QUERIED {
            let Some(old) = self.queried_order.pop_front() else {
                break;
            };
            if !self.installed.contains_key(&(old & 0x00ff_ffff)) {
                self.pending.remove(&old);
                self.queried.remove(&old);
                self.conflicted.remove(&old);
                self.stats.queries_forgotten += 1;
            }
        }
    }

    fn remember(&mut self, comm: u32, child: ChildSpec) {
        let members = self.pending.entry(comm).or_default();
        if !members.iter().any(|m| m.ip == child.ip) && members.len() < MAX_PENDING_MEMBERS {
            members.push(child);
        }
    }

    /// Installs the notify's group, with the members this switch learned for it, unless it
    /// already is; a refusal is written into `fail_cause`.
    fn install(
        &mut self,
        opts: &DaemonOptions,
        groups: &mut GroupMaps,
        c: &mut ControlPayload,
        (mrr, notify_port): (Ipv4Addr, u32),
        parent: Option<(u32, Ipv4Addr)>,
    ) {
        let comm = c.true_comm_id();
        let wire_id = comm & 0x00ff_ffff;
        if let Some((mrrs, _)) = self.installed.get_mut(&wire_id) {
            // Socket mode: each MRR notifies its own NMRRs; every one of them is an MRR here.
            if !mrrs.contains(&(mrr, notify_port)) {
                mrrs.push((mrr, notify_port));
            }
            return;
        }
        let uplink = parent.map(|(ifindex, _)| ifindex);
        let parent = parent.map(|(ifindex, ip)| ParentSpec {
            ifindex,
            own_mac: netdev_mac(ifindex),
            own_ip: opts.ip,
            // XDP on a veth or NIC in promiscuous bridge mode accepts any destination MAC;
            // the SPINE's port MAC is not learned by the control plane (yet).
            mac: [0xff; 6],
            ip,
        });
        let spec = GroupSpec {
            id: wire_id,
            role: opts.role,
            parent,
            own_rank: 0,
            mrr: Some(mrr),
            children: self.pending.get(&comm).cloned().unwrap_or_default(),
        };
        match groups.install(&spec) {
            Ok(index) => {
                self.installed
                    .insert(wire_id, (vec![(mrr, notify_port)], uplink));
                self.stats.groups_installed += 1;
                info!(
                    group = format_args!("{wire_id:#08x}"),
                    index,
                    children = spec.children.len(),
                    root = spec.parent.is_none(),
                    "installed from notify"
                );
            }
            Err(crate::Error::CapacityFull { .. }) => {
                self.stats.refused_capacity += 1;
                c.fail_cause = c.fail_cause.max(FAIL_CAPACITY);
            }
            Err(e) => {
                self.stats.refused_invalid += 1;
                c.fail_cause = c.fail_cause.max(FAIL_REFUSED);
                warn!(group = format_args!("{wire_id:#08x}"), error = %e, "installing from notify failed");
            }
        }
    }
}

/// The address a control packet's port is bound to: the sending host on a TOR's host
/// port, the first-hop TOR on a SPINE; `None` for a packet down a TOR's uplink (checked
/// against the uplink towards the group's SPINE instead).
fn port_bound_sender(role: Role, seen: &Seen<'_>, c: &ControlPayload) -> Option<Ipv4Addr> {
    match role {
        Role::Tor if seen.from_uplink => None,
        Role::Tor => Some(seen.parsed.addr.src_ip),
        Role::Spine => Some(Ipv4Addr::from(c.tor1_ip())),
    }
}

fn netdev_mac(ifindex: u32) -> [u8; 6] {
    netdev::ifname(ifindex)
        .and_then(|n| netdev::mac(&n).ok())
        .unwrap_or([0; 6])
}
