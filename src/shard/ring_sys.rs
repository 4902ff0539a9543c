//! Raw socket options that the safe crates (socket2, rustix) do not wrap.
//!
//! Lives beside the ring because project rule 9 keeps every `unsafe` block in the ring module,
//! each with a `// SAFETY:` comment saying who keeps the memory alive.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Attaches a classic BPF program to `socket`'s SO_REUSEPORT group (`SO_ATTACH_REUSEPORT_CBPF`).
///
/// Call it on any listening member of the group once all members listen; the program then
/// picks the socket for every new connection (see `crate::steering`).
pub fn attach_reuseport_cbpf(
    socket: BorrowedFd<'_>,
    program: &[libc::sock_filter],
) -> io::Result<()> {
    let len = u16::try_from(program.len()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("BPF program of {} instructions is too long", program.len()),
        )
    })?;
    let fprog = libc::sock_fprog {
        len,
        // The C struct wants `*mut`; the kernel only reads through it.
        filter: program.as_ptr().cast_mut(),
    };
    let optlen = libc::socklen_t::try_from(std::mem::size_of::<libc::sock_fprog>())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `fprog` lives on this stack frame and `program` is borrowed by the caller for the
    // whole call, so both stay valid until setsockopt returns; the kernel copies the
    // instructions into its own memory during the call (bpf_prog_create_from_user) and keeps no
    // pointer to ours afterwards. `socket` is a live descriptor for the duration of its borrow.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            std::ptr::from_ref(&fprog).cast::<libc::c_void>(),
            optlen,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `SO_INCOMING_CPU` of a socket: the CPU that last processed a packet for it, -1 if none yet.
///
/// rustix wraps this getsockopt safely, so no `unsafe` is needed here; it sits in this module
/// so the steering helpers are found together.
pub fn incoming_cpu(fd: BorrowedFd<'_>) -> io::Result<i32> {
    let cpu = rustix::net::sockopt::socket_incoming_cpu(fd)?;
    // The kernel stores an int; -1 (unset) comes back from rustix as u32::MAX.
    Ok(i32::from_ne_bytes(cpu.to_ne_bytes()))
}
