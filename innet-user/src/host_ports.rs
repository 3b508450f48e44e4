//! The daemon's address-to-port bindings as the data path reads them (`HOST_PORTS`).
//!
//! A daemon binds each host (or lower switch) address to the port its first control packet
//! came in on, and refuses control packets from it on any other port. The XDP program
//! applies the same binding to INC data of no group held here — host-to-host frames above
//! all (regroup notices, final results, NACKs), which no group's member check sees — and
//! drops such a frame from a bound address on another port (`spoofed_source`): a host can
//! no longer speak for a job member from its own port.

use std::net::Ipv4Addr;

use aya::maps::{HashMap, MapData};
use innet_common::maps::HOST_PORTS;

use crate::{
    error::{Error, Result},
    pins::PinLayout,
};

/// The pinned `HOST_PORTS` map of one switch.
pub struct HostPorts {
    map: HashMap<MapData, u32, u32>,
}

/// The map's key for `ip`: its octets as the program reads them from the packet.
fn key(ip: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(ip.octets())
}

impl HostPorts {
    /// Opens the map pinned under `pins`.
    ///
    /// # Errors
    /// innet not attached, or pins of an innet without the map.
    pub fn open(pins: &PinLayout) -> Result<Self> {
        Ok(Self {
            map: pins.open_typed(HOST_PORTS)?,
        })
    }

    /// Takes the map out of a loaded object (tests; the programs keep using it).
    ///
    /// # Errors
    /// The object has no such map.
    pub fn take(ebpf: &mut aya::Ebpf) -> Result<Self> {
        let map = ebpf.take_map(HOST_PORTS).ok_or(Error::MissingInObject {
            kind: "map",
            name: HOST_PORTS,
        })?;
        Ok(Self {
            map: HashMap::try_from(map).map_err(|source| Error::Map {
                name: HOST_PORTS,
                source,
            })?,
        })
    }

    /// Binds `ip` to port `ifindex` (again, when it moved).
    ///
    /// # Errors
    /// A map write failure (full: the daemon binds no more addresses than the map holds).
    pub fn bind(&mut self, ip: Ipv4Addr, ifindex: u32) -> Result<()> {
        self.map
            .insert(key(ip), ifindex, 0)
            .map_err(|source| Error::Map {
                name: HOST_PORTS,
                source,
            })
    }

    /// Forgets `ip`'s binding (expired); nothing when it has none.
    pub fn unbind(&mut self, ip: Ipv4Addr) {
        let _ = self.map.remove(&key(ip));
    }

    /// Forgets every binding (a daemon starts with none: a restarted one must not keep
    /// enforcing its predecessor's).
    pub fn clear(&mut self) {
        let keys: Vec<u32> = self
            .map
            .keys()
            .filter_map(std::result::Result::ok)
            .collect();
        for k in keys {
            let _ = self.map.remove(&k);
        }
    }

    /// The port `ip` is bound to, if any.
    #[must_use]
    pub fn port_of(&self, ip: Ipv4Addr) -> Option<u32> {
        self.map.get(&key(ip), 0).ok()
    }
}
