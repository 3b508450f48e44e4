//! What a switch does to a control packet on its way through, at any level of the fabric:
//! a query collects capabilities, addresses and free capacity on its way up; a climb shows
//! the MRR its ways up; a notify installs the group on the switches of the path the MRR
//! chose; a kill frees it there.

use std::{
    collections::{HashMap, HashSet, VecDeque, hash_map::Entry},
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use innet_common::{
    codec::Parsed,
    fail::{FAIL_CAPACITY, FAIL_NO_ROUTE, FAIL_PORT_CONFLICT, FAIL_REFUSED},
    proto::{
        COMM_TYPE_CLIMB, COMM_TYPE_PROBE, MASTER_NIC_MODE, PacketKind, QNH_HOPS_MASK, QNH_RESPONSE,
    },
    stats::DaemonStats,
    validate::Verdict,
    wire::{ControlPath, ControlPayload, PathHop},
};
use innet_net::netdev;

use tracing::{debug, info, warn};

use super::DaemonOptions;
use crate::group::{ChildSpec, GroupMaps, GroupSpec, ParentSpec, Role};

/// Groups whose queries a daemon remembers before their notify (the oldest are forgotten:
/// their notify is then refused as not from the MRR, and the job falls back).
pub const MAX_QUERIED: usize = 4096;
/// Members a daemon remembers per queried group.
const MAX_PENDING_MEMBERS: usize = 256;
/// Addresses a daemon binds to the port they were first seen on (beyond: not bound), and
/// hosts and upper switches it remembers a port for.
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
    /// Out of one port.
    Port(u32),
    /// A copy out of every uplink.
    Uplinks,
    /// Down towards the frame's destination: the bridge's port for it, else every port
    /// but the uplinks and the one it came in on.
    Below,
    /// Back to its sender, out of the port it came in on, as a notify (a probe's answer).
    Back,
    /// Back down out of the port it came in on, addresses swapped (a climb at the top).
    Return,
}

/// What this switch holds of a group it installed.
#[derive(Clone, Debug, Default)]
struct Installed {
    /// Its MRRs, each with the port its notifies came in on (its kill must come the same way).
    mrrs: Vec<KillFrom>,
    /// The port towards its parent (`None` at the root).
    parent: Option<u32>,
    /// Its children and their ports.
    children: Vec<(Ipv4Addr, u32)>,
}

/// What the daemon learns from control packets: group members seen in queries, on which
/// port hosts and the switches above are, and each installed group's MRR.
#[derive(Default)]
pub struct Registry {
    /// TOR: members under this switch per `true_comm_id`, from queries (and the MRR's notify).
    pending: HashMap<u32, Vec<ChildSpec>>,
    /// The MRRs of each group (per `true_comm_id`): the hosts its queries were addressed to
    /// and its climbs came from. Only they may notify. Node mode has one MRR; Socket mode
    /// one per CPU socket of the first node.
    queried: HashMap<u32, Vec<Ipv4Addr>>,
    /// The uplink towards each switch above, learned from climbs coming back down.
    above: HashMap<Ipv4Addr, u32>,
    /// The port each host's queries and climbs came up on: where frames for it go down.
    hosts_below: HashMap<Ipv4Addr, u32>,
    /// Groups queried but not installed (yet), oldest first: at most `MAX_QUERIED` are
    /// remembered, so a flood of queries cannot grow the daemon without bound.
    queried_order: VecDeque<u32>,
    /// Every group this daemon installed (wire group id).
    installed: HashMap<u32, Installed>,
    /// The port each host (TOR) or lower switch (above the TORs) address first sent a
    /// control packet on: its later control packets are accepted on that port only.
    bound: HashMap<Ipv4Addr, (u32, Instant)>,
    /// Groups in set-up whose member address came in on two ports (`true_comm_id`): their
    /// notify is answered with [`FAIL_PORT_CONFLICT`].
    conflicted: HashSet<u32>,
    /// The free capacity last read, and when (see [`Registry::free_capacity`]).
    free: Option<(Instant, u32)>,
    /// What the daemon did, published in the pinned `DAEMON_STATS` map.
    pub stats: DaemonStats,
}

