//! innet's counters in the Prometheus text exposition format (0.0.4): per port
//! (`innet_port_<counter>_total{port,ifindex[,facing]}`, with the kernel's
//! `innet_port_kernel_tx_dropped_total` and `innet_port_redirect_ready`), per group
//! (`innet_group_<counter>_total{group,index}`), the daemon's (`innet_daemon_<counter>_total`,
//! its guards' refusals among them) and
//! the group table's fill (`innet_groups`, `innet_group_capacity`), each with HELP and TYPE
//! lines from the counters' doc comments. `innet stats --prometheus` prints it once;
//! `innet daemon --metrics [ADDR:]PORT` serves it at `/metrics`, on loopback unless given an
//! address (the group labels name every wire id).

use std::{fmt::Write as _, net::SocketAddr};

use innet_common::stats::{DaemonStats, GroupStats, PortStats};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpListener,
};
use tracing::{debug, info, warn};

use crate::{
    error::Result,
    group_maps::{GroupInfo, GroupMaps},
    pins::PinLayout,
    port_health::PortHealth,
    stats::{self, PortCounters},
};

/// Everything the pins at `pins` count, as an exposition.
///
/// # Errors
/// innet is not attached there (no pinned maps), or a map read fails.
pub fn render(pins: &PinLayout) -> Result<String> {
    let ports = stats::read_with_health(pins)?;
    let daemon = stats::read_daemon(pins)?;
    let groups = GroupMaps::open(pins)?;
    Ok(exposition(
        &ports,
        &groups.list()?,
        groups.capacity(),
        &daemon,
    ))
}

/// The exposition of these counters.
#[must_use]
pub fn exposition(
    ports: &[PortCounters],
    groups: &[GroupInfo],
    capacity: u32,
    daemon: &DaemonStats,
) -> String {
    let mut out = String::new();
    for (k, name) in PortStats::NAMES.iter().enumerate() {
        family(
            &mut out,
            &format!("innet_port_{name}_total"),
            PortStats::HELP[k],
            "counter",
        );
        for p in ports {
            let _ = writeln!(
                out,
                "innet_port_{name}_total{{{}}} {}",
                port_labels(p),
                p.total.fields()[k].1
            );
        }
    }
    family(
        &mut out,
        "innet_port_kernel_tx_dropped_total",
        "Frames the kernel dropped on their way out of this port (its TX dropped): on veth, every frame redirected into a peer that cannot take it, and every failed XDP_TX.",
        "counter",
    );
    for p in ports {
        if let Some(d) = p.health.as_ref().and_then(|h| h.kernel_tx_dropped) {
            let _ = writeln!(
                out,
                "innet_port_kernel_tx_dropped_total{{{}}} {d}",
                port_labels(p)
            );
        }
    }
    family(
        &mut out,
        "innet_port_redirect_ready",
        "1 when frames innet redirects out of this natively attached port can leave it, 0 when the kernel drops them (innet stats names the fix).",
        "gauge",
    );
    for p in ports {
        if let Some(ready) = p.health.as_ref().and_then(PortHealth::redirect_ready) {
            let _ = writeln!(
                out,
                "innet_port_redirect_ready{{{}}} {}",
                port_labels(p),
                u8::from(ready)
            );
        }
    }
    for (k, name) in GroupStats::NAMES.iter().enumerate() {
        family(
            &mut out,
            &format!("innet_group_{name}_total"),
            GroupStats::HELP[k],
            "counter",
        );
        for g in groups {
            let _ = writeln!(
                out,
                "innet_group_{name}_total{{group=\"{:#08x}\",index=\"{}\"}} {}",
                g.id,
                g.config.index,
                g.stats.fields()[k].1
            );
        }
    }
    for (k, (name, value)) in daemon.fields().iter().enumerate() {
        family(
            &mut out,
            &format!("innet_daemon_{name}_total"),
            DaemonStats::HELP[k],
            "counter",
        );
        let _ = writeln!(out, "innet_daemon_{name}_total {value}");
    }
    family(&mut out, "innet_groups", "Groups installed here.", "gauge");
    let _ = writeln!(out, "innet_groups {}", groups.len());
    family(
        &mut out,
        "innet_group_capacity",
        "Groups this switch, NIC or DPU can hold (--capacity).",
        "gauge",
    );
    let _ = writeln!(out, "innet_group_capacity {capacity}");
    out
}

