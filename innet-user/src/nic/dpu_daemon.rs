//! `innet daemon --role dpu`: runs on a BlueField-style DPU's Arm cores, between the host
//! and the fabric. It attaches `innet_nic` to the host's representor (`pf0hpf`) and the
//! uplink (`p0`) and serves the host's setup requests, which arrive as control frames
//! on the host's port (see [`innet_net::nic::dpu`]): it installs the host's member of the tree,
//! answers from the DPU's own address, and frees the member on the host's release or when
//! it sees no data for the idle timeout. The host runs no BPF and holds no descriptor of
//! the DPU: its contributions and results are ordinary RoCEv2 frames on its PF.

use std::{future::Future, net::Ipv4Addr, time::Duration};

use aya::maps::{Array, MapData};
use innet_common::{
    capabilities::Capabilities,
    codec::{Addressing, encode_control, parse_unverified},
    control::{ControlEvent, SwitchConfig},
    fail::{FAIL_CAPACITY, FAIL_DPU_REFUSED},
    maps::{DAEMON_STATS, SWITCH_CONFIG},
    proto::{PacketKind, QNH_RESPONSE},
    stats::DaemonStats,
    validate::Verdict,
};
use innet_net::{
    netdev::{self, PacketSocket},
    nic::{
        dpu::{self, DpuRequest},
        tree::result_address,
    },
};
use tracing::{debug, info, warn};

use crate::{
    switch_daemon::{gc::IdleCollector, publish, ring, set_control},
    error::{Error, Result},
    group_maps::{DpuSide, GroupMaps, NicGroupSpec},
    loader::{self, AttachOptions},
    nic::membership::Memberships,
    pins::PinLayout,
};

/// How a DPU daemon runs.
#[derive(Clone, Debug)]
pub struct DpuDaemonOptions {
    pub pins: PinLayout,
    /// The representor of the host's PF (`pf0hpf`): the host's own traffic comes in here.
    pub host_port: String,
    /// The uplink representor (`p0`), towards the fabric.
    pub uplink: String,
    /// The DPU's own address (on its eswitch bridge): results reach the host from it, and
    /// ARP for the parent's MAC goes out of the interface that holds it.
    pub ip: Ipv4Addr,
    pub attach: AttachOptions,
    /// Leave programs, maps and groups pinned and attached on exit.
    pub keep_state: bool,
    /// Free members that saw no data for this long (`None`: never).
    pub idle_timeout: Option<Duration>,
    pub capabilities: Capabilities,
}

/// How long the daemon waits for ARP to find a parent's MAC.
const ARP_TIMEOUT: Duration = Duration::from_secs(2);

/// The DPU's fixed facts, read once at start.
struct Dpu {
    opts: DpuDaemonOptions,
    host_ifindex: u32,
    uplink_ifindex: u32,
    /// MAC of the host's representor: the source of the frames the DPU hands the host.
    mac: [u8; 6],
    /// The interface holding the DPU's address (ARP goes out of it, and the IGMP
    /// memberships in result addresses).
    arp_iface: String,
    arp_ifindex: u32,
    sock: PacketSocket,
}

