//! A kill frees a group where its MRR's notify installed it.

use innet_common::wire::ControlPayload;
use tracing::{debug, info, warn};

use super::{
    Registry, Route, Seen, Table,
    path::{off_path, on_path, tree_path},
    wire,
};
use crate::switch_daemon::DaemonOptions;

impl Registry {
    /// A kill from the group's MRR, on the port its notify came in on, frees it; from anyone
    /// else, or another port, it is ignored and counted. It follows its notify's path.
    pub(super) fn on_kill(
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
}