/// How long a reading of the free capacity serves queries.
const FREE_CAPACITY_TTL: Duration = Duration::from_millis(100);

/// The packet as the daemon sees it.
pub struct Seen<'a> {
    pub parsed: &'a Parsed<'a>,
    pub ingress: u32,
    pub from_uplink: bool,
    /// Whether the destination host sits behind one of this switch's host ports.
    pub dst_is_local: bool,
}

impl Seen<'_> {
    fn src(&self) -> Ipv4Addr {
        self.parsed.addr.src_ip
    }
    fn dst(&self) -> Ipv4Addr {
        self.parsed.addr.dst_ip
    }
}

/// A notify refused at this switch (its `fail_cause` says why).
struct Refused;

impl Registry {
    /// Rebuilds what a restarted daemon needs from the pinned groups: each group's MRR, its
    /// parent's port and its children.
    pub fn recover(groups: &GroupMaps) -> Self {
        let mut r = Self::default();
        for g in groups.list().unwrap_or_default() {
            let cfg = &g.config;
            if cfg.mrr_ip == [0; 4] {
                continue;
            }
            let parent = (cfg.is_root == 0).then_some(cfg.parent_ifindex);
            let children: Vec<(Ipv4Addr, u32)> = cfg.children
                [..usize::from(cfg.n_children).min(cfg.children.len())]
                .iter()
                .filter(|c| c.ip != [0; 4])
                .map(|c| (Ipv4Addr::from(c.ip), c.ifindex))
                .collect();
            // The MRR's kill comes from its own port when it is a child here; otherwise up
            // its branch from a child, or down from the parent.
            let mrr = Ipv4Addr::from(cfg.mrr_ip);
            let ports: Vec<u32> = match children.iter().find(|c| c.0 == mrr) {
                Some(c) => vec![c.1],
                None => children.iter().map(|c| c.1).chain(parent).collect(),
            };
            let mrrs = ports.into_iter().map(|p| (mrr, p)).collect();
            r.installed.insert(
                g.id,
                Installed {
                    mrrs,
                    parent,
                    children,
                },
            );
        }
        r
    }