/// Runs until `shutdown` completes.
///
/// # Errors
/// Attach failures, missing pins, an address that is on no interface here, or an
/// unusable ring buffer.
pub async fn run(opts: DpuDaemonOptions, shutdown: impl Future<Output = ()>) -> Result<()> {
    netdev::require_root("innet daemon --role dpu")?;
    let arp_iface = netdev::ifname_of(opts.ip).ok_or_else(|| Error::Io {
        path: format!(
            "--ip {}: no interface of this DPU holds it (give the address of its eswitch bridge, `ip -4 addr`)",
            opts.ip
        )
        .into(),
        source: std::io::ErrorKind::NotFound.into(),
    })?;
    let ports = [opts.host_port.clone(), opts.uplink.clone()];
    loader::attach_missing(&opts.pins, &ports, opts.attach, loader::attach_dpu)?;
    let host_ifindex = netdev::ifindex(&opts.host_port)?;
    let mut config: Array<MapData, SwitchConfig> = opts.pins.open_typed(SWITCH_CONFIG)?;
    let mut ring = ring::open(&opts.pins)?;
    let mut groups = GroupMaps::open(&opts.pins)?;
    let dpu = Dpu {
        host_ifindex,
        uplink_ifindex: netdev::ifindex(&opts.uplink)?,
        mac: netdev::mac(&opts.host_port)?,
        arp_ifindex: netdev::ifindex(&arp_iface)?,
        arp_iface,
        sock: PacketSocket::new().map_err(|source| Error::Io {
            path: "socket(AF_PACKET)".into(),
            source,
        })?,
        opts: DpuDaemonOptions {
            capabilities: opts.capabilities.with_window(groups.window()),
            ..opts
        },
    };
    let mut published: Array<MapData, DaemonStats> = dpu.opts.pins.open_typed(DAEMON_STATS)?;
    let mut stats = published.get(&0, 0).unwrap_or_default();
    let mut idle = IdleCollector::default();
    let mut joined = Memberships::default();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    set_control(&mut config, true, host_ifindex)?;
    info!(host_port = %dpu.opts.host_port, uplink = %dpu.opts.uplink, ip = %dpu.opts.ip, "DPU daemon running");

    tokio::pin!(shutdown);
    let result = loop {
        tokio::select! {
            () = &mut shutdown => break Ok(()),
            _ = tick.tick() => {
                if let Some(timeout) = dpu.opts.idle_timeout {
                    for id in idle.sweep(&mut groups, timeout) {
                        joined.leave(id);
                        stats.groups_collected += 1;
                    }
                    publish(&mut published, &stats);
                }
            }
            drained = ring::drain(&mut ring, |ev| dpu.handle(&mut groups, &mut joined, &mut stats, ev)) => {
                if let Err(e) = drained {
                    break Err(e);
                }
                publish(&mut published, &stats);
            }
        }
    };
    // The host's requests pass on untouched again before anything else goes away; the
    // host's port stays named, for members kept with --keep-state.
    set_control(&mut config, false, host_ifindex)?;
    if dpu.opts.keep_state {
        info!("exiting; programs, maps and groups stay pinned (--keep-state)");
    } else {
        let ports = loader::detach_all(&dpu.opts.pins, false)?;
        info!(?ports, "exiting; detached and unpinned");
    }
    result
}

impl Dpu {
    /// One request from the host: install (query) or release (kill) its member.
    fn handle(
        &self,
        groups: &mut GroupMaps,
        joined: &mut Memberships,
        stats: &mut DaemonStats,
        ev: &ControlEvent,
    ) {
        let frame = &ev.frame[..(ev.len as usize).min(ev.frame.len())];
        let Some((parsed, c)) = parse_unverified(frame)
            .ok()
            .and_then(|p| p.control().map(|c| (p, c)))
            .filter(|_| ev.ifindex == self.host_ifindex)
        else {
            warn!(
                ifindex = ev.ifindex,
                "dropping a control frame that is no request from the host"
            );
            stats.control_unparsable += 1;
            return;
        };
        stats.control_handled += 1;
        let host = (parsed.addr.src_ip, parsed.addr.src_mac);
        let wire_id = c.true_comm_id() & 0x00ff_ffff;
        match parsed.verdict {
            Verdict::Control(PacketKind::Query) if c.query_notify_hop & QNH_RESPONSE == 0 => {
                let offer = self.install(groups, joined, stats, &c, host);
                let answer = dpu::answer(c.true_comm_id(), offer);
                let to = Addressing {
                    src_mac: self.mac,
                    dst_mac: host.1,
                    src_ip: self.opts.ip,
                    dst_ip: host.0,
                    ..Addressing::default()
                };
                let frame = encode_control(&to, PacketKind::Notify, 0, &answer);
                if let Err(e) = self.sock.send(self.host_ifindex, &frame) {
                    warn!(error = %e, "answering the host failed");
                }
            }
            Verdict::Control(PacketKind::Kill) => {
                let owned = groups
                    .get(wire_id)
                    .is_ok_and(|g| g.config.host_ip == host.0.octets());
                if owned {
                    joined.leave(wire_id);
                }
                if owned && groups.remove(wire_id).is_ok() {
                    stats.groups_killed += 1;
                    info!(
                        group = format_args!("{wire_id:#08x}"),
                        "member released by the host"
                    );
                }
            }
            other => debug!(?other, "not a request: ignored"),
        }
    }

