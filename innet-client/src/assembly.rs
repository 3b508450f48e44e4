//! Host messages on their way in: each packet is filed under its message (collective,
//! sender, step) at its index as it arrives, so a message of any length is put together in
//! one pass when it is complete — not by scanning every packet held for every packet that
//! arrives, which made long messages quadratic.

use std::collections::HashMap;

use super::frames::{Frame, MASK24};

/// Packets one message may have (at 1,408 B each, messages up to about 180 MB); a packet
/// with a larger index is dropped rather than making the table grow without bound.
pub const MAX_MESSAGE_PACKETS: usize = 1 << 17;

/// A message by (sequence number, sender, step).
type Key = (u32, usize, u8);

/// The packets of one message received so far.
#[derive(Default)]
struct Partial {
    packets: Vec<Option<Frame>>,
    held: usize,
}

/// Host packets of collectives not finished yet.
#[derive(Default)]
pub struct Assembly {
    messages: HashMap<Key, Partial>,
}

impl Assembly {
    /// Files a host packet (of collective `seq & MASK24` or later). Returns `false` when its
    /// index is beyond [`MAX_MESSAGE_PACKETS`] (dropped).
    pub fn file(&mut self, f: Frame) -> bool {
        let i = f.bth.psn() as usize;
        if i >= MAX_MESSAGE_PACKETS {
            return false;
        }
        let key = (f.deth.src_qp(), f.inc.src_rank() as usize, f.inc.req_id);
        let m = self.messages.entry(key).or_default();
        if m.packets.len() <= i {
            m.packets.resize_with(i + 1, || None);
        }
        if m.packets[i].is_none() {
            m.held += 1;
        }
        m.packets[i] = Some(f);
        true
    }

    /// Whether any packet of collective `seq` is held.
    #[must_use]
    pub fn any_for(&self, seq: u32) -> bool {
        self.messages.keys().any(|k| k.0 == seq)
    }

    /// Packets held, all messages together.
    #[must_use]
    pub fn held(&self) -> usize {
        self.messages.values().map(|m| m.held).sum()
    }

    /// Takes every message of collective `seq` and step `step` (requests to send again).
    pub fn take_step(&mut self, seq: u32, step: u8) -> Vec<Frame> {
        let keys: Vec<Key> = self
            .messages
            .keys()
            .filter(|k| k.0 == seq && k.2 == step)
            .copied()
            .collect();
        keys.into_iter()
            .filter_map(|k| self.messages.remove(&k))
            .flat_map(|m| m.packets.into_iter().flatten())
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

    /// Indices of the packets held of a message.
    pub fn held_indices(&self, key: Key) -> impl Iterator<Item = usize> + '_ {
        self.messages.get(&key).into_iter().flat_map(|m| {
            m.packets
                .iter()
                .enumerate()
                .filter(|(_, p)| p.is_some())
                .map(|(i, _)| i)
        })
    }

    /// The message of `total` bytes in packets of `per` bytes, once every packet is here
    /// (each of the right length); it is then no longer held.
    pub fn take_message(&mut self, key: Key, total: usize, per: usize) -> Option<Vec<u8>> {
        let packets = total.div_ceil(per);
        let m = self.messages.get(&key)?;
        if m.held < packets || m.packets.len() < packets {
            return None;
        }
        let whole = m.packets[..packets].iter().enumerate().all(|(i, p)| {
            p.as_ref()
                .is_some_and(|f| f.body().len() == ((i + 1) * per).min(total) - i * per)
        });
        if !whole {
            return None;
        }
        let m = self.messages.remove(&key)?;
        let mut data = Vec::with_capacity(total);
        for f in m.packets.into_iter().take(packets).flatten() {
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
        keys.into_iter()
            .filter_map(|k| self.messages.remove(&k))
            .filter_map(|m| m.packets.into_iter().flatten().next())
            .collect()
    }
}

/// Whether 24-bit sequence number `a` comes before `b`.
#[must_use]
pub fn before(a: u32, b: u32) -> bool {
    let d = b.wrapping_sub(a) & MASK24;
    d != 0 && d < 1 << 23
}
