//! What a port's driver can do with XDP right now, as the kernel reports it (`xdp-features` of the
//! `netdev` generic netlink family, Linux 6.3+, asked through [`innet_net::netdev`]). innet needs
//! `NDO_XMIT` on every port it redirects frames out of: a native-mode redirect into a port
//! without it is dropped by the kernel after the program returned, where no counter of
//! innet sees it. A veth has it only while its peer runs an XDP program or has GRO on (the
//! peer's NAPI receives the frames), which no default veth has.

use innet_net::netdev::{self, ACT_NDO_XMIT};

pub use innet_net::netdev::AttachMode;

/// Whether frames XDP redirects out of `ifindex` can leave by it, and if not, the fix.
/// `None` when the kernel cannot tell (then nothing is said).
#[must_use]
pub fn redirect_blocked(ifname: &str, ifindex: u32) -> Option<String> {
    let features = netdev::xdp_features(ifindex).ok()?;
    if features & ACT_NDO_XMIT != 0 {
        return None;
    }
    Some(if let Some(peer) = veth_peer(ifindex) {
        format!(
            "frames innet redirects out of {ifname} are dropped by the kernel: its veth peer ({peer}) has no NAPI to receive them. Run `ethtool -K <peer> gro on` in the peer's namespace (or attach an XDP program there), or attach innet with `--mode skb`"
        )
    } else {
        format!(
            "frames innet redirects out of {ifname} are dropped by the kernel: its driver cannot transmit redirected frames (no ndo_xdp_xmit). Attach innet with `--mode skb`"
        )
    })
}

/// How the XDP program on `ifindex` is attached; `None` when none is (or the kernel does not
/// say).
#[must_use]
pub fn attach_mode(ifindex: u32) -> Option<AttachMode> {
    netdev::link(ifindex).ok()?.xdp
}

/// Whether `ifindex` is a veth.
#[must_use]
pub fn is_veth(ifindex: u32) -> bool {
    netdev::link(ifindex).is_ok_and(|l| l.kind.as_deref() == Some("veth"))
}

/// A veth's peer as `ip` names it (`ifindex N`, and its namespace's id when elsewhere);
/// `None` for other kinds of port.
fn veth_peer(ifindex: u32) -> Option<String> {
    let (index, netns) = netdev::link(ifindex).ok()?.peer?;
    Some(match netns {
        Some(ns) => format!("ifindex {index} in the namespace of netnsid {ns}"),
        None => format!("ifindex {index}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loopback_is_no_veth_and_has_no_program() {
        assert_eq!(attach_mode(1), None, "no XDP program on lo");
        assert!(!is_veth(1), "lo is no veth");
        assert_eq!(veth_peer(1), None);
        assert!(
            redirect_blocked("lo", 1).is_some_and(|m| m.contains("--mode skb")),
            "lo cannot transmit redirected frames, and the advice names the fix"
        );
    }
}
