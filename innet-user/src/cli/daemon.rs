//! `innet daemon`: run a switch in the foreground.

use std::net::Ipv4Addr;

use anyhow::{Context as _, Result};
use clap::{Args, ValueEnum};
use innet::{
    daemon::{self, DaemonOptions},
    group::Role,
    loader::{AttachOptions, Mode},
    nic::{self, daemon::NicDaemonOptions, dpu_daemon::DpuDaemonOptions},
};
use innet_common::{
    capabilities::Capabilities,
    proto::{DEFAULT_PAYLOAD_BYTES, Op, payload_for_mtu},
};
use tokio::signal::unix::{SignalKind, signal};

use super::{ModeArg, PinArgs};

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
    /// Ports to run on (repeatable): host-facing ports and uplinks
    #[arg(short = 'i', long = "iface", value_name = "IFNAME", required = true)]
    ifaces: Vec<String>,
    /// Ports towards SPINEs (repeatable; also list them with --iface); on a DPU its uplink
    /// representor (p0), the other --iface being the host's (pf0hpf)
    #[arg(long = "uplink", value_name = "IFNAME")]
    uplinks: Vec<String>,
    /// This host's role in the fabric
    #[arg(long, value_enum)]
    role: RoleArg,
    /// This switch's IPv4 address, reported in control packets (TOR and SPINE); a DPU's own
    /// address (on its eswitch bridge), the source of the results it hands its host
    #[arg(long, required_if_eq_any = [("role", "tor"), ("role", "spine"), ("role", "dpu")])]
    ip: Option<Ipv4Addr>,
    /// XDP mode
    #[arg(short = 'm', long, value_enum, default_value = "native")]
    mode: ModeArg,
    #[command(flatten)]
    sizing: super::SizingArgs,
    /// On exit, leave programs, maps and groups pinned and attached (a restart recovers them)
    #[arg(long)]
    keep_state: bool,
    /// Free groups the control plane installed after this many seconds without data (0: never)
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    idle_timeout: u64,
    /// Serve the counters in the Prometheus text format at http://ADDR:PORT/metrics
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<std::net::SocketAddr>,
    /// Ops this switch (or NIC) announces (comma-separated; default: all). Groups that
    /// need another op run on the hosts
    #[arg(long, value_delimiter = ',', value_parser = parse_op, value_name = "OP,...")]
    ops: Vec<Op>,
    #[command(flatten)]
    pins: PinArgs,
}

fn parse_op(s: &str) -> Result<Op, String> {
    Op::ALL
        .into_iter()
        .find(|op| op.name() == s)
        .ok_or_else(|| {
            let names: Vec<&str> = Op::ALL.iter().map(|op| op.name()).collect();
            format!("unknown op {s:?}: use {}", names.join(", "))
        })
}

pub fn run(a: DaemonArgs) -> Result<()> {
    // Bound before anything is attached: a taken port fails the start, naming it.
    let metrics = a
        .metrics
        .map(|addr| {
            innet::metrics::bind(addr).with_context(|| {
                format!("--metrics {addr}: cannot listen there (is the port taken?)")
            })
        })
        .transpose()?;
    for up in &a.uplinks {
        anyhow::ensure!(
            a.ifaces.contains(up),
            "uplink {up} must also be given with --iface {up}"
        );
    }
    let attach = AttachOptions {
        mode: mode_of(a.mode),
        sizing: a.sizing.sizing()?,
    };
    let mut capabilities = Capabilities::default();
    if !a.ops.is_empty() {
        capabilities.ops = a.ops.iter().fold(0, |m, op| m | 1 << *op as u8);
    }
    capabilities.max_data_size = largest_payload(&a.ifaces)?;
    let role = match a.role {
        RoleArg::Tor => Role::Tor,
        RoleArg::Spine => Role::Spine,
        RoleArg::Nic => {
            anyhow::ensure!(
                a.uplinks.is_empty(),
                "--uplink is for TORs: a NIC sends everything out of its own port"
            );
            let opts = NicDaemonOptions {
                pins: a.pins.layout(),
                ifaces: a.ifaces,
                attach,
                keep_state: a.keep_state,
                capabilities,
            };
            return block_on_signals(a.pins.layout(), metrics, |shutdown| {
                nic::daemon::run(opts, shutdown)
            });
        }
        RoleArg::Dpu => {
            let (host_port, uplink) = dpu_ports(&a.ifaces, &a.uplinks)?;
            let opts = DpuDaemonOptions {
                pins: a.pins.layout(),
                host_port,
                uplink,
                ip: a.ip.context("--ip is required for a DPU")?,
                attach,
                keep_state: a.keep_state,
                idle_timeout: idle_timeout(a.idle_timeout),
                capabilities,
            };
            return block_on_signals(a.pins.layout(), metrics, |shutdown| {
                nic::dpu_daemon::run(opts, shutdown)
            });
        }
    };
    let opts = DaemonOptions {
        pins: a.pins.layout(),
        ifaces: a.ifaces,
        uplinks: a.uplinks,
        role,
        ip: a.ip.context("--ip is required for a TOR or SPINE")?,
        attach,
        keep_state: a.keep_state,
        idle_timeout: idle_timeout(a.idle_timeout),
        capabilities,
    };
    block_on_signals(a.pins.layout(), metrics, |shutdown| {
        daemon::run(opts, shutdown)
    })
}

fn idle_timeout(seconds: u64) -> Option<std::time::Duration> {
    (seconds > 0).then(|| std::time::Duration::from_secs(seconds))
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

/// The payload every port carries: from the smallest MTU among them (jumbo frames where
/// every link has them; 1408 B on 1500 B links).
fn largest_payload(ifaces: &[String]) -> Result<u16> {
    let mut smallest: Option<(usize, &str)> = None;
    for i in ifaces {
        let mtu =
            innet_client::netdev::mtu(i).with_context(|| format!("reading the MTU of {i}"))?;
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
        let watch = tokio::spawn(innet::port_health::watch(pins));
        let result = daemon(shutdown).await.map_err(anyhow::Error::from);
        watch.abort();
        if let Some(s) = server {
            s.abort();
        }
        result
    })
}

fn mode_of(m: ModeArg) -> Mode {
    match m {
        ModeArg::Native => Mode::Native,
        ModeArg::Skb => Mode::Skb,
    }
}
