//! Host messages on their way in: each packet is filed under its message (collective,
//! sender, step) at its index as it arrives, so a message of any length is put together in
//! one pass when it is complete — not by scanning every packet held for every packet that
//! arrives, which made long messages quadratic.

use std::collections::{BTreeMap, HashMap};

use super::frames::{Frame, MASK24};

/// Packets one message may have (at 1,408 B each, messages up to about 180 MB); a packet
/// with a larger index is dropped rather than making the table grow without bound.
pub const MAX_MESSAGE_PACKETS: usize = 1 << 17;
/// Reassembly memory one sender may hold at least, and the communicator all together; each
/// grows by [`PEER_MESSAGES`] and [`COMM_MESSAGES`] times the longest message the job
/// reduced ([`Assembly::expect`]). A sender's messages held at once are a step or two of
/// the collective in progress and its final result; the communicator's, one per step of
/// recursive doubling with peers ahead, and a peer's next collective. What goes beyond is
/// dropped (a peer asks for it again by NACK), so a flood of partial messages costs a rank
/// at most this much.
pub const PEER_FLOOR: usize = 16 << 20;
pub const COMM_FLOOR: usize = 64 << 20;
pub const PEER_MESSAGES: usize = 3;
pub const COMM_MESSAGES: usize = 8;
/// What a packet held costs beyond its datagram: its frame and its place in the table.
const PACKET_OVERHEAD: usize = size_of::<Frame>() + 48;

/// A message by (sequence number, sender, step).
type Key = (u32, usize, u8);

/// Why a host packet was not filed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Its packet index lies beyond what its message can have.
    KeyOutOfRange,
    /// Its sender, or the communicator, holds the most reassembly memory it may.
    MemoryFull,
}

/// The packets of one message received so far, by index (only those held take memory: an
/// index far out costs one entry, not a table up to it).
#[derive(Default)]
struct Partial {
    packets: BTreeMap<u32, Frame>,
    /// What they cost ([`cost`]).
    bytes: usize,
}

fn cost(f: &Frame) -> usize {
    f.wire_len() + PACKET_OVERHEAD
}

/// Host packets of collectives not finished yet.
#[derive(Default)]
pub struct Assembly {
    messages: HashMap<Key, Partial>,
    /// Memory held per sender, and all together.
    by_sender: HashMap<usize, usize>,
    bytes: usize,
    /// The longest message the job reduced so far, which the caps grow with.
    message_bytes: usize,
}

impl Assembly {
    /// The job reduces messages of `bytes`: the caps make room for them.
    pub fn expect(&mut self, bytes: usize) {
        self.message_bytes = self.message_bytes.max(bytes);
    }

    /// Reassembly memory one sender, and the communicator, may hold.
    #[must_use]
    pub fn caps(&self) -> (usize, usize) {
        let m = self.message_bytes;
        (
            PEER_FLOOR.saturating_add(m.saturating_mul(PEER_MESSAGES)),
            COMM_FLOOR.saturating_add(m.saturating_mul(COMM_MESSAGES)),
        )
    }

    /// Memory held, all messages together.
    #[cfg(test)]
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Files a host packet (of collective `seq & MASK24` or later) whose message has at most
    /// `max_packets` packets. A packet already held stays as it is.
    ///
    /// # Errors
    /// The index is beyond `max_packets` (or [`MAX_MESSAGE_PACKETS`]), or the memory its
    /// sender or the communicator may hold is full: the packet is dropped.
    pub fn insert_packet(&mut self, f: Frame, max_packets: usize) -> Result<(), Refused> {
        let i = f.bth.psn();
        // One small frame with a far index: a huge table, or a message never complete.
        if i as usize >= max_packets.min(MAX_MESSAGE_PACKETS) {
            return Err(Refused::KeyOutOfRange);
        }
        let key = (f.deth.src_qp(), f.inc.src_rank() as usize, f.inc.req_id);
        if self
            .messages
            .get(&key)
            .is_some_and(|m| m.packets.contains_key(&i))
        {
            return Ok(());
        }
        let c = cost(&f);
        let (peer_cap, comm_cap) = self.caps();
        let peer = self.by_sender.entry(key.1).or_default();
        // A flood of partial messages: memory without bound.
        if *peer + c > peer_cap || self.bytes + c > comm_cap {
            return Err(Refused::MemoryFull);
        }
        *peer += c;
        self.bytes += c;
        let m = self.messages.entry(key).or_default();
        m.bytes += c;
        m.packets.insert(i, f);
        Ok(())
    }

