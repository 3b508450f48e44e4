//! Builds the eBPF objects and hands them to `src/lib.rs`, which embeds them.
//!
//! The object must be built by Debian's rustc (the only compiler here with a precompiled
//! `core` for `bpfel-unknown-none`) through bpf-linker with BTF, in a target directory of
//! its own so the nested cargo never waits on the outer one's lock. When that toolchain is
//! missing (`cargo check` on a bare machine) an empty object is embedded and the binary says
//! at run time to run `cargo xtask setup`; `INNET_EBPF_OBJ=<path>` embeds a prebuilt object.

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

const BPF_RUSTC: &str = "/usr/bin/rustc";
const BPF_TARGET: &str = "bpfel-unknown-none";

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let workspace = manifest
        .parent()
        .expect("innet-objects sits in the workspace");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo"));
    let out = out_dir.join("innet-ebpf.o");
    // The INC-socket selector (sk_reuseport), an object of its own.
    let selector = out_dir.join("innet-inc-socket.o");
    // The lab's test programs (fault injector, empty program), never in the operators' object.
    let lab = out_dir.join("innet-lab-ebpf.o");
    for watched in [
        "innet-ebpf/src",
        "innet-ebpf/Cargo.toml",
        "innet-common/src",
        "innet-common/Cargo.toml",
        "Cargo.lock",
    ] {
        println!(
            "cargo:rerun-if-changed={}",
            workspace.join(watched).display()
        );
    }
    println!("cargo:rerun-if-env-changed=INNET_EBPF_OBJ");
    // Rebuild once `cargo xtask setup` installs the toolchain (a missing path always reruns).
    println!("cargo:rerun-if-changed={BPF_RUSTC}");
    if let Some(linker) = which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    } else if let Some(home) = env::var_os("CARGO_HOME")
        .or_else(|| env::var_os("HOME").map(|h| Path::new(&h).join(".cargo").into()))
    {
        println!(
            "cargo:rerun-if-changed={}",
            Path::new(&home).join("bin/bpf-linker").display()
        );
    }

    if let Some(prebuilt) = env::var_os("INNET_EBPF_OBJ") {
        fs::copy(&prebuilt, &out).expect("copy INNET_EBPF_OBJ");
        // The selector is taken from beside it when there (else sharing is off).
        let beside = Path::new(&prebuilt).with_file_name("innet-inc-socket");
        fs::write(&selector, fs::read(beside).unwrap_or_default()).expect("write the selector");
        let beside = Path::new(&prebuilt).with_file_name("innet-lab-ebpf");
        fs::write(&lab, fs::read(beside).unwrap_or_default()).expect("write the lab object");
        return;
    }
    if !Path::new(BPF_RUSTC).exists() || which("bpf-linker").is_none() {
        println!(
            "cargo:warning=eBPF toolchain missing ({BPF_RUSTC} or bpf-linker): embedding no XDP object; run `cargo xtask setup`"
        );
        fs::write(&out, []).expect("write empty object");
        fs::write(&selector, []).expect("write empty object");
        fs::write(&lab, []).expect("write empty object");
        return;
    }
    let target_dir = workspace.join("target/bpf");
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace)
        .args([
            "build",
            "--package",
            "innet-ebpf",
            "--release",
            "--target",
            BPF_TARGET,
            "--target-dir",
        ])
        .arg(&target_dir);
    // The outer build's compiler settings must not leak into the eBPF build.
    for (key, _) in env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("CARGO_") && key != "CARGO_HOME"
            || key.starts_with("RUSTC")
            || key == "RUSTFLAGS"
            || key == "RUSTDOCFLAGS"
        {
            cmd.env_remove(key.as_ref());
        }
    }
    // One fixed environment: changing any of these rebuilds every eBPF dependency.
    cmd.env("RUSTC", BPF_RUSTC)
        .env("RUSTC_BOOTSTRAP", "aya_ebpf,innet_ebpf")
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            "-Cdebuginfo=2\x1f-Clink-arg=--btf",
        );
    let status = cmd.status().expect("run cargo for innet-ebpf");
    assert!(
        status.success(),
        "building innet-ebpf failed (see the errors above)"
    );
    let built = target_dir.join(BPF_TARGET).join("release");
    fs::copy(built.join("innet-ebpf"), &out).expect("copy the eBPF object");
    fs::copy(built.join("innet-inc-socket"), &selector).expect("copy the selector object");
    fs::copy(built.join("innet-lab-ebpf"), &lab).expect("copy the lab object");
}

fn which(bin: &str) -> Option<PathBuf> {
    env::split_paths(&env::var_os("PATH")?)
        .map(|d| d.join(bin))
        .find(|p| p.is_file())
}
