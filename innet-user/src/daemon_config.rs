//! The settings of `innet daemon`: a TOML file (`--config FILE`, every key in
//! `dist/innet/daemon.sample.toml`) under the command line's flags.
//!
//! Precedence, key by key: a flag (or `INNET_PIN_PATH` for `pin_path`) wins over the file,
//! the file over the built-in default. The ports are one setting: `--iface` or `--bridge`
//! on the command line replace both `iface` and `bridge` of the file. A switch flag
//! (`--keep-state`) can only turn its key on.
//!
//! Errors say where the faulty value came from (the flag, or the key and the file) and the
//! fix.

use std::{
    collections::BTreeSet,
    io,
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    time::Duration,
};

use innet_common::{
    group::{DEFAULT_CAPACITY, DEFAULT_WINDOW},
    proto::Op,
};
use serde::{Deserialize, Deserializer, de::Error as _};

use crate::{
    bridge::BridgeError,
    loader::{Sizing, XdpMode},
    pins::DEFAULT_ROOT,
};

/// Seconds without data after which a daemon frees a group, unless told otherwise.
pub const DEFAULT_IDLE_TIMEOUT: u64 = 300;

/// What a daemon runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DaemonRole {
    /// A top-of-rack switch: hosts below, SPINEs behind its uplinks.
    Tor,
    /// A switch above the TORs.
    Spine,
    /// A host's NIC ports.
    Nic,
    /// A BlueField-style DPU: the host's representor and the uplink.
    Dpu,
}

/// Every setting of a daemon, each unset until the file or a flag gives it. The file's keys
/// are these fields' names; an unknown key is refused.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonSettings {
    pub role: Option<DaemonRole>,
    /// The switch's (or DPU's) own IPv4 address.
    pub ip: Option<Ipv4Addr>,
    /// Ports by name.
    #[serde(default)]
    pub iface: Vec<String>,
    /// A bridge: every port enslaved to it is a port (beside `iface`).
    pub bridge: Option<String>,
    /// Ports towards SPINEs (each must also be a port); a DPU's uplink.
    #[serde(default)]
    pub uplink: Vec<String>,
    #[serde(default, deserialize_with = "mode")]
    pub mode: Option<XdpMode>,
    pub capacity: Option<u32>,
    pub window: Option<u32>,
    pub keep_state: Option<bool>,
    /// Seconds; 0 never frees.
    pub idle_timeout: Option<u64>,
    /// `[ADDR:]PORT`: a port alone is served on loopback ([`parse_metrics`]).
    #[serde(default, deserialize_with = "metrics")]
    pub metrics: Option<SocketAddr>,
    /// Empty: every op.
    #[serde(default, deserialize_with = "ops")]
    pub ops: Vec<Op>,
    pub pin_path: Option<PathBuf>,
}

/// Why the settings are unusable; each says where the value came from and the fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the config file {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{} is not a valid innet daemon config (dist/innet/daemon.sample.toml shows every key)",
        path.display()
    )]
    Parse {
        path: PathBuf,
        #[source]
        source: Box<toml::de::Error>,
    },
    #[error("no {what}: give {flag}, or {keys} in {}", in_file(file.as_deref()))]
    Missing {
        what: &'static str,
        flag: &'static str,
        keys: &'static str,
        file: Option<PathBuf>,
    },
    #[error("{origin}: cannot list the bridge's ports")]
    Bridge {
        origin: String,
        #[source]
        source: BridgeError,
    },
    #[error(
        "uplink {uplink} ({origin}) is not one of the ports: give it with --iface {uplink} too, or in `iface` (or enslave it to the `bridge`)"
    )]
    UplinkNotPort { uplink: String, origin: String },
    #[error("{origin}: the switch's group maps cannot be sized so")]
    Sizing {
        origin: String,
        #[source]
        source: crate::Error,
    },
}

fn in_file(file: Option<&Path>) -> String {
    file.map_or_else(
        || "a config file (--config FILE)".to_owned(),
        |f| format!("the config file {}", f.display()),
    )
}

