//! Reduction groups on one switch: the configuration userspace writes (`GROUPS`), the
//! aggregation slots the data plane owns (`SLOTS`), and the hand-off between the XDP
//! programs of one packet (`Handoff`, per-CPU scratch across tail calls).
//!
//! Window and reuse rule: a group owns `window` consecutive slots (the switch's window, a
//! power of two set at attach, [`DEFAULT_WINDOW`] unless `--window` says otherwise); round
//! `req_id` uses slot `req_id % window` ([`slot_of`]). A slot keeps its result until a newer
//! round claims it, so a retransmitted contribution of a completed round is answered from
//! the saved result. A round `r` is newer than the slot's round `s` when `(r - s) mod 256`
//! lies in `1..128`; otherwise the packet is stale and dropped. Hosts must therefore keep
//! at most `window / 2` rounds of a group in flight (the handshake tells them the smallest
//! window along the path).

use crate::wire::{ETH_LEN, IB_HEADERS_LEN, IPV4_LEN, UDP_LEN};

/// Children (hosts under a TOR, or TORs under a SPINE) of one group on one switch.
pub const MAX_CHILDREN: usize = 16;
/// Slots per group on a switch unless `innet attach --window` says otherwise.
pub const DEFAULT_WINDOW: u32 = 16;
/// Fewest slots per group `--window` accepts.
pub const MIN_WINDOW: u32 = 8;
/// Most slots per group: rounds are numbered by the 8-bit `req_id`, and the newer-than rule
/// needs every round in flight within 128 of the oldest.
pub const MAX_WINDOW: u32 = 128;

/// Whether `window` is a valid number of slots per group: a power of two (rounds map to
/// slots by a mask) from [`MIN_WINDOW`] to [`MAX_WINDOW`].
#[must_use]
pub const fn valid_window(window: u32) -> bool {
    window.is_power_of_two() && window >= MIN_WINDOW && window <= MAX_WINDOW
}

/// The slot (`SLOTS`, `NIC_COMPLETIONS`) of round `req_id` of the group at `index`, on a
/// switch of `2^window_shift` slots per group.
#[inline(always)]
#[must_use]
pub const fn slot_of(index: u32, window_shift: u8, req_id: u8) -> u32 {
    // Masked so that the verifier sees a bounded shift (windows are at most 2^7).
    let shift = (window_shift & 7) as u32;
    (index << shift) + (req_id as u32 & ((1 << shift) - 1))
}
/// Default number of groups one switch can hold (`innet attach --capacity`).
pub const DEFAULT_CAPACITY: u32 = 64;
/// Largest capacity the maps are declared with; `--capacity` may shrink it at load time.
pub const MAX_CAPACITY: u32 = 1024;
/// Bytes of a saved header template: Ethernet, IPv4 without options, UDP, BTH, DETH, INC.
pub const TEMPLATE_LEN: usize = ETH_LEN + IPV4_LEN + UDP_LEN + IB_HEADERS_LEN;
const _: () = assert!(TEMPLATE_LEN == 84);

/// Role of the switch in a group's tree.
pub const ROLE_TOR: u8 = 0;
pub const ROLE_SPINE: u8 = 1;
/// A host (or SmartNIC) port in a NIC-triggered reduction tree (the NIC paper): children are
/// other members' NICs, the host's own contribution is posted through `innet_nic_post`, the
/// root sends the result to the group's multicast address, and every member writes it into
/// `NIC_COMPLETIONS` for its host.
pub const ROLE_NIC: u8 = 2;

/// `Handoff::child` of the host's own contribution on a NIC (bit 16 of a slot's bitmap).
pub const LOCAL_CHILD: u32 = MAX_CHILDREN as u32;

/// One child of a group on this switch. Addresses as on the wire (big-endian bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Child {
    /// IPv4 address the child's packets come from (membership is checked against it).
    pub ip: [u8; 4],
    /// Port the child sits behind.
    pub ifindex: u32,
    pub mac: [u8; 6],
    /// Explicit padding (zero).
    pub pad: [u8; 2],
    /// The child's rank (host leader) or switch id (TOR under a SPINE), for operators.
    pub rank: u32,
}

