//! Installing and removing reduction groups on a switch by hand (`innet group …`), until the
//! control plane drives the same API. A group gets the lowest free index below the switch's
//! capacity; its slots and counters are zeroed when it is installed.

use std::net::Ipv4Addr;

use aya::maps::{Array, HashMap, Map, MapData, PerCpuArray, PerCpuValues};
use innet_common::{
    group::{Child, GroupConfig, MAX_CHILDREN, ROLE_SPINE, ROLE_TOR, Slot, WINDOW},
    maps::{GROUP_STATS, GROUPS, SLOTS},
    proto::{CONTROL_COMM_ID, HOST_COMM_ID},
    stats::GroupStats,
};

use crate::{
    error::{Error, Result},
    pins::PinLayout,
};

/// Where a switch sits in a group's tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Tor,
    Spine,
}

/// One child of a group: a host leader under a TOR, or a TOR under a SPINE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ChildSpec {
    /// Address its packets come from.
    pub ip: Ipv4Addr,
    /// Port it sits behind.
    pub ifindex: u32,
    /// Its rank (or switch id), for operators.
    pub rank: u32,
}

/// The way to the parent switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ParentSpec {
    pub ifindex: u32,
    pub own_mac: [u8; 6],
    pub own_ip: Ipv4Addr,
    pub mac: [u8; 6],
    pub ip: Ipv4Addr,
}

/// A group as an operator (or the control plane) describes it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct GroupSpec {
    /// 24-bit wire group id.
    pub id: u32,
    pub role: Role,
    /// `None` at the root of the tree.
    pub parent: Option<ParentSpec>,
    /// Rank this switch puts into packets it sends up.
    pub own_rank: u32,
    /// The group's MRR, when the control plane installed it.
    pub mrr: Option<Ipv4Addr>,
    pub children: Vec<ChildSpec>,
}

impl GroupSpec {
    fn to_config(&self, index: u32) -> Result<GroupConfig> {
        let bad = |why: &str| Error::BadGroup {
            id: self.id,
            why: why.to_owned(),
        };
        if self.id >= 1 << 24 {
            return Err(bad("the id must fit 24 bits (the wire group id)"));
        }
        if self.id == HOST_COMM_ID {
            return Err(bad(
                "id 0 is reserved (it marks host-to-host packets that no switch aggregates)",
            ));
        }
        if self.id as u8 == CONTROL_COMM_ID {
            return Err(bad(
                "ids ending in 0xff are reserved (comm_id 0xff marks control packets)",
            ));
        }
        if self.children.is_empty() || self.children.len() > MAX_CHILDREN {
            return Err(bad(&format!(
                "a group needs 1 to {MAX_CHILDREN} children on a switch"
            )));
        }
        for (i, c) in self.children.iter().enumerate() {
            if self.children[..i].iter().any(|o| o.ip == c.ip) {
                return Err(bad(&format!("child {} appears twice", c.ip)));
            }
        }
        let mut cfg = GroupConfig {
            index,
            role: match self.role {
                Role::Tor => ROLE_TOR,
                Role::Spine => ROLE_SPINE,
            },
            is_root: u8::from(self.parent.is_none()),
            n_children: self.children.len() as u8,
            own_rank: self.own_rank,
            mrr_ip: self.mrr.map_or([0; 4], |m| m.octets()),
            ..GroupConfig::default()
        };
        if let Some(p) = &self.parent {
            cfg.parent_ifindex = p.ifindex;
            cfg.own_mac = p.own_mac;
            cfg.own_ip = p.own_ip.octets();
            cfg.parent_mac = p.mac;
            cfg.parent_ip = p.ip.octets();
        }
        for (slot, c) in cfg.children.iter_mut().zip(&self.children) {
            *slot = Child {
                ip: c.ip.octets(),
                ifindex: c.ifindex,
                rank: c.rank,
                ..Child::default()
            };
        }
        Ok(cfg)
    }
}

/// An installed group with its counters summed over CPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupInfo {
    pub id: u32,
    pub config: GroupConfig,
    pub stats: GroupStats,
}

/// The group maps of one switch (pinned, or straight from a loaded object in tests).
pub struct GroupMaps {
    groups: HashMap<MapData, u32, GroupConfig>,
    slots: Array<MapData, Slot>,
    stats: PerCpuArray<MapData, GroupStats>,
    capacity: u32,
}

fn typed<T: TryFrom<Map, Error = aya::maps::MapError>>(name: &'static str, map: Map) -> Result<T> {
    T::try_from(map).map_err(|source| Error::Map { name, source })
}

impl GroupMaps {
    /// Opens the maps pinned under `pins`.
    ///
    /// # Errors
    /// innet not attached (no pins), or maps of the wrong type.
    pub fn open(pins: &PinLayout) -> Result<Self> {
        Self::from_maps(
            pins.open_map(GROUPS)?,
            pins.open_map(SLOTS)?,
            pins.open_map(GROUP_STATS)?,
        )
    }

