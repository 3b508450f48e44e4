//! Bystander traffic: what innet on a bridge host costs the ordinary traffic crossing it.
//! Two hosts talk TCP (`iperf3`) through a bridge whose two veth ports run innet, natively
//! or in generic (skb) mode, against the same bridge without innet, in turns within one
//! run; at the kernel's 1500 B MTU and at 9000 B (jumbo frames, which a veth port takes with
//! innet attached natively only because the programs declare `xdp.frags`). Each row also
//! records what the sending host's port looked like meanwhile (TSO, max MTU): a veth turns
//! TSO off on its peer while a native XDP program is attached, whatever the program.

use std::{
    panic::{AssertUnwindSafe, catch_unwind},
    process::Stdio,
    time::Duration,
};

use aya::programs::{Xdp, XdpMode as AyaXdpMode};
use innet::loader::XdpMode;
use innet_client::Mode;
use innet_common::{
    maps::PROG_PASS,
    proto::{Dtype, Op},
};
use serde::{Deserialize, Serialize};

use super::{
    LatencyRow,
    latency::{self, Sweep},
};
use innet_lab::{NetNs, PinRoot, innet_bin, unique_id};

/// How the bridge's ports ran while TCP crossed them: nothing, an empty XDP program
/// (`innet_pass`, to tell the driver's cost of native XDP from innet's), innet natively,
/// innet in skb mode.
pub const SETTINGS: [&str; 4] = [
    "without innet",
    "empty XDP native",
    "innet native",
    "innet skb",
];

/// One `iperf3` run through the bridge.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BystanderRow {
    /// One of [`SETTINGS`].
    pub setting: String,
    /// MTU of every link.
    pub mtu: usize,
    /// Which turn of the run (the settings alternate within a turn).
    pub turn: usize,
    /// Received TCP goodput.
    pub gbit_s: f64,
    /// `tcp-segmentation-offload` of the sending host's port during the run.
    pub sender_tso: bool,
    /// The sending host's port's max MTU during the run.
    pub sender_max_mtu: u64,
    /// Why the run failed, if it did.
    #[serde(default)]
    pub failed: Option<String>,
}

/// `turns` turns of every setting at every MTU in `mtus`, `seconds` of TCP each.
#[must_use]
pub fn run(mtus: &[usize], turns: usize, seconds: u32) -> Vec<BystanderRow> {
    let mut rows = vec![];
    for &mtu in mtus {
        for turn in 0..turns {
            for setting in SETTINGS {
                let measured = catch_unwind(AssertUnwindSafe(|| one(setting, mtu, seconds)));
                rows.push(match measured {
                    Ok(Ok(row)) => BystanderRow { turn, ..row },
                    Ok(Err(e)) => failed(setting, mtu, turn, e),
                    Err(p) => failed(setting, mtu, turn, panic_text(&p)),
                });
            }
        }
    }
    rows
}

fn failed(setting: &str, mtu: usize, turn: usize, why: String) -> BystanderRow {
    BystanderRow {
        setting: setting.into(),
        mtu,
        turn,
        gbit_s: 0.0,
        sender_tso: false,
        sender_max_mtu: 0,
        failed: Some(why),
    }
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "panicked".into())
}

/// The bridge: `a` — `pa` [br0] `pb` — `b`, GRO on the hosts' ports (as the test fabrics
/// have it: a native redirect into a veth needs its peer's NAPI).
struct Bridge {
    // Field order is teardown order: the pins go before the namespaces.
    pins: PinRoot,
    switch: NetNs,
    a: NetNs,
    b: NetNs,
    ports: [String; 2],
}

const A_IP: &str = "10.211.0.1";
const B_IP: &str = "10.211.0.2";

