//! The control-plane handshake of seed 000 §3.3 as the leaders (SRRs) run it:
//! every NMRR sends a query to the MRR; the switches fill in what they support, their
//! addresses and (SPINEs) their free capacity; the MRR picks the least-loaded SPINE,
//! intersects capabilities, and answers every NMRR with a notify that the switches install
//! the group from; after the last round the MRR kills the group.
//!
//! A `fail_cause` other than 0 in the notify means: do not use the network for this group
//! (host allreduce instead).

use std::{
    collections::{HashMap, HashSet},
    hash::{BuildHasher as _, Hasher as _},
    io,
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    time::{Duration, Instant},
};

use innet_common::{
    codec::{Addressing, encode_control, parse_unverified},
    proto::{
        COMM_TYPE_ALLREDUCE, CONTROL_COMM_ID, Dtype, MASTER_NODE_MODE, Op, PacketKind,
        QNH_RESPONSE, ROCEV2_UDP_PORT,
    },
    validate::Verdict,
    wire::{ControlPayload, ETH_LEN, IPV4_LEN, UDP_LEN},
};

/// `fail_cause` the MRR writes when the switches cannot reduce the group's op or type.
pub const FAIL_UNSUPPORTED: u8 = 3;
/// `fail_cause` when the reduction payload exceeds what the switches accept per packet.
pub const FAIL_TOO_LARGE: u8 = 4;

#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error(
        "no {what} within {timeout:?}: is `innet daemon` running on the switches, and are all leaders up?"
    )]
    Timeout {
        what: &'static str,
        timeout: Duration,
    },
    #[error("socket: {0}")]
    Io(#[from] io::Error),
}

/// What a group was set up with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupParams {
    pub true_comm_id: u32,
    /// The 24-bit id data packets carry.
    pub wire_id: u32,
    /// The SPINE serving the group (`0.0.0.0` when one TOR holds it all).
    pub spine: Ipv4Addr,
    /// Capabilities along the path, intersected.
    pub ops: u16,
    pub dtypes: u16,
    pub max_data_size: u16,
    /// 0: the network serves the group; otherwise why not (switch or MRR cause).
    pub fail_cause: u8,
}

impl GroupParams {
    /// Bytes of the node-local encoding.
    pub const BYTES: usize = 19;

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
        })
    }

    /// Whether allreduces of this group run through the network.
    #[must_use]
    pub fn in_network(&self) -> bool {
        self.fail_cause == 0
    }
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

fn payload(kind: PacketKind, rank: u32, c: &ControlPayload) -> Vec<u8> {
    encode_control(&Addressing::default(), kind, rank, c)[ETH_LEN + IPV4_LEN + UDP_LEN..].to_vec()
}

/// Parses a received UDP payload (BTH …) as a control packet of `kind` for `comm`.
fn control_of(buf: &[u8], kind: PacketKind, comm: u32) -> Option<ControlPayload> {
    // Rebuild a frame around the payload so the shared parser checks every field.
    let mut frame = vec![0u8; ETH_LEN + IPV4_LEN + UDP_LEN];
    frame[12..14].copy_from_slice(&[0x08, 0x00]);
    frame[ETH_LEN] = 0x45;
    let total = (IPV4_LEN + UDP_LEN + buf.len()) as u16;
    frame[ETH_LEN + 2..ETH_LEN + 4].copy_from_slice(&total.to_be_bytes());
    frame[ETH_LEN + 9] = 17;
    let udp = ETH_LEN + IPV4_LEN;
    frame[udp + 2..udp + 4].copy_from_slice(&ROCEV2_UDP_PORT.to_be_bytes());
    frame[udp + 4..udp + 6].copy_from_slice(&((UDP_LEN + buf.len()) as u16).to_be_bytes());
    frame.extend_from_slice(buf);
    let p = parse_unverified(&frame).ok()?;
    let c = p.control()?;
    (p.verdict == Verdict::Control(kind) && c.true_comm_id() == comm).then_some(c)
}

/// Receives until a control packet of `kind` for `comm` arrives or `deadline` passes.
fn recv_until(
    sock: &UdpSocket,
    kind: PacketKind,
    comm: u32,
    deadline: Instant,
) -> io::Result<Option<(ControlPayload, SocketAddr)>> {
    let mut buf = [0u8; 512];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        sock.set_read_timeout(Some(left))?;
        match sock.recv_from(&mut buf) {
            Ok((n, from)) => {
                if let Some(c) = control_of(&buf[..n], kind, comm) {
                    return Ok(Some((c, from)));
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(e),
        }
    }
}

/// What the group will reduce, for the MRR's capability check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Want {
    pub op: Op,
    pub dtype: Dtype,
    /// Payload bytes per packet the hosts will send.
    pub packet_bytes: u16,
}

/// Restores a socket's read timeout when the handshake is done with it.
struct RestoreTimeout<'a>(&'a UdpSocket, Option<Duration>);

impl<'a> RestoreTimeout<'a> {
    fn new(sock: &'a UdpSocket) -> io::Result<Self> {
        Ok(Self(sock, sock.read_timeout()?))
    }
}

impl Drop for RestoreTimeout<'_> {
    fn drop(&mut self) {
        let _ = self.0.set_read_timeout(self.1);
    }
}

/// A leader's end of the handshake, on its INC socket (UDP port 4791).
pub struct Leader<'a> {
    pub sock: &'a UdpSocket,
    pub rank: u32,
    pub timeout: Duration,
}