impl DaemonSettings {
    /// Reads and parses a config file.
    ///
    /// # Errors
    /// [`ConfigError::Read`], [`ConfigError::Parse`] (naming the key and line).
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses the text of the config file at `path`.
    ///
    /// # Errors
    /// [`ConfigError::Parse`].
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            source: Box::new(e),
        })
    }

    /// These settings (the command line's) over `file`'s, key by key. `path` names the file
    /// in later errors.
    #[must_use]
    pub fn over(self, file: Self, path: Option<&Path>) -> Merged {
        let mut from_file = BTreeSet::new();
        // Whether the flag wins; notes the keys the file gives.
        let mut pick = |key: &'static str, flag_set: bool, file_set: bool| {
            if !flag_set && file_set {
                from_file.insert(key);
            }
            flag_set
        };
        // The ports are one setting: the command line's replace the file's.
        let ports_flagged = !self.iface.is_empty() || self.bridge.is_some();
        pick("iface", ports_flagged, !file.iface.is_empty());
        pick("bridge", ports_flagged, file.bridge.is_some());
        let (iface, bridge) = if ports_flagged {
            (self.iface, self.bridge)
        } else {
            (file.iface, file.bridge)
        };
        let settings = Self {
            role: either(self.role, file.role, &mut pick, "role"),
            iface,
            bridge,
            ip: either(self.ip, file.ip, &mut pick, "ip"),
            uplink: either_vec(self.uplink, file.uplink, &mut pick, "uplink"),
            mode: either(self.mode, file.mode, &mut pick, "mode"),
            capacity: either(self.capacity, file.capacity, &mut pick, "capacity"),
            window: either(self.window, file.window, &mut pick, "window"),
            keep_state: either(self.keep_state, file.keep_state, &mut pick, "keep_state"),
            idle_timeout: either(
                self.idle_timeout,
                file.idle_timeout,
                &mut pick,
                "idle_timeout",
            ),
            metrics: either(self.metrics, file.metrics, &mut pick, "metrics"),
            ops: either_vec(self.ops, file.ops, &mut pick, "ops"),
            pin_path: either(self.pin_path, file.pin_path, &mut pick, "pin_path"),
        };
        Merged {
            settings,
            origins: Origins {
                file: path.map(Path::to_owned),
                from_file,
            },
        }
    }
}

fn either<T>(
    flag: Option<T>,
    file: Option<T>,
    pick: &mut impl FnMut(&'static str, bool, bool) -> bool,
    key: &'static str,
) -> Option<T> {
    if pick(key, flag.is_some(), file.is_some()) {
        flag
    } else {
        file
    }
}

fn either_vec<T>(
    flag: Vec<T>,
    file: Vec<T>,
    pick: &mut impl FnMut(&'static str, bool, bool) -> bool,
    key: &'static str,
) -> Vec<T> {
    if pick(key, !flag.is_empty(), !file.is_empty()) {
        flag
    } else {
        file
    }
}

/// Which keys came from the file, to name a faulty value's origin.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Origins {
    file: Option<PathBuf>,
    from_file: BTreeSet<&'static str>,
}

impl Origins {
    /// Where `key`'s value came from: "`window` in /etc/innet/tor0.toml" or "--window".
    #[must_use]
    pub fn of(&self, key: &'static str) -> String {
        match &self.file {
            Some(f) if self.from_file.contains(key) => format!("`{key}` in {}", f.display()),
            _ => format!("--{}", key.replace('_', "-")),
        }
    }
}

/// The command line's settings over the file's, before defaults and checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Merged {
    pub settings: DaemonSettings,
    pub origins: Origins,
}

/// A daemon's settings, complete and checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonConfig {
    pub role: DaemonRole,
    /// Set for every role but [`DaemonRole::Nic`].
    pub ip: Option<Ipv4Addr>,
    /// `iface`, then the bridge's ports not already among them.
    pub ports: Vec<String>,
    pub uplinks: Vec<String>,
    pub mode: XdpMode,
    pub sizing: Sizing,
    pub keep_state: bool,
    /// `None`: never.
    pub idle_timeout: Option<Duration>,
    pub metrics: Option<SocketAddr>,
    /// Empty: every op.
    pub ops: Vec<Op>,
    pub pin_path: PathBuf,
    pub origins: Origins,
}

