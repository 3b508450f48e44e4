//! The command line, in the shape of xdp-loader: one subcommand per verb, interface names,
//! `-m/--mode`, `-p/--pin-path`, `--all`, a grep-able `status` table.

mod daemon_cmd;
mod group_cmd;

use std::{fmt::Write as _, fs::File, io::BufWriter, path::PathBuf, thread, time::Duration};

use anyhow::{Context as _, Result, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};
use innet::{
    loader::{self, XdpMode},
    pcap,
    pins::{DEFAULT_ROOT, PinLayout},
    port_health,
    stats::{self, PortCounters},
};
use innet_common::stats::PortStats;

#[derive(Parser)]
#[command(
    name = "innet",
    version,
    about = "In-network allreduce with XDP: switch-port programs, counters, examples"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Load innet's switch program and attach it to interfaces (pinned: it stays after exit)
    Attach(AttachArgs),
    /// Detach innet from interfaces; the last detach unloads program and maps
    Detach(DetachArgs),
    /// List the interfaces innet is attached to
    Status(StatusArgs),
    /// Show the XDP counters (absolute; per second with --interval)
    Stats(StatsArgs),
    /// Run a switch: attach, process control packets, tear down on SIGINT/SIGTERM
    Daemon(daemon_cmd::DaemonArgs),
    /// Install, remove and inspect reduction groups on this switch
    #[command(subcommand)]
    Group(group_cmd::GroupCommand),
    /// Write example INC packets (query, notify, kill, data) to a pcap file for Wireshark
    Pcap(PcapArgs),
}

#[derive(Args)]
pub struct PinArgs {
    /// bpffs directory holding innet's pinned program, maps and links
    #[arg(short = 'p', long = "pin-path", default_value = DEFAULT_ROOT, env = "INNET_PIN_PATH")]
    pin_path: PathBuf,
}

impl PinArgs {
    pub fn layout(&self) -> PinLayout {
        PinLayout::new(&self.pin_path)
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub enum ModeArg {
    /// In the driver (veth and most NICs)
    Native,
    /// Generic XDP, works on any interface
    Skb,
}

#[derive(Args)]
struct AttachArgs {
    /// Interfaces to attach to
    #[arg(value_name = "IFNAME")]
    ifnames: Vec<String>,
    /// Interface to attach to (same as the positional form; repeatable)
    #[arg(short = 'i', long = "iface", value_name = "IFNAME")]
    iface: Vec<String>,
    /// XDP mode
    #[arg(short = 'm', long, value_enum, default_value = "native")]
    mode: ModeArg,
    #[command(flatten)]
    sizing: SizingArgs,
    #[command(flatten)]
    pins: PinArgs,
}

/// How the group maps are sized (only the attach that loads them, the first, uses this).
#[derive(Args)]
pub(crate) struct SizingArgs {
    /// Groups this switch can hold
    #[arg(long, default_value_t = innet_common::group::DEFAULT_CAPACITY)]
    capacity: u32,
    /// Slots per group, a power of two from 8 to 128: a group keeps up to half as many rounds
    /// in flight (long messages stream faster with more; memory grows with both)
    #[arg(long, default_value_t = innet_common::group::DEFAULT_WINDOW)]
    window: u32,
}

impl SizingArgs {
    /// The sizing, checked.
    pub(crate) fn sizing(&self) -> anyhow::Result<loader::Sizing> {
        Ok(loader::Sizing {
            capacity: self.capacity,
            window: self.window,
        }
        .checked()?)
    }
}

#[derive(Args)]
struct DetachArgs {
    /// Interfaces to detach from
    #[arg(value_name = "IFNAME", conflicts_with = "all")]
    ifnames: Vec<String>,
    /// Interface to detach from (same as the positional form; repeatable)
    #[arg(
        short = 'i',
        long = "iface",
        value_name = "IFNAME",
        conflicts_with = "all"
    )]
    iface: Vec<String>,
    /// Detach from every interface
    #[arg(short = 'a', long)]
    all: bool,
    /// Keep program and maps pinned (with their counters) after the last detach
    #[arg(long)]
    keep_maps: bool,
    #[command(flatten)]
    pins: PinArgs,
}

#[derive(Args)]
struct StatusArgs {
    /// Only this interface
    ifname: Option<String>,
    /// Machine-readable output
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pins: PinArgs,
}

#[derive(Args)]
struct StatsArgs {
    /// Print per-second rates every SECONDS instead of absolute counters once
    #[arg(short = 'i', long = "interval", value_name = "SECONDS")]
    interval: Option<f64>,
    /// Stop after this many rate lines (with --interval)
    #[arg(short = 'c', long)]
    count: Option<u64>,
    /// Also show each port and each CPU
    #[arg(short = 'e', long)]
    extended: bool,
    /// Machine-readable output (absolute counters)
    #[arg(long, conflicts_with = "interval")]
    json: bool,
    /// The Prometheus text exposition (what `innet daemon --metrics` serves), once
    #[arg(long, conflicts_with_all = ["interval", "json"])]
    prometheus: bool,
    #[command(flatten)]
    pins: PinArgs,
}

