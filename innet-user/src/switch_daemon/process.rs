//! What a switch does to a control packet on its way through, at any level of the fabric:
//! a query collects capabilities, addresses and free capacity on its way up; a climb shows
//! the MRR its ways up; a notify installs the group on the switches of the path the MRR
//! chose; a kill frees it there.

use std::{
    collections::{HashMap, VecDeque},
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use innet_common::{
    codec::Parsed,
    proto::{
        COMM_TYPE_CLIMB, COMM_TYPE_PROBE, MASTER_NIC_MODE, PacketKind, QNH_HOPS_MASK, QNH_RESPONSE,
    },
    stats::DaemonStats,
    validate::Verdict,
    wire::ControlPayload,
};

use super::{DaemonOptions, port_rate::WarnEvery};
use crate::group_maps::{ChildSpec, GroupMaps, GroupSpec};

mod bindings;
mod kill;
mod notify;
mod path;
mod query;
#[cfg(test)]
mod tests;

/// Groups whose queries a daemon remembers before their notify. Each port below gets an equal
/// share; a port that holds its share forgets its own oldest set-up (whose notify is then
/// refused as not from the MRR, and that job falls back), never another port's, and never
/// one younger than [`SETUP_GRACE`]. Sized so that one host flooding at its TOR's rate
/// (`port_rate`: a burst of 1,024 and 1,000 a second) fills no port's share above the TOR
/// within the grace on a switch of up to four ports below (16,384 / 4 ≥ 1,024 + 3 × 1,000).
pub const MAX_QUERIED: usize = 16_384;
/// How long a remembered set-up is safe from being forgotten: longer than a set-up takes
/// from its first query to its notify on a loaded fabric. Attack: above a TOR the set-ups of
/// all its hosts come on the TOR's port, so a host's queries under fresh wire ids would
/// forget a job's set-up between its query and its notify (the notify then finds no route,
/// `fail_cause` 2, and the job runs on the hosts to its end; CI saw it at three levels). A
/// port whose share holds only younger set-ups refuses a new one (`port_setups_refused`):
/// the flood's own, and new jobs' behind the same port while it lasts, never a running
/// set-up.
pub const SETUP_GRACE: Duration = Duration::from_secs(3);
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
    /// Per port below, the set-ups it brought that were not installed (yet), oldest first,
    /// with when each came: each port remembers at most its share of `MAX_QUERIED`, so a
    /// flood of queries from one port can neither grow the daemon nor flush the set-ups of
    /// the others.
    setup_order: HashMap<u32, VecDeque<(u32, Instant)>>,
    /// When a refused set-up was last named in the log.
    setup_refusal_warned: WarnEvery,
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
            order.retain(|(w, _)| *w != wire_id);
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
}