    /// Takes the maps out of a loaded object (tests; the programs keep using them).
    ///
    /// # Errors
    /// Maps missing from the object.
    pub fn take(ebpf: &mut aya::Ebpf) -> Result<Self> {
        let mut take = |name: &'static str| {
            ebpf.take_map(name)
                .ok_or(Error::MissingInObject { kind: "map", name })
        };
        Self::from_maps(take(GROUPS)?, take(SLOTS)?, take(GROUP_STATS)?)
    }

    fn from_maps(groups: Map, slots: Map, stats: Map) -> Result<Self> {
        let Map::HashMap(data) = &groups else {
            return Err(Error::MissingInObject {
                kind: "hash map",
                name: GROUPS,
            });
        };
        let capacity = data
            .info()
            .map(|i| i.max_entries())
            .map_err(|source| Error::Map {
                name: GROUPS,
                source,
            })?;
        let groups: HashMap<MapData, u32, GroupConfig> = typed(GROUPS, groups)?;
        Ok(Self {
            groups,
            slots: typed(SLOTS, slots)?,
            stats: typed(GROUP_STATS, stats)?,
            capacity,
        })
    }

    /// Groups this switch can hold.
    #[must_use]
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Installs `spec` at the lowest free index; returns the index.
    ///
    /// # Errors
    /// A bad spec, a group id already installed, or no free capacity.
    pub fn install(&mut self, spec: &GroupSpec) -> Result<u32> {
        if self.groups.get(&spec.id, 0).is_ok() {
            return Err(Error::GroupExists { id: spec.id });
        }
        let used: Vec<u32> = self.list()?.iter().map(|g| g.config.index).collect();
        let index = (0..self.capacity)
            .find(|i| !used.contains(i))
            .ok_or(Error::CapacityFull {
                capacity: self.capacity,
            })?;
        let config = spec.to_config(index)?;
        // Fresh slots and counters: nothing of a previous tenant of this index survives.
        // SAFETY: Slot is plain old data; all-zero is its empty state.
        let empty: Slot = unsafe { std::mem::zeroed() };
        for s in index * WINDOW..(index + 1) * WINDOW {
            self.slots.set(s, empty, 0).map_err(|source| Error::Map {
                name: SLOTS,
                source,
            })?;
        }
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| Error::Io {
            path: "/sys/devices/system/cpu/possible".into(),
            source: e,
        })?;
        let zeros =
            PerCpuValues::try_from(vec![GroupStats::default(); cpus]).map_err(|e| Error::Io {
                path: "per-cpu values".into(),
                source: e,
            })?;
        self.stats
            .set(index, zeros, 0)
            .map_err(|source| Error::Map {
                name: GROUP_STATS,
                source,
            })?;
        self.groups
            .insert(spec.id, config, 0)
            .map_err(|source| Error::Map {
                name: GROUPS,
                source,
            })?;
        Ok(index)
    }

    /// Removes a group; its index becomes free.
    ///
    /// # Errors
    /// No such group.
    pub fn remove(&mut self, id: u32) -> Result<()> {
        self.groups
            .remove(&id)
            .map_err(|_| Error::NoSuchGroup { id })
    }

    /// Every installed group, sorted by index.
    ///
    /// # Errors
    /// A map read failure.
    pub fn list(&self) -> Result<Vec<GroupInfo>> {
        let mut out = Vec::new();
        for entry in &self.groups {
            let (id, config) = entry.map_err(|source| Error::Map {
                name: GROUPS,
                source,
            })?;
            let mut stats = GroupStats::default();
            if let Ok(per_cpu) = self.stats.get(&config.index, 0) {
                for s in per_cpu.iter() {
                    stats.accumulate(s);
                }
            }
            out.push(GroupInfo { id, config, stats });
        }
        out.sort_by_key(|g| g.config.index);
        Ok(out)
    }

    /// One installed group with its counters.
    ///
    /// # Errors
    /// No such group, or a map read failure.
    pub fn get(&self, id: u32) -> Result<GroupInfo> {
        self.list()?
            .into_iter()
            .find(|g| g.id == id)
            .ok_or(Error::NoSuchGroup { id })
    }

    /// The slot of `round` of group `id` (for tests and `innet group show`).
    ///
    /// # Errors
    /// No such group or a map read failure.
    pub fn slot(&self, id: u32, round: u8) -> Result<Slot> {
        let cfg = self
            .groups
            .get(&id, 0)
            .map_err(|_| Error::NoSuchGroup { id })?;
        self.slots
            .get(&(cfg.index * WINDOW + u32::from(round) % WINDOW), 0)
            .map_err(|source| Error::Map {
                name: SLOTS,
                source,
            })
    }
}
