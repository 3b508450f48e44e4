//! The hosts' side of innet: roles, the control-plane handshake, and (with issue 5) the
//! allreduce API.

pub mod handshake;
pub mod local;
pub mod roles;
