//! What a group is on the wire: its id (drawn per job and generation), the set-up key its
//! members' queries carry, and the parameters a leader passes its node's ranks.

use std::{
    hash::{BuildHasher as _, Hasher as _},
    net::Ipv4Addr,
    time::Instant,
};

use innet_common::proto::CONTROL_COMM_ID;

/// What a group was set up with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupParams {
    pub true_comm_id: u32,
    /// The 24-bit id data packets carry.
    pub wire_id: u32,
    /// The root of the group's tree above the TORs (`0.0.0.0` when one TOR holds it all).
    pub spine: Ipv4Addr,
    /// Capabilities along the path, intersected.
    pub ops: u16,
    pub dtypes: u16,
    pub max_data_size: u16,
    /// Slots per group, the smallest along the path: half as many rounds may be in flight.
    pub window: u16,
    /// 0: the network serves the group; otherwise why not (switch or MRR cause).
    pub fail_cause: u8,
}

impl GroupParams {
    /// Bytes of the node-local encoding.
    pub const BYTES: usize = 21;

    /// Node-local encoding (little-endian; never on the wire).
    #[must_use]
    pub fn to_bytes(&self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        b[0..4].copy_from_slice(&self.true_comm_id.to_le_bytes());
        b[4..8].copy_from_slice(&self.wire_id.to_le_bytes());
        b[8..12].copy_from_slice(&self.spine.octets());
        b[12..14].copy_from_slice(&self.ops.to_le_bytes());
        b[14..16].copy_from_slice(&self.dtypes.to_le_bytes());
        b[16..18].copy_from_slice(&self.max_data_size.to_le_bytes());
        b[18] = self.fail_cause;
        b[19..21].copy_from_slice(&self.window.to_le_bytes());
        b
    }

    /// Decodes [`Self::to_bytes`]; `None` for anything else.
    #[must_use]
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        let b: &[u8; Self::BYTES] = b.try_into().ok()?;
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Some(Self {
            true_comm_id: u32_at(0),
            wire_id: u32_at(4),
            spine: Ipv4Addr::new(b[8], b[9], b[10], b[11]),
            ops: u16_at(12),
            dtypes: u16_at(14),
            max_data_size: u16_at(16),
            fail_cause: b[18],
            window: u16_at(19),
        })
    }

    /// Whether allreduces of this group run through the network.
    #[must_use]
    pub fn in_network(&self) -> bool {
        self.fail_cause == 0
    }
}

/// The group id of job `job`'s communicator: the MRR's "random group id", derived from the
/// job id every rank already shares, so no extra round trip hands it out. Never 0 in its
/// wire part and never ends in 0xff.
#[must_use]
fn group_id_for_job(job: u64) -> u32 {
    // splitmix64: every bit of the job id moves the result.
    let mut z = job.wrapping_add(0x9e37_79b9_7f4a_7c15);
    loop {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let id = z as u32;
        if id & 0x00ff_ffff != 0 && id as u8 != CONTROL_COMM_ID {
            return id;
        }
    }
}

/// The group id of generation `generation` of job `job`'s communicator: generation 0 is
/// `group_id_for_job`; each later one (set up again after the switches lost the group) is
/// a fresh id, the same on every leader, so nothing left of an older generation on some
/// switch can mix into it.
#[must_use]
pub fn group_id(job: u64, generation: u32) -> u32 {
    if generation == 0 {
        return group_id_for_job(job);
    }
    group_id_for_job(job ^ u64::from(generation).wrapping_mul(0xd6e8_feb8_6659_fd93))
}

/// The set-up key of generation `generation` of job `job`'s group: every leader's query and
/// the MRR's notify carry it (`job_id`), and a TOR makes a member only of a host whose query
/// carried the notify's key. Attack: a host outside the job that learnt or guessed a wire id
/// queries under it before the job's notify reaches the TOR, becomes a member and adds its
/// data to the job's rounds. The wire id is in every data packet; the key is derived apart
/// from it, from the job id, which only the job's ranks know (the interposer draws it at
/// random and broadcasts it over MPI), and travels only in control packets between a
/// member and its switches. Never 0.
#[must_use]
pub fn setup_key(job: u64, generation: u32) -> u64 {
    let mut z =
        job ^ 0x6a09_e667_f3bc_c908 ^ u64::from(generation).wrapping_mul(0xbb67_ae85_84ca_a73b);
    for _ in 0..2 {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
    }
    z.max(1)
}

/// A random `true_comm_id` whose wire id (low 24 bits) is neither 0 nor ends in 0xff.
#[must_use]
pub fn random_group_id() -> u32 {
    loop {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(Instant::now().elapsed().as_nanos());
        h.write_u32(std::process::id());
        let id = h.finish() as u32;
        if id & 0x00ff_ffff != 0 && id as u8 != CONTROL_COMM_ID {
            return id;
        }
    }
}