    /// Frees a group the control plane installed (idle collection).
    pub fn forget(&mut self, wire_id: u32) {
        self.installed.remove(&wire_id);
        self.free = None;
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
            (PacketKind::Query, false) if c.sup_comm_type == COMM_TYPE_CLIMB => {
                self.on_climb(opts, groups, seen, c)
            }
            (PacketKind::Query, false) => self.on_query(opts, groups, seen, c),
            (PacketKind::Notify, true) => self.on_notify(opts, groups, seen, c),
            (PacketKind::Kill, _) => self.on_kill(opts, groups, seen, c),
            _ => Some((c, Route::Path)),
        }
    }

    /// A query on its way up collects this switch's capabilities, address and free
    /// capacity, and tells it who the group's members under it are; unless the MRR hangs
    /// off the same TOR, it climbs every uplink to the top, then goes down to the MRR.
    /// A host (TOR) or lower switch address on another port than the one it is bound to is
    /// refused, and its group will not be installed ([`FAIL_PORT_CONFLICT`]).
    fn on_query(
        &mut self,
        opts: &DaemonOptions,
        groups: &mut GroupMaps,
        seen: &Seen<'_>,
        mut c: ControlPayload,
    ) -> Option<(ControlPayload, Route)> {
        let _ = groups.mark_setting_up(c.true_comm_id());
        let own = u32::from(opts.ip);
        let comm = c.true_comm_id();
        intersect(opts, &mut c);
        if seen.from_uplink {
            // On its way down to the MRR.
            return match opts.role {
                Role::Tor if seen.dst_is_local => {
                    c.set_tor2_ip(own);
                    Some((c, Route::Path))
                }
                Role::Tor => None,
                Role::Spine => Some((c, self.down_to(seen.dst()))),
            };
        }
        let free = self.up_from_below(opts, groups, seen, &c, seen.dst())?;
        match opts.role {
            Role::Tor => {
                c.set_tor1_ip(own);
                self.remember(
                    comm,
                    ChildSpec {
                        ip: seen.src(),
                        ifindex: seen.ingress,
                        rank: c.world_rank(),
                    },
                );
            }
            Role::Spine => {
                c.set_spine_ip(own);
                c.set_ava_grp_num(free);
            }
        }
        if !self.append(opts, &mut c.path, free) {
            return None;
        }
        // Up to the top even when the MRR is below: every way must reach every level, so
        // the MRR can find the one switch above all the group's TORs.
        let route = match opts.role {
            Role::Tor if seen.dst_is_local => Route::Path,
            _ if !opts.uplinks.is_empty() => Route::Uplinks,
            Role::Tor => Route::Path,
            Role::Spine => self.down_to(seen.dst()),
        };
        Some((c, route))
    }

    /// A climb on its way up: this switch appends itself and its free capacity, learns the
    /// MRR's port, and copies it to every uplink; the top sends it back. On its way back
    /// down, each switch learns the port of the switch above it and passes it on to the MRR.
    fn on_climb(
        &mut self,
        opts: &DaemonOptions,
        groups: &mut GroupMaps,
        seen: &Seen<'_>,
        mut c: ControlPayload,
    ) -> Option<(ControlPayload, Route)> {
        let own = u32::from(opts.ip);
        let comm = c.true_comm_id();
        let _ = groups.mark_setting_up(comm);
        if seen.from_uplink {
            let hops = c.path.hops();
            if let Some(k) = c.path.position(own)
                && let Some(up) = hops.get(k + 1)
                && self.above.len() < MAX_BOUND_ADDRESSES
            {
                self.above.insert(Ipv4Addr::from(up.ip()), seen.ingress);
            }
            return match opts.role {
                Role::Tor if !seen.dst_is_local && !self.hosts_below.contains_key(&seen.dst()) => {
                    None
                }
                _ => Some((c, self.down_to(seen.dst()))),
            };
        }
        let free = self.up_from_below(opts, groups, seen, &c, seen.src())?;
        if !self.append(opts, &mut c.path, free) {
            return None;
        }
        if opts.uplinks.is_empty() {
            self.stats.climbs_returned += 1;
            return Some((c, Route::Return));
        }
        Some((c, Route::Uplinks))
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
    /// `fail_cause`) and follows the path: up the MRR's branch, then down the NMRR's.
    fn on_notify(
        &mut self,
        opts: &DaemonOptions,
        groups: &mut GroupMaps,
        seen: &Seen<'_>,
        mut c: ControlPayload,
    ) -> Option<(ControlPayload, Route)> {
        let _ = groups.mark_setting_up(c.true_comm_id());
        let comm = c.true_comm_id();
        let wire_id = comm & 0x00ff_ffff;
        let mrr = seen.src();
        if !self.queried.get(&comm).is_some_and(|m| m.contains(&mrr)) {
            // Not from the host the group's queries went to (or no query seen at all).
            self.stats.refused_not_mrr += 1;
            warn!(group = format_args!("{wire_id:#08x}"), from = %mrr, "notify from a host that is not the group's MRR: ignored");
            return None;
        }
        let Some(k) = c.path.position(u32::from(opts.ip)) else {
            // Not on the path the MRR chose (or it chose none: the group will not use the
            // network): pass it on towards the NMRR, installing nothing.
            return off_path(opts, seen, c);
        };
        if !self.notify_port_ok(&c.path, k, seen) {
            self.stats.refused_wrong_port += 1;
            warn!(group = format_args!("{wire_id:#08x}"), from = %mrr, port = seen.ingress, "notify on a port it cannot come from: ignored");
            return None;
        }
        if self.conflicted.contains(&comm) && c.fail_cause == 0 {
            self.refuse(&mut c, FAIL_PORT_CONFLICT);
            warn!(
                group = format_args!("{wire_id:#08x}"),
                "a member's address came in on two ports during set-up: group refused"
            );
        }
        if c.fail_cause == 0 {
            self.install_hop(opts, groups, &mut c, seen, k);
        }
        let route = self.next_hop(&c.path, k, None).unwrap_or_else(|| {
            self.refuse(&mut c, FAIL_NO_ROUTE);
            Route::Below
        });
        Some((c, route))
    }

    /// Whether a notify for hop `k` came the way it must: up the MRR's branch from the hop
    /// below (the MRR itself at hop 0), or down the NMRR's from the hop above.
    fn notify_port_ok(&mut self, path: &ControlPath, k: usize, seen: &Seen<'_>) -> bool {
        let hops = path.hops();
        if k <= usize::from(path.turn) {
            let sender = match k.checked_sub(1) {
                None => seen.src(),
                Some(below) => Ipv4Addr::from(hops[below].ip()),
            };
            return !seen.from_uplink && self.on_its_port(sender, seen.ingress);
        }
        let parent = Ipv4Addr::from(hops[k - 1].ip());
        seen.from_uplink && *self.above.entry(parent).or_insert(seen.ingress) == seen.ingress
    }

    /// Hop `k`'s parent as (port, address), none at the root; [`Refused`] when the way to it
    /// is unknown here.
    fn hop_parent(
        &mut self,
        c: &mut ControlPayload,
        seen: &Seen<'_>,
        k: usize,
    ) -> Result<Option<(u32, Ipv4Addr)>, Refused> {
        let turn = usize::from(c.path.turn);
        match Ipv4Addr::from(c.path.hops()[k].parent()) {
            ip if ip.is_unspecified() => Ok(None),
            ip if k > turn => Ok(Some((seen.ingress, ip))),
            ip => {
                if let Some(&port) = self.above.get(&ip) {
                    return Ok(Some((port, ip)));
                }
                self.refuse(c, FAIL_NO_ROUTE);
                warn!(group = format_args!("{:#08x}", c.true_comm_id() & 0x00ff_ffff), parent = %ip, "no uplink towards the parent the MRR chose (no climb came back through it)");
                Err(Refused)
            }
        }
    }

    /// The children hop `k` has in this group: a TOR's hosts (the MRR among them on its own
    /// TOR), or the switches below on this notify's branch; [`Refused`] when a child's port
    /// is unknown here.
    fn hop_children(
        &mut self,
        role: Role,
        c: &mut ControlPayload,
        seen: &Seen<'_>,
        k: usize,
    ) -> Result<Vec<ChildSpec>, Refused> {
        let comm = c.true_comm_id();
        if role == Role::Tor {
            if k == 0 {
                // The MRR's TOR: the MRR is a member here too.
                self.remember(
                    comm,
                    ChildSpec {
                        ip: seen.src(),
                        ifindex: seen.ingress,
                        rank: 0,
                    },
                );
            }
            return Ok(self.pending.get(&comm).cloned().unwrap_or_default());
        }
        let path = c.path;
        self.branch_children(&path, k, seen).ok_or_else(|| {
            self.refuse(c, FAIL_NO_ROUTE);
            warn!(
                group = format_args!("{:#08x}", comm & 0x00ff_ffff),
                "no port towards a child the MRR chose (its query never came through here)"
            );
            Refused
        })
    }

    /// Installs the notify's group at hop `k` of its path (or adds the children this branch
    /// brings when it is installed already); a refusal is written into `fail_cause`.
    fn install_hop(
        &mut self,
        opts: &DaemonOptions,
        groups: &mut GroupMaps,
        c: &mut ControlPayload,
        seen: &Seen<'_>,
        k: usize,
    ) {
        let comm = c.true_comm_id();
        let wire_id = comm & 0x00ff_ffff;
        let expected = c.path.hops()[k].children;
        let mrr = seen.src();
        let Ok(parent) = self.hop_parent(c, seen, k) else {
            return;
        };
        let Ok(children) = self.hop_children(opts.role, c, seen, k) else {
            return;
        };
        if self.installed.contains_key(&wire_id) {
            self.extend(groups, c, (mrr, seen.ingress), parent, &children);
            return;
        }
        let spec = GroupSpec {
            id: wire_id,
            role: opts.role,
            parent: parent.map(|(ifindex, ip)| ParentSpec {
                ifindex,
                own_mac: netdev_mac(ifindex),
                own_ip: opts.ip,
                // XDP on a veth or NIC in promiscuous bridge mode accepts any destination
                // MAC; the parent's port MAC is not learned by the control plane (yet).
                mac: [0xff; 6],
                ip,
            }),
            own_rank: 0,
            mrr: Some(mrr),
            children: children.clone(),
        };
        match groups.install_expecting(&spec, usize::from(expected)) {
            Ok(index) => {
                self.installed.insert(
                    wire_id,
                    Installed {
                        mrrs: vec![(mrr, seen.ingress)],
                        parent: parent.map(|(port, _)| port),
                        children: children.iter().map(|c| (c.ip, c.ifindex)).collect(),
                    },
                );
                self.stats.groups_installed += 1;
                self.free = None;
                info!(
                    group = format_args!("{wire_id:#08x}"),
                    index,
                    children = spec.children.len(),
                    expected,
                    root = spec.parent.is_none(),
                    "installed from notify"
                );
            }
            Err(crate::Error::CapacityFull { .. }) => self.refuse(c, FAIL_CAPACITY),
            Err(e) => {
                self.refuse(c, FAIL_REFUSED);
                warn!(group = format_args!("{wire_id:#08x}"), error = %e, "installing from notify failed");
            }
        }
    }

    /// The children a notify's path gives a switch above the TORs at hop `k`: the hop below
    /// on the MRR's branch (it came from there), the next hop down on the NMRR's; `None`
    /// when this switch has no port for that one.
    fn branch_children(
        &self,
        path: &ControlPath,
        k: usize,
        seen: &Seen<'_>,
    ) -> Option<Vec<ChildSpec>> {
        let (hops, turn) = (path.hops(), usize::from(path.turn));
        let mut children = vec![];
        if k <= turn && k > 0 {
            children.push(ChildSpec {
                ip: Ipv4Addr::from(hops[k - 1].ip()),
                ifindex: seen.ingress,
                rank: 0,
            });
        }
        if k >= turn && k + 1 < hops.len() {
            let ip = Ipv4Addr::from(hops[k + 1].ip());
            children.push(ChildSpec {
                ip,
                ifindex: self.port_below(ip, None)?,
                rank: 0,
            });
        }
        Some(children)
    }

    /// Another branch of an installed group: its MRR (Socket mode) and children are added;
    /// it must agree on the parent.
    fn extend(
        &mut self,
        groups: &mut GroupMaps,
        c: &mut ControlPayload,
        from: KillFrom,
        parent: Option<(u32, Ipv4Addr)>,
        children: &[ChildSpec],
    ) {
        let wire_id = c.true_comm_id() & 0x00ff_ffff;
        let Some(inst) = self.installed.get_mut(&wire_id) else {
            return;
        };
        if inst.parent != parent.map(|(port, _)| port) {
            warn!(
                group = format_args!("{wire_id:#08x}"),
                "a notify names another parent than the group's: refused"
            );
            self.refuse(c, FAIL_REFUSED);
            return;
        }
        if !inst.mrrs.contains(&from) {
            inst.mrrs.push(from);
        }
        let new: Vec<ChildSpec> = children
            .iter()
            .filter(|c| !inst.children.iter().any(|(ip, _)| *ip == c.ip))
            .copied()
            .collect();
        if new.is_empty() {
            return;
        }
        match groups.add_children(wire_id, &new) {
            Ok(_) => inst.children.extend(new.iter().map(|c| (c.ip, c.ifindex))),
            Err(e) => {
                warn!(group = format_args!("{wire_id:#08x}"), error = %e, "adding a branch's children failed");
                self.refuse(c, FAIL_REFUSED);
            }
        }
    }

    /// Writes refusal `cause` into the notify (the worst cause wins) and counts it.
    fn refuse(&mut self, c: &mut ControlPayload, cause: u8) {
        let counter = match cause {
            FAIL_NO_ROUTE => &mut self.stats.no_route,
            FAIL_CAPACITY => &mut self.stats.refused_capacity,
            FAIL_PORT_CONFLICT => &mut self.stats.refused_port_conflict,
            _ => &mut self.stats.refused_invalid,
        };
        *counter += 1;
        c.fail_cause = c.fail_cause.max(cause);
    }

    /// Where a notify or kill at hop `k` goes next: up the MRR's branch, down the NMRR's,
    /// or (at the NMRR's TOR) to the NMRR. `installed`: the group's ports here, for a kill
    /// whose bindings may have expired. `None`: no port towards the next hop.
    fn next_hop(
        &self,
        path: &ControlPath,
        k: usize,
        installed: Option<&Installed>,
    ) -> Option<Route> {
        let (hops, turn) = (path.hops(), usize::from(path.turn));
        let Some(next) = hops.get(k + 1) else {
            return Some(Route::Below);
        };
        let ip = Ipv4Addr::from(next.ip());
        if k < turn {
            return self
                .above
                .get(&ip)
                .copied()
                .or_else(|| installed.and_then(|i| i.parent))
                .map(Route::Port);
        }
        self.port_below(ip, installed).map(Route::Port)
    }

    /// The port a lower switch (or host) `ip` sits behind.
    fn port_below(&self, ip: Ipv4Addr, installed: Option<&Installed>) -> Option<u32> {
        self.bound
            .get(&ip)
            .map(|(port, _)| *port)
            .or_else(|| self.hosts_below.get(&ip).copied())
            .or_else(|| installed.and_then(|i| i.children.iter().find(|c| c.0 == ip).map(|c| c.1)))
    }

    /// A kill from the group's MRR, on the port its notify came in on, frees it; from anyone
    /// else, or another port, it is ignored and counted. It follows its notify's path.
    fn on_kill(
        &mut self,
        opts: &DaemonOptions,
        groups: &mut GroupMaps,
        seen: &Seen<'_>,
        c: ControlPayload,
    ) -> Option<(ControlPayload, Route)> {
        let src = seen.src();
        let comm = c.true_comm_id();
        let wire_id = comm & 0x00ff_ffff;
        let mut freed = None;
        match self.installed.get(&wire_id) {
            Some(inst) if inst.mrrs.contains(&(src, seen.ingress)) => {
                let _ = groups.remove(wire_id);
                freed = self.installed.remove(&wire_id);
                self.pending.remove(&comm);
                self.queried.remove(&comm);
                self.queried_order.retain(|q| *q != comm);
                self.conflicted.remove(&comm);
                self.stats.groups_killed += 1;
                self.free = None;
                info!(group = format_args!("{wire_id:#08x}"), "killed by its MRR");
            }
            Some(inst) if inst.mrrs.iter().any(|(ip, _)| *ip == src) => {
                self.stats.refused_wrong_port += 1;
                warn!(group = format_args!("{wire_id:#08x}"), from = %src, port = seen.ingress, mrrs = ?inst.mrrs, "kill with the MRR's address on another port than its notify's: ignored");
                return None;
            }
            Some(inst) => {
                self.stats.refused_not_mrr += 1;
                warn!(group = format_args!("{wire_id:#08x}"), from = %src, mrrs = ?inst.mrrs, "kill from a host that is not one of the group's MRRs: ignored");
                return None;
            }
            None => {}
        }
        let Some(k) = c.path.position(u32::from(opts.ip)) else {
            return off_path(opts, seen, c);
        };
        let Some(route) = self.next_hop(&c.path, k, freed.as_ref()) else {
            self.stats.no_route += 1;
            debug!(
                group = format_args!("{wire_id:#08x}"),
                "kill names a next switch this one has no port for: dropped"
            );
            return None;
        };
        Some((c, route))
    }

    /// A query or climb on its way up: checks its port, remembers the group and its MRR
    /// `mrr` and the port of the host that sent it; returns this switch's free capacity, or
    /// `None` when the packet is refused.
    fn up_from_below(
        &mut self,
        opts: &DaemonOptions,
        groups: &GroupMaps,
        seen: &Seen<'_>,
        c: &ControlPayload,
        mrr: Ipv4Addr,
    ) -> Option<u32> {
        if !self.came_from_below(opts, seen, c) {
            return None;
        }
        let comm = c.true_comm_id();
        self.bound_queried(comm);
        self.add_mrr(comm, mrr);
        self.learn_host(seen.src(), seen.ingress);
        Some(self.free_capacity(groups))
    }

    /// Whether a query or climb from below comes on the port its sender is bound to: the
    /// host on a TOR, the switch below (its last hop) above the TORs. A conflict marks the
    /// group ([`FAIL_PORT_CONFLICT`]).
    fn came_from_below(
        &mut self,
        opts: &DaemonOptions,
        seen: &Seen<'_>,
        c: &ControlPayload,
    ) -> bool {
        let sender = match opts.role {
            Role::Tor => Some(seen.src()),
            Role::Spine => c
                .path
                .hops()
                .last()
                .map(PathHop::ip)
                .or((c.tor1_ip() != 0).then(|| c.tor1_ip()))
                .map(Ipv4Addr::from),
        };
        if let Some(addr) = sender
            && !self.on_its_port(addr, seen.ingress)
        {
            self.conflicted.insert(c.true_comm_id());
            return false;
        }
        true
    }

    /// Appends this switch to a query's or climb's path; `false` (counted) when it is full.
    fn append(&mut self, opts: &DaemonOptions, path: &mut ControlPath, free: u32) -> bool {
        let own = u32::from(opts.ip);
        if path.push(PathHop::seen(own, free, opts.uplinks.len())) {
            return true;
        }
        self.stats.paths_full += 1;
        warn!(
            hops = path.n_hops,
            "a path is full: the fabric is deeper than innet's control path holds"
        );
        false
    }

    /// Down towards `host`: the port its queries or climbs came up on, else the bridge's.
    fn down_to(&self, host: Ipv4Addr) -> Route {
        self.hosts_below
            .get(&host)
            .map_or(Route::Below, |p| Route::Port(*p))
    }

    /// Groups this switch can still take. Read from the maps at most every
    /// [`FREE_CAPACITY_TTL`] (a burst of queries must not walk the group map each), and again
    /// after this daemon installed or freed one.
    fn free_capacity(&mut self, groups: &GroupMaps) -> u32 {
        if let Some((at, free)) = self.free
            && at.elapsed() < FREE_CAPACITY_TTL
        {
            return free;
        }
        let used = groups.list().map_or(0, |g| g.len() as u32);
        let free = groups.capacity().saturating_sub(used);
        self.free = Some((Instant::now(), free));
        free
    }

    fn learn_host(&mut self, host: Ipv4Addr, port: u32) {
        if self.hosts_below.len() >= MAX_BOUND_ADDRESSES && !self.hosts_below.contains_key(&host) {
            self.hosts_below.clear();
        }
        self.hosts_below.insert(host, port);
    }

    fn add_mrr(&mut self, comm: u32, mrr: Ipv4Addr) {
        let mrrs = self.queried.entry(comm).or_default();
        if !mrrs.contains(&mrr) && mrrs.len() < MAX_PENDING_MEMBERS {
            mrrs.push(mrr);
        }
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
}

/// Intersects a query's capabilities with this switch's.
fn intersect(opts: &DaemonOptions, c: &mut ControlPayload) {
    let caps = opts.capabilities;
    c.set_sup_allreduce_op(c.sup_allreduce_op() & caps.ops);
    c.set_sup_data_type(c.sup_data_type() & caps.dtypes);
    c.set_sup_max_data_size(c.sup_max_data_size().min(caps.max_data_size));
    c.set_sup_window(c.sup_window().min(caps.window));
}

/// A notify or kill not for this switch (no path, or a path without it): on towards the
/// NMRR along the bridge, unless it came down an uplink to a TOR the NMRR is not under.
fn off_path(
    opts: &DaemonOptions,
    seen: &Seen<'_>,
    c: ControlPayload,
) -> Option<(ControlPayload, Route)> {
    match (opts.role, seen.from_uplink, seen.dst_is_local) {
        (Role::Tor, true, false) => None,
        _ => Some((c, Route::Path)),
    }
}

fn netdev_mac(ifindex: u32) -> [u8; 6] {
    netdev::ifname(ifindex)
        .and_then(|n| netdev::mac(&n).ok())
        .unwrap_or([0; 6])
}
