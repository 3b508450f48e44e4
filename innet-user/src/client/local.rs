//! The node-local path between a node's ranks: abstract Unix datagram sockets named after
//! the job and rank. Abstract sockets live in the network namespace, which is exactly a
//! node here (and on a real host, the host). The SRR uses it to hand the group parameters
//! of the handshake to its SRs (seed 000 step 0: "SRRs broadcast the parameters to their
//! SRs"); the allreduce of issue 5 reuses it for intra-node reduce and broadcast.

use std::{
    io,
    os::{
        linux::net::SocketAddrExt as _,
        unix::net::{SocketAddr, UnixDatagram},
    },
    time::Duration,
};

use super::handshake::GroupParams;

/// One rank's endpoint on its node.
pub struct LocalChannel {
    sock: UnixDatagram,
    job: u64,
}

fn name(job: u64, rank: u32) -> String {
    format!("innet-{job:016x}-{rank}")
}

impl LocalChannel {
    /// Binds rank `rank` of job `job` on this node.
    ///
    /// # Errors
    /// The name is taken (the same rank bound twice) or a socket error.
    pub fn bind(job: u64, rank: u32) -> io::Result<Self> {
        let addr = SocketAddr::from_abstract_name(name(job, rank).as_bytes())?;
        Ok(Self {
            sock: UnixDatagram::bind_addr(&addr)?,
            job,
        })
    }

    /// Sends `bytes` to rank `to` of the same job on this node.
    ///
    /// # Errors
    /// The rank is not bound (yet), or a socket error.
    pub fn send(&self, to: u32, bytes: &[u8]) -> io::Result<()> {
        let addr = SocketAddr::from_abstract_name(name(self.job, to).as_bytes())?;
        self.sock.send_to_addr(bytes, &addr).map(|_| ())
    }

    /// Receives one message, waiting at most `timeout`.
    ///
    /// # Errors
    /// Timeout (`WouldBlock`/`TimedOut`) or a socket error.
    pub fn recv(&self, buf: &mut [u8], timeout: Duration) -> io::Result<usize> {
        self.sock.set_read_timeout(Some(timeout))?;
        self.sock.recv(buf)
    }

    /// SRR: hands the group parameters to each of `srs`.
    ///
    /// # Errors
    /// As [`Self::send`].
    pub fn share_params(&self, srs: &[u32], params: &GroupParams) -> io::Result<()> {
        let bytes = params.to_bytes();
        srs.iter().try_for_each(|&sr| self.send(sr, &bytes))
    }

    /// SR: waits for its SRR's group parameters.
    ///
    /// # Errors
    /// Timeout, a socket error, or a message that is not group parameters.
    pub fn recv_params(&self, timeout: Duration) -> io::Result<GroupParams> {
        let mut buf = [0u8; GroupParams::BYTES];
        let n = self.recv(&mut buf, timeout)?;
        GroupParams::from_bytes(&buf[..n])
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not group parameters"))
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[test]
    fn the_srr_hands_the_parameters_to_its_srs() {
        let job = u64::from(std::process::id()) << 16 | 0x5a;
        let params = GroupParams {
            true_comm_id: 0x1234_5601,
            wire_id: 0x34_5601,
            spine: Ipv4Addr::new(10, 77, 250, 1),
            ops: 0x0fff,
            dtypes: 0x00ff,
            max_data_size: 1408,
            fail_cause: 0,
        };
        let srs: Vec<LocalChannel> = (1..4)
            .map(|r| LocalChannel::bind(job, r).expect("bind"))
            .collect();
        let srr = LocalChannel::bind(job, 0).expect("bind");
        srr.share_params(&[1, 2, 3], &params).expect("share");
        for sr in &srs {
            assert_eq!(
                sr.recv_params(Duration::from_secs(1)).expect("params"),
                params
            );
        }
        assert!(LocalChannel::bind(job, 0).is_err(), "a rank binds once");
        assert!(
            srs[0].recv_params(Duration::from_millis(20)).is_err(),
            "nothing more queued"
        );
    }
}