impl Merged {
    /// Applies the defaults, expands the bridge with `bridge_ports` ([`crate::bridge::ports`]
    /// outside tests) and checks what needs no kernel.
    ///
    /// # Errors
    /// A missing role, address or ports; a bridge that cannot be expanded; an uplink that is
    /// no port; a sizing out of range.
    pub fn resolve(
        self,
        bridge_ports: impl FnOnce(&str) -> Result<Vec<String>, BridgeError>,
    ) -> Result<DaemonConfig, ConfigError> {
        let Self {
            settings: s,
            origins,
        } = self;
        let missing = |what, flag, keys| ConfigError::Missing {
            what,
            flag,
            keys,
            file: origins.file.clone(),
        };
        let role = s.role.ok_or_else(|| missing("role", "--role", "`role`"))?;
        if role != DaemonRole::Nic && s.ip.is_none() {
            return Err(ConfigError::Missing {
                what: match role {
                    DaemonRole::Tor => "address for the TOR",
                    DaemonRole::Spine => "address for the SPINE",
                    _ => "address for the DPU",
                },
                flag: "--ip",
                keys: "`ip`",
                file: origins.file.clone(),
            });
        }
        let mut ports = s.iface;
        if let Some(bridge) = &s.bridge {
            let found = bridge_ports(bridge).map_err(|source| ConfigError::Bridge {
                origin: origins.of("bridge"),
                source,
            })?;
            tracing::info!(bridge, ports = ?found, "running on every port of the bridge");
            for p in found {
                if !ports.contains(&p) {
                    ports.push(p);
                }
            }
        }
        if ports.is_empty() {
            return Err(missing(
                "ports to run on",
                "--iface (or --bridge)",
                "`iface`/`bridge`",
            ));
        }
        if let Some(up) = s.uplink.iter().find(|u| !ports.contains(u)) {
            return Err(ConfigError::UplinkNotPort {
                uplink: up.clone(),
                origin: origins.of("uplink"),
            });
        }
        let sizing = Sizing {
            capacity: s.capacity.unwrap_or(DEFAULT_CAPACITY),
            window: s.window.unwrap_or(DEFAULT_WINDOW),
        }
        .checked()
        .map_err(|source| ConfigError::Sizing {
            origin: match source {
                crate::Error::Window { .. } => origins.of("window"),
                crate::Error::Capacity { .. } => origins.of("capacity"),
                _ => format!("{} with {}", origins.of("capacity"), origins.of("window")),
            },
            source,
        })?;
        Ok(DaemonConfig {
            role,
            ip: s.ip,
            ports,
            uplinks: s.uplink,
            mode: s.mode.unwrap_or_default(),
            sizing,
            keep_state: s.keep_state.unwrap_or(false),
            idle_timeout: Some(s.idle_timeout.unwrap_or(DEFAULT_IDLE_TIMEOUT))
                .filter(|&secs| secs > 0)
                .map(Duration::from_secs),
            metrics: s.metrics,
            ops: s.ops,
            pin_path: s.pin_path.unwrap_or_else(|| DEFAULT_ROOT.into()),
            origins,
        })
    }
}

/// Where `--metrics` and the file's `metrics` serve: `PORT` alone on loopback
/// (`127.0.0.1:PORT`), or `ADDR:PORT`. Loopback is the default because the exposition labels
/// every group with its wire id: not a secret (every data packet carries it), but nothing
/// the fabric's hosts need served either; a scraper elsewhere gets an address named for it.
///
/// # Errors
/// Neither a port nor an address with a port.
pub fn parse_metrics(s: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
    }
    s.parse().map_err(|_| {
        format!("{s:?} is no [ADDR:]PORT: give a port (served on 127.0.0.1) or ADDR:PORT")
    })
}

/// An op by the name `--ops` and the file's `ops` take (`sum`, `max` …).
///
/// # Errors
/// An unknown name, with the list of known ones.
pub fn parse_op(s: &str) -> Result<Op, String> {
    Op::ALL
        .into_iter()
        .find(|op| op.name() == s)
        .ok_or_else(|| {
            let names: Vec<&str> = Op::ALL.iter().map(|op| op.name()).collect();
            format!("unknown op {s:?}: use {}", names.join(", "))
        })
}

fn ops<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Op>, D::Error> {
    Vec::<String>::deserialize(d)?
        .iter()
        .map(|s| parse_op(s).map_err(D::Error::custom))
        .collect()
}

fn metrics<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    /// A port (a TOML integer) or `[ADDR:]PORT` (a string).
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Given {
        Port(u16),
        Text(String),
    }
    match Given::deserialize(d)? {
        Given::Port(port) => Ok(Some(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))),
        Given::Text(s) => parse_metrics(&s).map(Some).map_err(D::Error::custom),
    }
}

fn mode<'de, D: Deserializer<'de>>(d: D) -> Result<Option<XdpMode>, D::Error> {
    match String::deserialize(d)?.as_str() {
        "native" => Ok(Some(XdpMode::Native)),
        "skb" => Ok(Some(XdpMode::Skb)),
        other => Err(D::Error::custom(format!(
            "unknown mode {other:?}: use native or skb"
        ))),
    }
}

#[cfg(test)]
mod tests;
