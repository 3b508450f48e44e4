//! Reading the pinned counters: per port, per CPU, and summed.

use aya::maps::{MapData, PerCpuHashMap};
use innet_common::{
    maps::{DAEMON_STATS, PORT_STATS},
    stats::{DaemonStats, PortStats},
};

use crate::{
    error::{Error, Result},
    netdev,
    pins::PinLayout,
};

/// Counters of one ingress port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortCounters {
    pub ifindex: u32,
    /// `None` when the interface no longer exists in this namespace.
    pub ifname: Option<String>,
    /// Sum over CPUs.
    pub total: PortStats,
    /// One entry per possible CPU.
    pub per_cpu: Vec<PortStats>,
}

impl PortCounters {
    /// `ifname`, or `if<index>` for a vanished interface.
    #[must_use]
    pub fn label(&self) -> String {
        self.ifname
            .clone()
            .unwrap_or_else(|| format!("if{}", self.ifindex))
    }
}

/// Every port's counters, sorted by ifindex.
///
/// # Errors
/// No pinned map (innet not attached) or a map read failure.
pub fn read(pins: &PinLayout) -> Result<Vec<PortCounters>> {
    let map: PerCpuHashMap<MapData, u32, PortStats> = pins.open_typed(PORT_STATS)?;
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
            total,
            per_cpu,
        });
    }
    ports.sort_by_key(|p| p.ifindex);
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
