//! RoCEv2 Invariant CRC, as Linux's software RoCE computes it
//! (`drivers/infiniband/sw/rxe/rxe_icrc.c`): CRC-32 over 8 bytes of 0xFF, the IPv4 header
//! with TOS, TTL and checksum set to ones, the UDP header with its checksum set to ones, the
//! BTH with its `resv8a` byte set to ones, then the rest of the IB headers, the payload and
//! its pad bytes. The four ICRC bytes are that CRC, little-endian.

use crate::wire::{ETH_LEN, UDP_LEN};

/// ICRC of the RoCEv2 frame `frame` (Ethernet onwards) whose IPv4 header is `ip_len` bytes,
/// covering everything up to `icrc_offset` (where the ICRC goes).
#[must_use]
pub fn compute(frame: &[u8], ip_len: usize, icrc_offset: usize) -> u32 {
    let udp_off = ETH_LEN + ip_len;
    let bth_off = udp_off + UDP_LEN;
    compute_parts(
        &frame[ETH_LEN..udp_off],
        &frame[udp_off..bth_off],
        &frame[bth_off..icrc_offset],
    )
}

/// The same ICRC from the frame's pieces held apart: its IPv4 header `ip`, its UDP header
/// `udp`, and `ib`, the BTH onwards up to the ICRC (a host holds a UDP payload and knows
/// the headers its kernel will put in front).
#[must_use]
pub fn compute_parts(ip: &[u8], udp: &[u8], ib: &[u8]) -> u32 {
    compute_pieces(ip, udp, &[ib])
}

/// [`compute_parts`] of an IB part held in pieces, in order (the first holds the BTH's
/// first 8 bytes at least): headers, then a body where it lies, then its pad bytes.
///
/// # Panics
/// The first piece is shorter than 8 bytes.
#[must_use]
pub fn compute_pieces(ip: &[u8], udp: &[u8], ib: &[&[u8]]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&[0xff; 8]);

    let mut masked = [0u8; 60];
    let masked = &mut masked[..ip.len()];
    masked.copy_from_slice(ip);
    masked[1] = 0xff; // TOS
    masked[8] = 0xff; // TTL
    masked[10] = 0xff; // header checksum
    masked[11] = 0xff;
    hasher.update(masked);

    let mut udp_masked = [0u8; UDP_LEN];
    udp_masked.copy_from_slice(&udp[..UDP_LEN]);
    udp_masked[6] = 0xff;
    udp_masked[7] = 0xff;
    hasher.update(&udp_masked);

    let first = ib.first().copied().unwrap_or_default();
    let mut bth_head = [0u8; 8];
    bth_head.copy_from_slice(&first[..8]);
    bth_head[4] = 0xff; // resv8a
    hasher.update(&bth_head);
    hasher.update(&first[8..]);
    for piece in ib.iter().skip(1) {
        hasher.update(piece);
    }
    hasher.finalize()
}

#[cfg(test)]
mod tests {
    use crate::group::{crc32_step1, crc32_step8};

    /// The data plane's slicing-by-8 steps give the byte-wise CRC-32 for every length and
    /// every start, tails included.
    #[test]
    fn eight_byte_steps_match_the_byte_wise_crc() {
        let mut data = [0u8; 1500];
        for (i, b) in data.iter_mut().enumerate() {
            *b = ((i as u32).wrapping_mul(2_654_435_761) >> 13) as u8;
        }
        for len in [0, 1, 7, 8, 9, 63, 64, 1407, 1408, 1500] {
            let msg = &data[..len];
            let mut crc = !0u32;
            let mut words = msg.chunks_exact(8);
            for w in &mut words {
                let lo = u32::from_le_bytes(w[..4].try_into().unwrap());
                let hi = u32::from_le_bytes(w[4..].try_into().unwrap());
                crc = crc32_step8(crc, lo, hi);
            }
            for &b in words.remainder() {
                crc = crc32_step1(crc, b);
            }
            assert_eq!(!crc, crc32fast::hash(msg), "{len} bytes");
        }
    }
}