/// A group as installed on this switch (`GROUPS`, keyed by the 24-bit wire group id).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupConfig {
    /// Index of the group on this switch: slots `index << window_shift ..`, stats entry
    /// `index`.
    pub index: u32,
    /// [`ROLE_TOR`] or [`ROLE_SPINE`].
    pub role: u8,
    /// 1 when this switch is the root of the tree (sends results down instead of up).
    pub is_root: u8,
    /// Number of valid entries in `children`; each round expects one contribution from each.
    pub n_children: u8,
    /// log2 of the switch's slots per group (its window), written at install.
    pub window_shift: u8,
    /// Port towards the parent (0 at the root).
    pub parent_ifindex: u32,
    /// Addressing of packets sent to the parent: own port MAC/IP → parent MAC/IP.
    pub own_mac: [u8; 6],
    pub parent_mac: [u8; 6],
    pub own_ip: [u8; 4],
    pub parent_ip: [u8; 4],
    /// Rank this switch puts into `src_rank` of packets it sends up.
    pub own_rank: u32,
    /// The group's MRR (the only host whose kill frees it); 0 for groups added by hand.
    pub mrr_ip: [u8; 4],
    /// NIC role: the tree's root, whose results are accepted like the parent's.
    pub root_ip: [u8; 4],
    /// NIC role, at the root: where results go (the group's multicast address).
    pub result_ip: [u8; 4],
    pub result_mac: [u8; 6],
    /// Explicit padding (zero).
    pub pad1: [u8; 2],
    /// DPU member (0 elsewhere): the port towards the host. The host's contribution is the
    /// INC data that arrives on it; its result leaves by it as an ordinary RoCEv2 frame
    /// from `dpu_ip` to `host_ip`/`host_mac`. Children are then known by their member
    /// index (`Child::rank`, their packets' `src_rank`) and port.
    pub host_ifindex: u32,
    pub host_ip: [u8; 4],
    pub dpu_ip: [u8; 4],
    pub host_mac: [u8; 6],
    /// The DPU's host-facing port MAC: the source of the frames it hands the host.
    pub dpu_mac: [u8; 6],
    pub children: [Child; MAX_CHILDREN],
}

impl GroupConfig {
    /// Whether this member runs on a DPU for the host behind `host_ifindex`.
    #[inline(always)]
    #[must_use]
    pub const fn is_dpu(&self) -> bool {
        self.host_ifindex != 0
    }
}

impl Default for GroupConfig {
    fn default() -> Self {
        Self {
            index: 0,
            role: ROLE_TOR,
            is_root: 0,
            n_children: 0,
            window_shift: DEFAULT_WINDOW.trailing_zeros() as u8,
            parent_ifindex: 0,
            own_mac: [0; 6],
            parent_mac: [0; 6],
            own_ip: [0; 4],
            parent_ip: [0; 4],
            own_rank: 0,
            mrr_ip: [0; 4],
            root_ip: [0; 4],
            result_ip: [0; 4],
            result_mac: [0; 6],
            pad1: [0; 2],
            host_ifindex: 0,
            host_ip: [0; 4],
            dpu_ip: [0; 4],
            host_mac: [0; 6],
            dpu_mac: [0; 6],
            children: [Child::default(); MAX_CHILDREN],
        }
    }
}

/// Slot states.
pub const SLOT_EMPTY: u8 = 0;
/// Collecting contributions.
pub const SLOT_AGGREGATING: u8 = 1;
/// All children in, partial result sent to the parent, waiting for the final result.
pub const SLOT_SENT_UP: u8 = 2;
/// Final result known; kept to answer retransmissions until the slot is reused.
pub const SLOT_COMPLETE: u8 = 3;
/// Every contribution is in the stash and one CPU is folding them into the slot's data,
/// outside the lock, in input order (duplicates meanwhile are dropped, and a newer round
/// waits: the fold writes the data).
pub const SLOT_FOLDING: u8 = 4;

/// [`Slot::pending`]'s bit for the parent's result being copied into the slot's data (bits
/// below [`MAX_INPUTS`] are contributions being copied into their stash entries).
pub const PENDING_RESULT: u32 = 1 << 31;

