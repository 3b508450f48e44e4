//! Loading, attaching and detaching the XDP programs, with every object pinned (see
//! [`crate::pins`]) so that it outlives the process that attached it.

use std::{fs, io, path::Path};

use aya::{
    maps::{MapData, xdp::DevMapHash},
    programs::{
        ProgramError, SchedClassifier, TcAttachType, Xdp, XdpMode as AyaXdpMode,
        links::{FdLink, PinnedLink},
    },
};
use aya_obj::programs::XdpAttachType;
use innet_common::{
    control::SETTING_UP,
    maps::{
        CONTROL_EVENTS, CONTROL_OVERFLOW, DAEMON_STATS, GROUP_STATS, GROUPS, HOST_PORTS, JUMP,
        NIC_COMPLETIONS, PORT_STATS, PORTS, PROG_EGRESS, PROG_FANOUT, PROG_NIC, PROG_NIC_POST,
        PROG_SWITCH, SLOTS, SWITCH_CONFIG, TX_BLOCKED,
    },
};
use innet_net::netdev;
use tracing::{debug, info, warn};

use crate::{
    error::{Error, Result},
    pins::PinLayout,
};

mod object;
mod sizing;

pub use crate::attached::{PortStatus, attached, status};

pub use object::{load_object, load_switch};
pub(crate) use object::{program_mut, take_map, typed};
pub use sizing::{MAX_MAP_BYTES, MapMemory, Sizing};

/// How the program runs on an interface.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XdpMode {
    /// In the driver, before any skb exists (veth, most physical NICs).
    #[default]
    Native,
    /// Generic XDP after skb allocation: works on every interface, slower.
    Skb,
}

impl XdpMode {
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Native => "native",
            Self::Skb => "skb",
        }
    }
    const fn xdp_mode(self) -> AyaXdpMode {
        match self {
            Self::Native => AyaXdpMode::Driver,
            Self::Skb => AyaXdpMode::Skb,
        }
    }
}

/// Every map the object pins, by name.
const PINNED_MAPS: &[&str] = &[
    PORT_STATS,
    GROUPS,
    SLOTS,
    GROUP_STATS,
    JUMP,
    PORTS,
    CONTROL_EVENTS,
    CONTROL_OVERFLOW,
    SWITCH_CONFIG,
    DAEMON_STATS,
    NIC_COMPLETIONS,
    TX_BLOCKED,
    SETTING_UP,
    HOST_PORTS,
];
/// Programs pinned by name; the others are held by the `JUMP` table.
const PINNED_PROGS: &[&str] = &[PROG_SWITCH, PROG_EGRESS, PROG_NIC, PROG_NIC_POST];

/// How to load and attach.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttachOptions {
    pub mode: XdpMode,
    /// How the maps are sized (by the first attach only).
    pub sizing: Sizing,
}

/// What [`attach`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attached {
    pub ifname: String,
    pub ifindex: u32,
    pub mode: XdpMode,
    /// Whether this attach loaded the programs (first port) or reused the pinned ones.
    pub loaded: bool,
}

/// Attaches the switch program to `ifname`, adds the port to the broadcast devmap and pins
/// the link.
///
/// The first attach loads the object and pins programs and maps; later attaches reuse the
/// pinned program, so every port shares one set of maps.
///
/// # Errors
/// Not root, no bpffs, unknown interface, already attached, load or attach failures.
pub fn attach(pins: &PinLayout, ifname: &str, opts: AttachOptions) -> Result<Attached> {
    attach_entry(pins, ifname, opts, PROG_SWITCH)
}

/// Attaches the NIC-role program (`innet_nic`) to a host or SmartNIC port, pinned like
/// [`attach`]. The port needs no devmap entry: a NIC sends everything back out of itself.
///
/// # Errors
/// As [`attach`].
pub fn attach_nic(pins: &PinLayout, ifname: &str, opts: AttachOptions) -> Result<Attached> {
    attach_entry(pins, ifname, opts, PROG_NIC)
}

/// Attaches `innet_nic_post` to the NIC's post port (`nic::post_port`): what the host
/// writes into the port's peer is its own contribution, posted into the NIC.
///
/// # Errors
/// As [`attach`].
pub fn attach_nic_post(pins: &PinLayout, ifname: &str, opts: AttachOptions) -> Result<Attached> {
    attach_entry(pins, ifname, opts, PROG_NIC_POST)
}

