//! What every eBPF object of innet carries besides its programs: the panic handler a
//! `no_std` binary needs (the verifier proves no panic is reachable) and the GPL license
//! the kernel asks of programs that call GPL-only helpers.

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