/// Contributions one float slot keeps (children, plus the host's own on a NIC), each in its
/// own [`Stash`] entry: `slot * MAX_INPUTS + input`, where input `i < MAX_CHILDREN` is child
/// `i` and [`LOCAL_CHILD`] the NIC's host. A float round is folded in ascending input order
/// once all are in, so its result does not depend on the order packets arrived in.
pub const MAX_INPUTS: u32 = MAX_CHILDREN as u32 + 1;

/// One stashed float contribution (wire format, as the packet carried it).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Stash {
    pub bytes: [u8; crate::proto::MAX_PAYLOAD_BYTES],
}

/// Index into `STASH` of input `input` of slot `slot`.
#[inline(always)]
#[must_use]
pub const fn stash_index(slot: u32, input: u32) -> u32 {
    slot * MAX_INPUTS + input
}

/// The kernel's `struct bpf_spin_lock`. The verifier finds a map value's lock by this BTF
/// type name, so the name must stay exactly this.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct bpf_spin_lock {
    pub val: u32,
}

/// A saved header (everything before the payload) of a packet, replayed on output.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Template {
    pub bytes: [u8; TEMPLATE_LEN],
    /// 1 when `bytes` holds a header of the slot's current round.
    pub valid: u8,
    /// Child the saved packet was addressed to, or [`NOT_A_CHILD`] (then the result goes
    /// back to the sender with addresses swapped).
    pub dst_child: u8,
    /// Explicit padding (zero).
    pub pad: [u8; 2],
}

/// `Template::dst_child` when the packet was addressed to no child of the group.
pub const NOT_A_CHILD: u8 = 0xff;

/// One aggregation slot: one round of one group.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Slot {
    pub lock: bpf_spin_lock,
    /// `req_id` of the round the slot holds.
    pub round: u8,
    /// `SLOT_*`.
    pub state: u8,
    pub op: u8,
    pub dtype: u8,
    /// Elements per packet of this round (all contributions must agree).
    pub count: u16,
    /// Contributions added so far.
    pub arrived: u16,
    /// Bit `i`: child `i` contributed.
    pub bitmap: u32,
    /// Payload copies in flight outside the lock (bit `i`: input `i` into its stash entry;
    /// [`PENDING_RESULT`]: the parent's result into `data`). A newer round does not take a
    /// slot with copies in flight.
    pub pending: u32,
    /// The whole round the slot holds: its packets' 24-bit BTH PSN, whose low byte is
    /// `round` (hosts number rounds so). A round 256 later has the same `req_id`; the PSN
    /// tells it from the one left in the slot.
    pub psn: u32,
    /// The running or final result, in wire format (big-endian elements).
    pub data: [u8; crate::proto::MAX_PAYLOAD_BYTES],
    /// Header template per child: the packet that delivers the result to child `i`.
    pub templates: [Template; MAX_CHILDREN],
}

// The data plane reads slot data a whole element (up to 8 bytes) at a time: map values
// are 8-aligned, so the data must be too.
const _: () = assert!(core::mem::offset_of!(Slot, data).is_multiple_of(8));

/// What the aggregation program decided; the emit program carries it out.
pub const ACT_DROP: u32 = 0;
/// Send the result to every child (devmap broadcast; each copy rewritten for its port).
pub const ACT_BROADCAST: u32 = 1;
/// Send the partial result to the parent.
pub const ACT_UP: u32 = 2;
/// Answer the sender (a retransmission) with the saved result, out of the ingress port.
pub const ACT_REPLY: u32 = 3;
/// NIC role: the host posted again a round that is complete: write its completion again.
pub const ACT_COMPLETE: u32 = 4;

/// A result as a NIC hands it to its host (`NIC_COMPLETIONS`, an mmap-able array with the
/// layout of `SLOTS`): the host polls `stamp` in its mapping, no system call per round.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Completion {
    /// [`completion_stamp`] of the round whose result `data` holds; written after the data.
    pub stamp: u32,
    /// Payload bytes in `data`.
    pub len: u32,
    /// The result in wire format (big-endian elements).
    pub data: [u8; crate::proto::MAX_PAYLOAD_BYTES],
}