/// Attaches the NIC-role program to a DPU's representor, pinned like [`attach`], and adds
/// the port to the broadcast devmap: a DPU root's result leaves by both ports at once (to
/// the host, and to the group's multicast address).
///
/// # Errors
/// As [`attach`].
pub fn attach_dpu(pins: &PinLayout, ifname: &str, opts: AttachOptions) -> Result<Attached> {
    attach_entry(pins, ifname, opts, PROG_NIC)
        .and_then(|a| register_port(pins, a.ifindex).map(|()| a))
}

/// A daemon's start: attaches `attach` (the switch's or the NIC's) to every port of `ifaces`
/// that has no pinned link yet; ports already attached keep their pinned state (a restarted
/// daemon recovers it).
///
/// # Errors
/// As [`attach`].
pub fn attach_missing(
    pins: &PinLayout,
    ifaces: &[String],
    opts: AttachOptions,
    attach: fn(&PinLayout, &str, AttachOptions) -> Result<Attached>,
) -> Result<()> {
    let already = attached(pins)?;
    for ifname in ifaces {
        if already.contains(ifname) {
            info!(ifname, "already attached: recovering the pinned state");
            if let Ok(ifindex) = netdev::ifindex(ifname) {
                let blocked = warn_if_redirect_blocked(ifname, ifindex, opts.mode);
                crate::port_health::note(pins, ifindex, blocked);
            }
            continue;
        }
        attach(pins, ifname, opts)?;
    }
    Ok(())
}

fn attach_entry(
    pins: &PinLayout,
    ifname: &str,
    opts: AttachOptions,
    entry: &'static str,
) -> Result<Attached> {
    let mode = opts.mode;
    netdev::require_root("innet attach")?;
    netdev::require_bpffs(pins.bpffs())?;
    let ifindex = netdev::ifindex(ifname)?;
    let link_pin = pins.link(ifname);
    if link_pin.exists() {
        return Err(Error::AlreadyAttached {
            ifname: ifname.to_owned(),
            pin: link_pin,
        });
    }
    for dir in [pins.progs_dir(), pins.maps_dir(), pins.links_dir()] {
        fs::create_dir_all(&dir).map_err(Error::io(&dir))?;
    }
    let prog_pin = pins.prog(entry);
    let loaded = !prog_pin.exists();
    if loaded {
        load_and_pin(pins, opts.sizing)?;
    }
    let mut prog = open_pinned_program(&prog_pin)?;
    if entry == PROG_SWITCH {
        register_port(pins, ifindex)?;
        attach_fanout(pins, ifname)?;
    }

    let link_id = prog
        .attach(ifname, mode.xdp_mode())
        .map_err(|source| Error::Attach {
            ifname: ifname.to_owned(),
            mode: mode.name(),
            hint: attach_hint(&source, mode),
            source,
        })?;
    let link = prog.take_link(link_id).map_err(|source| Error::Load {
        program: entry.to_owned(),
        source,
    })?;
    pin_link(link, ifname, &link_pin)?;
    info!(ifname, ifindex, mode = mode.name(), loaded, "attached");
    let blocked = warn_if_redirect_blocked(ifname, ifindex, mode);
    crate::port_health::note(pins, ifindex, blocked);
    Ok(Attached {
        ifname: ifname.to_owned(),
        ifindex,
        mode,
        loaded,
    })
}

/// Attaches the fan-out program to the port's tc ingress (tcx) and pins the link: the
/// switch program hands it the results a devmap broadcast refuses (multi-buffer frames).
fn attach_fanout(pins: &PinLayout, ifname: &str) -> Result<()> {
    let pin = pins.tc_link(ifname);
    if pin.exists() {
        return Ok(());
    }
    let dir = pins.tc_links_dir();
    fs::create_dir_all(&dir).map_err(Error::io(&dir))?;
    let mut prog =
        SchedClassifier::from_pin(pins.prog(PROG_FANOUT)).map_err(|e| Error::OpenPinned {
            what: "program",
            path: pins.prog(PROG_FANOUT),
            source: Box::new(e),
        })?;
    let id = prog
        .attach(ifname, TcAttachType::Ingress)
        .map_err(|source| Error::Attach {
            ifname: ifname.to_owned(),
            mode: "tcx ingress",
            hint: "",
            source,
        })?;
    let link = prog.take_link(id).map_err(|source| Error::Load {
        program: PROG_FANOUT.to_owned(),
        source,
    })?;
    pin_link(link, ifname, &pin)?;
    debug!(ifname, "fan-out attached (tcx ingress)");
    Ok(())
}

