//! Example INC packets and a minimal pcap writer, so users can look at the wire format in
//! Wireshark (`innet pcap FILE`).

use std::{
    io::{self, Write},
    net::Ipv4Addr,
};

use innet_common::{
    codec::{Addressing, data_header, encode, encode_control, encode_elements},
    proto::{
        COMM_TYPE_ALLREDUCE, Dtype, MASTER_NODE_MODE, Op, PacketKind, QNH_RESPONSE,
        SEED_MAX_PAYLOAD_BYTES,
    },
    wire::ControlPayload,
};

const LINKTYPE_ETHERNET: u32 = 1;

/// Writes `frames` as a classic pcap (microsecond timestamps, one second apart).
///
/// # Errors
/// I/O errors of `out`.
pub fn write(out: &mut impl Write, frames: &[Vec<u8>]) -> io::Result<()> {
    out.write_all(&0xa1b2_c3d4u32.to_le_bytes())?;
    out.write_all(&2u16.to_le_bytes())?;
    out.write_all(&4u16.to_le_bytes())?;
    out.write_all(&0i32.to_le_bytes())?; // thiszone
    out.write_all(&0u32.to_le_bytes())?; // sigfigs
    out.write_all(&65535u32.to_le_bytes())?; // snaplen
    out.write_all(&LINKTYPE_ETHERNET.to_le_bytes())?;
    for (i, f) in frames.iter().enumerate() {
        let len = u32::try_from(f.len()).map_err(|_| io::Error::other("frame over 4 GiB"))?;
        out.write_all(&(1_700_000_000u32 + i as u32).to_le_bytes())?;
        out.write_all(&0u32.to_le_bytes())?;
        out.write_all(&len.to_le_bytes())?;
        out.write_all(&len.to_le_bytes())?;
        out.write_all(f)?;
    }
    Ok(())
}

/// The frames of a classic pcap (little-endian, micro- or nanosecond timestamps), as
/// `tshark -F pcap -w` and [`write()`] produce.
///
/// # Errors
/// Not a little-endian classic pcap, or a truncated record.
pub fn read(bytes: &[u8]) -> io::Result<Vec<Vec<u8>>> {
    let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, format!("pcap: {why}"));
    let u32_at = |i: usize| {
        bytes
            .get(i..i + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    if !matches!(u32_at(0), Some(0xa1b2_c3d4 | 0xa1b2_3c4d)) {
        return Err(bad(
            "not a little-endian classic pcap (write it with `-F pcap`)",
        ));
    }
    let mut frames = vec![];
    let mut at = 24;
    while at < bytes.len() {
        let len = u32_at(at + 8).ok_or_else(|| bad("truncated record header"))? as usize;
        let frame = bytes
            .get(at + 16..at + 16 + len)
            .ok_or_else(|| bad("truncated record"))?;
        frames.push(frame.to_vec());
        at += 16 + len;
    }
    Ok(frames)
}

/// A described example frame.
pub struct Example {
    pub description: String,
    pub frame: Vec<u8>,
}

/// Query, notify and kill of one group, then data packets for several ops and types.
#[must_use]
pub fn examples() -> Vec<Example> {
    let host = |i: u8| Addressing {
        src_mac: [0x02, 0x1c, 0, 0, 0, i],
        dst_mac: [0x02, 0x1c, 0, 0, 0, i + 1],
        src_ip: Ipv4Addr::new(10, 77, 0, i),
        dst_ip: Ipv4Addr::new(10, 77, 0, i + 1),
        udp_src_port: 49152 + u16::from(i),
        psn: u32::from(i),
        ..Addressing::default()
    };
    let group = 0x00c0_ff01;
    let mut query = ControlPayload {
        sup_comm_type: COMM_TYPE_ALLREDUCE,
        master_num: MASTER_NODE_MODE,
        ..ControlPayload::default()
    };
    query.set_global_group_size(8);
    query.set_local_group_size(4);
    query.set_true_comm_id(group);
    query.set_job_id(42);
    query.set_world_rank(4);
    query.set_dst_rank(0);
    let mut notify = query;
    notify.query_notify_hop = QNH_RESPONSE | 3;
    notify.set_sup_allreduce_op(0x0fff);
    notify.set_sup_data_type(0x00ff);
    notify.set_sup_max_data_size(SEED_MAX_PAYLOAD_BYTES as u16);
    notify.set_tor1_ip(u32::from(Ipv4Addr::new(10, 77, 1, 1)));
    notify.set_spine_ip(u32::from(Ipv4Addr::new(10, 77, 2, 1)));
    notify.set_tor2_ip(u32::from(Ipv4Addr::new(10, 77, 1, 2)));
    notify.set_ava_grp_num(1023);

    let mut out = vec![
        Example {
            description: "query from NMRR rank 4".into(),
            frame: encode_control(&host(4), PacketKind::Query, 4, &query),
        },
        Example {
            description: "notify from MRR rank 0".into(),
            frame: encode_control(&host(1), PacketKind::Notify, 0, &notify),
        },
        Example {
            description: "kill from MRR rank 0".into(),
            frame: encode_control(&host(1), PacketKind::Kill, 0, &query),
        },
    ];
    let cases: [(Op, Dtype, &[i64]); 6] = [
        (Op::Sum, Dtype::I32, &[1, -2, 300_000, i64::from(i32::MAX)]),
        (Op::Max, Dtype::U16, &[7, 65535, 0]),
        (Op::Prod, Dtype::I16, &[3, -4]),
        (Op::Bxor, Dtype::U8, &[0xa5, 0x5a, 0xff]),
        (Op::Minloc, Dtype::I64, &[-9, 1 << 40]),
        (Op::Sum, Dtype::U64, &[u32::MAX.into(); 32]),
    ];
    for (round, (op, dtype, values)) in cases.into_iter().enumerate() {
        let locs: Vec<i32> = (0..values.len() as i32).collect();
        let body = encode_elements(dtype, values, op.carries_location().then_some(&locs[..]));
        let hdr = data_header(group, 1, op, dtype, round as u8, 0, values.len() as u16);
        out.push(Example {
            description: format!(
                "data {} {} ×{} round {round}",
                op.name(),
                dtype.name(),
                values.len()
            ),
            // As hosts send them: the PSN's low byte is the round (`req_id`).
            frame: encode(
                &Addressing {
                    psn: round as u32,
                    ..host(2)
                },
                &hdr,
                &body,
            ),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_gives_back_what_write_wrote() {
        let frames: Vec<Vec<u8>> = examples().into_iter().map(|e| e.frame).collect();
        let mut file = vec![];
        write(&mut file, &frames).expect("write");
        assert_eq!(read(&file).expect("read"), frames);
        assert!(read(&file[..file.len() - 1]).is_err(), "a truncated record");
        assert!(
            read(b"\x0a\x0d\x0d\x0a pcapng").is_err(),
            "pcapng is refused"
        );
    }
}
