//! One request and its answer over a netlink socket made for the exchange, so it asks the
//! network namespace of the calling thread (a lab or daemon thread that entered a namespace
//! sees that namespace, as `ip -n` would). Dumps are read to their `NLMSG_DONE`; a request
//! the kernel refuses comes back as the `io::Error` of its errno.

use std::{fmt::Debug, io};

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkDeserializable, NetlinkHeader, NetlinkMessage,
    NetlinkPayload, NetlinkSerializable,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{Socket, SocketAddr, protocols};

/// What a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ask {
    /// One object (`RTM_GET*` with a key): the answer is one message.
    One,
    /// Every object of a kind (`NLM_F_DUMP`): the answer is every message up to `DONE`.
    Dump,
    /// A change (`RTM_NEW*` …) acknowledged by the kernel: the answer is empty.
    Change { create: bool },
}

impl Ask {
    fn flags(self) -> u16 {
        match self {
            Self::One => NLM_F_REQUEST,
            Self::Dump => NLM_F_REQUEST | NLM_F_DUMP,
            Self::Change { create: false } => NLM_F_REQUEST | NLM_F_ACK,
            Self::Change { create: true } => {
                NLM_F_REQUEST | NLM_F_ACK | netlink_packet_core::NLM_F_CREATE
            }
        }
    }
}

/// Sends `request` over rtnetlink and returns the kernel's answer.
///
/// # Errors
/// The socket failed, the kernel refused (its errno), or an answer did not parse.
pub fn route(request: RouteNetlinkMessage, ask: Ask) -> io::Result<Vec<RouteNetlinkMessage>> {
    exchange(protocols::NETLINK_ROUTE, request, ask)
}

/// Sends `request` over `protocol` (`NETLINK_ROUTE`, `NETLINK_GENERIC` …) and returns the
/// kernel's answer.
///
/// # Errors
/// The socket failed, the kernel refused (its errno), or an answer did not parse.
pub fn exchange<T>(protocol: isize, request: T, ask: Ask) -> io::Result<Vec<T>>
where
    T: NetlinkSerializable + NetlinkDeserializable + Debug,
{
    let mut socket = Socket::new(protocol)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let mut header = NetlinkHeader::default();
    header.flags = ask.flags();
    header.sequence_number = 1;
    let mut message = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(request));
    message.finalize();
    let mut buf = vec![0; message.buffer_len()];
    message.serialize(&mut buf);
    socket.send(&buf, 0)?;

    let mut answer = vec![];
    loop {
        // A datagram holds whole messages; a dump spans several datagrams.
        let (datagram, _) = socket.recv_from_full()?;
        let mut at = 0;
        while at < datagram.len() {
            let message = NetlinkMessage::<T>::deserialize(&datagram[at..])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            let length = message.header.length as usize;
            match message.payload {
                NetlinkPayload::InnerMessage(m) => {
                    answer.push(m);
                    if ask == Ask::One {
                        return Ok(answer);
                    }
                }
                NetlinkPayload::Error(e) if e.code.is_some() => return Err(e.to_io()),
                // An ACK (an error message without a code) or the end of a dump.
                NetlinkPayload::Error(_) | NetlinkPayload::Done(_) => return Ok(answer),
                _ => {}
            }
            if length == 0 {
                break;
            }
            at += length.next_multiple_of(4);
        }
    }
}

#[cfg(test)]
mod tests {
    use netlink_packet_route::link::{LinkAttribute, LinkMessage};

    use super::*;

    #[test]
    fn the_loopback_is_asked_for_by_index_and_found_in_the_dump() {
        let mut lo = LinkMessage::default();
        lo.header.index = 1;
        let one = route(RouteNetlinkMessage::GetLink(lo), Ask::One).expect("lo answers");
        let [RouteNetlinkMessage::NewLink(link)] = &one[..] else {
            panic!("one link message: {one:?}");
        };
        assert!(
            link.attributes
                .contains(&LinkAttribute::IfName("lo".into()))
        );
        let all = route(
            RouteNetlinkMessage::GetLink(LinkMessage::default()),
            Ask::Dump,
        )
        .expect("the links of this namespace");
        assert!(
            all.iter()
                .any(|m| matches!(m, RouteNetlinkMessage::NewLink(l) if l.header.index == 1))
        );
    }

    #[test]
    fn a_refused_request_is_its_errno() {
        let mut missing = LinkMessage::default();
        missing.header.index = 0x7fff_fff0;
        let e = route(RouteNetlinkMessage::GetLink(missing), Ask::One).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENODEV), "{e}");
    }
}
