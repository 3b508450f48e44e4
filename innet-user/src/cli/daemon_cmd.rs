//! `innet daemon`: run a switch in the foreground, set up by flags and a config file
//! ([`innet::daemon_config`] merges them).

use std::{net::Ipv4Addr, path::PathBuf};

use anyhow::{Context as _, Result};
use clap::{Args, ValueEnum};
use innet::{
    daemon_config::{DaemonConfig, DaemonRole, DaemonSettings, parse_op},
    group_maps::Role,
    loader::{AttachOptions, XdpMode},
    nic::{self, dpu_daemon::DpuDaemonOptions, nic_daemon::NicDaemonOptions},
    pins::PinLayout,
    switch_daemon::{self, DaemonOptions},
};
use innet_common::{
    capabilities::Capabilities,
    proto::{DEFAULT_PAYLOAD_BYTES, Op, payload_for_mtu},
};
use tokio::signal::unix::{SignalKind, signal};

use super::ModeArg;

#[derive(Clone, Copy, ValueEnum)]
enum RoleArg {
    Tor,
    Spine,
    /// A host's NIC ports: NIC-triggered reduction trees
    Nic,
    /// A BlueField-style DPU: the host's representor and the uplink (--uplink) of its
    /// eswitch; the DPU reduces for a host that runs no BPF
    Dpu,
}

#[derive(Args)]
pub struct DaemonArgs {
    /// Read the settings from this TOML file (dist/innet/daemon.sample.toml shows every
    /// key); a flag given here wins over the file's key
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Ports to run on (repeatable): host-facing ports and uplinks
    #[arg(short = 'i', long = "iface", value_name = "IFNAME")]
    ifaces: Vec<String>,
    /// Run on every port enslaved to this bridge (beside --iface)
    #[arg(long, value_name = "BRIDGE")]
    bridge: Option<String>,
    /// Ports towards the level above (repeatable; also list them with --iface): a TOR's
    /// towards its SPINEs or aggregation switches, an aggregation switch's towards the cores;
    /// on a DPU its uplink
    /// representor (p0), the other --iface being the host's (pf0hpf)
    #[arg(long = "uplink", value_name = "IFNAME")]
    uplinks: Vec<String>,
    /// This host's role in the fabric
    #[arg(long, value_enum)]
    role: Option<RoleArg>,
    /// This switch's IPv4 address, reported in control packets (TOR and SPINE); a DPU's own
    /// address (on its eswitch bridge), the source of the results it hands its host
    #[arg(long)]
    ip: Option<Ipv4Addr>,
    /// XDP mode [default: native]
    #[arg(short = 'm', long, value_enum)]
    mode: Option<ModeArg>,
    /// Groups this switch can hold [default: 64]
    #[arg(long)]
    capacity: Option<u32>,
    /// Slots per group, a power of two from 8 to 128: a group keeps up to half as many rounds
    /// in flight (long messages stream faster with more; memory grows with both) [default: 16]
    #[arg(long)]
    window: Option<u32>,
    /// On exit, leave programs, maps and groups pinned and attached (a restart recovers them)
    #[arg(long)]
    keep_state: bool,
    /// Free groups the control plane installed after this many seconds without data (0:
    /// never) [default: 300]
    #[arg(long, value_name = "SECONDS")]
    idle_timeout: Option<u64>,
    /// Serve the counters in the Prometheus text format at http://ADDR:PORT/metrics; a
    /// PORT alone is served on 127.0.0.1 (the labels name every group's wire id)
    #[arg(long, value_name = "[ADDR:]PORT", value_parser = innet::daemon_config::parse_metrics)]
    metrics: Option<std::net::SocketAddr>,
    /// Ops this switch (or NIC) announces (comma-separated; default: all). Groups that
    /// need another op run on the hosts
    #[arg(long, value_delimiter = ',', value_parser = parse_op, value_name = "OP,...")]
    ops: Vec<Op>,
    /// bpffs directory holding innet's pinned program, maps and links [default:
    /// /sys/fs/bpf/innet]
    #[arg(
        short = 'p',
        long = "pin-path",
        env = "INNET_PIN_PATH",
        value_name = "DIR"
    )]
    pin_path: Option<PathBuf>,
}

