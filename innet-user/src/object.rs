//! The XDP object, embedded at build time by `build.rs`.

use crate::error::{Error, Result};

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/innet-ebpf.o"));

/// The ELF object with innet's XDP programs and maps.
///
/// # Errors
/// [`Error::ObjectMissing`] when the binary was built without the eBPF toolchain.
pub fn ebpf_object() -> Result<&'static [u8]> {
    if OBJECT.is_empty() {
        return Err(Error::ObjectMissing);
    }
    Ok(OBJECT)
}

static SELECTOR: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/innet-inc-socket.o"));

/// The ELF object with the INC-socket selector (sk_reuseport) and its two maps.
///
/// # Errors
/// [`Error::ObjectMissing`] when the binary was built without the eBPF toolchain.
pub fn selector_object() -> Result<&'static [u8]> {
    if SELECTOR.is_empty() {
        return Err(Error::ObjectMissing);
    }
    Ok(SELECTOR)
}