impl Bridge {
    fn new(mtu: usize) -> Self {
        let (switch, a, b) = (NetNs::new("yb"), NetNs::new("ya"), NetNs::new("yc"));
        let id = unique_id();
        let ports = [format!("y{id}a"), format!("y{id}b")];
        switch.ip(&["link", "add", "br0", "type", "bridge"]);
        let mtu = mtu.to_string();
        for (host, port, addr) in [(&a, &ports[0], A_IP), (&b, &ports[1], B_IP)] {
            innet_lab::ip(&[
                "link",
                "add",
                port,
                "netns",
                &switch.name,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                &host.name,
            ]);
            switch.ip(&["link", "set", port, "mtu", &mtu, "master", "br0", "up"]);
            host.ip(&["link", "set", "eth0", "mtu", &mtu, "up"]);
            host.ip(&["addr", "add", &format!("{addr}/24"), "dev", "eth0"]);
            innet_lab::run(host.command("ethtool").args(["-K", "eth0", "gro", "on"]));
        }
        switch.ip(&["link", "set", "br0", "mtu", &mtu, "up"]);
        Self {
            pins: PinRoot::new(),
            switch,
            a,
            b,
            ports,
        }
    }

    /// `innet attach` on both ports in `mode`.
    fn attach(&self, mode: &str) -> Result<(), String> {
        let out = self
            .switch
            .command(innet_bin().to_str().expect("utf-8"))
            .args(["attach", &self.ports[0], &self.ports[1], "--mode", mode])
            .arg("--pin-path")
            .arg(self.pins.path())
            .output()
            .map_err(|e| format!("innet attach: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "innet attach --mode {mode}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// `innet_pass` (an empty program: `XDP_PASS`) natively on both ports; attached while
    /// the returned object lives.
    fn attach_empty(&self) -> Result<innet_lab::bpf::Loaded, String> {
        self.switch.run(|| {
            let mut loaded = innet_lab::bpf::Loaded::switch(1);
            let prog: &mut Xdp = loaded
                .lab
                .program_mut(PROG_PASS)
                .ok_or("no innet_pass in the object")?
                .try_into()
                .map_err(|e| format!("innet_pass: {e}"))?;
            for port in &self.ports {
                prog.attach(port, AyaXdpMode::Driver)
                    .map_err(|e| format!("attaching innet_pass to {port}: {e}"))?;
            }
            Ok(loaded)
        })
    }

    /// TCP goodput from `a` to `b` over `seconds`, in Gbit/s.
    fn iperf(&self, seconds: u32) -> Result<f64, String> {
        let mut cmd = self.b.command("iperf3");
        // Killed below, or with this thread.
        let mut server = innet_lab::die_with_parent(&mut cmd)
            .args(["-s", "-1", "-B", B_IP])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("iperf3 -s: {e} (is iperf3 installed? `cargo xtask setup`)"))?;
        // The server listens within milliseconds; the client retries its connect anyway.
        std::thread::sleep(Duration::from_millis(300));
        let out = self
            .a
            .command("iperf3")
            .args(["-c", B_IP, "-J", "-t", &seconds.to_string()])
            .output();
        let _ = server.kill();
        let _ = server.wait();
        let out = out.map_err(|e| format!("iperf3 -c: {e}"))?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .map_err(|e| format!("iperf3 -J printed no JSON ({e})"))?;
        if let Some(err) = v["error"].as_str() {
            return Err(format!("iperf3: {err}"));
        }
        v["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .map(|b| b / 1e9)
            .ok_or_else(|| "iperf3 reported no received rate".into())
    }

    /// The sending host's port: (TSO on, max MTU).
    fn sender_port(&self) -> (bool, u64) {
        let k = self.a.command("ethtool").args(["-k", "eth0"]).output();
        let tso = k.is_ok_and(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l.starts_with("tcp-segmentation-offload: on"))
        });
        let max_mtu = self
            .a
            .run(|| innet_net::netdev::link_named("eth0"))
            .ok()
            .and_then(|l| l.max_mtu)
            .map_or(0, u64::from);
        (tso, max_mtu)
    }
}

/// One run of `setting` on a fresh bridge.
fn one(setting: &str, mtu: usize, seconds: u32) -> Result<BystanderRow, String> {
    let bridge = Bridge::new(mtu);
    // Holds the empty program's links while the run lasts.
    let mut _empty = None;
    match setting {
        "empty XDP native" => _empty = Some(bridge.attach_empty()?),
        "innet native" => bridge.attach("native")?,
        "innet skb" => bridge.attach("skb")?,
        _ => {}
    }
    let (sender_tso, sender_max_mtu) = bridge.sender_port();
    let gbit_s = bridge.iperf(seconds)?;
    Ok(BystanderRow {
        setting: setting.into(),
        mtu,
        turn: 0,
        gbit_s,
        sender_tso,
        sender_max_mtu,
        failed: None,
    })
}

/// What the switches' attach mode costs innet itself: a 4-node `inc-node` sweep (int32 SUM,
/// every result checked) with the switches' programs native, then in skb mode, beside
/// `host-rd` on the same fabric.
#[must_use]
pub fn inc_latency(sizes: &[usize], iterations: usize) -> Vec<SwitchModeRow> {
    let mut rows = vec![];
    for (name, switch_mode) in [("native", XdpMode::Native), ("skb", XdpMode::Skb)] {
        let sweep = Sweep {
            nodes: vec![4],
            ppn: vec![1],
            sizes: sizes.to_vec(),
            modes: vec![Mode::HostRd, Mode::IncNode],
            iterations,
            op: Op::Sum,
            dtype: Dtype::I32,
            spin: None,
            mtu: None,
            link_rate: None,
            link_loss: None,
            window: None,
            switch_mode,
            fabric: super::latency::Depth::default(),
            profile: false,
        };
        let bar = indicatif::ProgressBar::hidden();
        rows.extend(
            latency::run(&sweep, &bar)
                .into_iter()
                .map(|row| SwitchModeRow {
                    switch_mode: name.into(),
                    row,
                }),
        );
    }
    rows
}

/// A latency row measured with the switches attached in `switch_mode`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SwitchModeRow {
    /// `native` or `skb`.
    pub switch_mode: String,
    pub row: LatencyRow,
}

