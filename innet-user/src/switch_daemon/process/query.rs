//! The way up: a query collects capabilities and free capacity and names the group's
//! members under each TOR; a climb shows the MRR its ways up; a probe finds a host's TOR.

use std::net::Ipv4Addr;
use std::time::Instant;

use innet_common::proto::QNH_RESPONSE;
use innet_common::wire::{ControlPath, ControlPayload, PathHop};
use tracing::warn;

use super::{
    Bind, FREE_CAPACITY_TTL, Installed, MAX_BOUND_ADDRESSES, MAX_PENDING_MEMBERS,
    MAX_PENDING_PER_PORT, Pending, Registry, Route, SETUP_GRACE, Seen, Setup, Table,
    path::{climb_down_hop, intersect, path_from_below},
    wire,
};
use crate::group_maps::{ChildSpec, Role};
use crate::switch_daemon::DaemonOptions;

impl Registry {
    /// A query on its way up collects this switch's capabilities, address and free
    /// capacity, and tells it who the group's members under it are; unless the MRR hangs
    /// off the same TOR, it climbs every uplink to the top, then goes down to the MRR.
    /// A host (TOR) or lower switch address on another port than the one it is bound to is
    /// refused, and its group will not be installed ([`FAIL_PORT_CONFLICT`]).
    pub(super) fn on_query(
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
    pub(super) fn on_climb(
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
    pub(super) fn on_probe(
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

    /// Where a notify or kill at hop `k` goes next: up the MRR's branch, down the NMRR's,
    /// or (at the NMRR's TOR) to the NMRR. `installed`: the group's ports here, for a kill
    /// whose bindings may have expired. `None`: no port towards the next hop.
    pub(super) fn next_hop(
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

    /// A query or climb on its way up: checks its path and port, remembers the group and
    /// its MRR `mrr` and the port of the host that sent it; returns this switch's free
    /// capacity, or `None` when the packet is refused.
    pub(super) fn up_from_below(
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
    pub(super) fn came_from_below(
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
    pub(super) fn append(
        &mut self,
        opts: &DaemonOptions,
        path: &mut ControlPath,
        free: u32,
    ) -> bool {
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

    /// Groups this switch can still take. Read from the maps at most every
    /// [`FREE_CAPACITY_TTL`] (a burst of queries must not walk the group map each), and again
    /// after this daemon installed or freed one.
    pub(super) fn free_capacity(&mut self, groups: &impl Table) -> u32 {
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

    /// Whether a query or climb for `comm` from `port` may go on: its wire id must not be
    /// set up or installed under another `true_comm_id` (then the set-up that is not
    /// installed is marked conflicted: two set-ups cannot share a wire id). A new set-up is
    /// remembered against `port`'s share; a port holding its share forgets its own oldest
    /// past [`SETUP_GRACE`], or refuses the new one when all are younger.
    pub(super) fn admit_setup(&mut self, comm: u32, port: u32) -> bool {
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
        let (share, now) = (self.setup_share(), Instant::now());
        let order = self.setup_order.entry(port).or_default();
        let mut forgotten = vec![];
        // The oldest go first, and only those past the grace (see `SETUP_GRACE`).
        while order.len() >= share
            && order
                .front()
                .is_some_and(|&(_, at)| now.saturating_duration_since(at) >= SETUP_GRACE)
        {
            forgotten.extend(order.pop_front().map(|(old, _)| old));
        }
        let full = order.len() >= share;
        if !full {
            order.push_back((w, now));
        }
        // What left the order is forgotten even when the new set-up is refused (a share
        // that shrank as ports came up can leave young ones above it): a set-up left in
        // `setups` without its place in the order would never be forgotten.
        for old in forgotten {
            if !self.installed.contains_key(&old) {
                self.setups.remove(&old);
                self.stats.queries_forgotten += 1;
                self.stats.port_setups_forgotten += 1;
            }
        }
        if full {
            self.refuse_young_setups_full(w, port, now);
            return false;
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

    /// Counts a new set-up refused because `port`'s share holds only set-ups younger than
    /// [`SETUP_GRACE`], and names the port in the log at most once per `WARN_EVERY`.
    fn refuse_young_setups_full(&mut self, w: u32, port: u32, now: Instant) {
        self.stats.port_setups_refused += 1;
        if self.setup_refusal_warned.due(now) {
            warn!(
                group = format_args!("{w:#08x}"),
                port,
                refused = self.stats.port_setups_refused,
                "a port brought more new set-ups than it may remember within the grace (a host flooding queries below it?): new set-ups from it are refused until the old ones are past the grace; their jobs run on the hosts. `innet stats` names the port (control_shed, control_over_share)"
            );
        }
    }

    /// Adds `child`, whose query carried set-up key `key`, to the members of set-up
    /// `wire_id`; `false` (counted) for a new member of a group installed already (its
    /// queries came after the group's notify, so it is no member the MRR counted) or one
    /// past its port's share of the set-up's members.
    pub(super) fn remember(&mut self, wire_id: u32, child: ChildSpec, key: u64) -> bool {
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
    pub(super) fn keyed_members(&mut self, wire_id: u32, key: u64) -> Vec<ChildSpec> {
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

    /// Adds `mrr` to the MRRs of set-up `wire_id`, unless the group is installed: every
    /// query of a set-up comes before its first notify, so a new MRR after it is none.
    pub(super) fn add_mrr(&mut self, wire_id: u32, mrr: Ipv4Addr) {
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
}