/// `port="…",ifindex="…"[,facing="…"]`.
fn port_labels(p: &PortCounters) -> String {
    let mut labels = format!(
        "port=\"{}\",ifindex=\"{}\"",
        escape(
            &p.ifname
                .clone()
                .unwrap_or_else(|| format!("if{}", p.ifindex))
        ),
        p.ifindex
    );
    if let Some(f) = p.facing {
        let _ = write!(labels, ",facing=\"{f}\"");
    }
    labels
}

fn family(out: &mut String, name: &str, help: &str, kind: &str) {
    let help = help.trim().replace('\\', "\\\\").replace('\n', "\\n");
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A label value with `\`, `"` and newlines escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Binds the metrics address (before the daemon starts, so a taken port is an error
/// naming it).
///
/// # Errors
/// The address cannot be bound.
pub fn bind(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let l = std::net::TcpListener::bind(addr)?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// How the metrics endpoint bounds its clients.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections served at once; beyond, a new one is closed at once (and logged).
    pub connections: usize,
    /// How long a client may take to send its request head (an idle connection is closed
    /// after it), and to take the answer.
    pub timeout: std::time::Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            connections: 64,
            timeout: std::time::Duration::from_secs(5),
        }
    }
}

/// Serves `GET /metrics` on `listener` from the pins at `pins` until dropped, each
/// connection in a task of its own: an idle or slow client never delays another's scrape.
pub async fn serve(listener: std::net::TcpListener, pins: PinLayout) {
    serve_with(listener, pins, Limits::default()).await;
}

/// [`serve`] with the given [`Limits`].
pub async fn serve_with(listener: std::net::TcpListener, pins: PinLayout, limits: Limits) {
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            warn!(error = %e, "the metrics listener cannot be used");
            return;
        }
    };
    if let Ok(a) = listener.local_addr() {
        info!(addr = %a, "serving Prometheus metrics at /metrics");
    }
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(limits.connections));
    let pins = std::sync::Arc::new(pins);
    loop {
        let Ok((conn, peer)) = listener.accept().await else {
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            warn!(%peer, limit = limits.connections, "metrics: too many open connections, closing a new one");
            continue;
        };
        let pins = pins.clone();
        tokio::spawn(async move {
            answer(conn, peer, &pins, limits.timeout).await;
            drop(slot);
        });
    }
}

