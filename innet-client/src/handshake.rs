//! The control-plane handshake of the switch paper's §3.3 as the leaders (SRRs) run it, for fabrics
//! of any depth: the MRR climbs the fabric to learn its own ways up; every NMRR sends a
//! query to the MRR; the switches fill in what they support and append themselves with
//! their free capacity; the MRR chooses the tree ([`crate::tree`]), intersects
//! capabilities, and answers every NMRR with a notify carrying its path through the tree,
//! which the switches on it install the group from; after the last round the MRR kills the
//! group along the same paths.
//!
//! A `fail_cause` other than 0 in the notify means: do not use the network for this group
//! (host allreduce instead).

use std::{
    collections::{HashMap, HashSet},
    io,
    net::{Ipv4Addr, SocketAddr},
    time::{Duration, Instant},
};

use innet_common::{
    capabilities::Capabilities,
    fail::{FAIL_CAPACITY, FAIL_NO_ROUTE, FAIL_NO_SWITCH, FAIL_TOO_LARGE, FAIL_UNSUPPORTED},
    proto::{
        COMM_TYPE_ALLREDUCE, COMM_TYPE_CLIMB, Dtype, MASTER_NIC_MODE, MASTER_NODE_MODE, Op,
        PacketKind, QNH_RESPONSE,
    },
    validate::Verdict,
    wire::{ControlPayload, PathHop},
};
use tracing::warn;

use super::{
    frames,
    tree::{self, NoTree, Way, Weigh},
};

mod params;
pub use params::{GroupParams, group_id, random_group_id, setup_key};
pub use crate::wire::Wire;

/// Each NMRR's notify (or kill), with its own path through the tree.
pub type Notices = Vec<(Ipv4Addr, ControlPayload)>;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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

/// Parses a received UDP payload as a control packet of `kind` for `comm`.
fn control_of(buf: &[u8], kind: PacketKind, comm: u32) -> Option<ControlPayload> {
    let f = frames::parse(buf)?;
    let c = f.control()?;
    (f.verdict == Verdict::Control(kind) && c.true_comm_id() == comm).then_some(c)
}

/// Where a leader's handshake hands the datagrams it is not waiting for.
pub type Aside<'a> = &'a dyn Fn(&[u8], SocketAddr);

/// Receives on `wire` until a control packet of `kind` for `comm` arrives or `deadline`
/// passes; anything else goes to `aside`, if any (also the datagrams behind the control
/// packet in a message UDP GRO coalesced).
pub(crate) fn recv_until(
    wire: &(impl Wire + ?Sized),
    (kind, comm): (PacketKind, u32),
    deadline: Instant,
    aside: Option<Aside<'_>>,
) -> io::Result<Option<(ControlPayload, SocketAddr)>> {
    let mut found = None;
    wire.receive_until(deadline, &mut |datagram, from| {
        if found.is_none()
            && let Some(c) = control_of(datagram, kind, comm)
        {
            found = Some((c, from));
            return true;
        }
        if let Some(aside) = aside {
            aside(datagram, from);
        }
        false
    })?;
    Ok(found)
}

/// What the group will reduce, for the MRR's capability check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Want {
    pub op: Op,
    pub dtype: Dtype,
    /// Payload bytes per packet the hosts will send.
    pub packet_bytes: u16,
}

/// What an MRR heard in the queries of its NMRRs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Collected {
    /// Capabilities along every path, intersected.
    pub ops: u16,
    pub dtypes: u16,
    pub max_data_size: u16,
    pub window: u16,
    /// Each NMRR's ways up, one per copy of its query.
    pub ways: HashMap<Ipv4Addr, Vec<Way>>,
    /// The MRR's own ways up, one per copy of its climb that came back.
    pub own: Vec<Way>,
    /// The worst `fail_cause` a query carried, or [`FAIL_NO_SWITCH`] when a query crossed no
    /// innet switch.
    pub fail_cause: u8,
}

impl Default for Collected {
    fn default() -> Self {
        Self {
            ops: u16::MAX,
            dtypes: u16::MAX,
            max_data_size: u16::MAX,
            window: u16::MAX,
            ways: HashMap::new(),
            own: vec![],
            fail_cause: 0,
        }
    }
}

