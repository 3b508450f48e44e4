//! Whether each attached port can send what innet redirects out of it. A native redirect
//! into a port whose driver cannot transmit it (`xdp-features` without `NDO_XMIT`: a veth
//! whose peer has no NAPI) is lost after the program returned: a devmap broadcast skips
//! the port without a trace, a single redirect fails in the kernel. Userspace keeps the
//! programs told which ports those are (`TX_BLOCKED`), so what they send out of one counts
//! as its `redirect_errors`; `innet stats`, `--json` and `--prometheus` show each port's
//! state with the fix, and the kernel's own TX drops of the port beside it; a running
//! daemon says when either changes (`port_watch`).

use innet_common::maps::TX_BLOCKED;
use tracing::debug;

use innet_net::netdev;

use crate::{pins::PinLayout, xdp_features};

/// What the kernel says about one attached port.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortHealth {
    /// The program runs in the driver (native XDP); `false` for generic (skb) mode, whose
    /// redirects go through the stack and need nothing of the port.
    pub native: bool,
    /// Why frames innet redirects out of this port are dropped, naming the fix; `None`
    /// when they can leave (or the kernel cannot tell).
    pub redirect_blocked: Option<String>,
    /// The kernel's count of frames dropped on their way out of this port
    /// (`ip -s link`'s TX dropped).
    pub kernel_tx_dropped: Option<u64>,
}

impl PortHealth {
    /// Frames redirected out of this port can leave it: `Some(false)` when the kernel drops
    /// them, `None` when it does not matter (generic mode) or the kernel cannot tell.
    #[must_use]
    pub fn redirect_ready(&self) -> Option<bool> {
        self.native.then_some(self.redirect_blocked.is_none())
    }

    /// A line for the operator when frames innet sent out of a port that cannot take them
    /// were lost (`lost`: its `redirect_errors`); `None` when there is nothing to say.
    #[must_use]
    pub fn drop_warning(&self, ifname: &str, lost: u64) -> Option<String> {
        let why = self.redirect_blocked.as_ref()?;
        (lost > 0).then(|| {
            format!(
                "{ifname}: {lost} frames innet sent out of it were dropped by the kernel; {why}"
            )
        })
    }
}

/// The health of port `ifname` (`ifindex`) in the current network namespace.
#[must_use]
pub fn of(ifname: &str, ifindex: u32) -> PortHealth {
    let link = netdev::link(ifindex).ok();
    let native = link.as_ref().and_then(|l| l.xdp) == Some(netdev::AttachMode::Native);
    PortHealth {
        native,
        redirect_blocked: native
            .then(|| xdp_features::redirect_blocked(ifname, ifindex))
            .flatten(),
        kernel_tx_dropped: link.and_then(|l| l.tx_dropped),
    }
}

/// Looks at every port attached under `pins` and tells the programs which of them cannot
/// transmit redirected frames (`TX_BLOCKED`), so that what they send out of those is
/// counted as `redirect_errors` there; returns what it saw.
pub fn refresh(pins: &PinLayout) -> Vec<(String, u32, PortHealth)> {
    let ports = look(pins);
    let blocked: Vec<u32> = ports
        .iter()
        .filter(|(_, _, h)| h.redirect_ready() == Some(false))
        .map(|(_, i, _)| *i)
        .collect();
    if let Err(e) = publish(pins, &blocked) {
        debug!(error = %e, "TX_BLOCKED not written (pins of an older innet?)");
    }
    ports
}

/// Records whether port `ifindex` can transmit redirected frames (after an attach, or
/// `false` after a detach).
pub fn note(pins: &PinLayout, ifindex: u32, blocked: bool) {
    let result = open_blocked(pins).and_then(|mut map| {
        let keys: Vec<u32> = map.keys().filter_map(Result::ok).collect();
        let others = keys.iter().filter(|&&k| k != 0 && k != ifindex).copied();
        let mut now: Vec<u32> = others.collect();
        if blocked {
            now.push(ifindex);
        }
        write_blocked(&mut map, &keys, &now)
    });
    if let Err(e) = result {
        debug!(error = %e, "TX_BLOCKED not written (pins of an older innet?)");
    }
}

type BlockedMap = aya::maps::HashMap<aya::maps::MapData, u32, u32>;

fn open_blocked(pins: &PinLayout) -> crate::error::Result<BlockedMap> {
    pins.open_typed(TX_BLOCKED)
}

/// Makes `TX_BLOCKED` (whose keys are `keys`) hold exactly `blocked`, and their count under
/// key 0.
fn write_blocked(map: &mut BlockedMap, keys: &[u32], blocked: &[u32]) -> crate::error::Result<()> {
    let map_err = |source| crate::Error::Map {
        name: TX_BLOCKED,
        source,
    };
    for k in keys.iter().filter(|k| **k != 0 && !blocked.contains(k)) {
        map.remove(k).map_err(map_err)?;
    }
    for &k in blocked {
        map.insert(k, 1, 0).map_err(map_err)?;
    }
    map.insert(0, blocked.len() as u32, 0).map_err(map_err)
}

fn publish(pins: &PinLayout, blocked: &[u32]) -> crate::error::Result<()> {
    let mut map = open_blocked(pins)?;
    let keys: Vec<u32> = map.keys().filter_map(Result::ok).collect();
    write_blocked(&mut map, &keys, blocked)
}

/// Every attached port that exists here, with its ifindex and health.
fn look(pins: &PinLayout) -> Vec<(String, u32, PortHealth)> {
    crate::attached::status(pins)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|p| {
            let ifindex = p.ifindex?;
            Some((p.ifname.clone(), ifindex, of(&p.ifname, ifindex)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warning_needs_both_a_blocked_port_and_lost_frames() {
        let mut h = PortHealth {
            native: true,
            redirect_blocked: Some("its veth peer has no NAPI".into()),
            kernel_tx_dropped: Some(0),
        };
        assert_eq!(h.drop_warning("p1", 0), None);
        assert_eq!(h.redirect_ready(), Some(false));
        let w = h.drop_warning("p1", 5).expect("a warning");
        assert!(w.contains("p1: 5 frames") && w.contains("no NAPI"), "{w}");
        h.native = false;
        h.redirect_blocked = None;
        assert_eq!(
            h.redirect_ready(),
            None,
            "generic mode needs nothing of the port"
        );
        assert_eq!(h.drop_warning("p1", 5), None);
    }
}
