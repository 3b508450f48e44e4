//! The NIC's post port: how a host hands its own contribution to its NIC. A hardware NIC
//! takes work from a queue in host memory; the lab's NIC is the XDP program on the host's
//! port, which sees only what arrives from the wire. So the NIC daemon makes a veth pair in
//! the host's namespace, [`POST_HOST`] and [`POST_NIC`], and attaches `innet_nic_post` to
//! [`POST_NIC`]: a frame the host writes into [`POST_HOST`] (a raw packet socket, one send
//! a packet) runs the NIC's program as the host's own part, which sends on through the
//! NIC's port. (This was `BPF_PROG_TEST_RUN` with live frames until a kernel refused those
//! with `EPERM`: Linux 6.18.44 on the lab machine.)
//!
//! Only this namespace's root can write into the pair; the program treats every frame from
//! it as the host's own, as the NIC treats the host's queue.

use std::{io, process::Command};

use innet_net::netdev;
use tracing::info;

use crate::{
    error::{Error, Result},
    loader::{self, AttachOptions},
    pins::PinLayout,
};

/// The end the host writes its posts into.
pub const POST_HOST: &str = "innet-post";
/// The end `innet_nic_post` runs on.
pub const POST_NIC: &str = "innet-postnic";

/// Makes the post port unless it exists, sizes it for frames of `mtu` bytes (the NIC ports'
/// largest: a post is a frame the NIC sends on), attaches `innet_nic_post` to it unless
/// attached; the ifindex hosts post into ([`POST_HOST`]).
///
/// # Errors
/// The pair cannot be made or sized, or the program not attached.
pub fn ensure(pins: &PinLayout, opts: AttachOptions, mtu: usize) -> Result<u32> {
    if netdev::ifindex(POST_HOST).is_err() {
        ip(&[
            "link", "add", POST_HOST, "type", "veth", "peer", "name", POST_NIC,
        ])?;
        info!(host = POST_HOST, nic = POST_NIC, "NIC post port made");
    }
    let mtu = mtu.to_string();
    for end in [POST_NIC, POST_HOST] {
        ip(&["link", "set", end, "mtu", &mtu, "up"])?;
    }
    loader::attach_missing(pins, &[POST_NIC.to_owned()], opts, loader::attach_nic_post)?;
    Ok(netdev::ifindex(POST_HOST)?)
}

/// Runs `ip ARGS` (iproute2) in this namespace.
fn ip(args: &[&str]) -> Result<()> {
    let what = || format!("`ip {}` (making the NIC's post port)", args.join(" "));
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|source| Error::Io {
            path: format!("{}: {source}; is iproute2 installed?", what()).into(),
            source,
        })?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    Err(Error::Io {
        path: format!("{} failed: {err}", what()).into(),
        source: io::Error::other(err),
    })
}