    /// Installs the host's member of the tree the request describes (again, if it is
    /// there already: a repeated request finds it fresh); the offer, or a `fail_cause`.
    fn install(
        &self,
        groups: &mut GroupMaps,
        joined: &mut Memberships,
        stats: &mut DaemonStats,
        c: &innet_common::wire::ControlPayload,
        (host_ip, host_mac): (Ipv4Addr, [u8; 6]),
    ) -> std::result::Result<Capabilities, u8> {
        let wire_id = c.true_comm_id() & 0x00ff_ffff;
        let group = format_args!("{wire_id:#08x}").to_string();
        let req = DpuRequest::from_payload(c).map_err(|e| {
            warn!(%group, error = %e, "a request for a tree that cannot be: refused");
            stats.refused_invalid += 1;
            FAIL_DPU_REFUSED
        })?;
        let parent = match req.parent {
            None => None,
            Some(ip) => {
                let mac = netdev::neighbour_mac(ip, &self.arp_iface, ARP_TIMEOUT).ok_or_else(|| {
                    warn!(%group, parent = %ip, iface = %self.arp_iface, "no ARP answer from the parent: refused");
                    stats.refused_invalid += 1;
                    FAIL_DPU_REFUSED
                })?;
                Some((ip, mac))
            }
        };
        let spec = NicGroupSpec {
            id: wire_id,
            ifindex: self.uplink_ifindex,
            own_mac: host_mac,
            own_ip: host_ip,
            own_rank: req.me,
            parent,
            root: req.root,
            result: result_address(wire_id),
            children: req
                .tree
                .children(req.me as usize)
                .map(|c| (Ipv4Addr::UNSPECIFIED, c as u32))
                .collect(),
            dpu: Some(DpuSide {
                host_ifindex: self.host_ifindex,
                host_ip,
                host_mac,
                dpu_ip: self.opts.ip,
                dpu_mac: self.mac,
            }),
        };
        // A repeated request (its answer was lost, or only slow: the host asks again after
        // 50 ms) finds the member as it is: the host may have had the first answer and
        // its tree be running, and a reinstall would lose the rounds in flight and leave,
        // for its duration, no member to take the host's frames.
        if groups.holds_nic(&spec).unwrap_or(false) {
            stats.setups_repeated += 1;
            debug!(%group, "a repeated request for the member as installed: answered again");
            return Ok(self.opts.capabilities);
        }
        // A request for another tree under the same id replaces the member.
        let again = groups.get(wire_id).is_ok();
        if again {
            let _ = groups.remove(wire_id);
        }
        // Results come by multicast to every member below the root: join before any flows.
        if req.me != 0
            && let Err(e) = joined.join(wire_id, self.arp_ifindex)
        {
            warn!(%group, error = %e, "joining the result address failed: refused");
            stats.refused_invalid += 1;
            return Err(FAIL_DPU_REFUSED);
        }
        let installed = groups.install_nic(&spec);
        if installed.is_err() {
            joined.leave(wire_id);
        }
        match installed {
            Ok(index) => {
                stats.groups_installed += u64::from(!again);
                info!(%group, me = req.me, members = req.tree.n, degree = req.tree.degree, host = %host_ip, index, "DPU member installed");
                Ok(self.opts.capabilities)
            }
            Err(e @ Error::CapacityFull { .. }) => {
                warn!(%group, error = %e, "no room for the group: refused");
                stats.refused_capacity += 1;
                Err(FAIL_CAPACITY)
            }
            Err(e) => {
                warn!(%group, error = %e, "installing the member failed: refused");
                stats.refused_invalid += 1;
                Err(FAIL_DPU_REFUSED)
            }
        }
    }
}