/// Reads one request head (at most 8 KiB, within `timeout`), answers it, and closes.
async fn answer(
    mut conn: tokio::net::TcpStream,
    peer: SocketAddr,
    pins: &PinLayout,
    timeout: std::time::Duration,
) {
    let mut head = vec![0u8; 8192];
    let mut n = 0;
    let read = async {
        while n < head.len() && !head[..n].windows(4).any(|w| w == b"\r\n\r\n") {
            match conn.read(&mut head[n..]).await {
                Ok(0) | Err(_) => break,
                Ok(k) => n += k,
            }
        }
    };
    if tokio::time::timeout(timeout, read).await.is_err() {
        debug!(%peer, "metrics: no request within the timeout, closing");
        return;
    }
    let request = String::from_utf8_lossy(&head[..n]);
    let path = request.split_whitespace().nth(1).unwrap_or("");
    let (status, kind, body) = if !request.starts_with("GET ") {
        (
            "405 Method Not Allowed",
            "text/plain",
            "only GET\n".to_owned(),
        )
    } else if path != "/metrics" {
        ("404 Not Found", "text/plain", "see /metrics\n".to_owned())
    } else {
        match render(pins) {
            Ok(body) => ("200 OK", "text/plain; version=0.0.4; charset=utf-8", body),
            Err(e) => (
                "503 Service Unavailable",
                "text/plain",
                format!("reading the counters: {e}\n"),
            ),
        }
    };
    debug!(%peer, status, "metrics request");
    let reply = format!(
        "HTTP/1.0 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let write = async {
        let _ = conn.write_all(reply.as_bytes()).await;
        let _ = conn.shutdown().await;
    };
    if tokio::time::timeout(timeout, write).await.is_err() {
        debug!(%peer, "metrics: the client did not take the answer within the timeout");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends `GET /metrics` and returns the status line of the answer (empty when the
    /// connection was closed unanswered).
    async fn scrape(addr: SocketAddr) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let mut answer = String::new();
        if s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await.is_ok() {
            let _ = s.read_to_string(&mut answer).await;
        }
        answer.lines().next().unwrap_or_default().to_owned()
    }

    #[test]
    fn idle_and_slow_clients_never_delay_a_scrape() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let listener = bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
            let addr = listener.local_addr().expect("addr");
            // No pins there: every scrape is answered 503, which is still an answer.
            let pins = PinLayout::new("/nonexistent/innet-metrics-test");
            let limits = Limits {
                connections: 8,
                timeout: std::time::Duration::from_millis(300),
            };
            tokio::spawn(serve_with(listener, pins, limits));
            let mut idle = vec![];
            for _ in 0..4 {
                idle.push(tokio::net::TcpStream::connect(addr).await.expect("idle"));
            }
            let mut slow = tokio::net::TcpStream::connect(addr).await.expect("slow");
            slow.write_all(b"GET /met").await.expect("half a request");
            for _ in 0..3 {
                let status = scrape(addr).await;
                assert!(status.starts_with("HTTP/1.0 503"), "{status}");
            }
            // The idle client is closed after the timeout: its read sees the end.
            let mut buf = [0u8; 16];
            let n = idle[0].read(&mut buf).await.expect("read");
            assert_eq!(n, 0, "an idle connection is closed, unanswered");
            // Past the bound (8 at once), a new connection is closed unanswered; once
            // those clients go, scrapes are answered again.
            drop(slow);
            tokio::time::sleep(std::time::Duration::from_millis(400)).await;
            let mut crowd = vec![];
            for _ in 0..8 {
                crowd.push(tokio::net::TcpStream::connect(addr).await.expect("crowd"));
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            assert_eq!(scrape(addr).await, "", "closed at once past the bound");
            drop(crowd);
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            assert!(scrape(addr).await.starts_with("HTTP/1.0 503"));
        });
    }

    #[test]
    fn every_family_has_help_and_type_and_labels_are_escaped() {
        let port = PortCounters {
            ifindex: 4,
            ifname: Some("p\"0".into()),
            facing: Some("uplink"),
            total: PortStats {
                rx_packets: 7,
                ..PortStats::default()
            },
            per_cpu: vec![],
            health: Some(PortHealth {
                native: true,
                redirect_blocked: Some("no NAPI".into()),
                kernel_tx_dropped: Some(3),
            }),
        };
        let daemon = DaemonStats {
            refused_comm_clash: 2,
            ..DaemonStats::default()
        };
        let text = exposition(&[port], &[], 64, &daemon);
        assert!(text.contains("innet_daemon_refused_comm_clash_total 2\n"));
        assert!(text.contains(
            "innet_port_rx_packets_total{port=\"p\\\"0\",ifindex=\"4\",facing=\"uplink\"} 7\n"
        ));
        assert!(text.contains("# TYPE innet_port_rx_packets_total counter\n"));
        assert!(text.contains("# HELP innet_port_rx_packets_total Every frame the program saw.\n"));
        assert!(text.contains("innet_group_capacity 64\n"));
        assert!(text.contains(
            "innet_port_kernel_tx_dropped_total{port=\"p\\\"0\",ifindex=\"4\",facing=\"uplink\"} 3\n"
        ));
        assert!(text.contains(
            "innet_port_redirect_ready{port=\"p\\\"0\",ifindex=\"4\",facing=\"uplink\"} 0\n"
        ));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().expect("a name");
            assert!(
                text.contains(&format!("# HELP {name} "))
                    && text.contains(&format!("# TYPE {name} ")),
                "{name}"
            );
        }
        assert_eq!(PortStats::HELP.len(), PortStats::NAMES.len());
        // promtool wants help on every family.
        for help in [PortStats::HELP, GroupStats::HELP, DaemonStats::HELP] {
            assert!(help.iter().all(|h| !h.trim().is_empty()), "{help:?}");
        }
    }
}
