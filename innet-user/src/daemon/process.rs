//! What a switch does to a control packet on its way through, at any level of the fabric:
//! a query collects capabilities, addresses and free capacity on its way up; a climb shows
//! the MRR its ways up; a notify installs the group on the switches of the path the MRR
//! chose; a kill frees it there.

use std::{
    collections::{HashMap, VecDeque, hash_map::Entry},
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

/// Groups whose queries a daemon remembers before their notify. Each port below gets an equal
/// share; a port that holds its share forgets its own oldest set-up (whose notify is then
/// refused as not from the MRR, and that job falls back), never another port's.
pub const MAX_QUERIED: usize = 4096;
/// Members a daemon remembers per queried group.
const MAX_PENDING_MEMBERS: usize = 256;
/// Members a daemon remembers per queried group and port below: a host has a leader per
/// CPU socket. Attack: one port's spoofed addresses fill a set-up's members before the
/// job's own queries arrive.
const MAX_PENDING_PER_PORT: usize = 8;
/// Addresses a daemon binds to the port they were first seen on (each port below gets an
/// equal share), and hosts and upper switches it remembers a port for.
const MAX_BOUND_ADDRESSES: usize = 1 << 16;
/// How long a binding outlives its address's last accepted control packet: longer than
/// any set-up, short enough that a host that moved (or an impostor that went quiet) does
/// not lock the address out.
pub const BINDING_TTL: Duration = Duration::from_mins(1);
/// A full binding or host table is swept for expired entries at most this often: a table
/// filled by a flood must not make every control packet scan it.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// The wire group id (low 24 bits) of a `true_comm_id`: what data packets carry, so what
/// authority over a group is decided on.
fn wire(comm: u32) -> u32 {
    comm & 0x00ff_ffff
}

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
    /// The `true_comm_id` it was installed under (`None`: recovered from the pinned group,
    /// which keeps only the wire id).
    comm: Option<u32>,
    /// Its MRRs, each with the port its notifies came in on (its kill must come the same way).
    mrrs: Vec<KillFrom>,
    /// The port towards its parent (`None` at the root).
    parent: Option<u32>,
    /// Its children and their ports.
    children: Vec<(Ipv4Addr, u32)>,
    /// The port below whose share of the switch's groups it counts against (`None`:
    /// installed from above, charged where it came up).
    charged: Option<u32>,
}

/// A group being set up, as its queries and climbs told this switch (by wire id).
#[derive(Clone, Debug)]
struct Setup {
    /// The `true_comm_id` of its first query or climb: another under the same wire id is
    /// refused.
    comm: u32,
    /// The port whose share of remembered set-ups it counts against (its first packet's).
    port: u32,
    /// Its MRRs: the hosts its queries were addressed to and its climbs came from. Only they
    /// may notify. Node mode has one; Socket mode one per CPU socket of the first node.
    mrrs: Vec<Ipv4Addr>,
    /// TOR: its members under this switch, from queries (and the MRR's notify), each with
    /// the set-up key its query carried.
    members: Vec<Pending>,
    /// A member address came in on two ports: its notify is answered with
    /// [`FAIL_PORT_CONFLICT`].
    conflicted: bool,
}

/// A host that queried for a group being set up, and the set-up key its query carried: it
/// becomes a member only if the MRR's notify carries the same key.
#[derive(Clone, Copy, Debug)]
struct Pending {
    child: ChildSpec,
    key: u64,
}

/// The port a host (or lower switch) sits behind, learned from its queries and climbs.
#[derive(Clone, Copy, Debug)]
struct HostPort {
    port: u32,
    /// When it was last seen there (or, contested, seen on another port).
    at: Instant,
    /// Seen on two ports below within [`BINDING_TTL`]: not used (frames for it go down every
    /// port below, where only its own TOR passes them on).
    contested: bool,
}

/// How an address's control packet fares against the port it is bound to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bind {
    Ok,
    /// Bound to another port.
    OtherPort,
    /// Its port binds its share of addresses already.
    PortFull,
}

