//! Links that bind, as a real cluster's do: every link of a fabric shaped to one rate in
//! both directions ([`LinkRate`], `Options::link_rate`), and the measurements that prove it
//! ([`tcp_rate`], [`LinkMeter`], and [`crate::link_checks`] across a whole fabric).
//!
//! Where the shaping sits: the switches' XDP programs redirect frames into their ports'
//! veths, which skips the sender's qdisc, and a switch port's XDP runs before its tc
//! ingress, so neither end of a link can shape every frame. A shaped fabric therefore runs
//! every link through a wire ([`crate::topology::Wires`]): a namespace between the two
//! ends whose tc program hands each frame to the other side's veth (`bpf_redirect`, which
//! goes through that veth's qdisc). A token bucket filter on both of the wire's veths
//! shapes each direction, whatever sent the frame: innet's switches, the hosts' INC
//! sockets, MPI's TCP. A host's own port also sends at the rate ([`pace_sender`]), as its
//! NIC would. [`LinkMeter`] reads what each link carried and dropped over a run.

use std::{
    collections::HashMap,
    fmt,
    str::FromStr,
    sync::atomic::{AtomicU16, Ordering},
    time::{Duration, Instant},
};

use crate::{NetNs, run};

/// A link's rate, in bits per second.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkRate(pub u64);

impl LinkRate {
    /// Bytes per second.
    #[must_use]
    pub fn bytes_per_second(self) -> f64 {
        self.0 as f64 / 8.0
    }

    /// How long `bytes` take on the link.
    #[must_use]
    pub fn time_for(self, bytes: u64) -> Duration {
        Duration::from_secs_f64(bytes as f64 / self.bytes_per_second())
    }
}

/// Units `tc` and iperf3 use: `kbit`, `mbit`, `gbit` (powers of 1,000), or bare bits per
/// second.
impl FromStr for LinkRate {
    type Err = String;

    #[expect(
        clippy::cast_sign_loss,
        reason = "the rate is checked to lie between 1kbit and 100gbit first"
    )]
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        let (digits, scale) = [
            ("gbit", 1_000_000_000),
            ("mbit", 1_000_000),
            ("kbit", 1_000),
        ]
        .into_iter()
        .find_map(|(unit, scale)| t.strip_suffix(unit).map(|d| (d, scale)))
        .unwrap_or((t.as_str(), 1));
        let n: f64 = digits.trim().parse().map_err(|_| {
            format!("link rate {s:?}: a number with kbit, mbit or gbit, e.g. 200mbit")
        })?;
        let bits = n * scale as f64;
        if !(1_000.0..=100e9).contains(&bits) {
            return Err(format!(
                "link rate {s:?}: between 1kbit and 100gbit, e.g. 200mbit"
            ));
        }
        Ok(Self(bits as u64))
    }
}

impl fmt::Display for LinkRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            b if b % 1_000_000_000 == 0 => write!(f, "{}gbit", b / 1_000_000_000),
            b if b % 1_000_000 == 0 => write!(f, "{}mbit", b / 1_000_000),
            b if b % 1_000 == 0 => write!(f, "{}kbit", b / 1_000),
            b => write!(f, "{b}bit"),
        }
    }
}

/// How long a shaped link's queue holds at most: a switch port's buffer. Frames past it
/// are dropped (as a full switch queue drops), so a sender that overruns the link loses
/// packets rather than waiting without bound.
pub const QUEUE: Duration = Duration::from_millis(10);

/// The token bucket's depth: 1 ms at the rate, and never under two frames of `mtu`, so a
/// frame always fits and bursts stay short.
fn burst_bytes(rate: LinkRate, mtu: usize) -> u64 {
    let frame = mtu as u64 + 14;
    (rate.0 / 8 / 1_000).max(2 * frame)
}

/// Shapes what leaves `dev` (in `ns`) to `rate`, with a queue of [`QUEUE`].
pub fn shape(ns: &NetNs, dev: &str, rate: LinkRate, mtu: usize) {
    let burst = burst_bytes(rate, mtu);
    let queued = u128::from(rate.0 / 8) * QUEUE.as_micros() / 1_000_000;
    let limit = u64::try_from(queued).unwrap_or(u64::MAX) + burst;
    tbf(ns, dev, rate, burst, limit);
}

/// How much a sender's own port queues at most: a NIC's transmit queue. Far more than a
/// socket's send buffer, so a sender that outruns its link waits for room in its socket (as
/// on a real NIC, which sends at its link's rate) instead of losing frames at its own port.
pub const SENDER_QUEUE_BYTES: u64 = 16 << 20;

/// Paces what a host sends from `dev` (in its own namespace) to `rate`, as its NIC would:
/// the queue is deep ([`SENDER_QUEUE_BYTES`]), so the host's sockets feel the link's rate
/// as back-pressure. The wire beyond still shapes every frame, the switches' XDP redirects
/// included, with a switch port's short queue ([`shape`]).
pub fn pace_sender(ns: &NetNs, dev: &str, rate: LinkRate, mtu: usize) {
    tbf(ns, dev, rate, burst_bytes(rate, mtu), SENDER_QUEUE_BYTES);
}

fn tbf(ns: &NetNs, dev: &str, rate: LinkRate, burst: u64, limit: u64) {
    run(ns.command("tc").args([
        "qdisc",
        "replace",
        "dev",
        dev,
        "root",
        "tbf",
        "rate",
        &format!("{}bit", rate.0),
        "burst",
        &burst.to_string(),
        "limit",
        &limit.to_string(),
    ]));
}