#[derive(Args)]
struct PcapArgs {
    /// Output file
    #[arg(default_value = "innet-examples.pcap")]
    file: PathBuf,
}

impl Cli {
    pub fn run(self) -> Result<()> {
        match self.command {
            Command::Attach(a) => attach(a),
            Command::Detach(a) => detach(a),
            Command::Status(a) => status(&a),
            Command::Stats(a) => stats_cmd(&a),
            Command::Pcap(a) => pcap_cmd(&a),
            Command::Group(c) => group_cmd::run(c),
            Command::Daemon(a) => daemon_cmd::run(a),
        }
    }
}

fn interfaces(positional: Vec<String>, flagged: Vec<String>, verb: &str) -> Result<Vec<String>> {
    let all: Vec<String> = positional.into_iter().chain(flagged).collect();
    if all.is_empty() {
        bail!("name at least one interface: `innet {verb} IFNAME` (see `ip link`)");
    }
    Ok(all)
}

fn attach(a: AttachArgs) -> Result<()> {
    let mode = match a.mode {
        ModeArg::Native => XdpMode::Native,
        ModeArg::Skb => XdpMode::Skb,
    };
    let pins = a.pins.layout();
    let sizing = a.sizing.sizing()?;
    for ifname in interfaces(a.ifnames, a.iface, "attach")? {
        let done = loader::attach(&pins, &ifname, loader::AttachOptions { mode, sizing })?;
        println!(
            "attached {} (ifindex {}) mode {}",
            done.ifname,
            done.ifindex,
            mode.name()
        );
        if done.loaded {
            println!(
                "group maps for {} groups x {} slots: {}",
                sizing.capacity,
                sizing.window,
                sizing.memory()
            );
        }
    }
    Ok(())
}

fn detach(a: DetachArgs) -> Result<()> {
    let pins = a.pins.layout();
    if a.all {
        let names = loader::detach_all(&pins, a.keep_maps)?;
        if names.is_empty() {
            println!("innet was not attached anywhere");
        }
        for n in &names {
            println!("detached {n}");
        }
        return Ok(());
    }
    for ifname in interfaces(a.ifnames, a.iface, "detach")? {
        loader::detach(&pins, &ifname, a.keep_maps)?;
        println!("detached {ifname}");
    }
    Ok(())
}

fn status(a: &StatusArgs) -> Result<()> {
    let mut ports = loader::status(&a.pins.layout())?;
    if let Some(name) = &a.ifname {
        ports.retain(|p| &p.ifname == name);
        if ports.is_empty() {
            bail!("innet is not attached to {name}");
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&ports)?);
        return Ok(());
    }
    println!(
        "{:<16} {:>8} {:>8} {:>8}",
        "Interface", "Ifindex", "Link", "Prog"
    );
    for p in &ports {
        let ifindex = p
            .ifindex
            .map_or_else(|| "gone".to_owned(), |i| i.to_string());
        println!(
            "{:<16} {:>8} {:>8} {:>8}",
            p.ifname, ifindex, p.link_id, p.prog_id
        );
    }
    Ok(())
}

fn stats_cmd(a: &StatsArgs) -> Result<()> {
    let pins = a.pins.layout();
    if a.prometheus {
        print!("{}", innet::metrics::render(&pins)?);
        return Ok(());
    }
    let Some(interval) = a.interval else {
        let ports = stats::read_with_health(&pins)?;
        let daemon = stats::read_daemon(&pins)?;
        if a.json {
            let mut v = stats_json(&ports);
            v["daemon"] = counters_json_of(&daemon.fields());
            println!("{}", serde_json::to_string_pretty(&v)?);
        } else {
            // A DPU's two ports are shown apart: the host's part against the fabric's.
            let dpu = ports.iter().any(|p| p.facing.is_some());
            print_table(&ports, a.extended || dpu);
            print_port_health(&ports);
            if daemon != innet_common::stats::DaemonStats::default() {
                println!("\ndaemon");
                for (name, v) in daemon.fields() {
                    println!("{name:<20} {v:>14}");
                }
            }
        }
        return Ok(());
    };
    if interval.is_nan() || interval <= 0.0 {
        bail!("--interval must be a positive number of seconds");
    }
    let period = Duration::from_secs_f64(interval);
    println!(
        "{:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "rx/s", "inc/s", "ctrl/s", "other/s", "bad/s", "pass/s", "drop/s"
    );
    let mut prev = stats::read(&pins)?;
    let mut lines = 0;
    while a.count.is_none_or(|c| lines < c) {
        thread::sleep(period);
        let now = stats::read(&pins)?;
        let rate = |f: fn(&PortStats) -> u64| {
            (f(&stats::sum(&now)).wrapping_sub(f(&stats::sum(&prev)))) as f64 / interval
        };
        println!(
            "{:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>10.0}",
            rate(|s| s.rx_packets),
            rate(|s| s.inc_data),
            rate(|s| s.inc_control),
            rate(|s| s.non_roce + s.roce_other),
            rate(|s| s.malformed),
            rate(|s| s.xdp_pass),
            rate(|s| s.xdp_drop),
        );
        if a.extended {
            for p in &now {
                let before = prev
                    .iter()
                    .find(|q| q.ifindex == p.ifindex)
                    .map(|q| q.total)
                    .unwrap_or_default();
                let d = p.total.rx_packets.wrapping_sub(before.rx_packets);
                if d > 0 {
                    println!("  {:<14} rx/s {:>10.0}", p.label(), d as f64 / interval);
                }
            }
        }
        prev = now;
        lines += 1;
    }
    Ok(())
}

