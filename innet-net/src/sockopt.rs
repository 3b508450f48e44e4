//! `setsockopt(2)` for the options the socket crates do not wrap (a DPU member's multicast
//! interface and router-alert option, a capture's forced buffer size and timeout).

use std::os::fd::AsRawFd;

/// Sets option `opt` of `level` on `sock` to `value`.
///
/// # Errors
/// The kernel refused it.
pub fn setsockopt<T>(
    sock: &impl AsRawFd,
    level: libc::c_int,
    opt: libc::c_int,
    value: &T,
) -> std::io::Result<()> {
    // SAFETY: setsockopt reads a value of exactly the size passed.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            opt,
            std::ptr::from_ref(value).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_option_is_set_and_a_bad_one_refused() {
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        setsockopt(&sock, libc::SOL_SOCKET, libc::SO_RCVBUF, &(1i32 << 16)).unwrap();
        let e = setsockopt(&sock, libc::SOL_SOCKET, -1, &0i32).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOPROTOOPT), "{e}");
    }
}
