//! How big a switch's group maps are, and what memory they take.

use std::fmt;

use innet_common::group::{
    Completion, DEFAULT_CAPACITY, DEFAULT_WINDOW, GroupConfig, MAX_CAPACITY, MAX_INPUTS, Slot,
    Stash, valid_window,
};
use innet_common::stats::GroupStats;

use crate::error::{Error, Result};

/// Most memory the group maps of one switch may take (`--capacity` × `--window`).
pub const MAX_MAP_BYTES: u64 = 1 << 30;

/// How a switch's group maps are sized: groups it holds, and slots (rounds in flight, see
/// [`innet_common::group`]) per group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizing {
    pub capacity: u32,
    pub window: u32,
}

impl Default for Sizing {
    fn default() -> Self {
        Self {
            capacity: DEFAULT_CAPACITY,
            window: DEFAULT_WINDOW,
        }
    }
}

/// Bytes of the maps that grow with [`Sizing`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapMemory {
    pub slots: u64,
    /// The float contributions kept for an order-independent fold.
    pub stash: u64,
    pub completions: u64,
    pub groups: u64,
}

impl MapMemory {
    #[must_use]
    pub fn total(&self) -> u64 {
        self.slots + self.stash + self.completions + self.groups
    }
}

impl fmt::Display for MapMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
        write!(
            f,
            "{:.1} MiB (slots {:.1}, float stash {:.1}, NIC completions {:.1}, groups {:.1})",
            mib(self.total()),
            mib(self.slots),
            mib(self.stash),
            mib(self.completions),
            mib(self.groups)
        )
    }
}

impl Sizing {
    /// Map memory this sizing takes.
    #[must_use]
    pub fn memory(&self) -> MapMemory {
        let slots = u64::from(self.capacity) * u64::from(self.window);
        let size = |s: usize| s as u64;
        MapMemory {
            slots: slots * size(size_of::<Slot>()),
            stash: slots * u64::from(MAX_INPUTS) * size(size_of::<Stash>()),
            completions: slots * size(size_of::<Completion>()),
            groups: u64::from(self.capacity)
                * size(size_of::<GroupConfig>() + size_of::<GroupStats>() * cpus()),
        }
    }

    /// This sizing if the switch can have it.
    ///
    /// # Errors
    /// A capacity or window out of range, or more map memory than [`MAX_MAP_BYTES`].
    pub fn checked(self) -> Result<Self> {
        if self.capacity == 0 || self.capacity > MAX_CAPACITY {
            return Err(Error::Capacity {
                capacity: self.capacity,
                max: MAX_CAPACITY,
            });
        }
        if !valid_window(self.window) {
            return Err(Error::Window {
                window: self.window,
            });
        }
        let memory = self.memory();
        if memory.total() > MAX_MAP_BYTES {
            return Err(Error::MapMemory {
                capacity: self.capacity,
                window: self.window,
                memory: memory.to_string(),
                limit_gib: MAX_MAP_BYTES >> 30,
            });
        }
        Ok(self)
    }
}

/// CPUs with a per-CPU copy of the group counters.
fn cpus() -> usize {
    aya::util::nr_cpus().unwrap_or(1)
}