/// What the daemon learns from control packets: groups in set-up and their members, on
/// which port hosts and the switches above are, and each installed group's MRR.
#[derive(Default)]
pub struct Registry {
    /// Groups queried (per wire id), installed or not (yet).
    setups: HashMap<u32, Setup>,
    /// Per port below, the set-ups it brought that were not installed (yet), oldest first:
    /// each port remembers at most its share of `MAX_QUERIED`, so a flood of queries from
    /// one port can neither grow the daemon nor flush the set-ups of the others.
    setup_order: HashMap<u32, VecDeque<u32>>,
    /// The uplink towards each switch above, learned from climbs coming back down.
    above: HashMap<Ipv4Addr, u32>,
    /// The port each host's queries and climbs came up on: where frames for it go down.
    hosts_below: HashMap<Ipv4Addr, HostPort>,
    /// Every group this daemon installed (wire group id).
    installed: HashMap<u32, Installed>,
    /// The port each host (TOR) or lower switch (above the TORs) address first sent a
    /// control packet on: its later control packets are accepted on that port only.
    bound: HashMap<Ipv4Addr, (u32, Instant)>,
    /// Addresses bound per port.
    bound_per_port: HashMap<u32, usize>,
    /// Bindings made, moved (`Some(port)`) or expired (`None`) since the daemon last took
    /// them for the data path's copy (`HOST_PORTS`).
    binding_changes: Vec<(Ipv4Addr, Option<u32>)>,
    /// When a full table may be swept again.
    next_sweep: Option<Instant>,
    /// Ports below (not uplinks), among which the quotas are shared.
    below_ports: usize,
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

/// The group table a daemon installs into: [`GroupMaps`] on a switch, an in-memory table in
/// the tests (so every handler runs without BPF maps or sockets).
pub trait Table {
    /// Marks `wire_id` as being set up (see [`GroupMaps::mark_setting_up`]).
    fn mark_setting_up(&mut self, wire_id: u32);
    /// See [`GroupMaps::install_expecting`].
    ///
    /// # Errors
    /// As [`GroupMaps::install_expecting`].
    fn install_expecting(&mut self, spec: &GroupSpec, expected: usize)
    -> crate::error::Result<u32>;
    /// See [`GroupMaps::add_children`].
    ///
    /// # Errors
    /// As [`GroupMaps::add_children`].
    fn add_children(&mut self, id: u32, children: &[ChildSpec]) -> crate::error::Result<usize>;
    /// See [`GroupMaps::remove`].
    ///
    /// # Errors
    /// No such group.
    fn remove(&mut self, id: u32) -> crate::error::Result<()>;
    /// Groups installed now.
    fn used(&self) -> u32;
    /// Groups this switch can hold.
    fn capacity(&self) -> u32;
}

impl Table for GroupMaps {
    fn mark_setting_up(&mut self, wire_id: u32) {
        let _ = GroupMaps::mark_setting_up(self, wire_id);
    }
    fn install_expecting(
        &mut self,
        spec: &GroupSpec,
        expected: usize,
    ) -> crate::error::Result<u32> {
        GroupMaps::install_expecting(self, spec, expected)
    }
    fn add_children(&mut self, id: u32, children: &[ChildSpec]) -> crate::error::Result<usize> {
        GroupMaps::add_children(self, id, children)
    }
    fn remove(&mut self, id: u32) -> crate::error::Result<()> {
        GroupMaps::remove(self, id)
    }
    fn used(&self) -> u32 {
        self.list().map_or(0, |g| g.len() as u32)
    }
    fn capacity(&self) -> u32 {
        GroupMaps::capacity(self)
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
            // Charged to the MRR's port when it is a child here (a host port on its TOR).
            let charged = children.iter().find(|c| c.0 == mrr).map(|c| c.1);
            let mrrs = ports.into_iter().map(|p| (mrr, p)).collect();
            r.installed.insert(
                g.id,
                Installed {
                    comm: None,
                    mrrs,
                    parent,
                    children,
                    charged,
                },
            );
        }
        r
    }

    /// Frees a group the control plane installed (idle collection).
    pub fn forget(&mut self, wire_id: u32) {
        self.installed.remove(&wire_id);
        self.free = None;
        self.drop_setup(wire_id);
    }

    /// Forgets the set-up of `wire_id`.
    fn drop_setup(&mut self, wire_id: u32) {
        if let Some(s) = self.setups.remove(&wire_id)
            && let Some(order) = self.setup_order.get_mut(&s.port)
        {
            order.retain(|w| *w != wire_id);
        }
    }

    /// Counts the ports below, among which the quotas are shared.
    fn ports(&mut self, opts: &DaemonOptions) {
        self.below_ports = opts.ifaces.len().saturating_sub(opts.uplinks.len()).max(1);
    }

    /// Each port's share of the remembered set-ups.
    fn setup_share(&self) -> usize {
        (MAX_QUERIED / self.below_ports.max(1)).max(1)
    }

    /// The bindings made, moved (`Some(port)`) or expired (`None`) since the last call, for
    /// the data path's copy ([`crate::host_ports`]).
    pub fn take_binding_changes(&mut self) -> Vec<(Ipv4Addr, Option<u32>)> {
        std::mem::take(&mut self.binding_changes)
    }

