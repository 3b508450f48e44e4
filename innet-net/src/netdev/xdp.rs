//! What a port's driver can do with XDP, as the kernel reports it through the `netdev`
//! generic netlink family (`xdp-features`, Linux 6.3+).

use std::io;

use netlink_packet_core::{
    DecodeError, DefaultNla, Emitable, ErrorContext as _, Nla, NlaBuffer, NlasIterator, Parseable,
    ParseableParametrized, emit_u32, parse_u32, parse_u64,
};
use netlink_packet_generic::{
    GenlFamily, GenlHeader, GenlMessage,
    ctrl::{GenlCtrl, GenlCtrlCmd, nlas::GenlCtrlAttrs},
};
use netlink_sys::protocols::NETLINK_GENERIC;

use crate::netlink::{Ask, exchange};

/// `NETDEV_XDP_ACT_*` bits of `xdp-features`.
pub const ACT_BASIC: u64 = 1;
pub const ACT_REDIRECT: u64 = 2;
pub const ACT_NDO_XMIT: u64 = 4;

const NETDEV_CMD_DEV_GET: u8 = 1;
const NETDEV_A_DEV_IFINDEX: u16 = 1;
const NETDEV_A_DEV_XDP_FEATURES: u16 = 3;

/// An attribute of the `netdev` family's device messages.
#[derive(Clone, Debug, PartialEq, Eq)]
enum DevAttr {
    Ifindex(u32),
    XdpFeatures(u64),
    Other(DefaultNla),
}

impl Nla for DevAttr {
    fn value_len(&self) -> usize {
        match self {
            Self::Ifindex(_) => 4,
            Self::XdpFeatures(_) => 8,
            Self::Other(n) => n.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            Self::Ifindex(_) => NETDEV_A_DEV_IFINDEX,
            Self::XdpFeatures(_) => NETDEV_A_DEV_XDP_FEATURES,
            Self::Other(n) => n.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            Self::Ifindex(i) => emit_u32(buffer, *i).expect("4 bytes"),
            Self::XdpFeatures(f) => buffer[..8].copy_from_slice(&f.to_ne_bytes()),
            Self::Other(n) => n.emit_value(buffer),
        }
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&'a T>> for DevAttr {
    fn parse(buf: &NlaBuffer<&'a T>) -> Result<Self, DecodeError> {
        let value = buf.value();
        Ok(match buf.kind() {
            NETDEV_A_DEV_IFINDEX => Self::Ifindex(parse_u32(value).context("ifindex")?),
            NETDEV_A_DEV_XDP_FEATURES => {
                Self::XdpFeatures(parse_u64(value).context("xdp-features")?)
            }
            _ => Self::Other(DefaultNla::parse(buf)?),
        })
    }
}

/// A `netdev` family message: `dev-get` asked, its answer read.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Dev {
    attrs: Vec<DevAttr>,
}

impl GenlFamily for Dev {
    fn family_name() -> &'static str {
        "netdev"
    }

    fn command(&self) -> u8 {
        NETDEV_CMD_DEV_GET
    }

    fn version(&self) -> u8 {
        1
    }
}

impl Emitable for Dev {
    fn buffer_len(&self) -> usize {
        self.attrs.as_slice().buffer_len()
    }

    fn emit(&self, buffer: &mut [u8]) {
        self.attrs.as_slice().emit(buffer);
    }
}

impl ParseableParametrized<[u8], GenlHeader> for Dev {
    fn parse_with_param(buf: &[u8], _: GenlHeader) -> Result<Self, DecodeError> {
        Ok(Self {
            attrs: NlasIterator::new(buf)
                .map(|nla| nla.and_then(|nla| DevAttr::parse(&nla)))
                .collect::<Result<_, _>>()
                .context("netdev device attributes")?,
        })
    }
}

/// The id the kernel gave the `netdev` generic netlink family.
fn family_id() -> io::Result<u16> {
    let ask = GenlMessage::from_payload(GenlCtrl {
        cmd: GenlCtrlCmd::GetFamily,
        nlas: vec![GenlCtrlAttrs::FamilyName(Dev::family_name().to_owned())],
    });
    exchange(NETLINK_GENERIC, ask, Ask::One)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENOENT) => {
                io::Error::other("no netdev netlink family (Linux 6.3 or later has it)")
            }
            _ => e,
        })?
        .iter()
        .flat_map(|m| &m.payload.nlas)
        .find_map(|a| match a {
            GenlCtrlAttrs::FamilyId(id) => Some(*id),
            _ => None,
        })
        .ok_or_else(|| io::Error::other("the kernel named no id for the netdev family"))
}

/// The `xdp-features` of `ifindex` in the current network namespace.
///
/// # Errors
/// No `netdev` family (a kernel before 6.3), no such interface, or a socket error.
pub fn xdp_features(ifindex: u32) -> io::Result<u64> {
    let mut ask = GenlMessage::from_payload(Dev {
        attrs: vec![DevAttr::Ifindex(ifindex)],
    });
    ask.set_resolved_family_id(family_id()?);
    exchange(NETLINK_GENERIC, ask, Ask::One)?
        .iter()
        .flat_map(|m| &m.payload.attrs)
        .find_map(|a| match a {
            DevAttr::XdpFeatures(f) => Some(*f),
            _ => None,
        })
        .ok_or_else(|| io::Error::other("the kernel reported no xdp-features"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loopback_cannot_transmit_redirected_frames() {
        let f = xdp_features(1).expect("the netdev family answers for lo (Linux 6.3+)");
        assert_eq!(f & ACT_NDO_XMIT, 0, "lo has no ndo_xdp_xmit: {f:#x}");
        assert!(xdp_features(u32::MAX).is_err(), "no such interface");
    }

    #[test]
    fn attributes_round_trip() {
        let dev = Dev {
            attrs: vec![
                DevAttr::Ifindex(7),
                DevAttr::XdpFeatures(ACT_BASIC | ACT_NDO_XMIT),
            ],
        };
        let mut buf = vec![0; dev.buffer_len()];
        dev.emit(&mut buf);
        assert_eq!(
            buf.len(),
            8 + 12,
            "an ifindex and a u64, each with its header"
        );
        let header = GenlHeader {
            cmd: NETDEV_CMD_DEV_GET,
            version: 1,
        };
        assert_eq!(Dev::parse_with_param(&buf, header).unwrap(), dev);
    }
}
