//! Network namespaces, veth pairs and bpffs pin roots that tear themselves down (RAII
//! guards with unique names). The first guard of a process records it as a run and sweeps
//! dead runs ([`crate::runs`]), and arms the signal teardown ([`crate::signals`]).

use std::{
    fs::File,
    os::fd::AsRawFd as _,
    path::PathBuf,
    process::{Command, Output},
    thread,
};

use innet::{loader, pins::PinLayout};

use crate::{require_root, unique_id};

/// Moves the calling thread into the network namespace `ns` is a handle of (a
/// single-threaded process moves whole). Needs CAP_SYS_ADMIN.
///
/// # Errors
/// The kernel's refusal.
pub fn set_netns(ns: &File) -> std::io::Result<()> {
    // SAFETY: a valid namespace fd; CLONE_NEWNET moves only the calling thread.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Runs a command and panics with its output unless it succeeds.
pub fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `ip ARGS…`.
#[expect(
    clippy::must_use_candidate,
    reason = "run for its effect; the output is there when wanted"
)]
pub fn ip(args: &[&str]) -> Output {
    run(Command::new("ip").args(args))
}

/// A network namespace `innet-test-<id>-<role>`, deleted (with its interfaces) on drop.
pub struct NetNs {
    pub name: String,
}

impl NetNs {
    #[must_use]
    pub fn new(role: &str) -> Self {
        require_root();
        crate::runs::register();
        let name = format!("innet-test-{}-{role}", unique_id());
        // Not under way while a teardown lists the namespaces (it would miss this one).
        let ns = {
            let _gate = crate::teardown::gate();
            ip(&["netns", "add", &name]);
            Self { name }
        };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// `ip -n <ns> ARGS…`.
    #[expect(
        clippy::must_use_candidate,
        reason = "run for its effect; the output is there when wanted"
    )]
    pub fn ip(&self, args: &[&str]) -> Output {
        run(Command::new("ip").arg("-n").arg(&self.name).args(args))
    }

    /// A command run inside the namespace with `nsenter --net` (unlike `ip netns exec`, it
    /// keeps /sys, so the bpffs pins stay visible).
    #[must_use]
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.name))
            .arg(program);
        c
    }

    /// Moves the calling thread into this namespace: sockets it opens from now on live
    /// there (other threads are not affected).
    pub fn enter(&self) {
        let path = format!("/run/netns/{}", self.name);
        let ns = File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        set_netns(&ns).unwrap_or_else(|e| panic!("setns({path}): {e}"));
    }

    /// Runs `f` on a thread that has entered this namespace; sockets it opens live there.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        thread::scope(|s| {
            s.spawn(|| {
                self.enter();
                f()
            })
            .join()
            .expect("thread inside the namespace panicked")
        })
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _gate = crate::teardown::gate();
        if let Ok(m) = std::fs::metadata(format!("/run/netns/{}", self.name)) {
            use std::os::unix::fs::MetadataExt as _;
            crate::teardown::remove_selector_pins(m.ino());
        }
        let out = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
        assert!(
            !(!matches!(&out, Ok(o) if o.status.success()) && !thread::panicking()),
            "deleting netns {}: {out:?}",
            self.name
        );
    }
}

/// A veth pair `a` (in `ns_a`, address `addr_a`) ↔ `b` (in `ns_b`, `addr_b`), both up,
/// with static neighbour entries so no ARP is needed.
pub fn veth(ns_a: &NetNs, a: &str, addr_a: &str, ns_b: &NetNs, b: &str, addr_b: &str) {
    ip(&[
        "link", "add", a, "netns", &ns_a.name, "type", "veth", "peer", "name", b, "netns",
        &ns_b.name,
    ]);
    for (ns, dev, addr) in [(ns_a, a, addr_a), (ns_b, b, addr_b)] {
        ns.ip(&["addr", "add", &format!("{addr}/24"), "dev", dev]);
        ns.ip(&["link", "set", dev, "up"]);
    }
    let mac = |ns: &NetNs, dev: &str| {
        let m = ns
            .run(|| innet_net::netdev::mac(dev))
            .expect("the veth's MAC");
        format!(
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    };
    let (mac_a, mac_b) = (mac(ns_a, a), mac(ns_b, b));
    ns_a.ip(&[
        "neigh",
        "replace",
        addr_b,
        "lladdr",
        &mac_b,
        "dev",
        a,
        "nud",
        "permanent",
    ]);
    ns_b.ip(&[
        "neigh",
        "replace",
        addr_a,
        "lladdr",
        &mac_a,
        "dev",
        b,
        "nud",
        "permanent",
    ]);
}

/// A private pin root `/sys/fs/bpf/innet-test-<id>`; on drop everything attached through it
/// is detached and unpinned.
pub struct PinRoot {
    pub layout: PinLayout,
}

impl PinRoot {
    #[must_use]
    pub fn new() -> Self {
        require_root();
        crate::runs::register();
        Self {
            layout: PinLayout::new(format!("/sys/fs/bpf/innet-test-{}", unique_id())),
        }
    }

    #[must_use]
    pub fn path(&self) -> PathBuf {
        self.layout.root().to_owned()
    }
}

impl Default for PinRoot {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for PinRoot {
    fn drop(&mut self) {
        let _gate = crate::teardown::gate();
        // Links pinned here keep programs attached: detach them even if the test failed.
        let result = loader::detach_all(&self.layout, false);
        let _ = std::fs::remove_dir_all(self.layout.root());
        if let Err(e) = result
            && !thread::panicking()
        {
            panic!("cleaning pin root {}: {e}", self.layout.root().display());
        }
    }
}
