//! The ports of a Linux bridge, so a daemon can run on "every port of `br0`" (`bridge` in
//! its config file, `--bridge`). Asked of rtnetlink in the current network namespace: sysfs
//! (`/sys/class/net/<bridge>/brif`) shows the namespace it was mounted in, which
//! `nsenter --net` does not change.

use std::io;

use innet_net::netdev;

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
    let link = netdev::link_named(bridge).map_err(|_| unknown())?;
    if link.kind.as_deref() != Some("bridge") {
        return Err(BridgeError::NotABridge {
            bridge: bridge.to_owned(),
            kind: link
                .kind
                .map_or_else(|| "a device".to_owned(), |k| format!("a {k}")),
        });
    }
    let links = netdev::links()
        .map_err(BridgeError::Netlink)?
        .into_iter()
        .map(|l| (l.name, l.master));
    let ports = enslaved_to(link.index, links);
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
    fn the_loopback_is_no_bridge_and_a_missing_one_is_named() {
        let e = ports("lo").expect_err("lo is no bridge");
        assert!(matches!(e, BridgeError::NotABridge { .. }), "{e}");
        let e = ports("innet-no-such-br").expect_err("no such bridge");
        assert!(e.to_string().contains("ip link show type bridge"), "{e}");
    }
}