fn print_table(ports: &[PortCounters], extended: bool) {
    let total = stats::sum(ports);
    let mut header = format!("{:<16}", "counter");
    if extended {
        for p in ports {
            let _ = write!(header, " {:>14}", p.label());
        }
    }
    let _ = write!(header, " {:>14}", "total");
    println!("{header}");
    for (i, (name, value)) in total.fields().iter().enumerate() {
        let mut line = format!("{name:<16}");
        if extended {
            for p in ports {
                let _ = write!(line, " {:>14}", p.total.fields()[i].1);
            }
        }
        let _ = write!(line, " {value:>14}");
        println!("{line}");
    }
    if extended {
        for p in ports {
            for (cpu, s) in p
                .per_cpu
                .iter()
                .enumerate()
                .filter(|(_, s)| s.rx_packets > 0)
            {
                println!(
                    "{} cpu{cpu}: rx_packets {} inc_data {} inc_control {} malformed {}",
                    p.label(),
                    s.rx_packets,
                    s.inc_data,
                    s.inc_control,
                    s.malformed
                );
            }
        }
    }
}

/// The kernel's TX drops per port, then a warning for each port whose redirected frames the
/// kernel drops, with how many innet lost there and the fix.
fn print_port_health(ports: &[PortCounters]) {
    let dropped: Vec<String> = ports
        .iter()
        .filter_map(|p| {
            Some(format!(
                "{} {}",
                p.label(),
                p.health.as_ref()?.kernel_tx_dropped?
            ))
        })
        .collect();
    if !dropped.is_empty() {
        println!("\nkernel tx_dropped: {}", dropped.join(", "));
    }
    for p in ports {
        let Some(h) = &p.health else { continue };
        let name = p.ifname.as_deref().unwrap_or_default();
        match (
            h.drop_warning(name, p.total.redirect_errors),
            &h.redirect_blocked,
        ) {
            (Some(line), _) => println!("warning: {line}"),
            (None, Some(why)) => println!("warning: {why}"),
            (None, None) => {}
        }
    }
}

fn counters_json_of(fields: &[(&'static str, u64)]) -> serde_json::Value {
    fields
        .iter()
        .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

fn counters_json(s: &PortStats) -> serde_json::Value {
    counters_json_of(&s.fields())
}

fn stats_json(ports: &[PortCounters]) -> serde_json::Value {
    serde_json::json!({
        "total": counters_json(&stats::sum(ports)),
        "ports": ports.iter().map(|p| serde_json::json!({
            "ifindex": p.ifindex,
            "ifname": p.ifname,
            "facing": p.facing,
            "counters": counters_json(&p.total),
            "kernel_tx_dropped": p.health.as_ref().and_then(|h| h.kernel_tx_dropped),
            "redirect_ready": p.health.as_ref().and_then(port_health::PortHealth::redirect_ready),
            "redirect_blocked": p.health.as_ref().and_then(|h| h.redirect_blocked.clone()),
        })).collect::<Vec<_>>(),
    })
}

fn pcap_cmd(a: &PcapArgs) -> Result<()> {
    let examples = pcap::examples();
    let file = File::create(&a.file).with_context(|| format!("creating {}", a.file.display()))?;
    let frames: Vec<Vec<u8>> = examples.iter().map(|e| e.frame.clone()).collect();
    pcap::write(&mut BufWriter::new(file), &frames)
        .with_context(|| format!("writing {}", a.file.display()))?;
    for (i, e) in examples.iter().enumerate() {
        println!("{:>3}  {:>5} B  {}", i + 1, e.frame.len(), e.description);
    }
    println!(
        "wrote {} packets to {} (open it in Wireshark: RoCEv2 BTH + DETH, INC header as data)",
        examples.len(),
        a.file.display()
    );
    Ok(())
}
