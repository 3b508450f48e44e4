//! Which ports innet is attached to, read from the pinned links (one per port): what
//! `innet status` shows and what a daemon's port health watches.

use std::{fs, io};

use aya::programs::links::{FdLink, PinnedLink};
use innet_net::netdev;

use crate::{
    error::{Error, Result},
    pins::PinLayout,
};

/// Interfaces with a pinned link, sorted.
///
/// # Errors
/// A links directory that exists but cannot be read.
pub fn attached(pins: &PinLayout) -> Result<Vec<String>> {
    let dir = pins.links_dir();
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(Error::Io {
                path: dir,
                source: e,
            });
        }
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect();
    names.sort();
    Ok(names)
}

/// One attached port as `innet status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PortStatus {
    pub ifname: String,
    /// `None` when the interface is gone (or lives in another namespace).
    pub ifindex: Option<u32>,
    pub link_id: u32,
    pub prog_id: u32,
}

/// Every attached port with its link and program ids.
///
/// # Errors
/// Unreadable pins.
pub fn status(pins: &PinLayout) -> Result<Vec<PortStatus>> {
    attached(pins)?
        .into_iter()
        .map(|ifname| {
            let path = pins.link(&ifname);
            let open_err = |e: Box<dyn std::error::Error + Send + Sync>| Error::OpenPinned {
                what: "link",
                path: path.clone(),
                source: e,
            };
            let link: FdLink = PinnedLink::from_pin(&path)
                .map_err(|e| open_err(Box::new(e)))?
                .into();
            let info = link.info().map_err(|e| open_err(Box::new(e)))?;
            // Dropping an FdLink made from a pin only closes our fd: the pin keeps the link.
            Ok(PortStatus {
                ifindex: netdev::ifindex(&ifname).ok(),
                ifname,
                link_id: info.id(),
                prog_id: info.program_id(),
            })
        })
        .collect()
}
