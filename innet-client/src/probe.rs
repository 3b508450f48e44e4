//! Which TOR a node hangs off, asked of the switches themselves: a probe (a query with
//! `sup_comm_type` = [`COMM_TYPE_PROBE`]) sent from the node's INC address towards any
//! other node is consumed by the first innet switch on the way, its TOR, which answers
//! with a notify carrying its own address in `tor1_ip` (docs/wire-format.md). Without an
//! innet TOR nobody answers and the wait runs out.

use std::{
    io,
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use innet_common::{
    demux::comm_key,
    proto::{COMM_TYPE_PROBE, MASTER_NODE_MODE, PacketKind, ROCEV2_UDP_PORT},
    wire::ControlPayload,
};

use crate::{
    frames,
    handshake::{random_group_id, recv_until},
    inc_socket,
};

/// How long the first try waits for the answer; each repeat waits twice as long.
pub const FIRST_WAIT: Duration = Duration::from_millis(100);
/// Tries before the TOR counts as absent (100 + 200 + 400 + 800 ms): a TOR's daemon on a
/// loaded host may answer late, and a probe unanswered at `MPI_Init` leaves the whole job
/// to MPI (what a node without an innet TOR pays once, at start).
pub const TRIES: u32 = 4;

/// The address of the innet TOR that the node at `ip` hangs off, learned by probing the
/// path towards `peer` (another node's INC address); `None` when no innet switch answered.
///
/// # Errors
/// `ip` is not an address of this host, or the INC socket cannot be bound or used.
pub fn tor_of(ip: Ipv4Addr, peer: Ipv4Addr) -> io::Result<Option<Ipv4Addr>> {
    let id = random_group_id();
    let socket = inc_socket::bind(ip, &[comm_key(id)])?;
    let mut q = ControlPayload {
        master_num: MASTER_NODE_MODE,
        sup_comm_type: COMM_TYPE_PROBE,
        ..ControlPayload::default()
    };
    q.set_true_comm_id(id);
    let packet = frames::control(ip, peer, PacketKind::Query, 0, &q);
    let mut wait = FIRST_WAIT;
    for _ in 0..TRIES {
        socket.sock.send_to(&packet, (peer, ROCEV2_UDP_PORT))?;
        let deadline = Instant::now() + wait;
        if let Some((answer, _)) =
            recv_until(&socket.sock, (PacketKind::Notify, id), deadline, None)?
            && answer.sup_comm_type == COMM_TYPE_PROBE
            && answer.tor1_ip() != 0
        {
            return Ok(Some(Ipv4Addr::from(answer.tor1_ip())));
        }
        wait *= 2;
    }
    Ok(None)
}
