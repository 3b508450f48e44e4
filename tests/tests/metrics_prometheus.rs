//! innet's counters in Prometheus: a TOR daemon serves them with `--metrics` (idle and slow
//! clients open beside the scrapes), a real Prometheus server (Debian's package, started
//! here on the TOR namespace's loopback) scrapes them, and its HTTP API answers a query for
//! a port counter; `promtool check metrics` accepts both the served exposition and `innet
//! stats --prometheus`.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    process::{Command, Stdio},
    time::Duration,
};

use innet_client::{Layout, Mode};
use innet_common::proto::{Dtype, Op};
use innet_lab::{
    NetNs,
    daemons::{DaemonGuard, learn_hosts, spawn_daemon_with, spawn_logged, wait_until},
    innet_bin,
    job::{checked_allreduce, run_job},
    run,
    topology::{Shape, Topology},
    unique_id,
};

const METRICS: &str = "127.0.0.1:9464";
const PROMETHEUS: &str = "127.0.0.1:9090";

/// An HTTP/1.0 GET of `path` at `addr` from inside `ns`: (status line, body).
fn get(ns: &NetNs, addr: &str, path: &str) -> Option<(String, String)> {
    ns.run(|| {
        let mut s = TcpStream::connect(addr).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
        let mut answer = String::new();
        s.read_to_string(&mut answer).ok()?;
        let (head, body) = answer.split_once("\r\n\r\n")?;
        Some((head.lines().next()?.to_owned(), body.to_owned()))
    })
}

/// `promtool check metrics` on `text`: its complaints (empty when it accepts it).
fn promtool(text: &str) -> String {
    let mut p = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus)");
    p.stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = p.wait_with_output().expect("promtool");
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// Prometheus scraping `METRICS` every second, its data in a directory of its own.
fn prometheus(ns: &NetNs) -> (DaemonGuard, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("innet-prometheus-{}", unique_id()));
    std::fs::create_dir_all(&dir).expect("prometheus dir");
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: innet\n    static_configs:\n      - targets: ['{METRICS}']\n"
        ),
    )
    .expect("prometheus.yml");
    let mut cmd = ns.command("prometheus");
    cmd.arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={PROMETHEUS}"));
    (spawn_logged(cmd), dir)
}

#[test]
fn prometheus_scrapes_the_daemons_counters_and_promtool_accepts_them() {
    let topo = Topology::new(Shape::small());
    learn_hosts(&topo);
    let tor = &topo.tors[0];
    let _daemons: Vec<DaemonGuard> = [spawn_daemon_with(tor, "tor", &["--metrics", METRICS])]
        .into_iter()
        .chain(
            topo.tors[1..]
                .iter()
                .map(|t| spawn_daemon_with(t, "tor", &[])),
        )
        .chain(
            topo.spines
                .iter()
                .map(|s| spawn_daemon_with(s, "spine", &[])),
        )
        .collect();
    run_job(
        &topo,
        Layout::new(4, 1, 1).expect("layout"),
        Mode::IncNode,
        |_| {},
        |comm| checked_allreduce(comm, 0, Op::Sum, Dtype::I32, 64),
    );

    // Idle clients (connected, sending nothing) and slow ones (half a request) stay open
    // while the endpoint is scraped below, by hand and by Prometheus: none of them may
    // delay an answer (one of them used to stall the endpoint for good).
    let stallers: Vec<TcpStream> = tor.ns.run(|| {
        (0..12)
            .map(|i| {
                let mut s = TcpStream::connect(METRICS).expect("connect");
                if i % 3 == 0 {
                    s.write_all(b"GET /metr").expect("half a request");
                }
                s
            })
            .collect()
    });

    // The daemon's own endpoint: the exposition, accepted by promtool.
    let (status, served) = get(&tor.ns, METRICS, "/metrics").expect("the metrics endpoint");
    assert_eq!(status, "HTTP/1.0 200 OK", "{served}");
    assert!(
        served.contains("# TYPE innet_port_rx_packets_total counter"),
        "{served}"
    );
    assert!(
        served.contains("innet_daemon_groups_installed_total 1"),
        "{served}"
    );
    promtool(&served);
    assert_eq!(
        get(&tor.ns, METRICS, "/nothing").map(|r| r.0),
        Some("HTTP/1.0 404 Not Found".into())
    );
    // `innet stats --prometheus` prints the same families once.
    let mut once = tor.ns.command(innet_bin().to_str().expect("utf-8"));
    once.args(["stats", "--prometheus", "--pin-path"])
        .arg(tor.pins.path());
    let printed = String::from_utf8(run(&mut once).stdout).expect("utf-8");
    promtool(&printed);
    let families = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| l.starts_with("# TYPE"))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(families(&printed), families(&served));

    // A real Prometheus scrapes it; its API answers for the port counters.
    let (prom, dir) = prometheus(&tor.ns);
    let mut answer = String::new();
    wait_until(
        "Prometheus to have scraped innet",
        Duration::from_mins(1),
        || {
            let q = "/api/v1/query?query=sum(innet_port_inc_data_total)";
            match get(&tor.ns, PROMETHEUS, q) {
                Some((status, body)) if status.contains("200") && body.contains("\"value\"") => {
                    answer = body;
                    true
                }
                _ => false,
            }
        },
    );
    drop(prom);
    drop(stallers);
    let _ = std::fs::remove_dir_all(&dir);
    let v: serde_json::Value = serde_json::from_str(&answer).expect("API JSON");
    assert_eq!(v["status"], "success", "{answer}");
    let value: f64 = v["data"]["result"][0]["value"][1]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("a value: {answer}"));
    // 4 contributions and the SPINE's results crossed TOR 0 at least.
    assert!(value >= 2.0, "{answer}");
}