/// What a member offers for itself in a NIC tree's handshake (no switch fills it in): its
/// NIC's capabilities, and why it cannot take part (`fail_cause`, 0 when it can).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offer {
    pub caps: Capabilities,
    pub fail_cause: u8,
}

/// A leader's end of the handshake, on its INC socket (UDP port 4791) or any [`Wire`].
pub struct Leader<'a> {
    pub sock: &'a dyn Wire,
    /// The socket's address (the ICRC covers it).
    pub ip: Ipv4Addr,
    pub rank: u32,
    /// How long the whole handshake may take.
    pub timeout: Duration,
    /// When an unanswered query is first sent again (then twice as long each time, up to
    /// a second).
    pub retry: Duration,
    /// NIC trees: what this member's NIC offers. Its control packets are then marked
    /// [`MASTER_NIC_MODE`] (switches pass them untouched) and no switch is expected.
    pub offer: Option<Offer>,
    /// The largest payload this leader's own link carries (from its MTU): where the
    /// negotiation of `sup_max_data_size` starts.
    pub payload: u16,
    /// What to do with the other datagrams meanwhile (a handshake that sets a running
    /// group up again must still answer peers finishing an earlier collective); `None`:
    /// they are dropped.
    pub aside: Option<Aside<'a>>,
    /// The group's [`setup_key`], carried by this leader's queries and notifies.
    pub key: u64,
}