    /// Takes a message out, and its memory off the counts.
    fn remove(&mut self, key: &Key) -> Option<Partial> {
        let m = self.messages.remove(key)?;
        self.bytes -= m.bytes;
        if let Some(peer) = self.by_sender.get_mut(&key.1) {
            *peer -= m.bytes;
            if *peer == 0 {
                self.by_sender.remove(&key.1);
            }
        }
        Some(m)
    }

    /// Drops every message of collective `seq`, step `step` from `sender`.
    pub fn discard(&mut self, key: Key) {
        self.remove(&key);
    }

    /// Whether any packet of collective `seq` is held.
    #[must_use]
    pub fn any_for(&self, seq: u32) -> bool {
        self.messages.keys().any(|k| k.0 == seq)
    }

    /// Packets held, all messages together.
    #[must_use]
    pub fn held(&self) -> usize {
        self.messages.values().map(|m| m.packets.len()).sum()
    }

    /// Takes every message of collective `seq` and step `step` (requests to send again).
    pub fn take_step(&mut self, seq: u32, step: u8) -> Vec<Frame> {
        let keys: Vec<Key> = self
            .messages
            .keys()
            .filter(|k| k.0 == seq && k.2 == step)
            .copied()
            .collect();
        keys.iter()
            .filter_map(|k| self.remove(k))
            .flat_map(|m| m.packets.into_values())
            .collect()
    }

    /// Senders of a message of collective `seq` and step `step`.
    #[must_use]
    pub fn senders(&self, seq: u32, step: u8) -> Vec<usize> {
        let mut s: Vec<usize> = self
            .messages
            .keys()
            .filter(|k| k.0 == seq && k.2 == step)
            .map(|k| k.1)
            .collect();
        s.sort_unstable();
        s
    }

    /// Indices of the packets held of a message, in order.
    pub fn held_indices(&self, key: Key) -> impl Iterator<Item = usize> + '_ {
        self.messages
            .get(&key)
            .into_iter()
            .flat_map(|m| m.packets.keys().map(|&i| i as usize))
    }

    /// The message of `total` bytes in packets of `per` bytes, once every packet is here
    /// (each of the right length); it is then no longer held.
    pub fn take_message(&mut self, key: Key, total: usize, per: usize) -> Option<Vec<u8>> {
        let packets = total.div_ceil(per);
        let m = self.messages.get(&key)?;
        if m.packets.len() < packets {
            return None;
        }
        let whole = (0..packets).all(|i| {
            m.packets
                .get(&(i as u32))
                .is_some_and(|f| f.body().len() == ((i + 1) * per).min(total) - i * per)
        });
        if !whole {
            return None;
        }
        let m = self.remove(&key)?;
        let mut data = Vec::with_capacity(total);
        for f in m.packets.into_values().take(packets) {
            data.extend_from_slice(f.body());
        }
        Some(data)
    }

    /// Takes everything of collective `seq` and earlier (24-bit order): the first packet of
    /// each message, by which a late peer is answered.
    pub fn take_until(&mut self, seq: u32) -> Vec<Frame> {
        let keys: Vec<Key> = self
            .messages
            .keys()
            .filter(|k| !before(seq, k.0))
            .copied()
            .collect();
        keys.iter()
            .filter_map(|k| self.remove(k))
            .filter_map(|m| m.packets.into_values().next())
            .collect()
    }
}

