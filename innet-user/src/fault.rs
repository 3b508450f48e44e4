//! The fault injector of test fabrics (`innet_fault`) from userspace: attach it to a port,
//! set what it drops, read what it did. Detached when dropped.

use aya::{
    Ebpf,
    maps::{Array, PerCpuArray},
    programs::{Xdp, XdpMode},
};
use innet_common::{
    fault::{FaultConfig, FaultStats},
    maps::{FAULT_CONFIG, FAULT_STATS, GROUP_STATS, GROUPS, NIC_COMPLETIONS, PROG_FAULT, SLOTS},
};

use crate::{
    error::{Error, Result},
    loader, netdev,
};

/// `innet_fault` attached to one port (in the current network namespace).
pub struct FaultInjector {
    ebpf: Ebpf,
}

impl FaultInjector {
    /// Loads only the injector (group maps shrunk to nothing) and attaches it to `ifname`.
    ///
    /// # Errors
    /// Not root, no such interface, or a load or attach failure.
    pub fn attach(ifname: &str, cfg: FaultConfig) -> Result<Self> {
        netdev::require_root("attaching the fault injector")?;
        let mut ebpf = loader::load_object_with(|l| {
            for map in [GROUPS, SLOTS, GROUP_STATS, NIC_COMPLETIONS] {
                l.map_max_entries(map, 1);
            }
        })?;
        let prog: &mut Xdp = ebpf
            .program_mut(PROG_FAULT)
            .ok_or(Error::MissingInObject {
                kind: "program",
                name: PROG_FAULT,
            })?
            .try_into()
            .map_err(|source| Error::Load {
                program: PROG_FAULT,
                source,
            })?;
        prog.load().map_err(|source| Error::Load {
            program: PROG_FAULT,
            source,
        })?;
        prog.attach(ifname, XdpMode::Driver)
            .map_err(|source| Error::Attach {
                ifname: ifname.to_owned(),
                mode: "native",
                hint: "",
                source,
            })?;
        let mut me = Self { ebpf };
        me.set(cfg)?;
        Ok(me)
    }

    /// Changes what is dropped.
    ///
    /// # Errors
    /// A map write failure.
    pub fn set(&mut self, cfg: FaultConfig) -> Result<()> {
        let map = self
            .ebpf
            .map_mut(FAULT_CONFIG)
            .ok_or(Error::MissingInObject {
                kind: "map",
                name: FAULT_CONFIG,
            })?;
        let mut config: Array<_, FaultConfig> =
            Array::try_from(map).map_err(|source| Error::Map {
                name: FAULT_CONFIG,
                source,
            })?;
        config.set(0, cfg, 0).map_err(|source| Error::Map {
            name: FAULT_CONFIG,
            source,
        })
    }

    /// What it saw and dropped, summed over CPUs.
    ///
    /// # Errors
    /// A map read failure.
    pub fn stats(&self) -> Result<FaultStats> {
        let map = self.ebpf.map(FAULT_STATS).ok_or(Error::MissingInObject {
            kind: "map",
            name: FAULT_STATS,
        })?;
        let stats: PerCpuArray<_, FaultStats> =
            PerCpuArray::try_from(map).map_err(|source| Error::Map {
                name: FAULT_STATS,
                source,
            })?;
        let per_cpu = stats.get(&0, 0).map_err(|source| Error::Map {
            name: FAULT_STATS,
            source,
        })?;
        let mut sum = FaultStats::default();
        for s in per_cpu.iter() {
            sum.accumulate(s);
        }
        Ok(sum)
    }
}
