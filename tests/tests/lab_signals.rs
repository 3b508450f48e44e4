//! A lab process ended by a signal leaves nothing behind, and one killed outright is swept
//! by the next run. The lab process is `innet-lab-fabric` (a fabric built as a test builds
//! one: one TOR, two nodes, the TOR's daemon, two NIC daemons, a helper process):
//! - SIGTERM and SIGHUP tear it down as Ctrl-C does, quietly, and it exits with 128 + the
//!   signal: none of its namespaces, pin roots, INC-socket pins, daemon logs, processes or
//!   its run record remain;
//! - after SIGKILL its daemons and helper die with it (parent-death signal), and the next
//!   run removes its namespaces, pin roots and record, while another live run's fabric
//!   stays untouched.
//!
//! Everything is checked against what the kernel and the filesystems list (`/run/netns`,
//! `/sys/fs/bpf`, `/proc`), found by the run's name prefix and its namespaces' inodes.

use std::{
    io::{BufRead as _, BufReader, Read as _},
    os::unix::{
        fs::MetadataExt as _,
        process::{CommandExt as _, ExitStatusExt as _},
    },
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use innet_lab::{RUNS_DIR, require_root, run_prefix, start_time};

/// One lab process at a time: each builds a fabric and loads the programs on this small
/// machine.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A running `innet-lab-fabric`; on drop (a failed test) it is ended by SIGTERM, which
/// tears its fabric down, or killed after 30 s.
struct Lab {
    child: Child,
    stderr: Option<thread::JoinHandle<String>>,
}

impl Lab {
    /// Starts one and waits (up to 3 minutes) until it printed `ready`.
    fn start() -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_innet-lab-fabric"));
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // A tool keeps a signal ignored that it started with ignored (`nohup`); this test
        // may itself run under one (a CI runner started with `nohup`), so the tool starts
        // with the default disposition of the signals it is sent.
        // SAFETY: signal(2) is async-signal-safe, as pre_exec requires.
        unsafe {
            cmd.pre_exec(|| {
                for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                    libc::signal(sig, libc::SIG_DFL);
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("spawn innet-lab-fabric");
        let mut err = child.stderr.take().expect("stderr");
        let stderr = thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let _ = tx.send(line.unwrap_or_default());
            }
        });
        let mut lab = Self {
            child,
            stderr: Some(stderr),
        };
        match rx.recv_timeout(Duration::from_mins(3)) {
            Ok(line) if line == "ready" => lab,
            other => {
                let status = lab.child.try_wait();
                panic!(
                    "innet-lab-fabric not ready ({other:?}, {status:?}):\n{}",
                    lab.stderr_text()
                );
            }
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on our child's pid (not reaped yet).
        assert_eq!(unsafe { libc::kill(self.pid() as i32, sig) }, 0, "kill");
    }

    /// Waits up to `bound` for it to exit.
    fn wait(&mut self, bound: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                start.elapsed() < bound,
                "innet-lab-fabric still runs after {bound:?}"
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// What it printed on stderr (once it exited).
    fn stderr_text(&mut self) -> String {
        self.stderr
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.signal(libc::SIGTERM);
            let start = Instant::now();
            while matches!(self.child.try_wait(), Ok(None)) {
                if start.elapsed() > Duration::from_secs(30) {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
                thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// What a run owns, as the system lists it.
#[derive(Debug)]
struct Objects {
    pid: u32,
    namespaces: Vec<PathBuf>,
    /// The namespaces' inodes (the INC-socket pins and the processes inside name them).
    inodes: Vec<u64>,
    pin_roots: Vec<PathBuf>,
    logs: Vec<PathBuf>,
    /// `(pid, start time)` of every process inside its namespaces.
    processes: Vec<(u32, u64)>,
}

impl Objects {
    fn of(pid: u32) -> Self {
        let prefix = run_prefix(pid);
        let namespaces = entries(Path::new("/run/netns"), &prefix);
        let inodes: Vec<u64> = namespaces
            .iter()
            .map(|p| std::fs::metadata(p).expect("namespace").ino())
            .collect();
        Self {
            pid,
            pin_roots: entries(Path::new("/sys/fs/bpf"), &prefix),
            logs: entries(&std::env::temp_dir(), &format!("innet-daemon-{pid:x}x")),
            processes: processes_in(&inodes),
            namespaces,
            inodes,
        }
    }

    fn record(&self) -> PathBuf {
        Path::new(RUNS_DIR).join(self.pid.to_string())
    }

    /// Which of these are still there: paths, and processes still running.
    fn left(&self) -> Vec<String> {
        let mut left: Vec<String> = self
            .namespaces
            .iter()
            .chain(&self.pin_roots)
            .chain(&self.logs)
            .chain(std::iter::once(&self.record()))
            .filter(|p| p.exists())
            .map(|p| p.display().to_string())
            .collect();
        left.extend(
            self.processes
                .iter()
                .filter(|&&(pid, start)| running(pid, start))
                .map(|(pid, _)| format!("process {pid}")),
        );
        for ino in &self.inodes {
            let pins = entries(
                Path::new(innet_client::inc_socket::PIN_ROOT),
                &innet_client::inc_socket::netns_prefix(*ino),
            );
            left.extend(pins.iter().map(|p| p.display().to_string()));
        }
        left
    }

    /// Panics unless the fabric of one `innet-lab-fabric` is all there.
    fn assert_whole(&self) {
        // One TOR and two nodes; their pin roots; three daemons and the helper.
        assert_eq!(self.namespaces.len(), 3, "{self:#?}");
        assert!(self.pin_roots.len() >= 3, "{self:#?}");
        assert_eq!(self.processes.len(), 4, "{self:#?}");
        assert_eq!(self.logs.len(), 3, "{self:#?}");
        assert!(self.record().exists(), "no run record: {self:#?}");
        assert!(self.left().len() > 4, "{self:#?}");
    }
}

fn entries(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

fn processes_in(inodes: &[u64]) -> Vec<(u32, u64)> {
    let mut v: Vec<(u32, u64)> = std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::metadata(format!("/proc/{pid}/ns/net"))
                .is_ok_and(|m| inodes.contains(&m.ino()))
        })
        .filter_map(|pid| Some((pid, start_time(pid)?)))
        .collect();
    v.sort_unstable();
    v
}

/// Whether process `pid` that started at `start` still runs (not a zombie, not a reuse).
fn running(pid: u32, start: u64) -> bool {
    let line = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = line
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or("Z");
    state != "Z" && start_time(pid) == Some(start)
}

/// Waits up to `bound` until `objects` left nothing; panics with what is left.
fn assert_gone(objects: &Objects, bound: Duration) {
    let start = Instant::now();
    loop {
        let left = objects.left();
        if left.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < bound,
            "run {} left behind: {left:#?}",
            objects.pid
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// Starts a lab process, ends it with `sig`: it must exit with 128 + `sig`, say so in one
/// line, and leave nothing.
fn ends_clean_on(sig: i32, said: &str) {
    require_root();
    let _serial = serial();
    let mut lab = Lab::start();
    let objects = Objects::of(lab.pid());
    objects.assert_whole();
    lab.signal(sig);
    let status = lab.wait(Duration::from_secs(30));
    let stderr = lab.stderr_text();
    assert_eq!(status.code(), Some(128 + sig), "{status}:\n{stderr}");
    assert!(stderr.contains(said), "{stderr}");
    assert!(
        !stderr.contains("Cannot remove namespace"),
        "noise on teardown:\n{stderr}"
    );
    // Nothing else than the one line, apart from blank lines.
    assert_eq!(
        stderr.lines().filter(|l| !l.trim().is_empty()).count(),
        1,
        "{stderr}"
    );
    // The process removed all before it exited: no waiting.
    assert_gone(&objects, Duration::ZERO);
}

#[test]
fn sigterm_tears_the_fabric_down_quietly() {
    ends_clean_on(libc::SIGTERM, "terminated, tearing its fabric down");
}

#[test]
fn sighup_tears_the_fabric_down_quietly() {
    ends_clean_on(libc::SIGHUP, "hung up, tearing its fabric down");
}

#[test]
fn the_run_after_a_sigkill_sweeps_the_dead_runs_leftovers_but_not_a_live_runs() {
    require_root();
    let _serial = serial();
    let live = Lab::start();
    let live_objects = Objects::of(live.pid());
    live_objects.assert_whole();

    let mut dead = Lab::start();
    let dead_objects = Objects::of(dead.pid());
    dead_objects.assert_whole();
    dead.signal(libc::SIGKILL);
    let status = dead.wait(Duration::from_secs(10));
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
    // Its daemons and helper die with it (parent-death signal), before any sweep.
    let start = Instant::now();
    while dead_objects
        .processes
        .iter()
        .any(|&(pid, start)| running(pid, start))
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the killed run's processes outlived it: {dead_objects:#?}"
        );
        thread::sleep(Duration::from_millis(50));
    }

    // The next run sweeps the dead one's namespaces, pins, logs and record as it starts.
    let next = Lab::start();
    assert_gone(&dead_objects, Duration::ZERO);
    // … and leaves the live one's whole: same namespaces, pins, processes.
    let still = Objects::of(live.pid());
    assert_eq!(still.namespaces, live_objects.namespaces);
    assert_eq!(still.pin_roots, live_objects.pin_roots);
    assert_eq!(still.processes, live_objects.processes);

    for mut lab in [live, next] {
        let objects = Objects::of(lab.pid());
        objects.assert_whole();
        lab.signal(libc::SIGTERM);
        let status = lab.wait(Duration::from_secs(30));
        assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status}");
        assert_gone(&objects, Duration::ZERO);
    }
}
