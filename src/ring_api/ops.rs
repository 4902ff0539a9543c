//! The seam between the shard and its ring: every operation the shard, the file cache and the
//! access log ask of a ring, plus the clock their timers run on.
//!
//! `Ring` (the real io_uring, real time) implements it for the binary; the deterministic
//! simulator (`shard::sim`, tests only) implements it with plain memory, modelled sockets and
//! a virtual clock. Buffers are named by index, never by pointer, so no `unsafe` is needed on
//! this side of the seam.

use std::io;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use super::slots::{ArenaSlot, ConnSlot, FileSlot, SocketSlot};

/// What a shard needs from a ring (see `Ring` for each method's contract).
pub trait RingOps {
    /// Time since the ring was built; every shard timer runs on it.
    fn now(&self) -> Duration;
    /// How far this ring's clock starts after `epoch`, µs (0 where the clock is simulated).
    fn clock_offset_us(&self, epoch: std::time::Instant) -> u64;
    /// Which io_uring opcodes this ring supports.
    fn probe_supports(&self, opcode: u8) -> bool;
    /// Whether completions are deferred task work (DEFER_TASKRUN), for the start-up log.
    fn deferred_taskrun(&self) -> bool;
    /// Whether the kernel consumes receive buffers incrementally (a receive takes only the
    /// bytes it got), for the start-up log; the simulator takes whole buffers.
    fn recv_incremental(&self) -> bool {
        false
    }
    /// Submission entries pushed since start.
    fn sqes_pushed(&self) -> u64;
    /// Kernel entries (`io_uring_enter` calls) since start.
    fn enters(&self) -> u64;
    /// Times the kernel answered EBUSY.
    fn busy(&self) -> u64;
    /// Entries that had to wait because the SQ was full.
    fn unqueued_total(&self) -> u64;
    /// Completions waiting in the overflow list because the CQ was full.
    fn cq_overflow(&mut self) -> u32;