impl DaemonArgs {
    /// The settings the command line gives (unset where no flag was given).
    fn settings(self) -> DaemonSettings {
        DaemonSettings {
            role: self.role.map(|r| match r {
                RoleArg::Tor => DaemonRole::Tor,
                RoleArg::Spine => DaemonRole::Spine,
                RoleArg::Nic => DaemonRole::Nic,
                RoleArg::Dpu => DaemonRole::Dpu,
            }),
            ip: self.ip,
            iface: self.ifaces,
            bridge: self.bridge,
            uplink: self.uplinks,
            mode: self.mode.map(mode_of),
            capacity: self.capacity,
            window: self.window,
            keep_state: self.keep_state.then_some(true),
            idle_timeout: self.idle_timeout,
            metrics: self.metrics,
            ops: self.ops,
            pin_path: self.pin_path,
        }
    }
}

/// The command line's settings over the config file's, defaulted, the bridge expanded.
fn config(mut a: DaemonArgs) -> Result<DaemonConfig> {
    let path = a.config.take();
    let file = match &path {
        Some(path) => {
            tracing::info!(file = %path.display(), "reading the config file");
            DaemonSettings::from_file(path)?
        }
        None => DaemonSettings::default(),
    };
    Ok(a.settings()
        .over(file, path.as_deref())
        .resolve(innet::bridge::ports)?)
}

pub fn run(a: DaemonArgs) -> Result<()> {
    let c = config(a)?;
    let pins = PinLayout::new(&c.pin_path);
    // Bound before anything is attached: a taken port fails the start, naming it.
    if let Some(addr) = c.metrics.filter(|a| !a.ip().is_loopback()) {
        tracing::warn!(
            %addr,
            "serving the metrics beyond loopback: every group's wire id is in its labels; give a port alone to serve them on 127.0.0.1 (docs/deploy.md)"
        );
    }
    let metrics = c
        .metrics
        .map(|addr| {
            innet::metrics::bind(addr).with_context(|| {
                format!(
                    "{} {addr}: cannot listen there (is the port taken?)",
                    c.origins.of("metrics")
                )
            })
        })
        .transpose()?;
    let attach = AttachOptions {
        mode: c.mode,
        sizing: c.sizing,
    };
    let mut capabilities = Capabilities::default();
    if !c.ops.is_empty() {
        capabilities.ops = c.ops.iter().fold(0, |m, op| m | 1 << *op as u8);
    }
    capabilities.max_data_size = largest_payload(&c.ports)?;
    if matches!(c.role, DaemonRole::Nic | DaemonRole::Dpu) {
        // A DPU sends a result to both its ports by devmap broadcast: single-buffer frames
        // only. NIC posts went through BPF_PROG_TEST_RUN's live frames, which had less room
        // than a received one (posts of 3392 B fell back in the bench; 2944 B is what they
        // carried before 8 KiB slots); they now arrive on a veth, not re-measured above it.
        capabilities.max_data_size = capabilities.max_data_size.min(NIC_PAYLOAD_BYTES);
    }
    let role = match c.role {
        DaemonRole::Tor => Role::Tor,
        DaemonRole::Spine => Role::Spine,
        DaemonRole::Nic => {
            anyhow::ensure!(
                c.uplinks.is_empty(),
                "--uplink is for switches (and DPUs): a NIC sends everything out of its own port"
            );
            let opts = NicDaemonOptions {
                pins: pins.clone(),
                ifaces: c.ports,
                attach,
                keep_state: c.keep_state,
                capabilities,
            };
            return block_on_signals(pins, metrics, |shutdown| {
                nic::nic_daemon::run(opts, shutdown)
            });
        }
        DaemonRole::Dpu => {
            let (host_port, uplink) = dpu_ports(&c.ports, &c.uplinks)?;
            let opts = DpuDaemonOptions {
                pins: pins.clone(),
                host_port,
                uplink,
                ip: c.ip.context("--ip is required for a DPU")?,
                attach,
                keep_state: c.keep_state,
                idle_timeout: c.idle_timeout,
                capabilities,
            };
            return block_on_signals(pins, metrics, |shutdown| {
                nic::dpu_daemon::run(opts, shutdown)
            });
        }
    };
    let opts = DaemonOptions {
        pins: pins.clone(),
        ifaces: c.ports,
        uplinks: c.uplinks,
        role,
        ip: c.ip.context("--ip is required for a TOR or SPINE")?,
        attach,
        keep_state: c.keep_state,
        idle_timeout: c.idle_timeout,
        capabilities,
    };
    block_on_signals(pins, metrics, |shutdown| switch_daemon::run(opts, shutdown))
}

