//! Small helpers every part of the lab uses: unique names, reproducible random data, the
//! root check, where this workspace's binaries are, reading a run's JSON back.

use std::{
    path::PathBuf,
    sync::atomic::{AtomicU32, Ordering},
};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A process-unique short id (`<pid in hex>x<n>`), short enough for interface names (at
/// most 6 + 1 + the counter's digits). The whole pid tells whose an object is: a run's
/// names begin with [`run_prefix`](crate::run_prefix), which the sweep of dead runs relies
/// on.
#[must_use]
pub fn unique_id() -> String {
    format!(
        "{:x}x{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Deterministic xorshift64: random test data that reproduces from its seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value whose float sums and products depend on the order they are taken in:
    /// ±m × 10ᵏ with m in [1, 2), k in −20..=20 when `wide`, else 0.
    pub fn order_sensitive(&mut self, wide: bool) -> f64 {
        let r = self.next_u64();
        let scale = if wide {
            10f64.powi((r % 41) as i32 - 20)
        } else {
            1.0
        };
        let v = scale * (1.0 + (r >> 20) as f64 / (1u64 << 44) as f64);
        if r & 1 << 10 != 0 { -v } else { v }
    }

    /// A value in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// Panics unless root: these tests load BPF programs and create namespaces.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "innet's integration tests need root (BPF, network namespaces): run `sudo -E cargo xtask test`"
    );
}

/// `target/<profile>` of this workspace, the profile this crate was built in.
#[must_use]
pub fn target_dir() -> PathBuf {
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target")
        .join(profile)
}

/// The `innet` binary of this workspace (built by `cargo xtask test` before the tests).
#[must_use]
pub fn innet_bin() -> PathBuf {
    workspace_bin("innet", "innet-user")
}

/// A binary of this workspace, `name` of `package`, built in this crate's profile (`cargo
/// xtask test` builds innet-user's and innet-lab's before the tests).
#[must_use]
pub fn workspace_bin(name: &str, package: &str) -> PathBuf {
    let p = target_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: build it with `cargo build -p {package} --bins` (cargo xtask test does)",
        p.display()
    );
    p
}

/// Reads an earlier run's JSON (`--render`); the error names the file and what it should be.
///
/// # Errors
/// The file cannot be read or is not a `what`.
pub fn read_json<T: serde::de::DeserializeOwned>(
    file: &std::path::Path,
    what: &str,
) -> Result<T, String> {
    let bytes = std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{} is not a {what}: {e}", file.display()))
}

/// Bytes as lowercase hex, two digits each.
#[must_use]
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}