/// The stamp of round `req_id` of wire group `wire_id` (24 bits): never 0 for an
/// installable group.
#[must_use]
pub const fn completion_stamp(wire_id: u32, req_id: u8) -> u32 {
    wire_id << 8 | req_id as u32
}

/// Per-CPU hand-off between `innet_switch`, the aggregation program, the fold programs and
/// the emit program.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Handoff {
    pub group: u32,
    pub slot: u32,
    /// The group's index (its slots and counters), so the aggregation program needs no
    /// second lookup of the group.
    pub index: u32,
    pub child: u32,
    /// 1 when the packet came from the parent (a result going down).
    pub from_parent: u32,
    /// `ACT_*`, set by the aggregation program (for a round it hands to a fold program:
    /// what to do with the fold).
    pub action: u32,
    /// Payload bytes of the packet.
    pub payload_len: u32,
    /// Whether broadcast should skip the ingress port (results from the parent).
    pub exclude_ingress: u32,
    /// Contributions that complete a round: the children, plus the host's own on a NIC.
    pub expected: u32,
    /// 1 at the root of the group's tree.
    pub is_root: u32,
    /// The child the packet is addressed to, or [`NOT_A_CHILD`] (see [`Template`]).
    pub dst_child: u32,
    /// The packet's op (`Op as u8`), defined on its element type.
    pub op: u32,
}

/// Index of the tail-call slot of the emit program in `JUMP`.
pub const JUMP_EMIT: u32 = 0;
/// Tail-call index of the fold program for `op` × `dtype`, which the aggregation program
/// hands a complete round to.
#[must_use]
pub const fn jump_fold(op: u8, dtype: u8) -> u32 {
    1 + op as u32 * 16 + dtype as u32
}
/// Tail-call index of the program that answers data of a group this switch lost.
pub const JUMP_LOST: u32 = 1 + 12 * 16;
/// Tail-call index of the aggregation program (every op and type: only the fold differs).
pub const JUMP_AGG: u32 = JUMP_LOST + 1;
/// Entries of `JUMP`.
pub const JUMP_SIZE: u32 = JUMP_AGG + 1;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: repr(C) structs of integers and byte arrays with explicit padding fields.
    unsafe impl aya::Pod for super::GroupConfig {}
    unsafe impl aya::Pod for super::Slot {}
    unsafe impl aya::Pod for super::Handoff {}
    unsafe impl aya::Pod for super::Completion {}
    unsafe impl aya::Pod for super::Stash {}
}

/// CRC-32 (IEEE, reflected) table, shared by the data plane's ICRC and userspace tests.
pub const CRC32_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// Slicing-by-8 tables: `CRC32_SLICES[k][b]` is the CRC of byte `b` followed by `k` zero
/// bytes, so eight message bytes advance the CRC with eight lookups ([`crc32_step8`])
/// instead of eight dependent rounds: the data plane's ICRC of a full packet is its
/// largest per-copy cost.
pub const CRC32_SLICES: [[u32; 256]; 8] = {
    let mut t = [[0u32; 256]; 8];
    t[0] = CRC32_TABLE;
    let mut k = 1;
    while k < 8 {
        let mut i = 0;
        while i < 256 {
            let prev = t[k - 1][i];
            t[k][i] = (prev >> 8) ^ CRC32_TABLE[(prev & 0xff) as usize];
            i += 1;
        }
        k += 1;
    }
    t
};

/// Advances the reflected CRC-32 state `crc` over one byte.
#[inline(always)]
#[must_use]
pub fn crc32_step1(crc: u32, b: u8) -> u32 {
    CRC32_TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8)
}

/// Advances the reflected CRC-32 state `crc` over eight bytes, given as their
/// little-endian halves `lo` (bytes 0–3) and `hi` (bytes 4–7).
#[inline(always)]
#[must_use]
pub fn crc32_step8(crc: u32, lo: u32, hi: u32) -> u32 {
    let t = &CRC32_SLICES;
    let lo = crc ^ lo;
    t[7][(lo & 0xff) as usize]
        ^ t[6][((lo >> 8) & 0xff) as usize]
        ^ t[5][((lo >> 16) & 0xff) as usize]
        ^ t[4][(lo >> 24) as usize]
        ^ t[3][(hi & 0xff) as usize]
        ^ t[2][((hi >> 8) & 0xff) as usize]
        ^ t[1][((hi >> 16) & 0xff) as usize]
        ^ t[0][(hi >> 24) as usize]
}