    /// Arms a multishot accept on `listener`; `None` when the ring itself is the source of
    /// connections (the simulator).
    fn accept_multi(&mut self, listener: Option<BorrowedFd<'_>>, token: u64);
    /// Arms a receive on a fixed socket (into a provided buffer); a `multishot` one stays
    /// armed, completing with `IORING_CQE_F_MORE` for each arrival, until it ends (no
    /// buffer, EOF, an error, a cancel).
    fn recv(&mut self, socket: SocketSlot, token: u64, multishot: bool);
    /// Takes ownership of provided buffer `bid` named by a receive completion.
    fn claim_recv(&mut self, bid: u16);
    /// The bytes a receive placed in provided buffer `bid`.
    fn recv_data(&self, bid: u16, len: usize) -> &[u8];
    /// Done with the `used` bytes a receive placed in provided buffer `bid`. With
    /// `kernel_keeps` (`Completion::buffer_more`: a buffer consumed incrementally, with room
    /// left) the kernel goes on filling it past them, so it goes back to the kernel as it is;
    /// otherwise it is provided to the ring again, whole.
    fn recycle_recv(&mut self, bid: u16, used: usize, kernel_keeps: bool);

    /// The header buffer of connection slot `conn`, for writing (not in flight).
    fn tx_mut(&mut self, conn: ConnSlot) -> &mut Vec<u8>;
    /// Sends `tx[conn][from..]`; the buffer is the ring's until `tx_done(conn)`.
    fn send_tx(&mut self, conn: ConnSlot, socket: SocketSlot, from: usize, flags: i32, token: u64);
    /// Asks the kernel for `socket`'s peer address (`len`: the listener family's `sockaddr`
    /// size) into connection `conn`'s peer buffer.
    fn get_peer(&mut self, conn: ConnSlot, socket: SocketSlot, len: usize, token: u64);
    /// The address bytes `get_peer` produced (`len` from its completion); the buffer is free
    /// for the slot's next connection.
    fn peer_done(&mut self, conn: ConnSlot, len: usize) -> &[u8];
    /// The send from `tx[conn]` completed.
    fn tx_done(&mut self, conn: ConnSlot);
    /// Bytes in connection `conn`'s header buffer.
    fn tx_len(&self, conn: ConnSlot) -> usize;
    /// Copies `tx[conn]` to the front of arena slot `slot`; returns its length. Neither may
    /// be in flight.
    fn copy_tx_to_arena(&mut self, conn: ConnSlot, slot: ArenaSlot) -> usize {
        // Taken out and put back: the header buffer and the arena are both borrowed from self.
        let tx = std::mem::take(self.tx_mut(conn));
        let n = tx.len();
        self.arena_mut(slot)[..n].copy_from_slice(&tx);
        *self.tx_mut(conn) = tx;
        n
    }
    /// Releases the memory of an idle connection's header buffer.
    fn tx_release(&mut self, conn: ConnSlot);

    /// Arena slot `slot` for writing by the shard (not in flight).
    fn arena_mut(&mut self, slot: ArenaSlot) -> &mut [u8];
    /// Arena slot `slot` for reading by the shard (not in flight).
    fn arena(&self, slot: ArenaSlot) -> &[u8];
    /// Copies `len` bytes of arena slot `from` at `from_off` to slot `to` at `to_off` (two
    /// distinct slots, neither in flight).
    fn arena_copy(
        &mut self,
        from: ArenaSlot,
        from_off: usize,
        to: ArenaSlot,
        to_off: usize,
        len: usize,
    );
    /// Rewrites arena slot `slot` out of place: `f(old bytes, new bytes)` fills a spare
    /// buffer from the slot's, and the spare becomes the slot's (the kernel must not own it).
    fn arena_rewrite(&mut self, slot: ArenaSlot, f: &mut dyn FnMut(&[u8], &mut [u8]));
    /// Reads `len` bytes of fixed file `file` at `file_offset` into `slot` at `buf_offset`.
    #[allow(clippy::too_many_arguments)]
    fn read_fixed(
        &mut self,
        slot: ArenaSlot,
        buf_offset: usize,
        len: usize,
        file: u32,
        file_offset: u64,
        rw_flags: i32,
        token: u64,
    );
    /// As `read_fixed` for background work (the scrub) at the idle I/O priority class: the
    /// block layer's scheduler (mq-deadline, bfq) dispatches clients' reads first. Where the
    /// ring has no priorities (the simulator), a plain read.
    fn read_fixed_idle(
        &mut self,
        slot: ArenaSlot,
        len: usize,
        file: u32,
        file_offset: u64,
        token: u64,
    ) {
        self.read_fixed(slot, 0, len, file, file_offset, 0, token);
    }
    /// Sends `len` bytes of arena slot `slot` from `offset` (MSG_DONTWAIT; SEND_ZC with
    /// `zerocopy`).
    #[allow(clippy::too_many_arguments)]
    fn send_arena(
        &mut self,
        slot: ArenaSlot,
        offset: usize,
        len: usize,
        socket: SocketSlot,
        flags: i32,
        zerocopy: bool,
        token: u64,
    );
    /// The ring is done with arena slot `slot`.
    fn arena_done(&mut self, slot: ArenaSlot);
    /// Sends static bytes, then closes the socket (linked).
    fn send_static_then_close(
        &mut self,
        socket: SocketSlot,
        bytes: &'static [u8],
        token: u64,
        close_token: u64,
    );
    /// Appends `buf` to the log file `fd`; the ring keeps it until `log_write_done`.
    fn write_log(&mut self, fd: BorrowedFd<'_>, buf: Vec<u8>, token: u64);
    /// The log write completed: its buffer, for reuse.
    fn log_write_done(&mut self) -> Vec<u8>;

    /// Closes fixed socket `socket`.
    fn close_fixed(&mut self, socket: SocketSlot, token: u64);
    /// Cancels every operation in flight on fixed socket `socket`.
    fn cancel_socket(&mut self, socket: SocketSlot, token: u64);
    /// Cancels the operation submitted with `target`.
    fn cancel_token(&mut self, target: u64, token: u64);
    /// Places an open file in file slot `index`.
    fn register_file(&mut self, index: FileSlot, fd: BorrowedFd<'_>) -> io::Result<()>;
    /// Empties file slot `index`.
    fn unregister_file(&mut self, index: FileSlot) -> io::Result<()>;
    /// The absolute fixed-file index of file slot `index`.
    fn file_fixed_index(&self, index: FileSlot) -> u32;
    /// Arms a one-shot poll for socket `socket` to become writable.
    fn poll_writable(&mut self, socket: SocketSlot, token: u64);
    /// Shuts down the write side of socket `socket`.
    fn shutdown_write(&mut self, socket: SocketSlot, token: u64);

    /// Arms a one-shot poll on a plain descriptor (an origin socket) for `events`.
    fn poll_fd(&mut self, fd: BorrowedFd<'_>, events: u32, token: u64);
    /// Sends `len` bytes of arena slot `slot` from `offset` on the plain socket `fd`.
    fn send_arena_fd(
        &mut self,
        slot: ArenaSlot,
        offset: usize,
        len: usize,
        fd: BorrowedFd<'_>,
        token: u64,
    );
    /// Receives at most `len` bytes from the plain socket `fd` into arena slot `slot` at
    /// `offset` (the slot is the kernel's until `arena_done`).
    fn recv_arena_fd(
        &mut self,
        slot: ArenaSlot,
        offset: usize,
        len: usize,
        fd: BorrowedFd<'_>,
        token: u64,
    );
    /// As `recv_arena_fd`, but never waits (MSG_DONTWAIT): `-EAGAIN` when nothing is there.
    /// An origin connection is probed so before it is reused and after each reply: any byte
    /// there is past a reply's end.
    fn probe_arena_fd(
        &mut self,
        slot: ArenaSlot,
        offset: usize,
        len: usize,
        fd: BorrowedFd<'_>,
        token: u64,
    );
    /// Writes the first `len` bytes of arena slot `slot` to file `fd` at `file_offset`, from
    /// the registered buffer (an O_DIRECT block write).
    fn write_arena_fd(
        &mut self,
        slot: ArenaSlot,
        len: usize,
        fd: BorrowedFd<'_>,
        file_offset: u64,
        token: u64,
    );
    /// Makes what was written to file `fd` durable (fdatasync).
    fn fsync_fd(&mut self, fd: BorrowedFd<'_>, token: u64);

    /// Submits queued entries and waits for at least `want` completions or `timeout`.
    fn submit_and_wait(&mut self, want: usize, timeout: Option<Duration>) -> io::Result<()>;
    /// Submits queued entries without running the completions other operations queued as
    /// deferred task work: what completes inline (a read from the page cache, a send into a
    /// socket with room, a receive whose bytes are there) is in the CQ when it returns, the
    /// rest waits for the next `submit_and_wait`. Where the ring defers nothing (the
    /// simulator), `submit_and_wait(0, None)`.
    fn submit_only(&mut self) -> io::Result<()> {
        self.submit_and_wait(0, None)
    }
    /// Submits and waits up to `timeout`, gathering a batch (see `Ring`).
    fn submit_and_wait_batched(
        &mut self,
        timeout: Duration,
        batch: Option<(usize, Duration)>,
    ) -> io::Result<()>;
    /// Moves up to `max` completions into `out`.
    fn drain_completions(&mut self, out: &mut Vec<Completion>, max: usize);
}

/// One completion, copied out of the CQ so handlers never hold the ring borrowed.
#[derive(Clone, Copy, Debug)]
pub struct Completion {
    /// The token the operation was submitted with.
    pub user_data: u64,
    /// Result: bytes, a slot index, or a negated errno.
    pub result: i32,
    /// CQE flags (`F_MORE`, `F_NOTIF`, buffer id).
    pub flags: u32,
}

impl Completion {
    /// More completions will follow for this submission (multishot, or SEND_ZC's notification).
    pub fn more(&self) -> bool {
        io_uring::cqueue::more(self.flags)
    }
    /// This is a SEND_ZC notification: the kernel is done with the buffer.
    pub fn is_notification(&self) -> bool {
        io_uring::cqueue::notif(self.flags)
    }
    /// The kernel keeps the provided buffer this receive used, to fill it further
    /// (`IORING_CQE_F_BUF_MORE`, incremental consumption): do not provide it again.
    pub fn buffer_more(&self) -> bool {
        io_uring::cqueue::buffer_more(self.flags)
    }
    /// The provided buffer a receive landed in.
    pub fn buffer_id(&self) -> Option<u16> {
        io_uring::cqueue::buffer_select(self.flags)
    }
}
