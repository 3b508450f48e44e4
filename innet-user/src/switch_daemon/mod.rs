//! `innet daemon`: owns a switch. It attaches innet to the given ports, takes the control
//! packets (query / notify / kill) that XDP hands up through the `CONTROL_EVENTS` ring,
//! processes them, and re-sends them along their path. SIGINT/SIGTERM gives the control
//! packets back to the fabric and detaches everything (unless `keep_state`); a restarted
//! daemon finds its pinned programs, maps and groups and carries on.

mod forward;
pub(crate) mod gc;
pub mod port_rate;
mod process;
pub(crate) mod ring;

use std::{future::Future, net::Ipv4Addr};

use aya::maps::{Array, MapData};
use innet_common::{
    capabilities::Capabilities,
    codec::{as_bytes, parse_unverified, replace_body, turn_around},
    control::{ControlEvent, SwitchConfig},
    maps::{DAEMON_STATS, SWITCH_CONFIG},
    proto::PacketKind,
    stats::DaemonStats,
};
use innet_net::netdev;
use tracing::{debug, info, warn};

use crate::{
    error::{Error, Result},
    group_maps::{GroupMaps, Role},
    host_ports::HostPorts,
    loader::{self, AttachOptions},
    pins::PinLayout,
};

pub use process::BINDING_TTL;

/// How a daemon runs its switch.
#[derive(Clone, Debug)]
pub struct DaemonOptions {
    pub pins: PinLayout,
    /// Ports to attach (host-facing and uplinks alike).
    pub ifaces: Vec<String>,
    /// Ports towards the switches above (parent-facing): a TOR's towards its SPINEs or
    /// aggregation switches, an aggregation switch's towards the cores; none at the top.
    pub uplinks: Vec<String>,
    pub role: Role,
    /// This switch's address, written into control packets (their path, `tor1_ip`,
    /// `spine_ip`, `tor2_ip`).
    pub ip: Ipv4Addr,
    pub attach: AttachOptions,
    /// Leave programs, maps and groups pinned and attached on exit.
    pub keep_state: bool,
    /// Free control-plane groups that saw no data for this long (`None`: never).
    pub idle_timeout: Option<std::time::Duration>,
    pub capabilities: Capabilities,
}

/// Runs until `shutdown` completes.
///
/// # Errors
/// Attach failures, missing maps, or an unusable ring buffer.
pub async fn run(opts: DaemonOptions, shutdown: impl Future<Output = ()>) -> Result<()> {
    netdev::require_root("innet daemon")?;
    loader::attach_missing(&opts.pins, &opts.ifaces, opts.attach, loader::attach)?;
    let mut config: Array<MapData, SwitchConfig> = opts.pins.open_typed(SWITCH_CONFIG)?;
    let mut ring = ring::open(&opts.pins)?;
    let forwarder = forward::Forwarder::new(&opts.ifaces)?;
    let mut groups = GroupMaps::open(&opts.pins)?;
    let opts = DaemonOptions {
        capabilities: opts.capabilities.with_window(groups.window()),
        ..opts
    };
    let mut registry = process::Registry::recover(&groups);
    let mut rates = port_rate::PortRates::default();
    // The data path's copy of the bindings starts as empty as the registry's.
    let mut host_ports = HostPorts::open(&opts.pins)
        .inspect_err(|e| warn!(error = %e, "no HOST_PORTS map (pins of an older innet?): host-to-host frames are not checked against address bindings"))
        .ok();
    if let Some(h) = host_ports.as_mut() {
        h.clear();
    }
    let mut published: Array<MapData, DaemonStats> = opts.pins.open_typed(DAEMON_STATS)?;
    // A restarted daemon continues the counters of the one before it.
    if let Ok(before) = published.get(&0, 0) {
        registry.stats = before;
    }
    let mut idle = gc::IdleCollector::default();
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    set_switch_config(&mut config, true, 0, Some(opts.ip))?;
    info!(ports = ?opts.ifaces, role = ?opts.role, ip = %opts.ip, "daemon running");

    tokio::pin!(shutdown);
    let result = loop {
        tokio::select! {
            () = &mut shutdown => break Ok(()),
            _ = tick.tick() => {
                warn_shed_ports(&mut rates);
                if let Some(timeout) = opts.idle_timeout {
                    for id in idle.sweep(&mut groups, timeout) {
                        registry.forget(id);
                        registry.stats.groups_collected += 1;
                    }
                    publish(&mut published, &registry.stats);
                }
            }
            drained = ring::drain(&mut ring, |ev| {
                if shed(&opts, &forwarder, &mut rates, ev) {
                    registry.stats.control_shed += 1;
                } else {
                    handle(&opts, &forwarder, &mut groups, &mut registry, ev);
                }
            }) => {
                sync_bindings(&mut registry, host_ports.as_mut());
                if let Err(e) = drained {
                    break Err(e);
                }
                publish(&mut published, &registry.stats);
            }
        }
    };
    // Give control packets back to the fabric before anything else goes away.
    set_switch_config(&mut config, false, 0, Some(std::net::Ipv4Addr::UNSPECIFIED))?;
    if opts.keep_state {
        info!("exiting; programs, maps and groups stay pinned (--keep-state)");
    } else {
        let ports = loader::detach_all(&opts.pins, false)?;
        info!(?ports, "exiting; detached and unpinned");
    }
    result
}

