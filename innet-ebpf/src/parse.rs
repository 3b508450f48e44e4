//! Bounds-checked access to packet memory.

use aya_ebpf::programs::XdpContext;

/// A pointer to a `T` at `offset` bytes into the frame, if the whole `T` lies inside it.
/// The check sits right beside the pointer arithmetic, where the verifier wants it.
#[inline(always)]
pub fn ptr_at<T>(ctx: &XdpContext, offset: usize) -> Option<*const T> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + offset + core::mem::size_of::<T>() > end {
        return None;
    }
    Some((start + offset) as *const T)
}

/// Frame length in bytes.
#[inline(always)]
pub fn frame_len(ctx: &XdpContext) -> usize {
    ctx.data_end() - ctx.data()
}
