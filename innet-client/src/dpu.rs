//! `inc-dpu`: a leader's member of the reduction tree lives on its node's DPU. The leader
//! asks for it over its own network port (see [`innet_net::nic::dpu`]) and, once the handshake
//! agrees, sends its contributions as ordinary RoCEv2 frames that its DPU takes as the
//! node's own part; results come back the same way. Dropping the handle releases the member.

use std::{
    io,
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    sync::Arc,
    time::{Duration, Instant},
};

use innet_common::proto::{PacketKind, ROCEV2_UDP_PORT};
use tracing::{debug, info};

use super::{frames, handshake::recv_until};
use innet_common::{capabilities::Capabilities, fail::FAIL_NO_DPU};

use innet_net::nic::dpu::{self, DpuRequest};

/// How long a leader waits for its DPU's first answer before it asks again (then twice as
/// long each time).
const FIRST_WAIT: Duration = Duration::from_millis(50);
/// How long a leader asks its DPU at most: a node without a DPU daemon costs this much at
/// set-up, once, before the job runs on the hosts.
pub const DPU_PATIENCE: Duration = Duration::from_millis(800);

/// A leader's member on its DPU; released when dropped.
pub struct DpuMember {
    sock: Arc<UdpSocket>,
    ip: Ipv4Addr,
    /// Where the leader's requests are addressed (another member: without a DPU daemon they
    /// go unanswered).
    via: Ipv4Addr,
    rank: u32,
    comm: u32,
    /// The DPU's own address, which its results to the host come from.
    dpu: Ipv4Addr,
}

impl DpuMember {
    /// The DPU's address: the only one the member's results may come from.
    #[must_use]
    pub fn address(&self) -> Ipv4Addr {
        self.dpu
    }
}

/// Asks this node's DPU to install `req`, sending from `ip` on `sock` to `via`; the DPU's
/// offer and the member (released when dropped), or the `fail_cause` the handshake must
/// carry. Waits at most `timeout` (and [`DPU_PATIENCE`]).
///
/// # Errors
/// A socket error.
pub fn join(
    sock: &Arc<UdpSocket>,
    (ip, rank): (Ipv4Addr, u32),
    via: Ipv4Addr,
    req: &DpuRequest,
    timeout: Duration,
) -> io::Result<Result<(Capabilities, DpuMember), u8>> {
    let deadline = Instant::now() + timeout.min(DPU_PATIENCE);
    let request = frames::control(ip, via, PacketKind::Query, rank, &req.to_payload(rank));
    let mut wait = FIRST_WAIT;
    loop {
        sock.send_to(&request, (via, ROCEV2_UDP_PORT))?;
        let until = (Instant::now() + wait).min(deadline);
        while let Some((c, from)) = recv_until(&**sock, (PacketKind::Notify, req.comm), until, None)? {
            match dpu::read_answer(&c, req.comm) {
                Some(Ok(caps)) => {
                    info!(dpu = %from.ip(), member = req.me, "the DPU installed this node's member");
                    let SocketAddr::V4(dpu) = from else {
                        continue;
                    };
                    let member = DpuMember {
                        dpu: *dpu.ip(),
                        sock: sock.clone(),
                        ip,
                        via,
                        rank,
                        comm: req.comm,
                    };
                    return Ok(Ok((caps, member)));
                }
                // Nothing was installed: nothing to release.
                Some(Err(fail_cause)) => return Ok(Err(fail_cause)),
                None => debug!(from = %from, "a notify that is no DPU answer: ignored"),
            }
        }
        if Instant::now() >= deadline {
            return Ok(Err(FAIL_NO_DPU));
        }
        wait = wait.saturating_mul(2);
    }
}

impl Drop for DpuMember {
    fn drop(&mut self) {
        let release = frames::control(
            self.ip,
            self.via,
            PacketKind::Kill,
            self.rank,
            &dpu::release(self.comm),
        );
        let _ = self.sock.send_to(&release, (self.via, ROCEV2_UDP_PORT));
    }
}