    /// Each port's share of the bound addresses.
    fn binding_share(&self) -> usize {
        (MAX_BOUND_ADDRESSES / self.below_ports.max(1)).max(1)
    }

    /// Each port's share of the switch's `capacity` groups: its fair share, but at least a
    /// quarter of them (a switch with many ports still serves a host with several jobs).
    fn group_share(&self, capacity: u32) -> usize {
        let capacity = capacity as usize;
        (capacity / self.below_ports.max(1))
            .max(capacity / 4)
            .max(1)
    }

    /// Whether `addr` may send control packets on `port`: an address is bound to the port
    /// it is first seen on (each port binds up to its share of [`MAX_BOUND_ADDRESSES`]);
    /// another port is refused and counted.
    fn on_its_port(&mut self, addr: Ipv4Addr, port: u32) -> Bind {
        let now = Instant::now();
        let share = self.binding_share();
        let held = |r: &Self| r.bound_per_port.get(&port).copied().unwrap_or(0);
        if self.bound.len() >= MAX_BOUND_ADDRESSES || held(self) >= share {
            self.sweep(now);
        }
        let room = self.bound.len() < MAX_BOUND_ADDRESSES;
        let full = held(self) >= share;
        match self.bound.entry(addr) {
            Entry::Occupied(e) if e.get().0 != port && now - e.get().1 < BINDING_TTL => {
                self.stats.refused_wrong_port += 1;
                warn!(from = %addr, port, bound_to = e.get().0, "control packet from an address bound to another port: refused");
                Bind::OtherPort
            }
            // An expired binding taken over by a port that binds its share already.
            Entry::Occupied(e) if e.get().0 != port && full => self.refuse_binding(addr, port),
            Entry::Occupied(mut e) => {
                let before = e.get().0;
                *e.get_mut() = (port, now);
                if before != port {
                    dec(&mut self.bound_per_port, before);
                    *self.bound_per_port.entry(port).or_default() += 1;
                    self.binding_changes.push((addr, Some(port)));
                }
                Bind::Ok
            }
            Entry::Vacant(_) if full => self.refuse_binding(addr, port),
            Entry::Vacant(e) => {
                if room {
                    e.insert((port, now));
                    *self.bound_per_port.entry(port).or_default() += 1;
                    self.binding_changes.push((addr, Some(port)));
                }
                Bind::Ok
            }
        }
    }

    /// A new address on a port that binds its share already: refused and counted. Stops a
    /// flood of spoofed source addresses from one port filling the table for every port.
    fn refuse_binding(&mut self, addr: Ipv4Addr, port: u32) -> Bind {
        self.stats.refused_port_bindings += 1;
        self.stats.refused_wrong_port += 1;
        debug!(from = %addr, port, "control packet from a new address on a port that binds its share of addresses: refused");
        Bind::PortFull
    }

    /// Forgets expired bindings and host ports, at most once per [`SWEEP_EVERY`]: a table
    /// filled by a flood is not scanned again on every control packet.
    fn sweep(&mut self, now: Instant) {
        if self.next_sweep.is_some_and(|t| now < t) {
            return;
        }
        self.next_sweep = Some(now + SWEEP_EVERY);
        self.stats.table_sweeps += 1;
        let (per_port, changes) = (&mut self.bound_per_port, &mut self.binding_changes);
        self.bound.retain(|addr, (port, last)| {
            let keep = now - *last < BINDING_TTL;
            if !keep {
                dec(per_port, *port);
                changes.push((*addr, None));
            }
            keep
        });
        let bound = &self.bound;
        let changes = &mut self.binding_changes;
        self.hosts_below.retain(|host, h| {
            let keep = now - h.at < BINDING_TTL;
            if !keep && !bound.contains_key(host) {
                changes.push((*host, None));
            }
            keep
        });
    }

