//! Re-sending a processed control frame along its path: out of the bridge port the
//! bridge's forwarding table names for the destination MAC (a raw AF_PACKET send, so the
//! frame leaves exactly as rewritten). Queries headed up go to every uplink, so every SPINE
//! reports its free capacity; frames from an uplink that are not for a local host are
//! dropped (another TOR's); unknown destinations are flooded to the other ports.

use std::{
    cell::RefCell,
    collections::HashMap,
    time::{Duration, Instant},
};

use innet_common::{
    proto::QNH_RESPONSE,
    wire::{BTH_LEN, DETH_LEN, ETH_LEN, INC_LEN, IPV4_LEN, UDP_LEN},
};
use tracing::debug;

use innet_net::netdev::{self, PacketSocket};

use crate::error::{Error, Result};

pub struct Forwarder {
    sock: PacketSocket,
    /// Attached ports: (name, ifindex).
    ports: Vec<(String, u32)>,
    /// The bridge this switch forwards ordinary traffic with (the first bridged port's
    /// master): its forwarding table answers for every port, bridged or not.
    bridge: Option<u32>,
    /// The bridge's forwarding table (MAC → port), read at most every [`FDB_TTL`]: a burst
    /// of control packets must not dump it once per packet.
    fdb: RefCell<Option<(Instant, FdbTable)>>,
}

/// A bridge forwarding table: learned MAC → port name.
type FdbTable = HashMap<[u8; 6], String>;

/// How long a read of the forwarding table serves lookups (a miss rereads it sooner).
const FDB_TTL: Duration = Duration::from_secs(1);
const FDB_MISS_REREAD: Duration = Duration::from_millis(50);

/// Offset of `query_notify_hop` in a control frame without IPv4 options.
const QNH_OFFSET: usize = ETH_LEN + IPV4_LEN + UDP_LEN + BTH_LEN + DETH_LEN + INC_LEN + 4;

impl Forwarder {
    pub fn new(ifaces: &[String]) -> Result<Self> {
        let sock = PacketSocket::new().map_err(|source| Error::Io {
            path: "socket(AF_PACKET)".into(),
            source,
        })?;
        let ports = ifaces
            .iter()
            .map(|n| Ok((n.clone(), netdev::ifindex(n)?)))
            .collect::<Result<Vec<_>>>()?;
        let bridge = ifaces
            .iter()
            .find_map(|n| netdev::link_named(n).ok()?.master);
        Ok(Self {
            sock,
            ports,
            bridge,
            fdb: RefCell::new(None),
        })
    }

    pub fn is_uplink(&self, ifindex: u32, uplinks: &[String]) -> bool {
        self.ports
            .iter()
            .any(|(n, i)| *i == ifindex && uplinks.contains(n))
    }

    fn name_of(&self, ifindex: u32) -> Option<&str> {
        self.ports
            .iter()
            .find(|(_, i)| *i == ifindex)
            .map(|(n, _)| n.as_str())
    }

    pub fn forward(&self, frame: &[u8], ingress: u32, uplinks: &[String]) -> Result<()> {
        let dst: [u8; 6] = frame[..6].try_into().expect("6 bytes");
        let ingress_name = self.name_of(ingress).unwrap_or_default().to_owned();
        let bridge = self.bridge;
        let from_uplink = uplinks.contains(&ingress_name);
        let is_query = frame.get(QNH_OFFSET).is_some_and(|q| q & QNH_RESPONSE == 0);
        let egress = bridge.and_then(|b| self.fdb_port(b, dst));
        let targets: Vec<u32> = match egress {
            Some(port) if uplinks.contains(&port) => {
                if from_uplink {
                    debug!("not for a host of this switch: dropped");
                    vec![]
                } else if is_query {
                    self.ports
                        .iter()
                        .filter(|(n, _)| uplinks.contains(n))
                        .map(|(_, i)| *i)
                        .collect()
                } else {
                    self.ports
                        .iter()
                        .filter(|(n, _)| *n == port)
                        .map(|(_, i)| *i)
                        .collect()
                }
            }
            Some(port) if port != ingress_name => self
                .ports
                .iter()
                .filter(|(n, _)| *n == port)
                .map(|(_, i)| *i)
                .collect(),
            Some(_) => vec![],
            None if from_uplink && !uplinks.is_empty() => vec![],
            None => self
                .ports
                .iter()
                .filter(|(_, i)| *i != ingress)
                .map(|(_, i)| *i)
                .collect(),
        };
        for ifindex in targets {
            self.send_on(frame, ifindex)?;
        }
        Ok(())
    }