/// Pins an attachment's bpf link at `pin`, so that it outlives this process.
fn pin_link<L>(link: L, ifname: &str, pin: &Path) -> Result<()>
where
    FdLink: TryFrom<L>,
{
    let fd_link = FdLink::try_from(link).map_err(|_| Error::NoBpfLink {
        ifname: ifname.to_owned(),
    })?;
    fd_link.pin(pin).map_err(|source| Error::Pin {
        path: pin.to_owned(),
        source,
    })?;
    Ok(())
}

/// Unpins the link pinned at `path`: dropping the last fd releases the link and detaches.
fn unpin_link(path: &Path) -> Result<()> {
    let link = PinnedLink::from_pin(path).map_err(|e| Error::OpenPinned {
        what: "link",
        path: path.to_owned(),
        source: Box::new(e),
    })?;
    drop(link.unpin().map_err(Error::io(path))?);
    Ok(())
}

/// Detaches the port's fan-out program, if it has one.
fn detach_fanout(pins: &PinLayout, ifname: &str) -> Result<()> {
    let path = pins.tc_link(ifname);
    if !path.exists() {
        return Ok(());
    }
    unpin_link(&path)
}

/// Says so when frames innet redirects out of a natively attached port would be dropped by
/// the kernel, and names the fix (generic XDP redirects through the stack: no check);
/// returns whether they would.
fn warn_if_redirect_blocked(ifname: &str, ifindex: u32, mode: XdpMode) -> bool {
    if mode != XdpMode::Native {
        return false;
    }
    let blocked = crate::xdp_features::redirect_blocked(ifname, ifindex);
    if let Some(why) = &blocked {
        warn!("{why}");
    }
    if crate::xdp_features::is_veth(ifindex) {
        info!(
            ifname,
            "a veth turns TSO off on its peer while a native XDP program is attached: TCP through this port is segmented on the peer (about 0.2x the throughput on veth, docs/benchmarks.md); `--mode skb` keeps TSO"
        );
    }
    blocked.is_some()
}

fn attach_hint(err: &ProgramError, mode: XdpMode) -> &'static str {
    let errno = std::error::Error::source(err)
        .and_then(|e| e.downcast_ref::<io::Error>())
        .and_then(io::Error::raw_os_error);
    match (errno, mode) {
        (Some(libc::EOPNOTSUPP), XdpMode::Native) => {
            ": the driver has no native XDP, try `--mode skb`"
        }
        (Some(libc::EBUSY | libc::EEXIST), _) => {
            ": another XDP program is attached; remove it first (`ip link set dev IF xdp off`)"
        }
        _ => "",
    }
}

fn open_pinned_program(path: &Path) -> Result<Xdp> {
    open_pinned_xdp(path, XdpAttachType::Interface)
}

fn open_pinned_xdp(path: &Path, attach_type: XdpAttachType) -> Result<Xdp> {
    Xdp::from_pin(path, attach_type).map_err(|e| Error::OpenPinned {
        what: "program",
        path: path.to_owned(),
        source: Box::new(e),
    })
}

/// Loads the object and pins its programs and maps.
fn load_and_pin(pins: &PinLayout, sizing: Sizing) -> Result<()> {
    let mut ebpf = load_switch(sizing)?;
    for &name in PINNED_MAPS {
        let map = ebpf
            .map(name)
            .ok_or(Error::MissingInObject { kind: "map", name })?;
        let path = pins.map(name);
        map.pin(&path)
            .map_err(|source| Error::Pin { path, source })?;
    }
    for &name in PINNED_PROGS {
        let prog: &mut Xdp = program_mut(&mut ebpf, name)?;
        let path = pins.prog(name);
        prog.pin(&path).map_err(|source| Error::Pin {
            path: path.clone(),
            source,
        })?;
        debug!(path = %path.display(), "program pinned");
    }
    let fanout: &mut SchedClassifier = program_mut(&mut ebpf, PROG_FANOUT)?;
    let path = pins.prog(PROG_FANOUT);
    fanout.pin(&path).map_err(|source| Error::Pin {
        path: path.clone(),
        source,
    })?;
    // The pins hold programs and maps: `ebpf` can be dropped.
    Ok(())
}

