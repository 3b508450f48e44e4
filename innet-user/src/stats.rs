//! Reading the pinned counters: per port, per CPU, and summed.

use aya::maps::{MapData, PerCpuHashMap};
use innet_common::{
    control::SwitchConfig,
    maps::{DAEMON_STATS, PORT_STATS, SWITCH_CONFIG},
    stats::{DaemonStats, PortStats},
};
use innet_net::netdev;

use crate::{
    error::{Error, Result},
    pins::PinLayout,
    port_health::{self, PortHealth},
};

/// Counters of one ingress port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortCounters {
    pub ifindex: u32,
    /// `None` when the interface no longer exists in this namespace.
    pub ifname: Option<String>,
    /// On a DPU: `"host"` for the host's representor, `"uplink"` for the others.
    pub facing: Option<&'static str>,
    /// Sum over CPUs.
    pub total: PortStats,
    /// One entry per possible CPU.
    pub per_cpu: Vec<PortStats>,
    /// What the kernel says of the port (`read_with_health`; `None` from `read`, or for a
    /// vanished interface).
    pub health: Option<PortHealth>,
}

impl PortCounters {
    /// `ifname` (`if<index>` for a vanished interface), with what it faces on a DPU.
    #[must_use]
    pub fn label(&self) -> String {
        let name = self
            .ifname
            .clone()
            .unwrap_or_else(|| format!("if{}", self.ifindex));
        match self.facing {
            Some(f) => format!("{name} ({f})"),
            None => name,
        }
    }
}

/// Every port's counters, sorted by ifindex.
///
/// # Errors
/// No pinned map (innet not attached) or a map read failure.
pub fn read(pins: &PinLayout) -> Result<Vec<PortCounters>> {
    let map: PerCpuHashMap<MapData, u32, PortStats> = pins.open_typed(PORT_STATS)?;
    // A DPU daemon names its host's port; 0 (or no daemon) on a switch or host NIC.
    let host_port = pins
        .open_typed::<aya::maps::Array<MapData, SwitchConfig>>(SWITCH_CONFIG)
        .ok()
        .and_then(|c| c.get(&0, 0).ok())
        .map_or(0, |c| c.host_ifindex);
    let mut ports = Vec::new();
    for entry in &map {
        let (ifindex, values) = entry.map_err(|source| Error::Map {
            name: PORT_STATS,
            source,
        })?;
        let per_cpu: Vec<PortStats> = values.iter().copied().collect();
        let mut total = PortStats::default();
        for s in &per_cpu {
            total.accumulate(s);
        }
        ports.push(PortCounters {
            ifindex,
            ifname: netdev::ifname(ifindex),
            facing: (host_port != 0).then_some(if ifindex == host_port {
                "host"
            } else {
                "uplink"
            }),
            total,
            per_cpu,
            health: None,
        });
    }
    ports.sort_by_key(|p| p.ifindex);
    Ok(ports)
}

/// Every port's counters with what the kernel says of each attached port: whether it can
/// send redirected frames (also passed on to the programs, see `port_health::refresh`), and
/// its TX drops.
///
/// # Errors
/// As `read`.
pub fn read_with_health(pins: &PinLayout) -> Result<Vec<PortCounters>> {
    let mut ports = read(pins)?;
    let seen = port_health::refresh(pins);
    for p in &mut ports {
        p.health = seen
            .iter()
            .find(|(_, ifindex, _)| *ifindex == p.ifindex)
            .map(|(_, _, h)| h.clone());
    }
    Ok(ports)
}

/// The sum over all ports.
#[must_use]
pub fn sum(ports: &[PortCounters]) -> PortStats {
    let mut total = PortStats::default();
    for p in ports {
        total.accumulate(&p.total);
    }
    total
}

/// The daemon's counters (all zero when no daemon ever ran on this switch).
///
/// # Errors
/// No pinned map (innet not attached) or a map read failure.
pub fn read_daemon(pins: &PinLayout) -> Result<DaemonStats> {
    let map: aya::maps::Array<MapData, DaemonStats> = pins.open_typed(DAEMON_STATS)?;
    map.get(&0, 0).map_err(|source| Error::Map {
        name: DAEMON_STATS,
        source,
    })
}
