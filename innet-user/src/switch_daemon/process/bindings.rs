//! Who may send from where: each host or lower switch address is bound to the port it
//! was first seen on, and hosts are remembered by the port their queries came up on.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::Ipv4Addr;
use std::time::Instant;

use tracing::{debug, warn};

use super::{
    BINDING_TTL, Bind, HostPort, Installed, MAX_BOUND_ADDRESSES, Registry, Route, SWEEP_EVERY,
};

impl Registry {
    /// Whether `addr` may send control packets on `port`: an address is bound to the port
    /// it is first seen on (each port binds up to its share of [`MAX_BOUND_ADDRESSES`]);
    /// another port is refused and counted.
    pub(super) fn on_its_port(&mut self, addr: Ipv4Addr, port: u32) -> Bind {
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
    pub(super) fn refuse_binding(&mut self, addr: Ipv4Addr, port: u32) -> Bind {
        self.stats.refused_port_bindings += 1;
        self.stats.refused_wrong_port += 1;
        debug!(from = %addr, port, "control packet from a new address on a port that binds its share of addresses: refused");
        Bind::PortFull
    }

    /// Forgets expired bindings and host ports, at most once per [`SWEEP_EVERY`]: a table
    /// filled by a flood is not scanned again on every control packet.
    pub(super) fn sweep(&mut self, now: Instant) {
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

    /// Learns the port `host` sits behind. The same host seen on two ports below within
    /// [`BINDING_TTL`] (above the TORs a host address is not bound: a spoofed query from
    /// another TOR carries it) is contested: its port is forgotten, and frames for it go down
    /// every port below (its own TOR passes them on) rather than to the spoofer's.
    /// `mirror`: hand what is learned to the data path's bindings too (above the TORs).
    pub(super) fn learn_host(&mut self, host: Ipv4Addr, port: u32, mirror: bool) {
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

    /// The port `host`'s queries and climbs came up on, unless contested.
    pub(super) fn host_port(&self, host: Ipv4Addr) -> Option<u32> {
        self.hosts_below
            .get(&host)
            .filter(|h| !h.contested)
            .map(|h| h.port)
    }

    /// Down towards `host`: the port its queries or climbs came up on, else the bridge's.
    pub(super) fn down_to(&self, host: Ipv4Addr) -> Route {
        self.host_port(host).map_or(Route::Below, Route::Port)
    }

    /// The port a lower switch (or host) `ip` sits behind.
    pub(super) fn port_below(&self, ip: Ipv4Addr, installed: Option<&Installed>) -> Option<u32> {
        self.bound
            .get(&ip)
            .map(|(port, _)| *port)
            .or_else(|| self.host_port(ip))
            .or_else(|| installed.and_then(|i| i.children.iter().find(|c| c.0 == ip).map(|c| c.1)))
    }
}

/// Takes one from the count of `port`.
pub(super) fn dec(counts: &mut HashMap<u32, usize>, port: u32) {
    if let Entry::Occupied(mut e) = counts.entry(port) {
        *e.get_mut() = e.get().saturating_sub(1);
        if *e.get() == 0 {
            e.remove();
        }
    }
}
