//! Control packets as the switch daemon receives them: any frame with a control header
//! (query, notify, kill) and arbitrary payload bytes. The payload decodes without panic and
//! re-encodes to a frame the parser takes back unchanged.
#![no_main]

use innet_common::{
    codec::{Addressing, as_bytes, encode_control, parse, read},
    proto::PacketKind,
    wire::ControlPayload,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (u8, u32, Vec<u8>)| {
    let (kind, rank, bytes) = input;
    let kind = [PacketKind::Query, PacketKind::Notify, PacketKind::Kill][usize::from(kind % 3)];
    let mut raw = bytes;
    raw.resize(size_of::<ControlPayload>(), 0);
    let c: ControlPayload = read(&raw);
    let _ = (c.true_comm_id(), c.global_group_size(), c.world_rank());
    let frame = encode_control(&Addressing::default(), kind, rank, &c);
    let back = parse(&frame).expect("an encoded control frame parses");
    assert_eq!(
        as_bytes(&back.control().expect("control")),
        as_bytes(&c),
        "the payload survives a round trip"
    );
});
