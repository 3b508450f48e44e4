//! Bounds-checked access to packet memory.

use aya_ebpf::programs::{TcContext, XdpContext};

/// Direct packet access, the same for XDP frames and (linear) tc skbs.
pub trait Packet {
    fn data(&self) -> usize;
    fn data_end(&self) -> usize;
    /// The whole frame's length: a multi-buffer XDP frame (`xdp.frags`) or a non-linear skb
    /// is longer than the part direct access reaches (`data_end - data`).
    fn total_len(&self) -> usize;
}

impl Packet for XdpContext {
    #[inline(always)]
    fn data(&self) -> usize {
        XdpContext::data(self)
    }
    #[inline(always)]
    fn data_end(&self) -> usize {
        XdpContext::data_end(self)
    }
    #[inline(always)]
    fn total_len(&self) -> usize {
        // SAFETY: the helper reads the context the kernel passed in.
        unsafe { aya_ebpf::helpers::bpf_xdp_get_buff_len(self.ctx) as usize }
    }
}

impl Packet for TcContext {
    #[inline(always)]
    fn data(&self) -> usize {
        TcContext::data(self)
    }
    #[inline(always)]
    fn data_end(&self) -> usize {
        TcContext::data_end(self)
    }
    #[inline(always)]
    fn total_len(&self) -> usize {
        self.len() as usize
    }
}

/// A pointer to a `T` at `offset` bytes into the frame, if the whole `T` lies inside it.
/// The check sits right beside the pointer arithmetic, where the verifier wants it.
#[inline(always)]
pub fn ptr_at<T>(ctx: &impl Packet, offset: usize) -> Option<*const T> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + offset + core::mem::size_of::<T>() > end {
        return None;
    }
    Some((start + offset) as *const T)
}

/// Frame length in bytes, every buffer of a multi-buffer frame included.
#[inline(always)]
pub fn frame_len(ctx: &impl Packet) -> usize {
    ctx.total_len()
}

/// `len` as a helper size argument the verifier accepts: in `1..=max`, or `None`.
/// Written as `((len - 1) & mask) + 1` because LLVM turns a plain `len == 0 || len > max`
/// test into an unsigned range check whose lower bound the verifier does not learn.
#[inline(always)]
pub fn helper_len(len: usize, max: usize) -> Option<u32> {
    // The mask must cover every buffer: each caller's `max` is at most 16384 (asserted where
    // the buffers are defined).
    let n = (len as u32).wrapping_sub(1) & 0x3fff;
    if n as usize >= max || len == 0 {
        return None;
    }
    Some(n + 1)
}