    /// The control payload to forward and its route, or `None` to consume the packet.
    pub fn process(
        &mut self,
        opts: &DaemonOptions,
        groups: &mut impl Table,
        seen: &Seen<'_>,
    ) -> Option<(ControlPayload, Route)> {
        let p = seen.parsed;
        let Verdict::Control(kind) = p.verdict else {
            return None;
        };
        self.ports(opts);
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
        groups: &mut impl Table,
        seen: &Seen<'_>,
        mut c: ControlPayload,
    ) -> Option<(ControlPayload, Route)> {
        let own = u32::from(opts.ip);
        let comm = c.true_comm_id();
        intersect(opts, &mut c);
        if seen.from_uplink {
            // On its way down to the MRR, from a switch above (whose daemon checked it).
            groups.mark_setting_up(wire(comm));
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
                let member = ChildSpec {
                    ip: seen.src(),
                    ifindex: seen.ingress,
                    rank: c.world_rank(),
                };
                if !self.remember(wire(comm), member, c.job_id()) {
                    return None;
                }
            }
            Role::Spine => {
                c.set_spine_ip(own);
                c.set_ava_grp_num(free);
            }
        }
        if !self.append(opts, &mut c.path, free) {
            return None;
        }
        // Only now, every check passed: a refused packet must not silence the group's
        // lost notices (2 s per packet).
        groups.mark_setting_up(wire(comm));
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
        groups: &mut impl Table,
        seen: &Seen<'_>,
        mut c: ControlPayload,
    ) -> Option<(ControlPayload, Route)> {
        let comm = c.true_comm_id();
        if seen.from_uplink {
            // Back down: this switch learns the uplink of the hop above it, only from a path
            // it is on once (a TOR first). A climb pre-filled below would otherwise name a
            // switch of the sender's choosing above this one and poison the uplink map.
            let Some(up) = climb_down_hop(opts, &c.path) else {
                self.bad_path(
                    comm,
                    "a climb coming back down on a path this switch is not on once",
                );
                return None;
            };
            if self.above.len() < MAX_BOUND_ADDRESSES || self.above.contains_key(&up) {
                self.above.insert(up, seen.ingress);
            }
            groups.mark_setting_up(wire(comm));
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
        groups.mark_setting_up(wire(comm));
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
        groups: &mut impl Table,
        seen: &Seen<'_>,
        mut c: ControlPayload,
    ) -> Option<(ControlPayload, Route)> {
        let comm = c.true_comm_id();
        let wire_id = wire(comm);
        let mrr = seen.src();
        if self.clashes(comm) {
            // The wire id is set up (or installed) under another high byte: a notify under
            // any other must not reach the group (it made its sender an MRR of it).
            self.stats.refused_not_mrr += 1;
            warn!(group = format_args!("{wire_id:#08x}"), from = %mrr, "notify under another true_comm_id than the group's: ignored");
            return None;
        }
        if !self
            .setups
            .get(&wire_id)
            .is_some_and(|s| s.mrrs.contains(&mrr))
        {
            // Not from the host the group's queries went to (or no query seen at all).
            self.stats.refused_not_mrr += 1;
            warn!(group = format_args!("{wire_id:#08x}"), from = %mrr, "notify from a host that is not the group's MRR: ignored");
            return None;
        }
        let k = match on_path(opts, &c.path) {
            Ok(Some(k)) => k,
            // Not on the path the MRR chose (or it chose none: the group will not use the
            // network): pass it on towards the NMRR, installing nothing.
            Ok(None) => return off_path(opts, seen, c),
            Err(()) => {
                self.bad_path(comm, "a notify names this switch twice");
                return None;
            }
        };
        if !tree_path(opts.role, &c.path, k) {
            // A path no tree has (a TOR inside it, a parent that is not the next hop up):
            // it would install the group with a parent or children of the sender's choosing.
            self.bad_path(comm, "a notify whose path is no tree's");
            return None;
        }
        if !self.notify_port_ok(&c.path, k, seen) {
            self.stats.refused_wrong_port += 1;
            warn!(group = format_args!("{wire_id:#08x}"), from = %mrr, port = seen.ingress, "notify on a port it cannot come from: ignored");
            return None;
        }
        // Only now, every check passed (a refused notify must not silence lost notices).
        groups.mark_setting_up(wire_id);
        if self.setups.get(&wire_id).is_some_and(|s| s.conflicted) && c.fail_cause == 0 {
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

    /// Whether `comm`'s wire id is set up or installed here under another `true_comm_id`
    /// (counted).
    fn clashes(&mut self, comm: u32) -> bool {
        let w = wire(comm);
        let other = |k: u32| k != comm;
        let clash = self.setups.get(&w).is_some_and(|s| other(s.comm))
            || self
                .installed
                .get(&w)
                .is_some_and(|i| i.comm.is_some_and(other));
        if clash {
            self.stats.refused_comm_clash += 1;
        }
        clash
    }

    /// Counts a control packet refused for its path.
    fn bad_path(&mut self, comm: u32, why: &str) {
        self.stats.refused_bad_path += 1;
        self.stats.refused_invalid += 1;
        warn!(
            group = format_args!("{:#08x}", wire(comm)),
            "{why}: refused"
        );
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
            return !seen.from_uplink && self.on_its_port(sender, seen.ingress) == Bind::Ok;
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
            let key = c.job_id();
            if k == 0 {
                // The MRR's TOR: the MRR is a member here too.
                self.remember(
                    wire(comm),
                    ChildSpec {
                        ip: seen.src(),
                        ifindex: seen.ingress,
                        rank: 0,
                    },
                    key,
                );
            }
            return Ok(self.keyed_members(wire(comm), key));
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
        groups: &mut impl Table,
        c: &mut ControlPayload,
        seen: &Seen<'_>,
        k: usize,
    ) {
        let comm = c.true_comm_id();
        let wire_id = wire(comm);
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
        // Charged to the port below it came up through (one from above was charged below).
        let charged = (!seen.from_uplink).then_some(seen.ingress);
        if let Some(port) = charged {
            let share = self.group_share(groups.capacity());
            let held = self
                .installed
                .values()
                .filter(|i| i.charged == Some(port))
                .count();
            if held >= share {
                // One host port installing groups of its own must leave the other ports'
                // set-ups their share of the switch.
                self.stats.refused_port_groups += 1;
                self.refuse(c, FAIL_CAPACITY);
                warn!(
                    group = format_args!("{wire_id:#08x}"),
                    port, held, share, "a port holds its share of the switch's groups: refused"
                );
                return;
            }
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
                        comm: Some(comm),
                        mrrs: vec![(mrr, seen.ingress)],
                        parent: parent.map(|(port, _)| port),
                        children: children.iter().map(|c| (c.ip, c.ifindex)).collect(),
                        charged,
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
    /// it must come in on one of the group's ports and agree on the parent. Nothing is added
    /// (the MRR least of all) unless every check passed.
    fn extend(
        &mut self,
        groups: &mut impl Table,
        c: &mut ControlPayload,
        from: KillFrom,
        parent: Option<(u32, Ipv4Addr)>,
        children: &[ChildSpec],
    ) {
        let wire_id = wire(c.true_comm_id());
        let Some(inst) = self.installed.get(&wire_id) else {
            return;
        };
        let port = from.1;
        if inst.parent != Some(port) && !inst.children.iter().any(|(_, p)| *p == port) {
            // Only the group's own set-up extends it: its branches come in on a port it has
            // here. An attacker's notify from its own port would make it an MRR, whose kill
            // then frees the group.
            self.stats.refused_not_group_port += 1;
            warn!(group = format_args!("{wire_id:#08x}"), from = %from.0, port, "a notify adding a branch on a port that is none of the group's: refused");
            self.refuse(c, FAIL_REFUSED);
            return;
        }
        if inst.parent != parent.map(|(port, _)| port) {
            warn!(
                group = format_args!("{wire_id:#08x}"),
                "a notify names another parent than the group's: refused"
            );
            self.refuse(c, FAIL_REFUSED);
            return;
        }
        let new: Vec<ChildSpec> = children
            .iter()
            .filter(|c| !inst.children.iter().any(|(ip, _)| *ip == c.ip))
            .copied()
            .collect();
        if !new.is_empty()
            && let Err(e) = groups.add_children(wire_id, &new)
        {
            warn!(group = format_args!("{wire_id:#08x}"), error = %e, "adding a branch's children failed");
            self.refuse(c, FAIL_REFUSED);
            return;
        }
        let Some(inst) = self.installed.get_mut(&wire_id) else {
            return;
        };
        inst.children.extend(new.iter().map(|c| (c.ip, c.ifindex)));
        if !inst.mrrs.contains(&from) {
            inst.mrrs.push(from);
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
            .or_else(|| self.host_port(ip))
            .or_else(|| installed.and_then(|i| i.children.iter().find(|c| c.0 == ip).map(|c| c.1)))
    }

    /// A kill from the group's MRR, on the port its notify came in on, frees it; from anyone
    /// else, or another port, it is ignored and counted. It follows its notify's path.
    fn on_kill(
        &mut self,
        opts: &DaemonOptions,
        groups: &mut impl Table,
        seen: &Seen<'_>,
        c: ControlPayload,
    ) -> Option<(ControlPayload, Route)> {
        let src = seen.src();
        let comm = c.true_comm_id();
        let wire_id = wire(comm);
        let mut freed = None;
        let clash = self
            .installed
            .get(&wire_id)
            .is_some_and(|i| i.comm.is_some_and(|k| k != comm));
        match self.installed.get(&wire_id) {
            Some(inst) if inst.mrrs.contains(&(src, seen.ingress)) && !clash => {
                let _ = groups.remove(wire_id);
                freed = self.installed.remove(&wire_id);
                self.drop_setup(wire_id);
                self.stats.groups_killed += 1;
                self.free = None;
                info!(group = format_args!("{wire_id:#08x}"), "killed by its MRR");
            }
            Some(inst)
                if inst.mrrs.iter().any(|(ip, _)| *ip == src)
                    && !inst.mrrs.contains(&(src, seen.ingress)) =>
            {
                self.stats.refused_wrong_port += 1;
                warn!(group = format_args!("{wire_id:#08x}"), from = %src, port = seen.ingress, mrrs = ?inst.mrrs, "kill with the MRR's address on another port than its notify's: ignored");
                return None;
            }
            Some(_) if clash => {
                // Authority is the wire id's: a kill under another high byte is not the
                // group's, whoever sends it.
                self.stats.refused_comm_clash += 1;
                self.stats.refused_not_mrr += 1;
                warn!(group = format_args!("{wire_id:#08x}"), from = %src, "kill under another true_comm_id than the group's: ignored");
                return None;
            }
            Some(inst) => {
                self.stats.refused_not_mrr += 1;
                warn!(group = format_args!("{wire_id:#08x}"), from = %src, mrrs = ?inst.mrrs, "kill from a host that is not one of the group's MRRs: ignored");
                return None;
            }
            None => {}
        }
        let k = match on_path(opts, &c.path) {
            Ok(Some(k)) if tree_path(opts.role, &c.path, k) => k,
            Ok(None) => return off_path(opts, seen, c),
            _ => {
                // A kill is routed along its path: one no tree has goes nowhere.
                self.bad_path(comm, "a kill whose path is no tree's");
                return None;
            }
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

    /// A query or climb on its way up: checks its path and port, remembers the group and
    /// its MRR `mrr` and the port of the host that sent it; returns this switch's free
    /// capacity, or `None` when the packet is refused.
    fn up_from_below(
        &mut self,
        opts: &DaemonOptions,
        groups: &impl Table,
        seen: &Seen<'_>,
        c: &ControlPayload,
        mrr: Ipv4Addr,
    ) -> Option<u32> {
        let comm = c.true_comm_id();
        if !path_from_below(opts, &c.path) {
            // A host's query or climb with a pre-filled path (or one that names this switch
            // already) would come back down with a hop above of the sender's choosing.
            self.bad_path(
                comm,
                "a query or climb from below with a path no switch below wrote",
            );
            return None;
        }
        if !self.came_from_below(opts, seen, c) {
            return None;
        }
        if !self.admit_setup(comm, seen.ingress) {
            return None;
        }
        self.add_mrr(wire(comm), mrr);
        // A TOR's data path knows its hosts from `bound`; above, from where they came up.
        self.learn_host(seen.src(), seen.ingress, opts.role != Role::Tor);
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
        let Some(addr) = sender else {
            return true;
        };
        match self.on_its_port(addr, seen.ingress) {
            Bind::Ok => true,
            Bind::OtherPort => {
                // Remembered like any set-up (within the port's share), so the mark is
                // bounded too.
                if self.admit_setup(c.true_comm_id(), seen.ingress)
                    && let Some(s) = self.setups.get_mut(&wire(c.true_comm_id()))
                {
                    s.conflicted = true;
                }
                false
            }
            Bind::PortFull => false,
        }
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
        self.host_port(host).map_or(Route::Below, Route::Port)
    }

    /// The port `host`'s queries and climbs came up on, unless contested.
    fn host_port(&self, host: Ipv4Addr) -> Option<u32> {
        self.hosts_below
            .get(&host)
            .filter(|h| !h.contested)
            .map(|h| h.port)
    }

    /// Groups this switch can still take. Read from the maps at most every
    /// [`FREE_CAPACITY_TTL`] (a burst of queries must not walk the group map each), and again
    /// after this daemon installed or freed one.
    fn free_capacity(&mut self, groups: &impl Table) -> u32 {
        if let Some((at, free)) = self.free
            && at.elapsed() < FREE_CAPACITY_TTL
        {
            return free;
        }
        let used = groups.used();
        let free = groups.capacity().saturating_sub(used);
        self.free = Some((Instant::now(), free));
        free
    }

    /// Learns the port `host` sits behind. The same host seen on two ports below within
    /// [`BINDING_TTL`] (above the TORs a host address is not bound: a spoofed query from
    /// another TOR carries it) is contested: its port is forgotten, and frames for it go down
    /// every port below (its own TOR passes them on) rather than to the spoofer's.
    /// `mirror`: hand what is learned to the data path's bindings too (above the TORs).
    fn learn_host(&mut self, host: Ipv4Addr, port: u32, mirror: bool) {
        let now = Instant::now();
        if self.hosts_below.len() >= MAX_BOUND_ADDRESSES && !self.hosts_below.contains_key(&host) {
            self.sweep(now);
        }
        let room = self.hosts_below.len() < MAX_BOUND_ADDRESSES;
        match self.hosts_below.entry(host) {
            Entry::Occupied(mut e) => {
                let h = e.get_mut();
                let fresh = now - h.at < BINDING_TTL;
                if h.port != port && fresh {
                    if !h.contested {
                        self.stats.host_port_contested += 1;
                        warn!(%host, port, before = h.port, "a host address came up on two ports below: its port is forgotten");
                        if mirror {
                            self.binding_changes.push((host, None));
                        }
                    }
                    h.contested = true;
                    h.at = now;
                } else if !(h.contested && fresh) {
                    if mirror && (h.port != port || h.contested) {
                        self.binding_changes.push((host, Some(port)));
                    }
                    *h = HostPort {
                        port,
                        at: now,
                        contested: false,
                    };
                }
            }
            Entry::Vacant(e) if room => {
                e.insert(HostPort {
                    port,
                    at: now,
                    contested: false,
                });
                if mirror {
                    self.binding_changes.push((host, Some(port)));
                }
            }
            // Full: not learned; frames for it go down every port below.
            Entry::Vacant(_) => {}
        }
    }

    /// Adds `mrr` to the MRRs of set-up `wire_id`, unless the group is installed: every
    /// query of a set-up comes before its first notify, so a new MRR after it is none.
    fn add_mrr(&mut self, wire_id: u32, mrr: Ipv4Addr) {
        if self.installed.contains_key(&wire_id) {
            return;
        }
        if let Some(s) = self.setups.get_mut(&wire_id)
            && !s.mrrs.contains(&mrr)
            && s.mrrs.len() < MAX_PENDING_MEMBERS
        {
            s.mrrs.push(mrr);
        }
    }

    /// Whether a query or climb for `comm` from `port` may go on: its wire id must not be
    /// set up or installed under another `true_comm_id` (then the set-up that is not
    /// installed is marked conflicted: two set-ups cannot share a wire id). A new set-up is
    /// remembered against `port`'s share; a port holding its share forgets its own oldest.
    fn admit_setup(&mut self, comm: u32, port: u32) -> bool {
        let w = wire(comm);
        if self.clashes(comm) {
            // An attacker's query for the victim's wire id under another high byte made it
            // an MRR of the victim's group.
            self.stats.refused_not_mrr += 1;
            if !self.installed.contains_key(&w)
                && let Some(s) = self.setups.get_mut(&w)
            {
                s.conflicted = true;
            }
            warn!(
                group = format_args!("{w:#08x}"),
                port, "a set-up under another true_comm_id than the wire id's: refused"
            );
            return false;
        }
        if self.setups.contains_key(&w) {
            return true;
        }
        let share = self.setup_share();
        let order = self.setup_order.entry(port).or_default();
        let mut forgotten = vec![];
        while order.len() >= share {
            let Some(old) = order.pop_front() else {
                break;
            };
            forgotten.push(old);
        }
        order.push_back(w);
        for old in forgotten {
            if !self.installed.contains_key(&old) {
                self.setups.remove(&old);
                self.stats.queries_forgotten += 1;
                self.stats.port_setups_forgotten += 1;
            }
        }
        self.setups.insert(
            w,
            Setup {
                comm,
                port,
                mrrs: vec![],
                members: vec![],
                conflicted: false,
            },
        );
        true
    }

    /// Adds `child`, whose query carried set-up key `key`, to the members of set-up
    /// `wire_id`; `false` (counted) for a new member of a group installed already (its
    /// queries came after the group's notify, so it is no member the MRR counted) or one
    /// past its port's share of the set-up's members.
    fn remember(&mut self, wire_id: u32, child: ChildSpec, key: u64) -> bool {
        let installed = self.installed.contains_key(&wire_id);
        let Some(s) = self.setups.get_mut(&wire_id) else {
            return true;
        };
        if s.members.iter().any(|m| m.child.ip == child.ip) {
            return true;
        }
        let on_port = s
            .members
            .iter()
            .filter(|m| m.child.ifindex == child.ifindex)
            .count();
        if installed || on_port >= MAX_PENDING_PER_PORT {
            self.stats.refused_extra_members += 1;
            self.stats.refused_not_mrr += 1;
            warn!(group = format_args!("{wire_id:#08x}"), from = %child.ip, installed, on_port, "a new member's query for an installed group or past its port's share: refused");
            return false;
        }
        if s.members.len() < MAX_PENDING_MEMBERS {
            s.members.push(Pending { child, key });
        }
        true
    }

    /// The members of set-up `wire_id` whose queries carried the notify's set-up `key`;
    /// the others are counted and left out. Attack: a host outside the job that knows the
    /// wire id (every data packet shows it) queries under it before the job's notify comes;
    /// without the key, which only the job's members know, it stays out of the group.
    /// Not checked against the path's count of children: in Socket mode several MRRs each
    /// name only their own leaders under a TOR that holds all of them.
    fn keyed_members(&mut self, wire_id: u32, key: u64) -> Vec<ChildSpec> {
        let Some(s) = self.setups.get(&wire_id) else {
            return vec![];
        };
        let (keyed, strangers): (Vec<&Pending>, Vec<&Pending>) =
            s.members.iter().partition(|m| m.key == key);
        for m in &strangers {
            warn!(group = format_args!("{wire_id:#08x}"), from = %m.child.ip, "a query without the group's set-up key: not made a member");
        }
        self.stats.refused_wrong_key += strangers.len() as u64;
        keyed.into_iter().map(|m| m.child).collect()
    }
}

/// Takes one from the count of `port`.
fn dec(counts: &mut HashMap<u32, usize>, port: u32) {
    if let Entry::Occupied(mut e) = counts.entry(port) {
        *e.get_mut() = e.get().saturating_sub(1);
        if *e.get() == 0 {
            e.remove();
        }
    }
}

/// Whether no switch appears twice on `hops`.
fn distinct(hops: &[PathHop]) -> bool {
    hops.iter()
        .enumerate()
        .all(|(i, h)| !hops[..i].iter().any(|g| g.ip() == h.ip()))
}

/// Where this switch sits on a notify's or kill's path: `Ok(None)` when it is not on it,
/// `Err` when it is on it twice.
fn on_path(opts: &DaemonOptions, path: &ControlPath) -> Result<Option<usize>, ()> {
    let own = u32::from(opts.ip);
    let mut at = path
        .hops()
        .iter()
        .enumerate()
        .filter(|(_, h)| h.ip() == own);
    match (at.next(), at.next()) {
        (None, _) => Ok(None),
        (Some((k, _)), None) => Ok(Some(k)),
        (Some(_), Some(_)) => Err(()),
    }
}

/// Whether a notify's or kill's path, with this switch at hop `k`, is one a tree has: up the
/// MRR's branch to `turn` and down as many hops (`2·turn + 1`), no switch twice, TORs at its
/// ends and only there, and each hop's parent the next hop up (`hops[k + 1]` below the turn,
/// `hops[k - 1]` past it; the turn's is above the path, or 0 at the root).
fn tree_path(role: Role, path: &ControlPath, k: usize) -> bool {
    let hops = path.hops();
    let (n, turn) = (hops.len(), usize::from(path.turn));
    if n != 2 * turn + 1 || k >= n || !distinct(hops) {
        return false;
    }
    if (role == Role::Tor) != (k == 0 || k == n - 1) {
        return false;
    }
    let parent = hops[k].parent();
    match k.cmp(&turn) {
        std::cmp::Ordering::Less => parent == hops[k + 1].ip(),
        std::cmp::Ordering::Greater => parent == hops[k - 1].ip(),
        std::cmp::Ordering::Equal => !hops.iter().any(|h| h.ip() == parent),
    }
}

/// Whether a query's or climb's path can come from below: a host sends it empty (a TOR is
/// its first hop); above the TORs it holds the switches below and not this one.
fn path_from_below(opts: &DaemonOptions, path: &ControlPath) -> bool {
    match opts.role {
        Role::Tor => path.n_hops == 0,
        Role::Spine => {
            path.n_hops > 0 && distinct(path.hops()) && path.position(u32::from(opts.ip)).is_none()
        }
    }
}

/// The switch above this one on a climb coming back down: the hop after this switch's,
/// which must be on the path once (a TOR first); `None` when it is not so.
fn climb_down_hop(opts: &DaemonOptions, path: &ControlPath) -> Option<Ipv4Addr> {
    let k = on_path(opts, path).ok()??;
    if !distinct(path.hops()) || (opts.role == Role::Tor && k != 0) {
        return None;
    }
    path.hops().get(k + 1).map(|h| Ipv4Addr::from(h.ip()))
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

#[cfg(test)]
#[path = "process_tests.rs"]
mod tests;
