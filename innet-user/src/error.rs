//! Typed errors of the library. Every message names the problem and the fix.

use std::{io, path::PathBuf};

use aya::{EbpfError, maps::MapError, pin::PinError, programs::ProgramError};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    ObjectMissing(#[from] innet_objects::ObjectMissing),
    #[error(transparent)]
    Netdev(#[from] innet_net::netdev::NetdevError),
    #[error(
        "innet is already attached to {ifname} (link pinned at {pin}): run `innet detach {ifname}` first"
    )]
    AlreadyAttached { ifname: String, pin: PathBuf },
    #[error(
        "innet is not attached to {ifname} (no link pinned at {pin}): `innet status` lists attached interfaces"
    )]
    NotAttached { ifname: String, pin: PathBuf },
    #[error("attaching to {ifname} in {mode} mode failed{hint}")]
    Attach {
        ifname: String,
        mode: &'static str,
        hint: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error(
        "the kernel gave {ifname} a netlink XDP attachment, which cannot be pinned: innet needs bpf_link XDP (Linux 5.9 or later)"
    )]
    NoBpfLink { ifname: String },
    #[error("group {id:#08x} is invalid: {why}")]
    BadGroup { id: u32, why: String },
    #[error("group {id:#08x} is already installed: `innet group del {id:#x}` first")]
    GroupExists { id: u32 },
    #[error("no group {id:#08x} on this switch: `innet group list` shows the installed ones")]
    NoSuchGroup { id: u32 },
    #[error(
        "this switch holds {capacity} groups, all taken: delete one, or re-attach with a larger `--capacity`"
    )]
    CapacityFull { capacity: u32 },
    #[error("capacity {capacity} is out of range: a switch holds 1 to {max} groups")]
    Capacity { capacity: u32, max: u32 },
    #[error(
        "window {window} is out of range: slots per group are a power of two from {} to {} (--window)",
        innet_common::group::MIN_WINDOW,
        innet_common::group::MAX_WINDOW
    )]
    Window { window: u32 },
    #[error(
        "--capacity {capacity} --window {window} would take {memory}, more than the {limit_gib} GiB a switch's group maps may take: lower --capacity or --window"
    )]
    MapMemory {
        capacity: u32,
        window: u32,
        memory: String,
        /// The limit (`loader::MAX_MAP_BYTES`), GiB.
        limit_gib: u64,
    },
    #[error("adding port {ifindex} to the broadcast devmap failed")]
    DevMap {
        ifindex: u32,
        #[source]
        source: aya::maps::xdp::XdpMapError,
    },
    #[error("parsing the XDP object failed")]
    Object(#[source] EbpfError),
    #[error(
        "the kernel refused program {program} (rerun with RUST_LOG=debug for the verifier log)"
    )]
    Load {
        program: String,
        #[source]
        source: ProgramError,
    },
    #[error(
        "the object has no {kind} named {name}: the embedded object does not match this binary, rebuild with `cargo xtask build`"
    )]
    MissingInObject {
        kind: &'static str,
        name: &'static str,
    },
    #[error("pinning at {path} failed")]
    Pin {
        path: PathBuf,
        #[source]
        source: PinError,
    },
    #[error("opening pinned {what} at {path} failed: is innet attached? (`innet status`)")]
    OpenPinned {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("map {name}")]
    Map {
        name: &'static str,
        #[source]
        source: MapError,
    },
    #[error("{path}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { path, source }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
