//! innet's eBPF objects, built from `innet-ebpf` by `build.rs` (Debian's rustc, bpf-linker,
//! BTF) and embedded here, so that every binary carries the programs it loads: the switch
//! and NIC daemons the XDP object, a host runtime the INC-socket selector, the lab's tools
//! (feature `lab`) the test programs.

/// An object this binary was built without.
#[derive(Debug, thiserror::Error)]
#[error(
    "this binary was built without the eBPF toolchain, so it embeds no {0} object: run `cargo xtask setup`, then rebuild"
)]
pub struct ObjectMissing(pub &'static str);

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/innet-ebpf.o"));

/// The ELF object with innet's XDP programs and maps.
///
/// # Errors
/// [`ObjectMissing`] when the binary was built without the eBPF toolchain.
pub fn ebpf_object() -> Result<&'static [u8], ObjectMissing> {
    embedded(OBJECT, "XDP")
}

static SELECTOR: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/innet-inc-socket.o"));

/// The ELF object with the INC-socket selector (sk_reuseport) and its two maps.
///
/// # Errors
/// [`ObjectMissing`] when the binary was built without the eBPF toolchain.
pub fn selector_object() -> Result<&'static [u8], ObjectMissing> {
    embedded(SELECTOR, "INC-socket selector")
}

#[cfg(feature = "lab")]
static LAB: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/innet-lab-ebpf.o"));

/// The lab's object: the test wire's fault injector (`innet_fault`, tc) and an empty XDP
/// program (`innet_pass`). Only lab tools embed it (feature `lab`); operators' binaries
/// carry production programs only.
///
/// # Errors
/// [`ObjectMissing`] when the binary was built without the eBPF toolchain.
#[cfg(feature = "lab")]
pub fn lab_object() -> Result<&'static [u8], ObjectMissing> {
    embedded(LAB, "lab")
}

fn embedded(object: &'static [u8], what: &'static str) -> Result<&'static [u8], ObjectMissing> {
    if object.is_empty() {
        return Err(ObjectMissing(what));
    }
    Ok(object)
}