/// Per (MTU, setting): the mean goodput, and its ratio to the same MTU's run without innet
/// (means over the turns).
#[must_use]
pub fn summary(rows: &[BystanderRow]) -> Vec<(usize, String, f64, f64)> {
    let mut mtus: Vec<usize> = rows.iter().map(|r| r.mtu).collect();
    mtus.dedup();
    let mean = |mtu: usize, setting: &str| {
        let v: Vec<f64> = rows
            .iter()
            .filter(|r| r.mtu == mtu && r.setting == setting && r.failed.is_none())
            .map(|r| r.gbit_s)
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let mut out = vec![];
    for mtu in mtus {
        let Some(base) = mean(mtu, SETTINGS[0]) else {
            continue;
        };
        for s in SETTINGS {
            if let Some(m) = mean(mtu, s) {
                out.push((mtu, s.to_owned(), m, m / base));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(setting: &str, mtu: usize, gbit_s: f64) -> BystanderRow {
        BystanderRow {
            setting: setting.into(),
            mtu,
            turn: 0,
            gbit_s,
            sender_tso: true,
            sender_max_mtu: 65535,
            failed: None,
        }
    }

    #[test]
    fn ratios_are_to_the_same_mtus_runs_without_innet() {
        let mut rows = vec![
            row(SETTINGS[0], 1500, 10.0),
            row(SETTINGS[1], 1500, 2.0),
            row(SETTINGS[0], 1500, 12.0),
            row(SETTINGS[1], 1500, 3.0),
            row(SETTINGS[2], 1500, 9.9),
            row(SETTINGS[0], 9000, 8.0),
            row(SETTINGS[1], 9000, 4.0),
        ];
        rows.push(BystanderRow {
            failed: Some("x".into()),
            ..row(SETTINGS[2], 9000, 0.0)
        });
        let s = summary(&rows);
        let get = |mtu, set: &str| {
            s.iter()
                .find(|(m, x, _, _)| *m == mtu && x == set)
                .map(|(_, _, g, r)| (*g, *r))
        };
        let near = |got: Option<(f64, f64)>, want: (f64, f64)| {
            got.is_some_and(|(g, r)| (g - want.0).abs() < 1e-9 && (r - want.1).abs() < 1e-9)
        };
        assert!(near(get(1500, SETTINGS[0]), (11.0, 1.0)));
        assert!(near(get(1500, SETTINGS[1]), (2.5, 2.5 / 11.0)));
        assert!(near(get(1500, SETTINGS[2]), (9.9, 0.9)));
        assert!(near(get(9000, SETTINGS[1]), (4.0, 0.5)));
        assert_eq!(
            get(9000, SETTINGS[2]),
            None,
            "a failed run is no measurement"
        );
    }
}