/// CRC state after the ICRC's 8-byte 0xFF prefix (rxe starts from this value).
pub const ICRC_SEED: u32 = 0xdebb_20e3;

/// The reflected CRC-32 polynomial.
const CRC32_POLY: u32 = 0xedb8_8320;

/// `a · b` modulo the CRC-32 polynomial, both in the CRC's reflected bit order (bit 31 is
/// `x^0`). Branch-free, 32 fixed [`crc32_mul_step`]s.
#[inline(always)]
#[must_use]
pub const fn crc32_mul(a: u32, b: u32) -> u32 {
    let mut pb = (0u32, b);
    let mut i = 0;
    while i < 32 {
        pb = crc32_mul_step(a, i, pb);
        i += 1;
    }
    pb.0
}

/// Step `i` (0–31) of [`crc32_mul`]`(a, b)`: `(p, b)` holds the product so far and `b`
/// times `x^i`. A BPF program inside a `bpf_loop` callback runs the steps as a callback of
/// their own: the verifier walked the 32 steps inline on so many states that the fan-out
/// program went past the kernel's 1 M instruction limit (Linux 6.18).
#[inline(always)]
#[must_use]
pub const fn crc32_mul_step(a: u32, i: u32, (p, b): (u32, u32)) -> (u32, u32) {
    let take = ((a >> (31 - (i & 31))) & 1).wrapping_neg();
    (
        p ^ (b & take),
        (b >> 1) ^ (CRC32_POLY & (b & 1).wrapping_neg()),
    )
}

/// `CRC32_X2N[k]` is `x^(2^k)` modulo the polynomial.
const CRC32_X2N: [u32; 32] = {
    let mut t = [0u32; 32];
    t[0] = 1 << 30;
    let mut k = 1;
    while k < 32 {
        t[k] = crc32_mul(t[k - 1], t[k - 1]);
        k += 1;
    }
    t
};

/// `x^(8n)` modulo the polynomial, for `n < 65536`: what moves a CRC state past `n` zero
/// bytes. Because the CRC is linear, the state after a header `h` and then `n` bytes `m`
/// is `crc32_mul(crc32_shift_bytes(n), state_after(h)) ^ state_of(m from 0)`: a result's
/// payload is run through the CRC once and each copy's own header combined with it
/// ([`crc32_combine`]). Branch-free, 16 fixed steps. The data plane looks it up instead
/// ([`crc32_shift_lookup`], a table built from it); this is the reference the table's test
/// holds it to.
#[inline(always)]
#[must_use]
pub fn crc32_shift_bytes(n: u32) -> u32 {
    let mut p = 1u32 << 31;
    let mut i = 0u32;
    while i < 16 {
        let bit = (n >> i) & 1;
        // Read back through memory: LLVM would make the masked update a select, which BPF
        // compiles to a branch, and the verifier would walk every product as a constant of
        // its own, 2^16 paths (the fan-out program then exceeded the 1 M instruction limit).
        // SAFETY: reads a local.
        let take = unsafe { core::ptr::read_volatile(&raw const bit) }.wrapping_neg();
        let m = crc32_mul(CRC32_X2N[(i + 3) as usize], p);
        p ^= (p ^ m) & take;
        i += 1;
    }
    p
}

/// Lengths [`crc32_shift_lookup`] knows: every payload with its padding and more.
const SHIFT_TABLE_LEN: usize = crate::proto::MAX_PAYLOAD_BYTES + 8;

/// `CRC32_X8N[n]` is [`crc32_shift_bytes`]`(n)`, each entry the one before times `x^8`.
static CRC32_X8N: [u32; SHIFT_TABLE_LEN] = {
    let mut t = [0u32; SHIFT_TABLE_LEN];
    t[0] = 1 << 31;
    let mut n = 1;
    while n < SHIFT_TABLE_LEN {
        t[n] = crc32_mul(t[n - 1], CRC32_X2N[3]);
        n += 1;
    }
    t
};

