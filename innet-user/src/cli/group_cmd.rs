//! `innet group add | del | list | show`: install reduction groups by hand.

use std::net::Ipv4Addr;

use anyhow::{Context as _, Result};
use clap::{Args, Subcommand, ValueEnum};
use innet::group_maps::{ChildSpec, GroupInfo, GroupMaps, GroupSpec, ParentSpec, Role};
use innet_net::netdev;

use super::PinArgs;

#[derive(Subcommand)]
pub enum GroupCommand {
    /// Install a group on this switch
    Add(AddArgs),
    /// Remove a group (its slots are freed); `kill` is the same
    #[command(alias = "kill")]
    Del {
        /// Group id (24 bits, hex with 0x or decimal)
        #[arg(value_parser = parse_id)]
        id: u32,
        #[command(flatten)]
        pins: PinArgs,
    },
    /// List installed groups with their counters
    List {
        /// Machine-readable output
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        pins: PinArgs,
    },
    /// Show one group: tree position, children, counters
    Show {
        #[arg(value_parser = parse_id)]
        id: u32,
        #[command(flatten)]
        pins: PinArgs,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum RoleArg {
    Tor,
    Spine,
}

#[derive(Args)]
pub struct AddArgs {
    /// Group id (24 bits, hex with 0x or decimal; ids ending in 0xff are reserved)
    #[arg(value_parser = parse_id)]
    id: u32,
    /// This switch's role in the group's tree
    #[arg(long, value_enum)]
    role: RoleArg,
    /// A child: IP@IFNAME[#RANK] (a host leader under a TOR, a TOR under a SPINE); repeat
    #[arg(long = "child", value_name = "IP@IFNAME[#RANK]", required = true)]
    children: Vec<String>,
    /// Port towards the parent switch; without it this switch is the root
    #[arg(long, requires_all = ["parent_ip", "parent_mac", "own_ip"])]
    parent: Option<String>,
    /// Parent switch's IPv4 address (results come from it, partials go to it)
    #[arg(long)]
    parent_ip: Option<Ipv4Addr>,
    /// Parent's MAC address (aa:bb:cc:dd:ee:ff)
    #[arg(long, value_parser = parse_mac)]
    parent_mac: Option<[u8; 6]>,
    /// This switch's IPv4 address towards the parent
    #[arg(long)]
    own_ip: Option<Ipv4Addr>,
    /// Rank this switch reports in packets it sends up
    #[arg(long, default_value_t = 0)]
    own_rank: u32,
    #[command(flatten)]
    pins: PinArgs,
}

fn parse_id(s: &str) -> Result<u32, String> {
    let v = match s.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    };
    v.map_err(|e| format!("`{s}` is not a group id ({e}); write it as 0xabc123 or decimal"))
}

fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = s.split(':').collect();
    let bad = || format!("`{s}` is not a MAC address; write it as aa:bb:cc:dd:ee:ff");
    if parts.len() != 6 {
        return Err(bad());
    }
    let mut mac = [0u8; 6];
    for (m, p) in mac.iter_mut().zip(parts) {
        *m = u8::from_str_radix(p, 16).map_err(|_| bad())?;
    }
    Ok(mac)
}

fn parse_child(s: &str) -> Result<ChildSpec> {
    let (ip, rest) = s
        .split_once('@')
        .with_context(|| format!("child `{s}`: write it as IP@IFNAME[#RANK]"))?;
    let (ifname, rank) = match rest.split_once('#') {
        Some((i, r)) => (
            i,
            r.parse()
                .with_context(|| format!("child `{s}`: rank `{r}` is not a number"))?,
        ),
        None => (rest, 0),
    };
    let ip: Ipv4Addr = ip
        .parse()
        .with_context(|| format!("child `{s}`: `{ip}` is not an IPv4 address"))?;
    Ok(ChildSpec {
        ip,
        ifindex: netdev::ifindex(ifname)?,
        rank,
    })
}

pub fn run(cmd: GroupCommand) -> Result<()> {
    match cmd {
        GroupCommand::Add(a) => add(a),
        GroupCommand::Del { id, pins } => {
            GroupMaps::open(&pins.layout())?.remove(id)?;
            println!("removed group {id:#08x}");
            Ok(())
        }
        GroupCommand::List { json, pins } => list(&GroupMaps::open(&pins.layout())?, json),
        GroupCommand::Show { id, pins } => {
            show(&GroupMaps::open(&pins.layout())?.get(id)?);
            Ok(())
        }
    }
}