/// What every shaped link carried from one moment on: each wire port's bytes and drops (its
/// tbf's counters) since [`LinkMeter::start`].
pub struct LinkMeter<'a> {
    wires: &'a NetNs,
    at: Instant,
    sent: HashMap<String, (u64, u64)>,
}

/// The busiest link over a [`LinkMeter`]'s window.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkUse {
    /// Its wire port (one direction of one link).
    pub port: String,
    /// Its bits over the window's time and the rate: 1 is a link that never idled.
    pub share: f64,
    /// Frames every shaped port dropped in the window (full queues).
    pub drops: u64,
}

impl<'a> LinkMeter<'a> {
    /// Starts counting on the wire namespace `wires`.
    #[must_use]
    pub fn start(wires: &'a NetNs) -> Self {
        // Read first: the window starts when the counters were read, not before the
        // `tc` process that reads them (milliseconds: a short case's whole length).
        let sent = shaped_ports(wires);
        Self {
            wires,
            at: Instant::now(),
            sent,
        }
    }

    /// The busiest link since the start, at `rate`; `None` when no shaped port carried
    /// anything or `tc` could not be read.
    #[must_use]
    pub fn busiest(&self, rate: LinkRate) -> Option<LinkUse> {
        // Both ends of the window are the moments the counters were read.
        let now = shaped_ports(self.wires);
        let secs = self.at.elapsed().as_secs_f64();
        let delta = |dev: &String, (bytes, drops): (u64, u64)| {
            let (b0, d0) = self.sent.get(dev).copied().unwrap_or_default();
            (bytes.saturating_sub(b0), drops.saturating_sub(d0))
        };
        let drops = now.iter().map(|(dev, c)| delta(dev, *c).1).sum();
        let (port, bytes) = now
            .iter()
            .map(|(dev, c)| (dev.clone(), delta(dev, *c).0))
            .max_by_key(|(_, bytes)| *bytes)
            .filter(|(_, bytes)| *bytes > 0)?;
        Some(LinkUse {
            port,
            share: bytes as f64 * 8.0 / secs.max(1e-9) / rate.0 as f64,
            drops,
        })
    }
}

/// Bytes and drops of every tbf in `ns` so far, by device (`tc -s -j qdisc show`).
fn shaped_ports(ns: &NetNs) -> HashMap<String, (u64, u64)> {
    let Ok(out) = ns
        .command("tc")
        .args(["-s", "-j", "qdisc", "show"])
        .output()
    else {
        return HashMap::new();
    };
    let qdiscs: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
    qdiscs
        .iter()
        .filter(|q| q["kind"] == "tbf")
        .filter_map(|q| {
            Some((
                q["dev"].as_str()?.to_owned(),
                (q["bytes"].as_u64()?, q["drops"].as_u64().unwrap_or(0)),
            ))
        })
        .collect()
}

/// What iperf3 measured of one TCP flow (bits per second received) from `client` to the
/// server it starts in `server` at `server_ip`, over `secs` seconds.
#[must_use]
pub fn tcp_rate(client: &NetNs, server: &NetNs, server_ip: std::net::Ipv4Addr, secs: u32) -> f64 {
    static NEXT_PORT: AtomicU16 = AtomicU16::new(5201);
    let port = NEXT_PORT.fetch_add(1, Ordering::Relaxed);
    let mut srv = server
        .command("iperf3")
        .args([
            "-s",
            "-1",
            "-B",
            &server_ip.to_string(),
            "-p",
            &port.to_string(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("iperf3 server");
    // The server listens within a moment; the client tries again until it does (iperf3
    // reports a refused connection in its JSON, not always in its exit status).
    let mut measured = None;
    for _ in 0..50 {
        let out = client
            .command("iperf3")
            .args([
                "-c",
                &server_ip.to_string(),
                "-p",
                &port.to_string(),
                "-t",
                &secs.to_string(),
                "-J",
            ])
            .output()
            .expect("iperf3 client");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if let Some(bits) = v["end"]["sum_received"]["bits_per_second"].as_f64() {
            measured = Some(bits);
            break;
        }
        let refused = v["error"].as_str().is_some_and(|e| e.contains("refused"));
        assert!(refused, "iperf3 measured nothing: {v}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = srv.kill();
    let _ = srv.wait();
    measured.expect("iperf3 never reached its server")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_and_print_as_tc_writes_them() {
        for (text, bits) in [
            ("200mbit", 200_000_000),
            ("1gbit", 1_000_000_000),
            ("1.5gbit", 1_500_000_000),
            ("500kbit", 500_000),
            ("2000000", 2_000_000),
            (" 100MBIT ", 100_000_000),
        ] {
            assert_eq!(text.parse::<LinkRate>(), Ok(LinkRate(bits)), "{text}");
        }
        assert_eq!(LinkRate(200_000_000).to_string(), "200mbit");
        assert_eq!(LinkRate(1_500_000_000).to_string(), "1500mbit");
        for bad in ["", "fast", "10", "-5mbit", "200tbit", "1e12"] {
            let e = bad.parse::<LinkRate>().unwrap_err();
            assert!(e.contains("e.g. 200mbit"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_bucket_holds_a_millisecond_and_at_least_two_frames() {
        assert_eq!(burst_bytes(LinkRate(200_000_000), 1500), 25_000);
        assert_eq!(burst_bytes(LinkRate(1_000_000), 1500), 2 * 1514);
        assert_eq!(
            LinkRate(8_000_000).time_for(1_000_000),
            Duration::from_secs(1)
        );
    }
}