impl Leader<'_> {
    /// NMRR: query the MRR, then wait for its notify.
    ///
    /// # Errors
    /// No notify within the timeout, or a socket error.
    pub fn join(
        &self,
        mrr: Ipv4Addr,
        comm: u32,
        nodes: u16,
    ) -> Result<GroupParams, HandshakeError> {
        let _restore = RestoreTimeout::new(self.sock)?;
        let mut q = ControlPayload {
            master_num: MASTER_NODE_MODE,
            sup_comm_type: COMM_TYPE_ALLREDUCE,
            ..ControlPayload::default()
        };
        q.set_true_comm_id(comm);
        q.set_global_group_size(nodes);
        q.set_world_rank(self.rank);
        q.set_sup_allreduce_op(0xffff);
        q.set_sup_data_type(0xffff);
        q.set_sup_max_data_size(u16::MAX);
        self.sock.send_to(
            &payload(PacketKind::Query, self.rank, &q),
            (mrr, ROCEV2_UDP_PORT),
        )?;
        let deadline = Instant::now() + self.timeout;
        let (n, _) = recv_until(self.sock, PacketKind::Notify, comm, deadline)?.ok_or(
            HandshakeError::Timeout {
                what: "notify from the MRR",
                timeout: self.timeout,
            },
        )?;
        Ok(params(comm, &n))
    }

    /// MRR: collect every NMRR's query (one copy per SPINE for NMRRs under other TORs),
    /// pick the SPINE with the most free capacity, check the capabilities against `want`,
    /// and notify every NMRR.
    ///
    /// # Errors
    /// A missing query within the timeout, or a socket error.
    pub fn create(
        &self,
        nmrrs: &[Ipv4Addr],
        comm: u32,
        want: Want,
    ) -> Result<GroupParams, HandshakeError> {
        let _restore = RestoreTimeout::new(self.sock)?;
        let deadline = Instant::now() + self.timeout;
        let mut heard: HashSet<Ipv4Addr> = HashSet::new();
        let mut spines: HashMap<u32, u32> = HashMap::new();
        let (mut ops, mut dtypes, mut max) = (u16::MAX, u16::MAX, u16::MAX);
        // Other SPINEs' copies follow the first one closely; wait a little for them.
        let mut grace: Option<Instant> = None;
        loop {
            let until = grace.map_or(deadline, |g| g.min(deadline));
            let Some((q, from)) = recv_until(self.sock, PacketKind::Query, comm, until)? else {
                if heard.len() == nmrrs.len() {
                    break;
                }
                return Err(HandshakeError::Timeout {
                    what: "query from every NMRR",
                    timeout: self.timeout,
                });
            };
            if let SocketAddr::V4(a) = from {
                heard.insert(*a.ip());
            }
            ops &= q.sup_allreduce_op();
            dtypes &= q.sup_data_type();
            max = max.min(q.sup_max_data_size());
            if q.spine_ip() != 0 {
                let free = spines.entry(q.spine_ip()).or_insert(q.ava_grp_num());
                *free = (*free).min(q.ava_grp_num());
            }
            if heard.len() == nmrrs.len() && grace.is_none() {
                grace = Some(Instant::now() + Duration::from_millis(50));
            }
        }
        let spine = spines
            .iter()
            .max_by_key(|(ip, free)| (**free, std::cmp::Reverse(**ip)))
            .map_or(0, |(ip, _)| *ip);
        let mut n = ControlPayload {
            master_num: MASTER_NODE_MODE,
            sup_comm_type: COMM_TYPE_ALLREDUCE,
            query_notify_hop: QNH_RESPONSE,
            ..ControlPayload::default()
        };
        n.set_true_comm_id(comm);
        n.set_global_group_size(nmrrs.len() as u16 + 1);
        n.set_spine_ip(spine);
        n.set_sup_allreduce_op(ops);
        n.set_sup_data_type(dtypes);
        n.set_sup_max_data_size(max);
        if ops & (1 << want.op as u8) == 0 || dtypes & (1 << want.dtype as u8) == 0 {
            n.fail_cause = FAIL_UNSUPPORTED;
        } else if want.packet_bytes > max {
            n.fail_cause = FAIL_TOO_LARGE;
        }
        for &nmrr in nmrrs {
            self.sock.send_to(
                &payload(PacketKind::Notify, self.rank, &n),
                (nmrr, ROCEV2_UDP_PORT),
            )?;
        }
        Ok(params(comm, &n))
    }

    /// MRR: free the group on every switch.
    ///
    /// # Errors
    /// A socket error.
    pub fn kill(&self, nmrrs: &[Ipv4Addr], comm: u32) -> Result<(), HandshakeError> {
        let mut k = ControlPayload::default();
        k.set_true_comm_id(comm);
        for &nmrr in nmrrs {
            self.sock.send_to(
                &payload(PacketKind::Kill, self.rank, &k),
                (nmrr, ROCEV2_UDP_PORT),
            )?;
        }
        Ok(())
    }
}

fn params(comm: u32, c: &ControlPayload) -> GroupParams {
    GroupParams {
        true_comm_id: comm,
        wire_id: comm & 0x00ff_ffff,
        spine: Ipv4Addr::from(c.spine_ip()),
        ops: c.sup_allreduce_op(),
        dtypes: c.sup_data_type(),
        max_data_size: c.sup_max_data_size(),
        fail_cause: c.fail_cause,
    }
}