impl Leader<'_> {
    fn send(&self, to: Ipv4Addr, kind: PacketKind, c: &ControlPayload) -> io::Result<()> {
        let p = frames::control(self.ip, to, kind, self.rank, c);
        self.sock.send(to, &p)
    }

    fn query(&self, comm: u32, nodes: u16) -> ControlPayload {
        let mut q = ControlPayload {
            master_num: self.master(),
            sup_comm_type: COMM_TYPE_ALLREDUCE,
            ..ControlPayload::default()
        };
        q.set_true_comm_id(comm);
        q.set_job_id(self.key);
        q.set_global_group_size(nodes);
        q.set_world_rank(self.rank);
        q.set_sup_allreduce_op(0xffff);
        q.set_sup_data_type(0xffff);
        q.set_sup_max_data_size(self.payload);
        // Hosts have no slots: the switches on the path lower it to theirs.
        q.set_sup_window(u16::MAX);
        if let Some(o) = self.offer {
            q.set_sup_allreduce_op(o.caps.ops);
            q.set_sup_data_type(o.caps.dtypes);
            q.set_sup_max_data_size(o.caps.max_data_size.min(self.payload));
            q.set_sup_window(o.caps.window);
            q.fail_cause = o.fail_cause;
        }
        q
    }

    fn master(&self) -> u8 {
        if self.offer.is_some() {
            MASTER_NIC_MODE
        } else {
            MASTER_NODE_MODE
        }
    }

    /// Sends `q` to `mrr` until its notify comes back (a query sent before the MRR listens
    /// is lost; the switches ignore repeats).
    fn ask(
        &self,
        mrr: Ipv4Addr,
        comm: u32,
        q: &ControlPayload,
    ) -> Result<ControlPayload, HandshakeError> {
        let deadline = Instant::now() + self.timeout;
        let mut wait = self.retry;
        loop {
            self.send(mrr, PacketKind::Query, q)?;
            // Back off: every repeat costs every switch on the path some work.
            let next = (Instant::now() + wait).min(deadline);
            wait = (wait * 2).min(Duration::from_secs(1));
            if let Some((n, _)) =
                recv_until(self.sock, (PacketKind::Notify, comm), next, self.aside)?
            {
                return Ok(n);
            }
            if Instant::now() >= deadline {
                return Err(HandshakeError::Timeout {
                    what: "notify from the MRR",
                    timeout: self.timeout,
                });
            }
        }
    }

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
        let n = self.ask(mrr, comm, &self.query(comm, nodes))?;
        Ok(params(comm, &n))
    }

    /// Socket mode, MRR `j > 0`: hand what its own NMRRs reported to the first MRR (as a
    /// query of its own), and return the first MRR's decision.
    ///
    /// # Errors
    /// No notify within the timeout, or a socket error.
    pub fn sync(
        &self,
        first_mrr: Ipv4Addr,
        comm: u32,
        leaders: u16,
        heard: &Collected,
    ) -> Result<ControlPayload, HandshakeError> {
        let mut q = self.query(comm, leaders);
        q.set_sup_allreduce_op(heard.ops);
        q.set_sup_data_type(heard.dtypes);
        q.set_sup_max_data_size(heard.max_data_size);
        q.set_sup_window(heard.window);
        q.fail_cause = heard.fail_cause;
        self.ask(first_mrr, comm, &q)
    }

    /// MRR: climb the fabric (its own ways up come back to it), then collect the query of
    /// every host in `from` (one copy per way up).
    ///
    /// # Errors
    /// A missing query within the timeout, or a socket error.
    pub fn collect(&self, from: &[Ipv4Addr], comm: u32) -> Result<Collected, HandshakeError> {
        let start = Instant::now();
        let deadline = start + self.timeout;
        let mut heard: HashSet<Ipv4Addr> = HashSet::new();
        let mut c = Collected::default();
        if let Some(o) = self.offer {
            // The MRR's own NIC counts like any member's.
            c.ops = o.caps.ops;
            c.dtypes = o.caps.dtypes;
            c.max_data_size = o.caps.max_data_size;
            c.window = o.caps.window;
            c.fail_cause = o.fail_cause;
        }
        if from.is_empty() {
            return Ok(c);
        }
        // A NIC tree needs no switch, so no climb.
        let mut climb = self.offer.is_none().then(|| Climb {
            to: from[0],
            next: start,
            wait: self.retry,
        });
        // Copies through other ways follow the first closely; wait a little for them.
        let mut grace: Option<Instant> = None;
        // How long a climb may still come back once every query is in.
        let mut climb_until: Option<Instant> = None;
        loop {
            let climbing = climb.as_mut().filter(|_| c.own.is_empty());
            if let Some(cl) = climbing
                && Instant::now() >= cl.next
            {
                self.send(cl.to, PacketKind::Query, &self.climb(comm))?;
                cl.next = Instant::now() + cl.wait;
                cl.wait = (cl.wait * 2).min(Duration::from_secs(1));
            }
            let all_in = heard.len() == from.len();
            if all_in {
                if c.own.is_empty() && climb.is_some() && !no_switch(&c, from) {
                    let until = *climb_until.get_or_insert(Instant::now() + CLIMB_WAIT);
                    if Instant::now() >= until.min(deadline) {
                        return Ok(c);
                    }
                } else if all_local(&c) || no_switch(&c, from) || every_way_in(&c) {
                    return Ok(c);
                } else if grace.is_none() {
                    grace = Some(Instant::now() + COPIES_GRACE);
                }
            }
            let mut until = grace.map_or(deadline, |g| g.min(deadline));
            if let Some(cl) = climb.as_ref().filter(|_| c.own.is_empty()) {
                until = until.min(cl.next);
            }
            if let Some(t) = climb_until {
                until = until.min(t);
            }
            let Some((q, from_addr)) =
                recv_until(self.sock, (PacketKind::Query, comm), until, self.aside)?
            else {
                if grace.is_some_and(|g| Instant::now() >= g) {
                    return Ok(c);
                }
                if Instant::now() >= deadline {
                    if all_in {
                        return Ok(c);
                    }
                    return Err(HandshakeError::Timeout {
                        what: "query from every NMRR",
                        timeout: self.timeout,
                    });
                }
                continue;
            };
            if q.sup_comm_type == COMM_TYPE_CLIMB {
                let way = q.path.hops().to_vec();
                if !way.is_empty() && !c.own.contains(&way) {
                    c.own.push(way);
                }
                continue;
            }
            let SocketAddr::V4(a) = from_addr else {
                continue;
            };
            if !from.contains(a.ip()) {
                continue;
            }
            heard.insert(*a.ip());
            c.ops &= q.sup_allreduce_op();
            c.dtypes &= q.sup_data_type();
            c.max_data_size = c.max_data_size.min(q.sup_max_data_size());
            c.window = c.window.min(q.sup_window());
            c.fail_cause = c.fail_cause.max(q.fail_cause);
            if q.tor1_ip() == 0 && self.offer.is_none() {
                // No innet switch stamped it: plain bridges or routers in between.
                c.fail_cause = c.fail_cause.max(FAIL_NO_SWITCH);
            }
            let way = q.path.hops().to_vec();
            let ways = c.ways.entry(*a.ip()).or_default();
            if !way.is_empty() && !ways.contains(&way) {
                ways.push(way);
            }
        }
    }

    /// The climb the MRR sends up the fabric (to any other leader: the top sends it back).
    fn climb(&self, comm: u32) -> ControlPayload {
        ControlPayload {
            sup_comm_type: COMM_TYPE_CLIMB,
            ..self.query(comm, 0)
        }
    }

    /// MRR: the notify for what was collected: the intersected capabilities, and a
    /// `fail_cause` when the network cannot serve `want`. [`Self::address`] adds each
    /// NMRR's path.
    #[must_use]
    pub fn decide(
        &self,
        heard: &Collected,
        comm: u32,
        leaders: u16,
        want: Option<Want>,
    ) -> ControlPayload {
        let mut n = ControlPayload {
            master_num: self.master(),
            sup_comm_type: COMM_TYPE_ALLREDUCE,
            query_notify_hop: QNH_RESPONSE,
            fail_cause: heard.fail_cause,
            ..ControlPayload::default()
        };
        n.set_true_comm_id(comm);
        n.set_global_group_size(leaders);
        n.set_sup_allreduce_op(heard.ops);
        n.set_sup_data_type(heard.dtypes);
        n.set_sup_max_data_size(heard.max_data_size);
        n.set_sup_window(heard.window);
        if n.fail_cause == 0
            && let Some(want) = want
        {
            if heard.ops & (1 << want.op as u8) == 0 || heard.dtypes & (1 << want.dtype as u8) == 0
            {
                n.fail_cause = FAIL_UNSUPPORTED;
            } else if want.packet_bytes > heard.max_data_size {
                n.fail_cause = FAIL_TOO_LARGE;
            }
        }
        n
    }

    /// MRR: notify `base` for each of `to`, with its path through the tree chosen from
    /// what was `heard` (the root goes into `spine_ip`); a group no tree serves gets
    /// [`FAIL_NO_ROUTE`] (or [`FAIL_CAPACITY`]) instead.
    #[must_use]
    pub fn address(
        &self,
        base: &ControlPayload,
        heard: &Collected,
        to: &[Ipv4Addr],
        weigh: Weigh,
    ) -> Notices {
        let mut base = *base;
        if base.fail_cause == 0 && self.offer.is_none() {
            let ways: Vec<(Ipv4Addr, Vec<Way>)> = to
                .iter()
                .map(|ip| (*ip, heard.ways.get(ip).cloned().unwrap_or_default()))
                .collect();
            match tree::choose(self.ip, &heard.own, &ways, weigh) {
                Ok(t) => {
                    base.set_spine_ip(if t.level > 1 { u32::from(t.root) } else { 0 });
                    return t
                        .paths
                        .into_iter()
                        .map(|(ip, path)| (ip, ControlPayload { path, ..base }))
                        .collect();
                }
                Err(e) => {
                    warn!(error = %e, "no tree of switches serves the group");
                    base.fail_cause = match e {
                        NoTree::TooManyChildren { .. } => FAIL_CAPACITY,
                        NoTree::NoWay(_) | NoTree::NoCommonSwitch => FAIL_NO_ROUTE,
                    };
                }
            }
        }
        to.iter().map(|ip| (*ip, base)).collect()
    }

    /// MRR: sends each NMRR its notify.
    ///
    /// # Errors
    /// A socket error.
    pub fn notify(&self, notices: &Notices) -> Result<(), HandshakeError> {
        // Those that go up first: a switch must hold the group before any data reaches it,
        // and the MRR's own TOR answers the NMRRs under it at once.
        let (up, here): (Vec<_>, Vec<_>) = notices.iter().partition(|(_, n)| n.path.n_hops > 1);
        for &(host, n) in up.into_iter().chain(here) {
            let mut n = n;
            n.set_job_id(self.key);
            self.send(host, PacketKind::Notify, &n)?;
        }
        Ok(())
    }

    /// MRR (Node mode): collect every NMRR's query, decide, and notify every NMRR.
    ///
    /// # Errors
    /// A missing query within the timeout, or a socket error.
    #[cfg_attr(
        not(feature = "test-hooks"),
        expect(
            dead_code,
            reason = "the tests' MRR; the library's runs the steps itself"
        )
    )]
    pub fn create(
        &self,
        nmrrs: &[Ipv4Addr],
        comm: u32,
        want: Want,
    ) -> Result<(GroupParams, Notices), HandshakeError> {
        let heard = self.collect(nmrrs, comm)?;
        let base = self.decide(&heard, comm, nmrrs.len() as u16 + 1, Some(want));
        let notices = self.address(&base, &heard, nmrrs, Weigh::ByLoad);
        self.notify(&notices)?;
        let n = notices.first().map_or(&base, |(_, n)| n);
        Ok((params(comm, n), notices))
    }

    /// MRR: frees the group on every switch, along the paths of its notifies.
    ///
    /// # Errors
    /// A socket error.
    pub fn kill(&self, notices: &Notices) -> Result<(), HandshakeError> {
        for (nmrr, n) in notices {
            let mut k = ControlPayload {
                master_num: self.master(),
                path: n.path,
                ..ControlPayload::default()
            };
            k.set_true_comm_id(n.true_comm_id());
            self.send(*nmrr, PacketKind::Kill, &k)?;
        }
        Ok(())
    }
}

