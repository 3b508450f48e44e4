//! The Arm side (a SmartNIC's cores) where no Arm kernel is at hand: the aarch64 build of
//! `innet` runs under `qemu-aarch64` user emulation for what needs no kernel — its help, the
//! example capture (byte for byte the x86 build's), and `innet-common`'s unit tests.

use std::{path::Path, process::Command};

use anyhow::{Context as _, Result, ensure};

use crate::{
    setup::{self, AARCH64, AARCH64_LINKER},
    shell::{cargo, exec, workspace},
};

/// User emulation and the sysroot its dynamic loader comes from.
const QEMU: &str = "qemu-aarch64";
const SYSROOT: &str = "/usr/aarch64-linux-gnu";

/// Cross-builds `innet` for aarch64 and checks it under emulation against this machine's
/// build (`target/debug/innet`, built first by the caller).
pub fn run() -> Result<()> {
    setup::cross(AARCH64)?;
    setup::apt_install_missing(&["qemu-user"])?;
    let runner = format!("{QEMU} -L {SYSROOT}");
    let cross = |c: &mut Command| {
        c.current_dir(workspace())
            .env(
                "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER",
                AARCH64_LINKER,
            )
            .env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER", &runner);
    };
    let mut build = cargo();
    build.args([
        "build",
        "--package",
        "innet-user",
        "--bins",
        "--target",
        AARCH64,
    ]);
    cross(&mut build);
    exec(&mut build)?;
    let arm = workspace().join("target").join(AARCH64).join("debug/innet");
    let native = workspace().join("target/debug/innet");

    let help = emulated(&arm, &["--help"])?;
    ensure!(
        help.contains("attach") && help.contains("daemon"),
        "the aarch64 `innet --help` lists no commands:\n{help}"
    );
    let dir = std::env::temp_dir().join(format!("innet-arm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let (arm_pcap, native_pcap) = (dir.join("arm.pcap"), dir.join("x86.pcap"));
    emulated(&arm, &["pcap", path_str(&arm_pcap)?])?;
    exec(Command::new(&native).arg("pcap").arg(&native_pcap))?;
    let same = std::fs::read(&arm_pcap)? == std::fs::read(&native_pcap)?;
    let _ = std::fs::remove_dir_all(&dir);
    ensure!(
        same,
        "`innet pcap` wrote different bytes on aarch64 than on this machine"
    );
    println!("arm: `innet --help` and `innet pcap` under {QEMU}: the same capture as x86");

    let mut test = cargo();
    // With the userspace helpers (codec, ICRC, reduce): what a DPU's daemon runs.
    test.args([
        "test",
        "--package",
        "innet-common",
        "--features",
        "user",
        "--lib",
    ])
    .args(["--target", AARCH64]);
    cross(&mut test);
    exec(&mut test)?;
    println!("arm: innet-common's unit tests pass under {QEMU}");
    Ok(())
}

/// Runs the aarch64 `innet` with `args` under emulation; its standard output.
fn emulated(innet: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new(QEMU)
        .args(["-L", SYSROOT])
        .arg(innet)
        .args(args)
        .output()
        .with_context(|| format!("running {QEMU} {}", innet.display()))?;
    ensure!(
        out.status.success(),
        "{QEMU} {} {args:?} failed: {}",
        innet.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn path_str(p: &Path) -> Result<&str> {
    p.to_str().context("a temporary path that is not UTF-8")
}
