//! Network namespaces, veth pairs and bpffs pin roots that tear themselves down (RAII
//! guards with unique names), and the Ctrl-C path that tears down a whole process's fabric.

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

/// A network namespace `innet-test-<id>`, deleted (with its interfaces) on drop.
pub struct NetNs {
    pub name: String,
}

impl NetNs {
    #[must_use]
    pub fn new(role: &str) -> Self {
        require_root();
        let name = format!("innet-test-{}-{role}", unique_id());
        ip(&["netns", "add", &name]);
        let ns = Self { name };
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

/// Removes the selector pins of INC sockets a killed process left behind in namespace
/// `name`.
fn remove_selector_pins(name: &str) {
    if let Ok(m) = std::fs::metadata(format!("/run/netns/{name}")) {
        use std::os::unix::fs::MetadataExt as _;
        let prefix = innet_client::inc_socket::netns_prefix(m.ino());
        let root = std::path::Path::new(innet_client::inc_socket::PIN_ROOT);
        for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

/// On Ctrl-C, tears down what this process built — its namespaces (and the INC-socket
/// pins in them), its pin roots, its node-local sockets — then exits with 130: an
/// interrupted benchmark, campaign or demo leaves nothing behind. (Panics unwind through
/// the fabric's guards instead.)
pub fn tear_down_on_interrupt(tool: &'static str) {
    ctrlc::set_handler(move || {
        eprintln!("\n{tool} interrupted: tearing its fabric down");
        exit_torn_down(130);
    })
    .expect("install the Ctrl-C handler");
}

/// Tears down what this process built (as on Ctrl-C) and exits with `code`: for a tool
/// that must stop without unwinding, such as a watchdog that found a hang.
pub fn exit_torn_down(code: i32) -> ! {
    crate::mpi::autogroup::restore_now();
    tear_down_by_prefix(&format!("innet-test-{}x", std::process::id() % 10_000));
    std::process::exit(code)
}

fn tear_down_by_prefix(prefix: &str) {
    stop_children();
    if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            if name.starts_with(prefix) {
                remove_selector_pins(name);
                let _ = Command::new("ip").args(["netns", "del", name]).status();
            }
        }
    }
    // Node-local sockets of this process's jobs (see `job::job_id`).
    let sockets = format!("innet-{:06x}", std::process::id());
    for e in std::fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .flatten()
    {
        if e.file_name().to_string_lossy().starts_with(&sockets) {
            let _ = std::fs::remove_file(e.path());
        }
    }
    for e in std::fs::read_dir("/sys/fs/bpf")
        .into_iter()
        .flatten()
        .flatten()
    {
        if e.file_name().to_string_lossy().starts_with(prefix) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Sends SIGINT to this process's children (the daemons: they detach and unpin on it) and
/// waits up to 3 s for them to go.
fn stop_children() {
    let me = std::process::id();
    let children = || -> Vec<i32> {
        let mut out = vec![];
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            // Field 4 of /proc/PID/stat, after the parenthesised command name.
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            let parent = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if parent == Some(me) {
                out.push(pid);
            }
        }
        out
    };
    for pid in children() {
        // SAFETY: plain kill(2) on a child's pid.
        unsafe { libc::kill(pid, libc::SIGINT) };
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while std::time::Instant::now() < deadline {
        // Reap the ones that exited; stop when none is left.
        // SAFETY: waitpid on any child without blocking.
        while unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) } > 0 {}
        if children().is_empty() {
            break;
        }
        thread::sleep(std::time::Duration::from_millis(50));
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        remove_selector_pins(&self.name);
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
        let out = ns.ip(&["-j", "link", "show", dev]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ip -j output");
        v[0]["address"].as_str().expect("address").to_owned()
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