fn add(a: AddArgs) -> Result<()> {
    netdev::require_root("innet group add")?;
    let children = a
        .children
        .iter()
        .map(|c| parse_child(c))
        .collect::<Result<Vec<_>>>()?;
    let parent = match a.parent {
        Some(ifname) => Some(ParentSpec {
            ifindex: netdev::ifindex(&ifname)?,
            own_mac: netdev::mac(&ifname)?,
            own_ip: a.own_ip.expect("clap requires it"),
            mac: a.parent_mac.expect("clap requires it"),
            ip: a.parent_ip.expect("clap requires it"),
        }),
        None => None,
    };
    let role = match a.role {
        RoleArg::Tor => Role::Tor,
        RoleArg::Spine => Role::Spine,
    };
    let spec = GroupSpec {
        id: a.id,
        role,
        parent,
        own_rank: a.own_rank,
        mrr: None,
        children,
    };
    let mut maps = GroupMaps::open(&a.pins.layout())?;
    let index = maps.install(&spec)?;
    println!(
        "installed group {:#08x} at index {index} ({} children, {})",
        a.id,
        spec.children.len(),
        if spec.parent.is_some() {
            "sends up to its parent"
        } else {
            "root"
        }
    );
    Ok(())
}

fn list(maps: &GroupMaps, json: bool) -> Result<()> {
    let groups = maps.list()?;
    if json {
        let rows: Vec<serde_json::Value> = groups
            .iter()
            .map(|g| {
                serde_json::json!({
                    "id": g.id,
                    "index": g.config.index,
                    "role": if g.config.role == 0 { "tor" } else { "spine" },
                    "root": g.config.is_root != 0,
                    "children": g.config.n_children,
                    "counters": g.stats.fields().iter().map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v))).collect::<serde_json::Map<_, _>>(),
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({ "capacity": maps.capacity(), "window": maps.window(), "groups": rows })
        );
        return Ok(());
    }
    println!(
        "{:<10} {:>5} {:<6} {:>4} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>8}",
        "Group",
        "Index",
        "Role",
        "Kids",
        "rx",
        "aggregated",
        "completed",
        "sent_up",
        "sent_down",
        "dup",
        "stale",
        "rejected"
    );
    for g in &groups {
        let s = &g.stats;
        let role = match (g.config.role, g.config.is_root) {
            (0, 1) => "tor*",
            (0, _) => "tor",
            (_, 1) => "spine*",
            _ => "spine",
        };
        println!(
            "{:<10} {:>5} {:<6} {:>4} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>8}",
            format!("{:#08x}", g.id),
            g.config.index,
            role,
            g.config.n_children,
            s.rx,
            s.aggregated,
            s.completed,
            s.sent_up,
            s.sent_down,
            s.duplicates,
            s.stale,
            s.mismatch + s.not_member + s.unsupported
        );
    }
    println!(
        "{} of {} groups in use, {} slots each (* = root)",
        groups.len(),
        maps.capacity(),
        maps.window()
    );
    Ok(())
}

fn show(g: &GroupInfo) {
    let c = &g.config;
    println!(
        "group {:#08x}  index {}  role {}  {}",
        g.id,
        c.index,
        if c.role == 0 { "tor" } else { "spine" },
        if c.is_root != 0 { "root" } else { "non-root" }
    );
    if c.is_root == 0 {
        let mac = |m: [u8; 6]| {
            m.iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(":")
        };
        println!(
            "  parent  {} ({}) via ifindex {}  own {} ({})",
            Ipv4Addr::from(c.parent_ip),
            mac(c.parent_mac),
            c.parent_ifindex,
            Ipv4Addr::from(c.own_ip),
            mac(c.own_mac)
        );
    }
    for (i, ch) in c
        .children
        .iter()
        .take(usize::from(c.n_children))
        .enumerate()
    {
        println!(
            "  child {i:>2}  {:<15} ifindex {:<4} rank {}",
            Ipv4Addr::from(ch.ip).to_string(),
            ch.ifindex,
            ch.rank
        );
    }
    for (name, v) in g.stats.fields() {
        println!("  {name:<14} {v}");
    }
}