/// Whether 24-bit sequence number `a` comes before `b`.
#[must_use]
pub fn before(a: u32, b: u32) -> bool {
    let d = b.wrapping_sub(a) & MASK24;
    d != 0 && d < 1 << 23
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use innet_common::proto::{Dtype, HOST_COMM_ID, Op};

    use super::*;
    use crate::frames::{self, DataId};

    /// Host packet `psn` of message (`seq`, `from`, `step`) with `body`.
    fn packet(seq: u32, from: u32, step: u8, psn: u32, body: &[u8]) -> Frame {
        let addr = frames::addressing(
            Ipv4Addr::new(10, 0, 0, 2),
            Ipv4Addr::new(10, 0, 0, 1),
            psn,
            seq,
        );
        let id = DataId {
            src_rank: from,
            op: Op::Sum,
            dtype: Dtype::U8,
            req_id: step,
            pkt_index: psn,
        };
        frames::parse(&frames::data(&addr, HOST_COMM_ID, id, body)).unwrap()
    }

    #[test]
    fn one_frame_with_a_far_index_takes_no_table_up_to_it() {
        let mut a = Assembly::default();
        // Beyond what a message of 3 packets can have: refused.
        assert_eq!(
            a.insert_packet(packet(1, 1, 0, 131_071, &[1; 100]), 3),
            Err(Refused::KeyOutOfRange)
        );
        // Of a collective whose length is not known yet: held, at the cost of one packet.
        a.insert_packet(packet(2, 1, 0, 131_071, &[1; 100]), MAX_MESSAGE_PACKETS)
            .unwrap();
        assert!(
            a.bytes() < 1024,
            "{} bytes for one 100-byte packet",
            a.bytes()
        );
        assert_eq!(a.held(), 1);
    }

    #[test]
    fn messages_still_come_together_in_any_order() {
        let mut a = Assembly::default();
        for i in [2u32, 0, 1] {
            a.insert_packet(packet(5, 1, 3, i, &[i as u8; 4]), 3).unwrap();
        }
        // A duplicate changes nothing.
        a.insert_packet(packet(5, 1, 3, 1, &[9; 4]), 3).unwrap();
        assert_eq!(a.held_indices((5, 1, 3)).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(
            a.take_message((5, 1, 3), 12, 4).unwrap(),
            [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
        );
        assert_eq!((a.held(), a.bytes()), (0, 0));
    }

    #[test]
    fn a_flood_of_partial_messages_stops_at_the_caps() {
        let mut a = Assembly::default();
        let (peer_cap, comm_cap) = a.caps();
        let body = [0u8; 1400];
        let per_packet = cost(&packet(1, 1, 0, 0, &body));
        let mut refused = 0;
        // One sender: its cap.
        for i in 0..(peer_cap / per_packet + 10) as u32 {
            if a.insert_packet(
                packet(1, 1, (i >> 16) as u8, i & 0xffff, &body),
                MAX_MESSAGE_PACKETS,
            ) == Err(Refused::MemoryFull)
            {
                refused += 1;
            }
        }
        assert!(
            a.bytes() <= peer_cap && refused >= 10,
            "{} {refused}",
            a.bytes()
        );
        // Many senders: the communicator's.
        for from in 2..64u32 {
            for i in 0..(peer_cap / per_packet) as u32 / 4 {
                let _ = a.insert_packet(packet(1, from, 0, i, &body), MAX_MESSAGE_PACKETS);
            }
        }
        assert!(a.bytes() <= comm_cap);
        assert!(
            a.bytes() + per_packet > comm_cap,
            "the communicator's cap was reached"
        );
        // Taking a sender's messages gives its room back.
        a.take_until(1);
        assert_eq!((a.held(), a.bytes()), (0, 0));
        a.insert_packet(packet(2, 1, 0, 0, &body), 1).unwrap();
    }

    #[test]
    fn the_caps_grow_with_the_jobs_messages() {
        let mut a = Assembly::default();
        let before = a.caps();
        a.expect(100 << 20);
        let after = a.caps();
        assert_eq!(after.0, before.0 + PEER_MESSAGES * (100 << 20));
        assert_eq!(after.1, before.1 + COMM_MESSAGES * (100 << 20));
        a.expect(usize::MAX);
        assert_eq!(a.caps(), (usize::MAX, usize::MAX));
    }
}
