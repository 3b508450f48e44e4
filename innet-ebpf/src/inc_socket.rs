//! The INC-socket selector: communicators whose leaders share a host address bind one
//! `SO_REUSEPORT` group on UDP 4791, and this program hands each datagram to the socket of
//! its communicator, by the key `innet_common::demux` reads out of it. A datagram with no
//! registered key goes wherever the kernel's hash puts it; every socket drops what is not
//! its own.
//!
//! Its own object (not the XDP one), so a client loads two small maps, not the switch's.
#![no_std]
#![no_main]

mod object;

use aya_ebpf::{
    EbpfContext as _,
    bindings::sk_action,
    helpers::generated::bpf_skb_load_bytes,
    macros::{map, sk_reuseport},
    maps::{HashMap, ReusePortSockArray},
    programs::SkReuseportContext,
};
use innet_common::demux::{self, CONTROL_COMM_OFFSET, HEAD_LEN, KeySource, MAX_KEYS, MAX_SOCKETS};

/// The sockets of the group, at the indices their owners claimed.
#[map]
static INC_SOCKETS: ReusePortSockArray = ReusePortSockArray::pinned(MAX_SOCKETS, 0);
/// Datagram key → index in `INC_SOCKETS`.
#[map]
static INC_SOCKET_KEYS: HashMap<u32, u32> = HashMap::pinned(MAX_KEYS, 0);

#[sk_reuseport]
pub fn innet_inc_socket(ctx: SkReuseportContext) -> u32 {
    if let Some(index) = key(&ctx).and_then(|k| unsafe { INC_SOCKET_KEYS.get(&k) }) {
        // On failure (the socket just closed) the kernel falls back to its hash.
        let _ = INC_SOCKETS.select_reuseport(&ctx, *index);
    }
    sk_action::SK_PASS
}

fn key(ctx: &SkReuseportContext) -> Option<u32> {
    let mut head = [0u8; HEAD_LEN];
    load(ctx, 0, &mut head)?;
    match demux::key_source(&head) {
        KeySource::Key(k) => Some(k),
        KeySource::ControlComm => {
            let mut comm = [0u8; 4];
            load(ctx, CONTROL_COMM_OFFSET, &mut comm)?;
            Some(demux::comm_key(u32::from_be_bytes(comm)))
        }
        KeySource::Unknown => None,
    }
}

/// Copies bytes from `offset` of the datagram (its UDP header is at 0).
#[inline(always)]
fn load<const N: usize>(ctx: &SkReuseportContext, offset: usize, to: &mut [u8; N]) -> Option<()> {
    let ret = unsafe {
        bpf_skb_load_bytes(
            ctx.as_ptr(),
            offset as u32,
            to.as_mut_ptr().cast(),
            N as u32,
        )
    };
    (ret == 0).then_some(())
}