/// [`crc32_shift_bytes`]`(n)` looked up, for `n` up to a payload and its padding (`None`
/// beyond): what the data plane uses. Computed, it is 16 multiplications of 32 steps,
/// which the verifier walks on every path through a program (a fan-out program that
/// computed it twice exceeded the kernel's 1 M instruction limit on Linux 6.18).
#[inline(always)]
#[must_use]
pub fn crc32_shift_lookup(n: u32) -> Option<u32> {
    CRC32_X8N.get(n as usize).copied()
}

/// The CRC state after a prefix whose state is `head`, then `n` bytes whose state, run
/// from zero, is `tail` (`shift` is [`crc32_shift_bytes`]`(n)`).
#[inline(always)]
#[must_use]
pub const fn crc32_combine(head: u32, shift: u32, tail: u32) -> u32 {
    crc32_mul(shift, head) ^ tail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_powers_of_two_the_round_numbers_can_tell_apart() {
        assert!([8, 16, 32, 64, 128].into_iter().all(valid_window));
        assert!(![0, 4, 12, 100, 256].into_iter().any(valid_window));
    }

    extern crate std;
    use std::vec::Vec;

    fn crc_state(mut crc: u32, bytes: &[u8]) -> u32 {
        for &b in bytes {
            crc = crc32_step1(crc, b);
        }
        crc
    }

    #[test]
    fn a_payload_crc_combines_with_any_header_like_one_pass() {
        let mut x = 0x1234_5678_u32;
        let mut byte = || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        };
        for n in [0usize, 1, 7, 8, 64, 1408, 3392, 8192, 8197] {
            let head: Vec<u8> = (0..70).map(|_| byte()).collect();
            let tail: Vec<u8> = (0..n).map(|_| byte()).collect();
            let whole = crc_state(crc_state(ICRC_SEED, &head), &tail);
            let combined = crc32_combine(
                crc_state(ICRC_SEED, &head),
                crc32_shift_bytes(n as u32),
                crc_state(0, &tail),
            );
            assert_eq!(combined, whole, "{n} bytes");
        }
    }

    /// `a · b` the long way: polynomial product, then reduced; in the reflected order.
    fn reference_mul(a: u32, b: u32) -> u32 {
        let (a, b) = (u64::from(a.reverse_bits()), u64::from(b.reverse_bits()));
        let mut product = 0u64;
        for i in 0..32 {
            if b >> i & 1 == 1 {
                product ^= a << i;
            }
        }
        let poly = u64::from(CRC32_POLY.reverse_bits()) | 1 << 32;
        for bit in (32..64).rev() {
            if product >> bit & 1 == 1 {
                product ^= poly << (bit - 32);
            }
        }
        (product as u32).reverse_bits()
    }

    #[test]
    fn the_product_matches_the_long_way() {
        let mut x = 0x9e37_79b9_u32;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let (a, b) = (x, x.rotate_left(11) ^ 0x5bd1_e995);
            assert_eq!(crc32_mul(a, b), reference_mul(a, b), "{a:#x} · {b:#x}");
        }
        assert_eq!(
            crc32_mul(1 << 31, 0x1234_5678),
            0x1234_5678,
            "x^0 is the unit"
        );
    }

    #[test]
    fn the_shift_table_holds_the_computed_shift_for_every_length() {
        for n in 0..SHIFT_TABLE_LEN as u32 {
            assert_eq!(
                crc32_shift_lookup(n),
                Some(crc32_shift_bytes(n)),
                "{n} bytes"
            );
        }
        assert_eq!(crc32_shift_lookup(SHIFT_TABLE_LEN as u32), None);
    }

    #[test]
    fn a_group_owns_its_window_of_slots() {
        for shift in 3..=7u8 {
            let window = 1u32 << shift;
            for req_id in 0..=255u8 {
                let slot = slot_of(5, shift, req_id);
                assert_eq!(slot, 5 * window + u32::from(req_id) % window);
            }
        }
        assert_eq!(slot_of(1, 4, 17), 17, "default window: 16 slots per group");
    }
}
