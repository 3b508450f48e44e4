//! Where innet pins its objects on the bpffs:
//!
//! ```text
//! <root>/                      default /sys/fs/bpf/innet
//!   progs/innet_switch         the loaded program, shared by every attached port
//!   maps/PORT_STATS            counters (and, later, group and slot maps)
//!   links/<ifname>             one bpf_link per attached interface
//! ```
//!
//! Pinned links keep the program attached after the CLI exits; unpinning the last link and
//! the program unloads everything.

use std::path::{Path, PathBuf};

use aya::maps::{Map, MapData, MapError};

use crate::error::{Error, Result};

/// The default pin root.
pub const DEFAULT_ROOT: &str = "/sys/fs/bpf/innet";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinLayout {
    root: PathBuf,
}

impl Default for PinLayout {
    fn default() -> Self {
        Self::new(DEFAULT_ROOT)
    }
}

impl PinLayout {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }
    #[must_use]
    pub fn root(&self) -> &Path {
        &self.root
    }
    /// The bpffs mount the root lives on (its parent directory).
    #[must_use]
    pub fn bpffs(&self) -> &Path {
        self.root.parent().unwrap_or(&self.root)
    }
    #[must_use]
    pub fn progs_dir(&self) -> PathBuf {
        self.root.join("progs")
    }
    #[must_use]
    pub fn maps_dir(&self) -> PathBuf {
        self.root.join("maps")
    }
    #[must_use]
    pub fn links_dir(&self) -> PathBuf {
        self.root.join("links")
    }
    #[must_use]
    pub fn prog(&self, name: &str) -> PathBuf {
        self.progs_dir().join(name)
    }
    #[must_use]
    pub fn map(&self, name: &str) -> PathBuf {
        self.maps_dir().join(name)
    }
    #[must_use]
    pub fn link(&self, ifname: &str) -> PathBuf {
        self.links_dir().join(ifname)
    }
    /// The tc links of the switch ports' fan-out program, one per port.
    #[must_use]
    pub fn tc_links_dir(&self) -> PathBuf {
        self.root.join("tc-links")
    }
    #[must_use]
    pub fn tc_link(&self, ifname: &str) -> PathBuf {
        self.tc_links_dir().join(ifname)
    }
}

impl PinLayout {
    /// Opens the pinned map `name` (typed by the caller with `try_into`).
    ///
    /// # Errors
    /// No such pin (innet not attached), or not a map of a known type.
    pub fn open_map(&self, name: &'static str) -> Result<Map> {
        let path = self.map(name);
        let data = MapData::from_pin(&path).map_err(|e| Error::OpenPinned {
            what: "map",
            path,
            source: Box::new(e),
        })?;
        Map::from_map_data(data).map_err(|source| Error::Map { name, source })
    }

    /// Opens the pinned map `name` as the typed map `T`.
    ///
    /// # Errors
    /// As [`Self::open_map`], or a map of another type.
    pub fn open_typed<T: TryFrom<Map, Error = MapError>>(&self, name: &'static str) -> Result<T> {
        T::try_from(self.open_map(name)?).map_err(|source| Error::Map { name, source })
    }
}
