//! The ports of a Linux bridge, so a daemon can run on "every port of `br0`" (`bridge` in
//! its config file, `--bridge`). Asked of rtnetlink in the current network namespace: sysfs
//! (`/sys/class/net/<bridge>/brif`) shows the namespace it was mounted in, which
//! `nsenter --net` does not change.

use std::{ffi::CStr, io};

use crate::xdp_features::{find, link_attributes};

const IFLA_MASTER: u16 = 10;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;

/// Why the ports of a bridge could not be listed; each names the fix.
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    #[error(
        "no interface named `{bridge}` in this network namespace: check `ip link show type bridge`"
    )]
    Unknown { bridge: String },
    #[error(
        "`{bridge}` is {kind}, not a bridge: name a bridge (`ip link show type bridge`), or list the ports with `iface` (--iface)"
    )]
    NotABridge { bridge: String, kind: String },
    #[error(
        "bridge `{bridge}` has no ports: enslave them first (`ip link set PORT master {bridge}`), or list the ports with `iface` (--iface)"
    )]
    NoPorts { bridge: String },
    #[error("asking the kernel for the interfaces of this namespace failed")]
    Netlink(#[source] io::Error),
}

/// The names of every port enslaved to `bridge`, sorted.
///
/// # Errors
/// No such interface, not a bridge, a bridge without ports, or a netlink error.
pub fn ports(bridge: &str) -> Result<Vec<String>, BridgeError> {
    let unknown = || BridgeError::Unknown {
        bridge: bridge.to_owned(),
    };
    let index = innet_client::netdev::ifindex(bridge).map_err(|_| unknown())?;
    let attrs = link_attributes(index).map_err(|_| unknown())?;
    match kind(&attrs) {
        Some(k) if k == "bridge" => {}
        other => {
            return Err(BridgeError::NotABridge {
                bridge: bridge.to_owned(),
                kind: other.map_or_else(|| "a device".to_owned(), |k| format!("a {k}")),
            });
        }
    }
    // A port that vanishes between the listing and its query is simply not a port.
    let links = interfaces()
        .map_err(BridgeError::Netlink)?
        .into_iter()
        .map(|(i, name)| (name, link_attributes(i).ok().and_then(|a| master(&a))));
    let ports = enslaved_to(index, links);
    if ports.is_empty() {
        return Err(BridgeError::NoPorts {
            bridge: bridge.to_owned(),
        });
    }
    Ok(ports)
}

/// Of `(name, master ifindex)` pairs, the names whose master is `bridge`, sorted.
fn enslaved_to(bridge: u32, links: impl IntoIterator<Item = (String, Option<u32>)>) -> Vec<String> {
    let mut ports: Vec<String> = links
        .into_iter()
        .filter(|(_, m)| *m == Some(bridge))
        .map(|(name, _)| name)
        .collect();
    ports.sort();
    ports
}

/// `IFLA_MASTER` of `RTM_GETLINK` attributes: the bridge (or bond) a port is enslaved to.
fn master(attrs: &[u8]) -> Option<u32> {
    find(attrs, IFLA_MASTER)
        .and_then(|v| v.get(..4))
        .map(|v| u32::from_ne_bytes(v.try_into().expect("4 bytes")))
}

/// `IFLA_LINKINFO`'s kind (`bridge`, `veth` …); physical ports have none.
fn kind(attrs: &[u8]) -> Option<String> {
    let k = find(find(attrs, IFLA_LINKINFO)?, IFLA_INFO_KIND)?;
    Some(String::from_utf8_lossy(k.strip_suffix(b"\0").unwrap_or(k)).into_owned())
}

/// Every interface of the current network namespace: (ifindex, name).
fn interfaces() -> io::Result<Vec<(u32, String)>> {
    // SAFETY: if_nameindex has no preconditions; it returns null or an array that ends in a
    // zeroed entry, freed below.
    let list = unsafe { libc::if_nameindex() };
    if list.is_null() {
        return Err(io::Error::last_os_error());
    }
    let mut out = vec![];
    let mut at = list;
    loop {
        // SAFETY: `at` stays within the array: it stops at the zeroed entry.
        let entry = unsafe { &*at };
        if entry.if_index == 0 || entry.if_name.is_null() {
            break;
        }
        // SAFETY: if_name is a NUL-terminated string owned by the array.
        let name = unsafe { CStr::from_ptr(entry.if_name) };
        out.push((entry.if_index, name.to_string_lossy().into_owned()));
        // SAFETY: this entry was not the last one.
        at = unsafe { at.add(1) };
    }
    // SAFETY: `list` came from if_nameindex and is freed once.
    unsafe { libc::if_freenameindex(list) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_bridges_own_ports_count_sorted() {
        let links = [
            ("swp2".to_owned(), Some(7)),
            ("lo".to_owned(), None),
            ("swp1".to_owned(), Some(7)),
            ("br0".to_owned(), None),
            ("bond-port".to_owned(), Some(9)),
        ];
        assert_eq!(enslaved_to(7, links.clone()), ["swp1", "swp2"]);
        assert!(enslaved_to(3, links).is_empty());
    }

    #[test]
    fn attributes_give_master_and_kind() {
        let attr = |kind: u16, value: &[u8]| {
            let len = 4 + value.len();
            let mut a = (len as u16).to_ne_bytes().to_vec();
            a.extend_from_slice(&kind.to_ne_bytes());
            a.extend_from_slice(value);
            a.resize(len.next_multiple_of(4), 0);
            a
        };
        let mut attrs = attr(IFLA_MASTER, &7u32.to_ne_bytes());
        attrs.extend(attr(IFLA_LINKINFO, &attr(IFLA_INFO_KIND, b"bridge\0")));
        assert_eq!(master(&attrs), Some(7));
        assert_eq!(kind(&attrs).as_deref(), Some("bridge"));
        assert_eq!(master(&[]), None);
        assert_eq!(kind(&[]), None, "a physical port has no kind");
    }

    #[test]
    fn the_loopback_is_no_bridge_and_a_missing_one_is_named() {
        assert!(interfaces().is_ok_and(|l| l.iter().any(|(_, n)| n == "lo")));
        let e = ports("lo").expect_err("lo is no bridge");
        assert!(matches!(e, BridgeError::NotABridge { .. }), "{e}");
        let e = ports("innet-no-such-br").expect_err("no such bridge");
        assert!(e.to_string().contains("ip link show type bridge"), "{e}");
    }
}
