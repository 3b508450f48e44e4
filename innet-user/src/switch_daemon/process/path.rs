//! Checks of a control packet's path against the tree a group can have: pure functions of
//! the path and this switch's place.

use std::net::Ipv4Addr;

use innet_common::wire::{ControlPath, ControlPayload, PathHop};
use innet_net::netdev;

use super::{Route, Seen};
use crate::group_maps::Role;
use crate::switch_daemon::DaemonOptions;

/// Whether no switch appears twice on `hops`.
pub(super) fn distinct(hops: &[PathHop]) -> bool {
    hops.iter()
        .enumerate()
        .all(|(i, h)| !hops[..i].iter().any(|g| g.ip() == h.ip()))
}

/// Where this switch sits on a notify's or kill's path: `Ok(None)` when it is not on it,
/// `Err` when it is on it twice.
pub(super) fn on_path(opts: &DaemonOptions, path: &ControlPath) -> Result<Option<usize>, ()> {
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
pub(super) fn tree_path(role: Role, path: &ControlPath, k: usize) -> bool {
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
pub(super) fn path_from_below(opts: &DaemonOptions, path: &ControlPath) -> bool {
    match opts.role {
        Role::Tor => path.n_hops == 0,
        Role::Spine => {
            path.n_hops > 0 && distinct(path.hops()) && path.position(u32::from(opts.ip)).is_none()
        }
    }
}

/// The switch above this one on a climb coming back down: the hop after this switch's,
/// which must be on the path once (a TOR first); `None` when it is not so.
pub(super) fn climb_down_hop(opts: &DaemonOptions, path: &ControlPath) -> Option<Ipv4Addr> {
    let k = on_path(opts, path).ok()??;
    if !distinct(path.hops()) || (opts.role == Role::Tor && k != 0) {
        return None;
    }
    path.hops().get(k + 1).map(|h| Ipv4Addr::from(h.ip()))
}

/// Intersects a query's capabilities with this switch's.
pub(super) fn intersect(opts: &DaemonOptions, c: &mut ControlPayload) {
    let caps = opts.capabilities;
    c.set_sup_allreduce_op(c.sup_allreduce_op() & caps.ops);
    c.set_sup_data_type(c.sup_data_type() & caps.dtypes);
    c.set_sup_max_data_size(c.sup_max_data_size().min(caps.max_data_size));
    c.set_sup_window(c.sup_window().min(caps.window));
}

/// A notify or kill not for this switch (no path, or a path without it): on towards the
/// NMRR along the bridge, unless it came down an uplink to a TOR the NMRR is not under.
pub(super) fn off_path(
    opts: &DaemonOptions,
    seen: &Seen<'_>,
    c: ControlPayload,
) -> Option<(ControlPayload, Route)> {
    match (opts.role, seen.from_uplink, seen.dst_is_local) {
        (Role::Tor, true, false) => None,
        _ => Some((c, Route::Path)),
    }
}

pub(super) fn netdev_mac(ifindex: u32) -> [u8; 6] {
    netdev::ifname(ifindex)
        .and_then(|n| netdev::mac(&n).ok())
        .unwrap_or([0; 6])
}
