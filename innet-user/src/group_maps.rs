//! Installing and removing reduction groups on a switch by hand (`innet group …`), until the
//! control plane drives the same API. A group gets the lowest free index below the switch's
//! capacity; its slots and counters are zeroed when it is installed.

use std::net::Ipv4Addr;

use aya::maps::{Array, HashMap, Map, MapData, PerCpuArray, PerCpuValues};
use innet_common::{
    control::SETTING_UP,
    group::{
        Child, Completion, GroupConfig, MAX_CHILDREN, ROLE_NIC, ROLE_SPINE, ROLE_TOR, Slot, slot_of,
    },
    maps::{GROUP_STATS, GROUPS, NIC_COMPLETIONS, SLOTS},
    proto::{CONTROL_COMM_ID, HOST_COMM_ID},
    stats::GroupStats,
};

use crate::{
    error::{Error, Result},
    loader::{take_map, typed},
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

/// Checks a wire group id and a list of child addresses; the error names the broken rule.
fn check(id: u32, children: &[Ipv4Addr], min_children: usize, on: &str) -> Result<()> {
    let bad = |why: String| Error::BadGroup { id, why };
    if id >= 1 << 24 {
        return Err(bad("the id must fit 24 bits (the wire group id)".into()));
    }
    if id == HOST_COMM_ID {
        return Err(bad(
            "id 0 is reserved (it marks host-to-host packets that no switch aggregates)".into(),
        ));
    }
    if id as u8 == CONTROL_COMM_ID {
        return Err(bad(
            "ids ending in 0xff are reserved (comm_id 0xff marks control packets)".into(),
        ));
    }
    if children.len() < min_children || children.len() > MAX_CHILDREN {
        return Err(bad(format!(
            "a group needs {min_children} to {MAX_CHILDREN} children on {on}"
        )));
    }
    for (i, c) in children.iter().enumerate() {
        if children[..i].contains(c) {
            return Err(bad(format!("child {c} appears twice")));
        }
    }
    Ok(())
}

impl GroupSpec {
    fn to_config(&self, index: u32) -> Result<GroupConfig> {
        // Children in rank order (then address): a float round is folded in child order,
        // so the same members give the same bits whatever order their queries came in.
        let mut children = self.children.clone();
        children.sort_by_key(|c| (c.rank, c.ip));
        let ips: Vec<Ipv4Addr> = children.iter().map(|c| c.ip).collect();
        check(self.id, &ips, 1, "a switch")?;
        let mut cfg = GroupConfig {
            index,
            role: match self.role {
                Role::Tor => ROLE_TOR,
                Role::Spine => ROLE_SPINE,
            },
            is_root: u8::from(self.parent.is_none()),
            n_children: children.len() as u8,
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
        for (slot, c) in cfg.children.iter_mut().zip(&children) {
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

/// A member's part of a NIC-triggered reduction tree (the NIC paper), as its NIC holds it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct NicGroupSpec {
    /// 24-bit wire group id.
    pub id: u32,
    /// The NIC port: children's packets arrive on it, partials and results leave by it.
    pub ifindex: u32,
    pub own_mac: [u8; 6],
    pub own_ip: Ipv4Addr,
    /// This member's index in the tree (`src_rank` of the partials it sends up).
    pub own_rank: u32,
    /// The parent member's address and MAC; `None` at the root.
    pub parent: Option<(Ipv4Addr, [u8; 6])>,
    /// The root, whose (multicast) results every member accepts.
    pub root: Ipv4Addr,
    /// Where the root sends each result: the group's multicast address and MAC.
    pub result: (Ipv4Addr, [u8; 6]),
    /// Children's addresses with their member index (on a DPU the address is unspecified:
    /// children are known by index).
    pub children: Vec<(Ipv4Addr, u32)>,
    /// On a DPU: the host this member serves.
    pub dpu: Option<DpuSide>,
}

/// A DPU member's host side: the port towards the host, the host's address and MAC, and
/// the DPU's own (the source of the results it hands the host).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DpuSide {
    pub host_ifindex: u32,
    pub host_ip: Ipv4Addr,
    pub host_mac: [u8; 6],
    pub dpu_ip: Ipv4Addr,
    pub dpu_mac: [u8; 6],
}

impl NicGroupSpec {
    fn to_config(&self, index: u32) -> Result<GroupConfig> {
        if self.dpu.is_some() {
            let ranks: Vec<Ipv4Addr> = self.children.iter().map(|c| Ipv4Addr::from(c.1)).collect();
            check(self.id, &ranks, 0, "a DPU")?;
        } else {
            let ips: Vec<Ipv4Addr> = self.children.iter().map(|c| c.0).collect();
            check(self.id, &ips, 0, "a NIC")?;
        }
        let (parent_ip, parent_mac) = self.parent.unwrap_or((Ipv4Addr::UNSPECIFIED, [0; 6]));
        let mut cfg = GroupConfig {
            index,
            role: ROLE_NIC,
            is_root: u8::from(self.parent.is_none()),
            n_children: self.children.len() as u8,
            parent_ifindex: self.ifindex,
            own_mac: self.own_mac,
            parent_mac,
            own_ip: self.own_ip.octets(),
            parent_ip: parent_ip.octets(),
            own_rank: self.own_rank,
            root_ip: self.root.octets(),
            result_ip: self.result.0.octets(),
            result_mac: self.result.1,
            ..GroupConfig::default()
        };
        if let Some(d) = self.dpu {
            // The host owns the member: the idle collector may free it (MRR set).
            cfg.mrr_ip = d.host_ip.octets();
            cfg.host_ifindex = d.host_ifindex;
            cfg.host_ip = d.host_ip.octets();
            cfg.host_mac = d.host_mac;
            cfg.dpu_ip = d.dpu_ip.octets();
            cfg.dpu_mac = d.dpu_mac;
        }
        for (slot, (ip, rank)) in cfg.children.iter_mut().zip(&self.children) {
            *slot = Child {
                ip: ip.octets(),
                ifindex: self.ifindex,
                rank: *rank,
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
    /// NIC results (`None` for maps opened without them: a switch by hand).
    completions: Option<Array<MapData, Completion>>,
    /// Groups being set up (`None` for pins of an object without the map).
    setting_up: Option<HashMap<MapData, u32, u64>>,
    capacity: u32,
}

impl GroupMaps {
    /// Opens the maps pinned under `pins`.
    ///
    /// # Errors
    /// innet not attached (no pins), or maps of the wrong type.
    pub fn open(pins: &PinLayout) -> Result<Self> {
        let mut maps = Self::from_maps(
            pins.open_map(GROUPS)?,
            pins.open_map(SLOTS)?,
            pins.open_map(GROUP_STATS)?,
        )?;
        maps.completions = pins.open_typed(NIC_COMPLETIONS).ok();
        maps.setting_up = pins.open_typed(SETTING_UP).ok();
        Ok(maps)
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
        let mut maps = Self::from_maps(take(GROUPS)?, take(SLOTS)?, take(GROUP_STATS)?)?;
        maps.completions = Some(take_map(ebpf, NIC_COMPLETIONS)?);
        maps.setting_up = take_map(ebpf, SETTING_UP).ok();
        Ok(maps)
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
            completions: None,
            setting_up: None,
            capacity,
        })
    }

    /// Marks group `wire_id` as being set up on this switch, now: for the next
    /// [`innet_common::control::SETTING_UP_NS`] its data addressed here is dropped (the child retransmits) rather
    /// than answered with a group-lost notice, since its install may only be late. The
    /// daemon calls this for every query and notify it sees; without the map (older pins)
    /// it does nothing.
    ///
    /// # Errors
    /// A map write failure.
    pub fn mark_setting_up(&mut self, wire_id: u32) -> Result<()> {
        let Some(map) = self.setting_up.as_mut() else {
            return Ok(());
        };
        map.insert(wire_id & 0x00ff_ffff, innet_common::clock::ktime_ns(), 0)
            .map_err(|source| Error::Map {
                name: SETTING_UP,
                source,
            })
    }

    /// Groups this switch can hold.
    #[must_use]
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Slots per group on this switch (`innet attach --window`): the load sized `SLOTS`
    /// for `capacity × window`.
    #[must_use]
    pub fn window(&self) -> u32 {
        self.slots.len() / self.capacity.max(1)
    }

    /// The slots of the group at `index`.
    fn slots_of(&self, index: u32) -> std::ops::Range<u32> {
        let window = self.window();
        index * window..(index + 1) * window
    }

    /// Installs `spec` at the lowest free index; returns the index.
    ///
    /// # Errors
    /// A bad spec, a group id already installed, or no free capacity.
    pub fn install(&mut self, spec: &GroupSpec) -> Result<u32> {
        self.install_with(spec.id, |index| spec.to_config(index))
    }

    /// Installs a control-plane group that will have `expected` children, of which
    /// `spec.children` are known now; the others come with later notifies
    /// ([`Self::add_children`]). Their entries stay empty until then, so no round completes
    /// without them.
    ///
    /// # Errors
    /// As [`Self::install`].
    pub fn install_expecting(&mut self, spec: &GroupSpec, expected: usize) -> Result<u32> {
        if expected > MAX_CHILDREN {
            return Err(Error::BadGroup {
                id: spec.id,
                why: format!("{expected} children: at most {MAX_CHILDREN} on a switch"),
            });
        }
        self.install_with(spec.id, |index| {
            let mut cfg = spec.to_config(index)?;
            cfg.n_children = cfg.n_children.max(expected as u8);
            Ok(cfg)
        })
    }

    /// Adds `children` to installed group `id`, each in an empty entry (one it already has
    /// is skipped); returns how many were added.
    ///
    /// # Errors
    /// No such group, no empty entry left, or a map write failure.
    pub fn add_children(&mut self, id: u32, children: &[ChildSpec]) -> Result<usize> {
        let mut cfg = self
            .groups
            .get(&id, 0)
            .map_err(|_| Error::NoSuchGroup { id })?;
        let n = usize::from(cfg.n_children).min(MAX_CHILDREN);
        let mut added = 0;
        for c in children {
            let entries = &mut cfg.children[..n];
            if entries.iter().any(|e| e.ip == c.ip.octets()) {
                continue;
            }
            let Some(free) = entries.iter_mut().find(|e| e.ip == [0; 4]) else {
                return Err(Error::BadGroup {
                    id,
                    why: format!("no room for child {}: all {n} entries are taken", c.ip),
                });
            };
            *free = Child {
                ip: c.ip.octets(),
                ifindex: c.ifindex,
                rank: c.rank,
                ..Child::default()
            };
            added += 1;
        }
        if added > 0 {
            self.groups
                .insert(id, cfg, 0)
                .map_err(|source| Error::Map {
                    name: GROUPS,
                    source,
                })?;
        }
        Ok(added)
    }

    /// Installs a NIC tree member at the lowest free index (its completions cleared too);
    /// returns the index.
    ///
    /// # Errors
    /// As [`Self::install`].
    pub fn install_nic(&mut self, spec: &NicGroupSpec) -> Result<u32> {
        self.install_with(spec.id, |index| spec.to_config(index))
    }

    /// Whether NIC member `spec` is installed exactly as `spec` asks (a repeated request):
    /// then it keeps its rounds, not reinstalled.
    ///
    /// # Errors
    /// A map read failure, or a spec that cannot be installed.
    pub fn holds_nic(&self, spec: &NicGroupSpec) -> Result<bool> {
        let Ok(config) = self.groups.get(&spec.id, 0) else {
            return Ok(false);
        };
        let asked = GroupConfig {
            window_shift: config.window_shift,
            ..spec.to_config(config.index)?
        };
        Ok(asked == config)
    }

    fn install_with(
        &mut self,
        id: u32,
        config: impl FnOnce(u32) -> Result<GroupConfig>,
    ) -> Result<u32> {
        if self.groups.get(&id, 0).is_ok() {
            return Err(Error::GroupExists { id });
        }
        let used: Vec<u32> = self.list()?.iter().map(|g| g.config.index).collect();
        let index = (0..self.capacity)
            .find(|i| !used.contains(i))
            .ok_or(Error::CapacityFull {
                capacity: self.capacity,
            })?;
        let config = GroupConfig {
            window_shift: self.window().trailing_zeros() as u8,
            ..config(index)?
        };
        // Fresh slots and counters: nothing of a previous tenant of this index survives.
        // SAFETY: Slot is plain old data; all-zero is its empty state.
        let empty: Slot = unsafe { std::mem::zeroed() };
        for s in self.slots_of(index) {
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
        let slots = self.slots_of(index);
        if let Some(completions) = &mut self.completions {
            // SAFETY: Completion is plain old data; stamp 0 marks no result.
            let empty: Completion = unsafe { std::mem::zeroed() };
            for s in slots {
                completions.set(s, empty, 0).map_err(|source| Error::Map {
                    name: NIC_COMPLETIONS,
                    source,
                })?;
            }
        }
        self.groups
            .insert(id, config, 0)
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

    /// The completion entry of `round` of NIC group `id` (tests; hosts map the array).
    ///
    /// # Errors
    /// No such group, maps opened without completions, or a map read failure.
    pub fn completion(&self, id: u32, round: u8) -> Result<Completion> {
        let cfg = self
            .groups
            .get(&id, 0)
            .map_err(|_| Error::NoSuchGroup { id })?;
        let map = self.completions.as_ref().ok_or(Error::MissingInObject {
            kind: "map",
            name: NIC_COMPLETIONS,
        })?;
        map.get(&slot_of(cfg.index, cfg.window_shift, round), 0)
            .map_err(|source| Error::Map {
                name: NIC_COMPLETIONS,
                source,
            })
    }

    /// Overwrites the slot of `round` of group `id`: the lab stages states the data plane
    /// only passes through between two instructions (a copy in flight on another CPU).
    ///
    /// # Errors
    /// No such group or a map write failure.
    pub fn write_slot(&mut self, id: u32, round: u8, slot: &Slot) -> Result<()> {
        let cfg = self
            .groups
            .get(&id, 0)
            .map_err(|_| Error::NoSuchGroup { id })?;
        self.slots
            .set(slot_of(cfg.index, cfg.window_shift, round), *slot, 0)
            .map_err(|source| Error::Map {
                name: SLOTS,
                source,
            })
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
            .get(&slot_of(cfg.index, cfg.window_shift, round), 0)
            .map_err(|source| Error::Map {
                name: SLOTS,
                source,
            })
    }
}