/// Adds the port to the broadcast devmap, with the egress program that rewrites its copies.
fn register_port(pins: &PinLayout, ifindex: u32) -> Result<()> {
    let egress = open_pinned_xdp(&pins.prog(PROG_EGRESS), XdpAttachType::DevMap)?;
    let fd = egress.fd().map_err(|source| Error::Load {
        program: PROG_EGRESS.to_owned(),
        source,
    })?;
    let mut ports = open_ports(pins)?;
    ports
        .insert(ifindex, ifindex, Some(fd), 0)
        .map_err(|source| Error::DevMap { ifindex, source })
}

fn open_ports(pins: &PinLayout) -> Result<DevMapHash<MapData>> {
    pins.open_typed(PORTS)
}

/// Detaches innet from `ifname` by removing its pinned link and its devmap entry. When no
/// port is left and `keep_maps` is false, programs and maps are unpinned too (and so
/// unloaded).
///
/// # Errors
/// Not root, not attached, or a pin that cannot be removed.
pub fn detach(pins: &PinLayout, ifname: &str, keep_maps: bool) -> Result<()> {
    netdev::require_root("innet detach")?;
    let path = pins.link(ifname);
    if !path.exists() {
        return Err(Error::NotAttached {
            ifname: ifname.to_owned(),
            pin: path,
        });
    }
    unpin_link(&path)?;
    detach_fanout(pins, ifname)?;
    if let Ok(ifindex) = netdev::ifindex(ifname) {
        // A vanished interface has already left the devmap (the kernel removes it).
        let _ = open_ports(pins).map(|mut p| p.remove(ifindex));
        crate::port_health::note(pins, ifindex, false);
    }
    info!(ifname, "detached");
    if attached(pins)?.is_empty() && !keep_maps {
        remove_pins(pins)?;
    }
    Ok(())
}

/// Detaches every port, then unpins program and maps unless `keep_maps`.
///
/// # Errors
/// As [`detach`].
pub fn detach_all(pins: &PinLayout, keep_maps: bool) -> Result<Vec<String>> {
    netdev::require_root("innet detach --all")?;
    let names = attached(pins)?;
    for ifname in &names {
        detach(pins, ifname, true)?;
    }
    if !keep_maps {
        remove_pins(pins)?;
    }
    Ok(names)
}

/// Unpins program and maps and removes the pin directories.
fn remove_pins(pins: &PinLayout) -> Result<()> {
    for path in PINNED_PROGS
        .iter()
        .chain([&PROG_FANOUT])
        .map(|p| pins.prog(p))
        .chain(PINNED_MAPS.iter().map(|m| pins.map(m)))
    {
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::Io { path, source: e }),
        }
    }
    for dir in [
        pins.progs_dir(),
        pins.maps_dir(),
        pins.links_dir(),
        pins.tc_links_dir(),
        pins.root().to_owned(),
    ] {
        let _ = fs::remove_dir(&dir);
    }
    info!(root = %pins.root().display(), "program and maps unpinned");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use innet_common::group::{DEFAULT_CAPACITY, DEFAULT_WINDOW, MAX_CAPACITY, MAX_INPUTS, Stash};

    #[test]
    fn sizing_is_checked_and_its_memory_counted() {
        let default = Sizing::default().checked().expect("the default sizing");
        let m = default.memory();
        assert_eq!(
            m.stash,
            u64::from(DEFAULT_CAPACITY * DEFAULT_WINDOW * MAX_INPUTS) * size_of::<Stash>() as u64
        );
        assert!(m.total() > m.stash && m.total() <= MAX_MAP_BYTES);
        let wide = Sizing {
            capacity: 16,
            window: 128,
        };
        // 16 × 128 slots: twice the default 64 × 16.
        assert_eq!(wide.memory().slots, 2 * default.memory().slots);
        for bad in [12, 256] {
            assert!(matches!(
                Sizing { window: bad, ..default }.checked(),
                Err(Error::Window { window }) if window == bad
            ));
        }
        let Err(e) = Sizing {
            capacity: MAX_CAPACITY,
            window: 128,
        }
        .checked() else {
            panic!("1024 groups × 128 slots exceed the memory bound");
        };
        let text = e.to_string();
        assert!(text.contains("lower --capacity or --window"), "{text}");
    }
}