    /// Sends a copy of the frame out of every uplink.
    pub fn send_uplinks(&self, frame: &[u8], uplinks: &[String]) -> Result<()> {
        for (_, ifindex) in self.ports.iter().filter(|(n, _)| uplinks.contains(n)) {
            self.send_on(frame, *ifindex)?;
        }
        Ok(())
    }

    /// Sends the frame down towards its destination MAC: out of the port the bridge
    /// learned it behind, else out of every port that is neither an uplink nor `ingress`
    /// (never up, so a frame looking for a host cannot loop).
    pub fn send_below(&self, frame: &[u8], ingress: u32, uplinks: &[String]) -> Result<()> {
        let dst: [u8; 6] = frame[..6].try_into().expect("6 bytes");
        let learned = self
            .bridge
            .and_then(|b| self.fdb_port(b, dst))
            .filter(|p| !uplinks.contains(p));
        let below = self.ports.iter().filter(|(n, i)| {
            *i != ingress && !uplinks.contains(n) && learned.as_ref().is_none_or(|l| l == n)
        });
        for (_, ifindex) in below {
            self.send_on(frame, *ifindex)?;
        }
        Ok(())
    }

    /// Whether the frame's destination MAC was learned behind a host port of this switch.
    pub fn dst_is_local(&self, frame: &[u8], uplinks: &[String]) -> bool {
        let dst: [u8; 6] = frame[..6].try_into().expect("6 bytes");
        self.bridge
            .and_then(|b| self.fdb_port(b, dst))
            .is_some_and(|p| !uplinks.contains(&p) && self.ports.iter().any(|(n, _)| *n == p))
    }

    /// The port behind which the bridge learned `mac`, from the cached table.
    fn fdb_port(&self, bridge: u32, mac: [u8; 6]) -> Option<String> {
        let mut cache = self.fdb.borrow_mut();
        let age = cache.as_ref().map(|(at, _)| at.elapsed());
        let hit = cache.as_ref().and_then(|(_, t)| t.get(&mac).cloned());
        let stale = age.is_none_or(|a| a > FDB_TTL || (hit.is_none() && a > FDB_MISS_REREAD));
        if !stale {
            return hit;
        }
        let table = fdb_table(bridge);
        let port = table.get(&mac).cloned();
        *cache = Some((Instant::now(), table));
        port
    }

    /// Sends the frame out of one port.
    pub fn send_on(&self, frame: &[u8], ifindex: u32) -> Result<()> {
        self.sock.send(ifindex, frame).map_err(|source| Error::Io {
            path: format!("AF_PACKET send on ifindex {ifindex}").into(),
            source,
        })
    }
}

/// The bridge's learned (non-local) entries: MAC → port name (`bridge fdb show br BRIDGE`,
/// asked through netlink).
fn fdb_table(bridge: u32) -> FdbTable {
    let (Ok(fdb), Ok(links)) = (netdev::bridge_fdb(bridge), netdev::links()) else {
        return HashMap::new();
    };
    let names: HashMap<u32, String> = links.into_iter().map(|l| (l.index, l.name)).collect();
    fdb.into_iter()
        .filter_map(|(mac, port)| Some((mac, names.get(&port)?.clone())))
        .collect()
}