/// A DPU's two ports: (the host's representor, the uplink).
fn dpu_ports(ifaces: &[String], uplinks: &[String]) -> Result<(String, String)> {
    let usage = "a DPU runs on two ports: `-i pf0hpf -i p0 --uplink p0` (the host's representor and the uplink)";
    anyhow::ensure!(ifaces.len() == 2 && uplinks.len() == 1, "{usage}");
    let host = ifaces
        .iter()
        .find(|i| **i != uplinks[0])
        .with_context(|| format!("both ports are the uplink: {usage}"))?;
    Ok((host.clone(), uplinks[0].clone()))
}

/// The most a NIC or DPU daemon announces.
const NIC_PAYLOAD_BYTES: u16 = 2944;

/// The payload every port carries: from the smallest MTU among them (jumbo frames where
/// every link has them; 1408 B on 1500 B links).
fn largest_payload(ifaces: &[String]) -> Result<u16> {
    let mut smallest: Option<(usize, &str)> = None;
    for i in ifaces {
        let mtu = innet_net::netdev::mtu(i).with_context(|| format!("reading the MTU of {i}"))?;
        if smallest.is_none_or(|(m, _)| mtu < m) {
            smallest = Some((mtu, i));
        }
    }
    let Some((mtu, iface)) = smallest else {
        return Ok(DEFAULT_PAYLOAD_BYTES as u16);
    };
    let payload = payload_for_mtu(mtu);
    anyhow::ensure!(
        payload > 0,
        "the MTU of {iface} ({mtu} B) cannot carry an INC packet: raise it to 1500 (`ip link set {iface} mtu 1500`)"
    );
    tracing::info!(
        mtu,
        iface,
        payload,
        "largest payload per packet, from the smallest MTU"
    );
    Ok(payload as u16)
}

/// Runs a daemon on a single-threaded runtime until SIGINT or SIGTERM, with the watch of
/// its ports and, given a listener, the metrics server beside it.
fn block_on_signals<F, Fut>(
    pins: innet::pins::PinLayout,
    metrics: Option<std::net::TcpListener>,
    daemon: F,
) -> Result<()>
where
    F: FnOnce(std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>) -> Fut,
    Fut: std::future::Future<Output = innet::error::Result<()>>,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(async {
        let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        let shutdown = Box::pin(async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        });
        // Served on this runtime's thread between the daemon's events; ends with it.
        let server = metrics.map(|l| tokio::spawn(innet::metrics::serve(l, pins.clone())));
        let watch = tokio::spawn(innet::port_watch::watch(pins));
        let result = daemon(shutdown).await.map_err(anyhow::Error::from);
        watch.abort();
        if let Some(s) = server {
            s.abort();
        }
        result
    })
}

fn mode_of(m: ModeArg) -> XdpMode {
    match m {
        ModeArg::Native => XdpMode::Native,
        ModeArg::Skb => XdpMode::Skb,
    }
}