/// Copies the bindings the registry made, moved or let expire into the data path's map.
fn sync_bindings(registry: &mut process::Registry, host_ports: Option<&mut HostPorts>) {
    let changes = registry.take_binding_changes();
    let Some(map) = host_ports else { return };
    for (ip, port) in changes {
        match port {
            Some(port) => {
                if let Err(e) = map.bind(ip, port) {
                    warn!(%ip, port, error = %e, "binding not copied to the data path");
                }
            }
            None => map.unbind(ip),
        }
    }
}

/// Writes the daemon's counters where `innet stats` reads them.
pub(crate) fn publish(map: &mut Array<MapData, DaemonStats>, stats: &DaemonStats) {
    if let Err(e) = map.set(0, *stats, 0) {
        warn!(error = %e, "publishing the daemon counters failed");
    }
}

/// Turns the hand-up of control packets to the daemon on or off; `host_ifindex` names a
/// DPU's port towards its host (0 on a switch).
pub(crate) fn set_control(
    config: &mut Array<MapData, SwitchConfig>,
    on: bool,
    host_ifindex: u32,
) -> Result<()> {
    set_switch_config(config, on, host_ifindex, None)
}

/// [`set_control`], and the switch's own address (`own_ip`: the data plane answers data
/// addressed to it for a group it does not hold with a group-lost notice); `None` keeps
/// the address already published.
pub(crate) fn set_switch_config(
    config: &mut Array<MapData, SwitchConfig>,
    on: bool,
    host_ifindex: u32,
    own_ip: Option<std::net::Ipv4Addr>,
) -> Result<()> {
    let before = config.get(&0, 0).unwrap_or_default();
    let value = SwitchConfig {
        control_to_daemon: u32::from(on),
        host_ifindex,
        own_ip: own_ip.map_or(before.own_ip, |ip| ip.octets()),
    };
    config.set(0, value, 0).map_err(|source| Error::Map {
        name: SWITCH_CONFIG,
        source,
    })
}

/// Names the host ports whose control frames were shed, with the fix.
fn warn_shed_ports(rates: &mut port_rate::PortRates) {
    for (ifindex, frames) in rates.due_warnings(std::time::Instant::now()) {
        let port = innet_net::netdev::ifname(ifindex).unwrap_or_else(|| ifindex.to_string());
        warn!(
            %port,
            frames,
            limit = port_rate::FRAMES_PER_SECOND,
            "shed control frames from a host port over its rate (counter control_shed): a host \
             on it floods the control plane; find it with `tcpdump -i {port} udp port 4791` and stop it; \
             other ports' set-ups go on"
        );
    }
}

/// Whether `ev` comes from a TOR's host port past its rate ([`port_rate`]): dropped before
/// anything reads it.
fn shed(
    opts: &DaemonOptions,
    forwarder: &forward::Forwarder,
    rates: &mut port_rate::PortRates,
    ev: &ControlEvent,
) -> bool {
    opts.role == Role::Tor
        && !forwarder.is_uplink(ev.ifindex, &opts.uplinks)
        && !rates.admit(ev.ifindex, std::time::Instant::now())
}

fn handle(
    opts: &DaemonOptions,
    forwarder: &forward::Forwarder,
    groups: &mut GroupMaps,
    registry: &mut process::Registry,
    ev: &ControlEvent,
) {
    let len = (ev.len as usize).min(ev.frame.len());
    let mut frame = ev.frame[..len].to_vec();
    let parsed = match parse_unverified(&frame) {
        Ok(p) => p,
        Err(e) => {
            warn!(ifindex = ev.ifindex, error = %e, "dropping a control frame that does not parse");
            registry.stats.control_unparsable += 1;
            return;
        }
    };
    registry.stats.control_handled += 1;
    let seen = process::Seen {
        parsed: &parsed,
        ingress: ev.ifindex,
        from_uplink: forwarder.is_uplink(ev.ifindex, &opts.uplinks),
        dst_is_local: forwarder.dst_is_local(&frame, &opts.uplinks),
    };
    let kind = parsed.verdict;
    let Some((payload, route)) = registry.process(opts, groups, &seen) else {
        debug!(?kind, "control frame consumed");
        return;
    };
    let turned = match route {
        process::Route::Back => turn_around(&mut frame, PacketKind::Notify),
        process::Route::Return => turn_around(&mut frame, PacketKind::Query),
        _ => Ok(()),
    };
    if let Err(e) = turned {
        warn!(error = %e, "turning a control frame around failed");
        return;
    }
    if let Err(e) = replace_body(&mut frame, as_bytes(&payload)) {
        warn!(error = %e, "rewriting a control frame failed");
        return;
    }
    debug!(?kind, ifindex = ev.ifindex, ?route, "forwarding");
    let sent = match route {
        process::Route::Path => forwarder.forward(&frame, ev.ifindex, &opts.uplinks),
        process::Route::Port(ifindex) => forwarder.send_on(&frame, ifindex),
        process::Route::Uplinks => forwarder.send_uplinks(&frame, &opts.uplinks),
        process::Route::Below => forwarder.send_below(&frame, ev.ifindex, &opts.uplinks),
        process::Route::Back | process::Route::Return => forwarder.send_on(&frame, ev.ifindex),
    };
    if let Err(e) = sent {
        warn!(error = %e, "forwarding a control frame failed");
    }
}
