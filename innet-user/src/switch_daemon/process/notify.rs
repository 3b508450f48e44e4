//! The way down: the MRR's notify installs the group on the switches of the path it chose.

use std::net::Ipv4Addr;

use innet_common::fail::{FAIL_CAPACITY, FAIL_NO_ROUTE, FAIL_PORT_CONFLICT, FAIL_REFUSED};
use innet_common::wire::{ControlPath, ControlPayload};
use tracing::{info, warn};

use super::{
    Bind, Installed, KillFrom, Refused, Registry, Route, Seen, Table,
    path::{netdev_mac, off_path, on_path, tree_path},
    wire,
};
use crate::group_maps::{ChildSpec, GroupSpec, ParentSpec, Role};
use crate::switch_daemon::DaemonOptions;

impl Registry {
    /// A notify installs the group on every switch of its path (or records why not in
    /// `fail_cause`) and follows the path: up the MRR's branch, then down the NMRR's.
    pub(super) fn on_notify(
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
    pub(super) fn clashes(&mut self, comm: u32) -> bool {
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
    pub(super) fn bad_path(&mut self, comm: u32, why: &str) {
        self.stats.refused_bad_path += 1;
        self.stats.refused_invalid += 1;
        warn!(
            group = format_args!("{:#08x}", wire(comm)),
            "{why}: refused"
        );
    }

    /// Whether a notify for hop `k` came the way it must: up the MRR's branch from the hop
    /// below (the MRR itself at hop 0), or down the NMRR's from the hop above.
    pub(super) fn notify_port_ok(&mut self, path: &ControlPath, k: usize, seen: &Seen<'_>) -> bool {
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
    pub(super) fn hop_parent(
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
    pub(super) fn hop_children(
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
    pub(super) fn install_hop(
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
    pub(super) fn branch_children(
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
    pub(super) fn extend(
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
    pub(super) fn refuse(&mut self, c: &mut ControlPayload, cause: u8) {
        let counter = match cause {
            FAIL_NO_ROUTE => &mut self.stats.no_route,
            FAIL_CAPACITY => &mut self.stats.refused_capacity,
            FAIL_PORT_CONFLICT => &mut self.stats.refused_port_conflict,
            _ => &mut self.stats.refused_invalid,
        };
        *counter += 1;
        c.fail_cause = c.fail_cause.max(cause);
    }
}