/// How long the MRR waits for other copies of the queries once it has one of each.
const COPIES_GRACE: Duration = Duration::from_millis(50);
/// How long the MRR still waits for its climb once every query is in.
const CLIMB_WAIT: Duration = Duration::from_secs(1);

/// The MRR's climb, sent again (backing off) until one comes back.
struct Climb {
    to: Ipv4Addr,
    next: Instant,
    wait: Duration,
}

/// Whether every query and the climb stayed on one TOR: no copies through other ways come.
fn all_local(c: &Collected) -> bool {
    let Some(tor) = mrr_tor(c) else {
        return false;
    };
    c.ways.values().all(|ways| stayed_on(ways, tor))
}

/// Whether every copy has come: of the MRR's climb and of each query of an NMRR under
/// another TOR, as many as the switches on their first way copied them to (each hop names
/// its uplinks). Otherwise the MRR waits [`COPIES_GRACE`] for the rest.
fn every_way_in(c: &Collected) -> bool {
    let Some(tor) = mrr_tor(c) else {
        return false;
    };
    let complete = |ways: &[Way]| {
        ways.first().is_some_and(|w| {
            let expected: usize = w[..w.len() - 1]
                .iter()
                .map(|h| usize::from(h.uplinks))
                .product();
            ways.len() >= expected
        })
    };
    complete(&c.own)
        && c.ways
            .values()
            .all(|ways| stayed_on(ways, tor) || complete(ways))
}

/// The MRR's TOR, as its climb found it.
fn mrr_tor(c: &Collected) -> Option<u32> {
    c.own.first().and_then(|w| w.first()).map(PathHop::ip)
}

/// Whether `ways` never left TOR `tor` (a query that went straight to an MRR beside it).
fn stayed_on(ways: &[Way], tor: u32) -> bool {
    ways.iter().all(|w| w.len() == 1 && w[0].ip() == tor)
}

/// Whether the queries crossed no innet switch (the group will not use the network).
fn no_switch(c: &Collected, from: &[Ipv4Addr]) -> bool {
    from.iter()
        .all(|ip| c.ways.get(ip).is_none_or(Vec::is_empty))
}

/// The group parameters a notify announces.
#[must_use]
pub fn params(comm: u32, c: &ControlPayload) -> GroupParams {
    GroupParams {
        true_comm_id: comm,
        wire_id: comm & 0x00ff_ffff,
        spine: Ipv4Addr::from(c.spine_ip()),
        ops: c.sup_allreduce_op(),
        dtypes: c.sup_data_type(),
        max_data_size: c.sup_max_data_size(),
        window: c.sup_window(),
        fail_cause: c.fail_cause,
    }
}

#[cfg(test)]
mod tests;
