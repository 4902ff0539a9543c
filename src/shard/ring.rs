//! The ring module: every `unsafe` line of shardline's data path lives here.
//!
//! `Ring` owns the io_uring instance *and* every piece of memory the kernel may touch on the
//! shard's behalf: the registered buffer arena, the provided-buffer ring for receives and the
//! per-connection header buffers. Callers never hand raw pointers to the kernel; they name a
//! buffer by index, and the ring tracks which buffers are the kernel's until their completion
//! is acknowledged (`arena_done`, `tx_done`, `recycle_recv`). Mutating a buffer the kernel owns
//! is an invariant violation and panics, in release builds too.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use io_uring::{opcode, squeue, types, IoUring};

use crate::ring_api::custody::Custody;
use crate::ring_api::slots::{ArenaSlot, ConnSlot, FileSlot, SocketSlot};

/// Buffer group id of the provided-buffer ring used for receives.
/// The idle I/O priority class (IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT): background reads
/// the block layer's scheduler dispatches after every other class.
const IOPRIO_IDLE: u16 = 3 << 13;
const RECV_BUFFER_GROUP: u16 = 0;
/// `IOU_PBUF_RING_INC`: the kernel consumes a provided buffer a receive at a time, each taking
/// only the bytes it got (`RecvBuffers`).
const RECV_BUFFERS_INCREMENTAL: u16 = 2;
/// `RWF_DONTCACHE` (Linux 6.14+); the io-uring crate has no constant for it yet.
pub const RWF_DONTCACHE: i32 = 0x80;
/// On drop, how long the ring waits for cancelled operations to complete before it closes.
const DROP_DRAIN_TIMEOUT: Duration = Duration::from_millis(1000);
/// `io_uring_register` opcode that restricts auto-allocated fixed-file slots to a range.
const IORING_REGISTER_FILE_ALLOC_RANGE: libc::c_uint = 25;

/// Sizes of everything a ring owns; all of it is allocated in `Ring::new` and never grows.
#[derive(Clone, Debug)]
pub struct RingConfig {
    /// Submission queue entries.
    pub sq_entries: u32,
    /// Completion queue entries (should be several times the SQ for multishot ops).
    pub cq_entries: u32,
    /// Fixed-file slots reserved for accepted sockets (auto-allocated by accept).
    pub socket_slots: u32,
    /// Fixed-file slots for open files, after the socket slots.
    pub file_slots: u32,
    /// Registered arena slots.
    pub arena_slots: u16,
    /// Bytes per arena slot (one chunk).
    pub chunk_bytes: usize,
    /// Alignment of every arena slot (>= the largest O_DIRECT memory alignment we accept).
    pub arena_align_bytes: usize,
    /// Provided receive buffers (power of two).
    pub recv_buffers: u16,
    /// Bytes per provided receive buffer.
    pub recv_buffer_bytes: usize,
    /// Connection slots (one header buffer each).
    pub conn_slots: usize,
    /// Most entries that may wait in the unqueued FIFO (the SQ was full and the kernel would
    /// not take more, e.g. while its CQ overflow list is flushed): the most operations the
    /// shard can have in flight at once, from its config (`shard::unqueued_bound`). Every
    /// waiting entry is an operation in flight, so more is a bug that breaks that bound.
    pub unqueued_max_entries: usize,
}

pub use crate::ring_api::ops::Completion;

/// Anonymous, page-aligned memory mapped for the life of the ring.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mapping {
    /// Maps `len` bytes (rounded to pages) and touches them from the calling thread, so a pinned
    /// shard gets memory on its own NUMA node (first touch).
    fn new(len: usize) -> io::Result<Mapping> {
        assert!(len > 0);
        // SAFETY: an anonymous private mapping with no address hint; the kernel picks the
        // address. The result is checked before use and unmapped only in Drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap null"))?;
        Ok(Mapping { ptr, len })
    }

    fn base(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len came from our own successful mmap; Ring drops the IoUring (and with
        // it every registration that references this memory) before its Mappings.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// The provided-buffer ring: receives pick a buffer only when data arrives, so an idle
/// keep-alive connection holds no receive memory at all. Where the kernel consumes buffers
/// incrementally (`IOU_PBUF_RING_INC`, 6.12+), each receive takes only the bytes it needs from
/// the ring's head buffer and the next receive, from any socket, goes on after them: a head
/// trickled a byte at a time through many connections uses one buffer per 4 KiB received,
/// not one per receive (`offset` follows how far each buffer is filled).
struct RecvBuffers {
    ring: Mapping,
    bufs: Mapping,
    entries: u16,
    buffer_bytes: usize,
    /// Our copy of the tail; published to the kernel with a release store.
    tail: u16,
    /// Per buffer: bytes the kernel filled and we consumed since it was last provided (the
    /// next receive into it lands there). Always 0 without incremental consumption.
    offset: Vec<usize>,
}

impl RecvBuffers {
    fn new(entries: u16, buffer_bytes: usize) -> io::Result<RecvBuffers> {
        assert!(
            entries.is_power_of_two(),
            "recv_buffers must be a power of two"
        );
        let ring_len = usize::from(entries) * std::mem::size_of::<types::BufRingEntry>();
        let ring = Mapping::new(ring_len)?;
        let bufs = Mapping::new(usize::from(entries) * buffer_bytes)?;
        Ok(RecvBuffers {
            ring,
            bufs,
            entries,
            buffer_bytes,
            tail: 0,
            offset: vec![0; usize::from(entries)],
        })
    }

    fn entry_ptr(&self, index: u16) -> *mut types::BufRingEntry {
        let mask = self.entries - 1;
        // SAFETY: index & mask < entries, and the ring mapping holds `entries` entries.
        unsafe {
            self.ring
                .base()
                .cast::<types::BufRingEntry>()
                .add(usize::from(index & mask))
        }
    }

    /// Gives buffer `bid` back to the kernel, whole.
    fn provide(&mut self, bid: u16) {
        let slot = usize::from(bid);
        self.offset[slot] = 0;
        let addr = self.bufs.base() as u64 + (slot * self.buffer_bytes) as u64;
        let entry = self.entry_ptr(self.tail);
        // SAFETY: the entry lies inside our ring mapping; the kernel reads entries only up to
        // the published tail, and this one is past it until the release store below.
        unsafe {
            (*entry).set_addr(addr);
            (*entry).set_len(self.buffer_bytes as u32);
            (*entry).set_bid(bid);
        }
        self.tail = self.tail.wrapping_add(1);
        // SAFETY: the tail field overlays entry 0's reserved bytes inside our mapping; the
        // kernel reads it concurrently, hence the atomic release store.
        unsafe {
            let tail = types::BufRingEntry::tail(self.ring.base().cast::<types::BufRingEntry>());
            (*(tail as *const AtomicU16)).store(self.tail, Ordering::Release);
        }
    }

    fn data(&self, bid: u16, len: usize) -> &[u8] {
        let slot = usize::from(bid);
        let at = self.offset[slot];
        assert!(slot < usize::from(self.entries) && at + len <= self.buffer_bytes);
        // SAFETY: the kernel wrote `len` bytes into this buffer at `at` (where the last
        // receive into it ended) and handed them to us (the caller checked the custody:
        // `Ring::recv_data`); it writes only past them until `provide` returns the buffer.
        unsafe {
            std::slice::from_raw_parts(self.bufs.base().add(slot * self.buffer_bytes + at), len)
        }
    }

    /// The kernel keeps buffer `bid` (`IORING_CQE_F_BUF_MORE`): its next receive into it
    /// lands after the `used` bytes just consumed.
    fn advance(&mut self, bid: u16, used: usize) {
        let at = &mut self.offset[usize::from(bid)];
        *at += used;
        assert!(
            *at < self.buffer_bytes,
            "recv buffer {bid} kept with no room left"
        );
    }
}

/// The registered buffer arena: `slots` chunks, each aligned for O_DIRECT.
struct Arena {
    mem: Mapping,
    slot_stride: usize,
    chunk_bytes: usize,
    /// The registered buffer each slot names now (`arena_rewrite` swaps one with `spare`).
    buffer_of: Vec<u16>,
    /// The one registered buffer no slot names: where a slot's bytes are rewritten out of
    /// place. No kernel operation ever uses it while it is the spare.
    spare: u16,
}

impl Arena {
    /// Where registered buffer `buffer` starts in the mapping.
    fn buffer_base(&self, buffer: u16) -> *mut u8 {
        // SAFETY: `buffer` < slots + 1, the buffers the mapping was sized for.
        unsafe { self.mem.base().add(usize::from(buffer) * self.slot_stride) }
    }
}

/// A shard's io_uring plus all memory the kernel may touch for it.
pub struct Ring {
    // Field order matters: the IoUring is dropped (closing the ring and its registrations)
    // before the memory it references.
    uring: IoUring,
    arena: Arena,
    recv: RecvBuffers,
    /// The kernel consumes receive buffers incrementally (`RECV_BUFFERS_INCREMENTAL`).
    recv_incremental: bool,
    tx: super::header_buffers::HeaderBuffers,
    /// Per connection slot: where the kernel writes the peer's `sockaddr` (`get_peer`).
    peers: PeerBuffers,
    /// Which of the buffers above the kernel holds now (shared with the simulated ring).
    custody: Custody,
    log_in_flight: Option<Vec<u8>>,
    /// Entries that did not fit in the SQ, in submission order (TigerBeetle's `unqueued`).
    unqueued: VecDeque<squeue::Entry>,
    /// `RingConfig::unqueued_max_entries`.
    unqueued_max_entries: usize,
    socket_slots: u32,
    /// Whether SINGLE_ISSUER|DEFER_TASKRUN were accepted by the kernel.
    pub deferred_taskrun: bool,
    /// SQEs pushed since start (for metrics).
    pub sqes_pushed: u64,
    /// io_uring_enter calls made.
    pub enters: u64,
    /// Times the kernel answered EBUSY (its CQ overflow list must be reaped first).
    pub busy: u64,
    /// Entries that had to wait in the unqueued FIFO because the SQ was full.
    pub unqueued_total: u64,
    /// When the ring was built: the origin of the shard's clock (`RingOps::now`).
    started: std::time::Instant,
    /// Test hook: the kernel "takes nothing" on flush (as under EBUSY), so entries queue.
    #[cfg(test)]
    refuse_submits: bool,
}

impl Ring {
    /// Builds the ring, registers fixed files, the arena and the receive buffers.
    pub fn new(cfg: &RingConfig) -> io::Result<Ring> {
        assert!(cfg.arena_align_bytes.is_power_of_two());
        assert!(cfg.chunk_bytes.is_multiple_of(cfg.arena_align_bytes));
        let (uring, deferred_taskrun) = build_uring(cfg.sq_entries, cfg.cq_entries)?;

        let total_files = cfg.socket_slots + cfg.file_slots;
        uring.submitter().register_files_sparse(total_files)?;
        register_file_alloc_range(uring.as_raw_fd(), 0, cfg.socket_slots)?;

        let slot_stride = cfg.chunk_bytes;
        // One buffer more than the slots: the spare that sealing writes into.
        let buffers = usize::from(cfg.arena_slots) + 1;
        let mem = Mapping::new(buffers * slot_stride)?;
        let iovecs: Vec<libc::iovec> = (0..buffers)
            .map(|i| libc::iovec {
                // SAFETY: in-bounds offset of the arena mapping.
                iov_base: unsafe { mem.base().add(i * slot_stride) }.cast(),
                iov_len: cfg.chunk_bytes,
            })
            .collect();
        // SAFETY: every iovec points into `mem`, which the Ring owns and drops only after the
        // IoUring (whose close unregisters the buffers).
        unsafe { uring.submitter().register_buffers(&iovecs) }.map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "registering a {} MiB buffer arena failed ({e}); raise RLIMIT_MEMLOCK \
                     (ulimit -l) or lower arena_bytes",
                    (usize::from(cfg.arena_slots) * slot_stride) >> 20
                ),
            )
        })?;
        let arena = Arena {
            mem,
            slot_stride,
            chunk_bytes: cfg.chunk_bytes,
            buffer_of: (0..cfg.arena_slots).collect(),
            spare: cfg.arena_slots,
        };

        let mut recv = RecvBuffers::new(cfg.recv_buffers, cfg.recv_buffer_bytes)?;
        // Incremental consumption where the kernel has it (6.12+; older ones refuse the flag
        // with EINVAL and every receive takes a whole buffer).
        let register = |flags: u16| {
            // SAFETY: the ring mapping stays alive as long as the Ring (dropped after the
            // IoUring); it is page aligned as the kernel requires.
            unsafe {
                uring.submitter().register_buf_ring_with_flags(
                    recv.ring.base() as u64,
                    cfg.recv_buffers,
                    RECV_BUFFER_GROUP,
                    flags,
                )
            }
        };
        let incremental = match register(RECV_BUFFERS_INCREMENTAL) {
            Ok(()) => true,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                register(0)?;
                false
            }
            Err(e) => return Err(e),
        };
        let mut custody = Custody::new(
            usize::from(cfg.arena_slots),
            usize::from(cfg.recv_buffers),
            cfg.conn_slots,
            cfg.socket_slots,
            cfg.file_slots,
        );
        for bid in 0..cfg.recv_buffers {
            custody.provide_recv(bid);
            recv.provide(bid);
        }

        Ok(Ring {
            uring,
            arena,
            recv,
            recv_incremental: incremental,
            tx: crate::shard::header_buffers::HeaderBuffers::new(cfg.conn_slots),
            peers: PeerBuffers::new(cfg.conn_slots),
            custody,
            log_in_flight: None,
            unqueued: VecDeque::with_capacity(usize::try_from(cfg.sq_entries).unwrap_or(0)),
            unqueued_max_entries: cfg.unqueued_max_entries,
            socket_slots: cfg.socket_slots,
            deferred_taskrun,
            sqes_pushed: 0,
            enters: 0,
            busy: 0,
            unqueued_total: 0,
            started: std::time::Instant::now(),
            #[cfg(test)]
            refuse_submits: false,
        })
    }

    /// Queues `entry`. A full SQ never loses an entry nor panics: entries wait in the
    /// unqueued FIFO (in order) and go to the kernel at the next submit, once it has room.
    fn push(&mut self, entry: squeue::Entry) {
        self.sqes_pushed += 1;
        if self.unqueued.is_empty() && self.push_sq(&entry) {
            return;
        }
        // SQ full: offer what we have to the kernel now, then queue behind earlier entries.
        self.flush_unqueued();
        if self.unqueued.is_empty() && self.push_sq(&entry) {
            return;
        }
        assert!(
            self.unqueued.len() < self.unqueued_max_entries,
            "unqueued FIFO past {} entries: more operations in flight than the config allows",
            self.unqueued_max_entries
        );
        self.unqueued_total += 1;
        self.unqueued.push_back(entry);
    }

    fn push_sq(&mut self, entry: &squeue::Entry) -> bool {
        // SAFETY: every entry built by this module references only memory owned by the Ring
        // (arena, recv ring, tx buffers, log buffer) or 'static data, kept alive until its
        // completion; entries waiting in `unqueued` reference the same memory.
        unsafe { self.uring.submission().push(entry).is_ok() }
    }

    /// Submits the SQ (without waiting) and moves unqueued entries into the room it freed.
    fn flush_unqueued(&mut self) {
        #[cfg(test)]
        if self.refuse_submits {
            return;
        }
        self.enters += 1;
        match self.uring.submit() {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => self.busy += 1,
            // EAGAIN/EINTR: the kernel took nothing now; the entries stay queued for later.
            Err(_) => {}
        }
        while let Some(entry) = self.unqueued.front() {
            let entry = entry.clone();
            if !self.push_sq(&entry) {
                break;
            }
            self.unqueued.pop_front();
        }
    }

    /// Entries waiting for room in the SQ (they go out with the next submit).
    pub fn unqueued_len(&self) -> usize {
        self.unqueued.len()
    }

    /// Arms a multishot accept that places sockets straight into fixed-file slots.
    pub fn accept_multi(&mut self, listener: BorrowedFd<'_>, token: u64) {
        let e = opcode::AcceptMulti::new(types::Fd(listener.as_raw_fd()))
            .allocate_file_index(true)
            .build()
            .user_data(token);
        self.push(e);
    }

    /// Bytes per provided receive buffer.
    pub fn recv_buffer_bytes(&self) -> usize {
        self.recv.buffer_bytes
    }

    fn arena_ptr(&mut self, slot: ArenaSlot, offset: usize, len: usize) -> *mut u8 {
        let i = slot.index();
        assert!(offset
            .checked_add(len)
            .is_some_and(|end| end <= self.arena.chunk_bytes));
        self.custody.lend_arena(slot);
        // SAFETY: bounds asserted above.
        unsafe { self.arena.buffer_base(self.arena.buffer_of[i]).add(offset) }
    }

    fn submit_and_wait_inner(
        &mut self,
        want: usize,
        timeout: Option<Duration>,
        min_wait_usec: u32,
    ) -> io::Result<()> {
        if !self.unqueued.is_empty() {
            self.flush_unqueued();
        }
        // Never sleep while entries wait to be submitted or the kernel holds overflowed
        // completions: reap first (the caller drains the CQ right after this returns).
        let want = if !self.unqueued.is_empty() || self.cq_overflow_pending() {
            0
        } else {
            want
        };
        self.enters += 1;
        let res = match timeout {
            Some(t) if want > 0 => {
                let ts = types::Timespec::new()
                    .sec(t.as_secs())
                    .nsec(t.subsec_nanos());
                let mut args = types::SubmitArgs::new().timespec(&ts);
                if min_wait_usec > 0 {
                    args = args.min_wait_usec(min_wait_usec);
                }
                self.uring.submitter().submit_with_args(want, &args)
            }
            None if want > 0 => self.uring.submitter().submit_and_wait(want),
            _ => {
                // With DEFER_TASKRUN, completions of socket operations are queued as task work
                // that only an enter with GETEVENTS runs; the crate's submit() adds that flag
                // only when the kernel advertises IORING_SQ_TASKRUN. A busy loop (want == 0)
                // must still reap them, or a new request waits until the shard goes idle.
                let pending = self.uring.submission().len() as u32;
                // SAFETY: no argument pointer is passed; the SQ entries were pushed by `push`,
                // whose memory invariants hold until their completions.
                unsafe {
                    self.uring.submitter().enter::<libc::sigset_t>(
                        pending,
                        0,
                        io_uring::EnterFlags::GETEVENTS.bits(),
                        None,
                    )
                }
            }
        };
        match res {
            Ok(_) => Ok(()),
            // A timeout or a signal is a normal end of a wait.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR)) => Ok(()),
            // The kernel has overflowed completions to post before it takes more work: the
            // caller reaps the CQ now and the SQ entries go out with the next enter.
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                self.busy += 1;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    fn cq_overflow_pending(&mut self) -> bool {
        // IORING_SQ_CQ_OVERFLOW: completions wait in the kernel's overflow list.
        self.uring.submission().cq_overflow()
    }
}

/// The real ring behind the shard's seam (the operations live here, not in a second copy);
/// the clock is real time since the ring was built.
impl Ring {
    /// A receive with `flags` from a plain socket into an arena slot (`recv_arena_fd`,
    /// `probe_arena_fd`); the slot is the kernel's until `arena_done`.
    fn recv_arena_fd_flags(
        &mut self,
        slot: ArenaSlot,
        offset: usize,
        len: usize,
        fd: BorrowedFd<'_>,
        flags: i32,
        token: u64,
    ) {
        let ptr = self.arena_ptr(slot, offset, len);
        let e = opcode::Recv::new(types::Fd(fd.as_raw_fd()), ptr, len as u32)
            .flags(flags)
            .build()
            .user_data(token);
        self.push(e);
    }
}

impl crate::ring_api::ops::RingOps for Ring {
    fn now(&self) -> Duration {
        self.started.elapsed()
    }
    fn clock_offset_us(&self, epoch: std::time::Instant) -> u64 {
        u64::try_from(self.started.saturating_duration_since(epoch).as_micros()).unwrap_or(0)
    }
    /// Which io_uring opcodes this kernel supports.
    fn probe_supports(&self, opcode: u8) -> bool {
        let mut probe = io_uring::Probe::new();
        self.uring.submitter().register_probe(&mut probe).is_ok() && probe.is_supported(opcode)
    }
    fn deferred_taskrun(&self) -> bool {
        self.deferred_taskrun
    }
    fn recv_incremental(&self) -> bool {
        self.recv_incremental
    }
    fn sqes_pushed(&self) -> u64 {
        self.sqes_pushed
    }
    fn enters(&self) -> u64 {
        self.enters
    }
    fn busy(&self) -> u64 {
        self.busy
    }
    fn unqueued_total(&self) -> u64 {
        self.unqueued_total
    }
    /// Completions the kernel could not post because the CQ was full (it keeps them, with
    /// IORING_FEAT_NODROP, and posts them once we reap; a non-zero count means the CQ is too
    /// small for the load).
    fn cq_overflow(&mut self) -> u32 {
        self.uring.completion().overflow()
    }
    fn accept_multi(&mut self, listener: Option<BorrowedFd<'_>>, token: u64) {
        if let Some(l) = listener {
            Ring::accept_multi(self, l, token);
        }
    }
    /// Arms one receive on a fixed socket; the kernel picks a provided buffer when data comes.
    fn recv(&mut self, socket: SocketSlot, token: u64, multishot: bool) {
        let e = if multishot {
            opcode::RecvMulti::new(types::Fixed(socket.raw()), RECV_BUFFER_GROUP)
                .build()
                .user_data(token)
        } else {
            opcode::Recv::new(types::Fixed(socket.raw()), std::ptr::null_mut(), 0)
                .buf_group(RECV_BUFFER_GROUP)
                .build()
                .flags(squeue::Flags::BUFFER_SELECT)
                .user_data(token)
        };
        self.push(e);
    }
    /// Takes ownership of provided buffer `bid` named by a receive completion; it stays ours
    /// until `recycle_recv`.
    fn claim_recv(&mut self, bid: u16) {
        self.custody.claim_recv(bid);
    }
    /// The bytes a receive placed in provided buffer `bid`.
    fn recv_data(&self, bid: u16, len: usize) -> &[u8] {
        self.custody.check_recv_held(bid);
        self.recv.data(bid, len)
    }
    /// Hands provided buffer `bid` back once its bytes were copied out: as it is when the
    /// kernel keeps filling it, else provided again whole.
    fn recycle_recv(&mut self, bid: u16, used: usize, kernel_keeps: bool) {
        self.custody.provide_recv(bid);
        if kernel_keeps {
            self.recv.advance(bid, used);
        } else {
            self.recv.provide(bid);
        }
    }
    /// The header buffer of connection slot `conn`, for writing; it must not be in flight.
    fn tx_mut(&mut self, conn: ConnSlot) -> &mut Vec<u8> {
        self.tx.get_mut(conn.index())
    }
    /// Sends `tx[conn][from..]`; the buffer is the kernel's until `tx_done(conn)`.
    fn send_tx(&mut self, conn: ConnSlot, socket: SocketSlot, from: usize, flags: i32, token: u64) {
        // `lend` keeps the Vec untouched (asserted) until tx_done, so the heap block the
        // kernel reads stays where it is.
        let buf = self.tx.lend(conn.index(), from);
        let (ptr, len) = (buf.as_ptr(), buf.len());
        let e = opcode::Send::new(types::Fixed(socket.raw()), ptr, len as u32)
            .flags(flags | libc::MSG_NOSIGNAL)
            .build()
            .user_data(token);
        self.push(e);
    }
    /// Asks for the peer address of `socket` (`SO_PEERNAME`, a socket command on the direct
    /// descriptor) into connection `conn`'s peer buffer; `len` is the listener family's
    /// `sockaddr` size (the kernel refuses a buffer longer than the address).
    fn get_peer(&mut self, conn: ConnSlot, socket: SocketSlot, len: usize, token: u64) {
        self.custody.lend_peer(conn.index());
        let buf = &mut self.peers.bufs[conn.index()];
        assert!(len <= buf.len(), "peer address longer than its buffer");
        let e = opcode::GetSockOpt::new(
            types::Fixed(socket.raw()),
            libc::SOL_SOCKET as u32,
            libc::SO_PEERNAME as u32,
            buf.as_mut_ptr().cast(),
            len as u32,
        )
        .build()
        .user_data(token);
        self.push(e);
    }
    /// The peer address `get_peer` wrote (`len` bytes: the completion's result); the buffer
    /// is ours again.
    fn peer_done(&mut self, conn: ConnSlot, len: usize) -> &[u8] {
        self.custody.peer_done(conn.index());
        &self.peers.bufs[conn.index()][..len.min(crate::client::sockaddr::SOCKADDR_IN6_BYTES)]
    }
    /// The kernel is done with `tx[conn]` (its send completed).
    fn tx_done(&mut self, conn: ConnSlot) {
        self.tx.done(conn.index());
    }
    /// Bytes in connection `conn`'s header buffer.
    fn tx_len(&self, conn: ConnSlot) -> usize {
        self.tx.len(conn.index())
    }
    /// Releases the heap memory of an idle connection's header buffer.
    fn tx_release(&mut self, conn: ConnSlot) {
        self.tx.release(conn.index());
    }
    /// Arena slot `slot` for writing by the shard (the kernel must not own it).
    fn arena_mut(&mut self, slot: ArenaSlot) -> &mut [u8] {
        let i = slot.index();
        self.custody.check_arena_free(slot, "mutated");
        let base = self.arena.buffer_base(self.arena.buffer_of[i]);
        // SAFETY: the slot's buffer, in the arena mapping, which no kernel operation uses
        // (asserted); the &mut self borrow keeps any other view of it out.
        unsafe { std::slice::from_raw_parts_mut(base, self.arena.chunk_bytes) }
    }
    /// Arena slot `slot` for reading by the shard (the kernel must not own it).
    fn arena(&self, slot: ArenaSlot) -> &[u8] {
        let i = slot.index();
        self.custody.check_arena_free(slot, "read");
        let base = self.arena.buffer_base(self.arena.buffer_of[i]);
        // SAFETY: as in arena_mut; shared access to bytes no kernel op is writing.
        unsafe { std::slice::from_raw_parts(base, self.arena.chunk_bytes) }
    }
    fn arena_copy(
        &mut self,
        from: ArenaSlot,
        from_off: usize,
        to: ArenaSlot,
        to_off: usize,
        len: usize,
    ) {
        let (i, j) = (from.index(), to.index());
        assert_ne!(i, j, "an arena copy within one slot");
        self.custody.check_arena_free(from, "copied");
        self.custody.check_arena_free(to, "copied");
        let chunk = self.arena.chunk_bytes;
        assert!(from_off.checked_add(len).is_some_and(|e| e <= chunk));
        assert!(to_off.checked_add(len).is_some_and(|e| e <= chunk));
        let src = self.arena.buffer_base(self.arena.buffer_of[i]);
        let dst = self.arena.buffer_base(self.arena.buffer_of[j]);
        // SAFETY: two distinct slots' buffers (buffers do not overlap), bounds asserted, and
        // no kernel operation uses either (asserted); the &mut self borrow keeps every other
        // view out while the copy runs.
        unsafe { std::ptr::copy_nonoverlapping(src.add(from_off), dst.add(to_off), len) }
    }
    /// Rewrites slot `slot` out of place: `f` reads the slot's bytes and writes the spare
    /// buffer, which then becomes the slot's (its old buffer is the new spare).
    fn arena_rewrite(&mut self, slot: ArenaSlot, f: &mut dyn FnMut(&[u8], &mut [u8])) {
        let i = slot.index();
        self.custody.check_arena_free(slot, "rewritten");
        let (from, to) = (self.arena.buffer_of[i], self.arena.spare);
        assert_ne!(from, to);
        let len = self.arena.chunk_bytes;
        // SAFETY: two distinct registered buffers of the arena mapping (buffers do not
        // overlap: each is `slot_stride` >= `chunk_bytes` apart). No kernel operation uses
        // either: the slot's is not in flight (asserted) and the spare is never handed to the
        // kernel. The &mut self borrow keeps every other view out until `f` returns.
        let (src, dst) = unsafe {
            (
                std::slice::from_raw_parts(self.arena.buffer_base(from), len),
                std::slice::from_raw_parts_mut(self.arena.buffer_base(to), len),
            )
        };
        f(src, dst);
        self.arena.buffer_of[i] = to;
        self.arena.spare = from;
    }
    /// Reads `len` bytes of fixed file `file` at `file_offset` into arena slot `slot` at
    /// `buf_offset` (a registered-buffer read). The slot is the kernel's until `arena_done`.
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
    ) {
        self.custody.check_file_index(file);
        let ptr = self.arena_ptr(slot, buf_offset, len);
        let buffer = self.arena.buffer_of[slot.index()];
        let e = opcode::ReadFixed::new(types::Fixed(file), ptr, len as u32, buffer)
            .offset(file_offset)
            .rw_flags(rw_flags)
            .build()
            .user_data(token);
        self.push(e);
    }
    fn read_fixed_idle(
        &mut self,
        slot: ArenaSlot,
        len: usize,
        file: u32,
        file_offset: u64,
        token: u64,
    ) {
        self.custody.check_file_index(file);
        let ptr = self.arena_ptr(slot, 0, len);
        let buffer = self.arena.buffer_of[slot.index()];
        let e = opcode::ReadFixed::new(types::Fixed(file), ptr, len as u32, buffer)
            .offset(file_offset)
            .ioprio(IOPRIO_IDLE)
            .build()
            .user_data(token);
        self.push(e);
    }
    /// Sends `len` bytes of arena slot `slot` from `offset`; with `zerocopy`, as SEND_ZC from
    /// the registered buffer (the slot comes back only with the notification completion).
    ///
    /// Always `MSG_DONTWAIT`: a full socket completes the send short or with `-EAGAIN` instead
    /// of parking it in the kernel, so a client that stops reading never pins the slot; the
    /// caller waits for writability with `poll_writable`, holding nothing the kernel owns.
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
    ) {
        let ptr = self.arena_ptr(slot, offset, len);
        let flags = flags | libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT;
        let e = if zerocopy {
            opcode::SendZc::new(types::Fixed(socket.raw()), ptr, len as u32)
                .buf_index(Some(self.arena.buffer_of[slot.index()]))
                .flags(flags)
                .build()
        } else {
            opcode::Send::new(types::Fixed(socket.raw()), ptr, len as u32)
                .flags(flags)
                .build()
        };
        self.push(e.user_data(token));
    }
    /// The kernel is done with arena slot `slot` (its read, send or ZC notification arrived).
    fn arena_done(&mut self, slot: ArenaSlot) {
        self.custody.arena_done(slot);
    }
    /// Sends static bytes (canned responses), optionally linked to a close of the socket.
    fn send_static_then_close(
        &mut self,
        socket: SocketSlot,
        bytes: &'static [u8],
        token: u64,
        close_token: u64,
    ) {
        let e = opcode::Send::new(
            types::Fixed(socket.raw()),
            bytes.as_ptr(),
            bytes.len() as u32,
        )
        .flags(libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
        .build()
        .flags(squeue::Flags::IO_HARDLINK)
        .user_data(token);
        self.push(e);
        self.close_fixed(socket, close_token);
    }
    /// Appends `buf` to the log file `fd` (opened O_APPEND); the ring keeps the buffer until
    /// `log_write_done` hands it back. One log write at a time.
    fn write_log(&mut self, fd: BorrowedFd<'_>, buf: Vec<u8>, token: u64) {
        self.custody.lend_log();
        let (ptr, len) = (buf.as_ptr(), buf.len() as u32);
        // The Vec's heap block does not move when the Vec is moved into the Option.
        self.log_in_flight = Some(buf);
        let e = opcode::Write::new(types::Fd(fd.as_raw_fd()), ptr, len)
            .offset(u64::MAX)
            .build()
            .user_data(token);
        self.push(e);
    }
    /// The log write completed: its buffer, for reuse.
    fn log_write_done(&mut self) -> Vec<u8> {
        self.custody.log_done();
        self.log_in_flight
            .take()
            .expect("the custody had a log write")
    }
    /// Closes fixed socket `socket`.
    fn close_fixed(&mut self, socket: SocketSlot, token: u64) {
        let e = opcode::Close::new(types::Fixed(socket.raw()))
            .build()
            .user_data(token);
        self.push(e);
    }
    /// Cancels every operation in flight on fixed socket `socket`.
    fn cancel_socket(&mut self, socket: SocketSlot, token: u64) {
        let b = types::CancelBuilder::fd(types::Fixed(socket.raw())).all();
        let e = opcode::AsyncCancel2::new(b).build().user_data(token);
        self.push(e);
    }
    /// Cancels the operation submitted with `target`.
    fn cancel_token(&mut self, target: u64, token: u64) {
        let e = opcode::AsyncCancel::new(target).build().user_data(token);
        self.push(e);
    }
    /// Places an open file in fixed-file slot `index` (relative to the file range).
    fn register_file(&mut self, index: FileSlot, fd: BorrowedFd<'_>) -> io::Result<()> {
        self.custody.check_file_slot(index);
        self.uring
            .submitter()
            .register_files_update(self.socket_slots + index.raw(), &[fd.as_raw_fd()])?;
        Ok(())
    }
    /// Empties fixed-file slot `index` (relative to the file range).
    fn unregister_file(&mut self, index: FileSlot) -> io::Result<()> {
        self.custody.check_file_slot(index);
        self.uring
            .submitter()
            .register_files_update(self.socket_slots + index.raw(), &[-1])?;
        Ok(())
    }
    /// The absolute fixed-file index of file slot `index`.
    fn file_fixed_index(&self, index: FileSlot) -> u32 {
        self.socket_slots + index.raw()
    }
    /// Arms a one-shot poll for socket `socket` to become writable (no buffer involved).
    fn poll_writable(&mut self, socket: SocketSlot, token: u64) {
        let e = opcode::PollAdd::new(types::Fixed(socket.raw()), libc::POLLOUT as u32)
            .build()
            .user_data(token);
        self.push(e);
    }
    /// Shuts down the write side of socket `socket` (a FIN after what was sent).
    fn shutdown_write(&mut self, socket: SocketSlot, token: u64) {
        let e = opcode::Shutdown::new(types::Fixed(socket.raw()), libc::SHUT_WR)
            .build()
            .user_data(token);
        self.push(e);
    }
    /// Arms a one-shot poll on a plain descriptor. The caller keeps `fd` open until the
    /// completion (a descriptor is a number: closed early, the kernel would poll another file).
    fn poll_fd(&mut self, fd: BorrowedFd<'_>, events: u32, token: u64) {
        let e = opcode::PollAdd::new(types::Fd(fd.as_raw_fd()), events)
            .build()
            .user_data(token);
        self.push(e);
    }
    /// Sends from an arena slot on a plain socket (an origin request); the slot is the
    /// kernel's until `arena_done`.
    fn send_arena_fd(
        &mut self,
        slot: ArenaSlot,
        offset: usize,
        len: usize,
        fd: BorrowedFd<'_>,
        token: u64,
    ) {
        let ptr = self.arena_ptr(slot, offset, len);
        let e = opcode::Send::new(types::Fd(fd.as_raw_fd()), ptr, len as u32)
            .flags(libc::MSG_NOSIGNAL)
            .build()
            .user_data(token);
        self.push(e);
    }
    /// Receives from a plain socket straight into an arena slot (origin bytes land in the
    /// registered buffer they are written to disk from); the slot is the kernel's until
    /// `arena_done`.
    fn recv_arena_fd(
        &mut self,
        slot: ArenaSlot,
        offset: usize,
        len: usize,
        fd: BorrowedFd<'_>,
        token: u64,
    ) {
        self.recv_arena_fd_flags(slot, offset, len, fd, 0, token);
    }
    /// A receive that never waits (MSG_DONTWAIT: io_uring completes it with -EAGAIN instead
    /// of arming a poll); the slot is the kernel's until `arena_done`.
    fn probe_arena_fd(
        &mut self,
        slot: ArenaSlot,
        offset: usize,
        len: usize,
        fd: BorrowedFd<'_>,
        token: u64,
    ) {
        self.recv_arena_fd_flags(slot, offset, len, fd, libc::MSG_DONTWAIT, token);
    }
    /// Writes the front of an arena slot to a file from the registered buffer; the slot is
    /// the kernel's until `arena_done`.
    fn write_arena_fd(
        &mut self,
        slot: ArenaSlot,
        len: usize,
        fd: BorrowedFd<'_>,
        file_offset: u64,
        token: u64,
    ) {
        let ptr = self.arena_ptr(slot, 0, len);
        let buffer = self.arena.buffer_of[slot.index()];
        let e = opcode::WriteFixed::new(types::Fd(fd.as_raw_fd()), ptr, len as u32, buffer)
            .offset(file_offset)
            .build()
            .user_data(token);
        self.push(e);
    }
    /// fdatasync through the ring (no memory involved).
    fn fsync_fd(&mut self, fd: BorrowedFd<'_>, token: u64) {
        let e = opcode::Fsync::new(types::Fd(fd.as_raw_fd()))
            .flags(types::FsyncFlags::DATASYNC)
            .build()
            .user_data(token);
        self.push(e);
    }
    /// Submits queued SQEs and waits for at least `want` completions or `timeout`.
    fn submit_and_wait(&mut self, want: usize, timeout: Option<Duration>) -> io::Result<()> {
        self.submit_and_wait_inner(want, timeout, 0)
    }
    /// An enter without GETEVENTS: the entries are issued (inline completions are posted as
    /// it returns), the deferred task work of other sockets is left for the loop's next wait.
    /// No enter at all when nothing is queued.
    fn submit_only(&mut self) -> io::Result<()> {
        if !self.unqueued.is_empty() {
            self.flush_unqueued();
        }
        if !self.unqueued.is_empty() || self.cq_overflow_pending() {
            // Entries the SQ could not take, or completions the kernel holds back: the
            // reaping enter empties the way first.
            return self.submit_and_wait_inner(0, None, 0);
        }
        let pending = self.uring.submission().len() as u32;
        if pending == 0 {
            return Ok(());
        }
        self.enters += 1;
        // SAFETY: no argument pointer is passed; the SQ entries were pushed by `push`, whose
        // memory invariants hold until their completions.
        let res = unsafe {
            self.uring
                .submitter()
                .enter::<libc::sigset_t>(pending, 0, 0, None)
        };
        match res {
            Ok(_) => Ok(()),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR)) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                self.busy += 1;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
    /// Submits queued SQEs and waits for completions until `timeout`.
    ///
    /// With `batch` (and a kernel with IORING_FEAT_MIN_TIMEOUT, 6.12+) the wait gathers up to
    /// `batch.0` completions for at most `batch.1`, then returns as soon as one is there: one
    /// wake-up per batch of completions instead of one per completion, for at most that much
    /// added latency.
    fn submit_and_wait_batched(
        &mut self,
        timeout: Duration,
        batch: Option<(usize, Duration)>,
    ) -> io::Result<()> {
        let (want, min_wait_usec) = match batch {
            Some((want, min_wait)) if self.uring.params().is_feature_min_timeout() => {
                (want, min_wait.as_micros() as u32)
            }
            _ => (1, 0),
        };
        self.submit_and_wait_inner(want, Some(timeout), min_wait_usec)
    }
    /// Moves up to `max` completions into `out` (bounded batch; handlers never reap the ring).
    fn drain_completions(&mut self, out: &mut Vec<Completion>, max: usize) {
        let mut cq = self.uring.completion();
        cq.sync();
        for cqe in cq.by_ref().take(max) {
            out.push(Completion {
                user_data: cqe.user_data(),
                result: cqe.result(),
                flags: cqe.flags(),
            });
        }
    }
}

impl Drop for Ring {
    /// Cancels every operation still in flight and waits (bounded) for their completions, so
    /// the kernel is done with the arena, receive buffers and header buffers before the memory
    /// is unmapped (the IoUring itself is dropped after this, then the memory).
    fn drop(&mut self) {
        self.unqueued.clear();
        let cancel_all = opcode::AsyncCancel2::new(types::CancelBuilder::any())
            .build()
            .user_data(0);
        if !self.push_sq(&cancel_all) {
            let _ = self.uring.submit();
            let _ = self.push_sq(&cancel_all);
        }
        let deadline = std::time::Instant::now() + DROP_DRAIN_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            let ts = types::Timespec::new()
                .sec(0)
                .nsec(left.min(Duration::from_millis(50)).subsec_nanos());
            let args = types::SubmitArgs::new().timespec(&ts);
            let waited = self.uring.submitter().submit_with_args(1, &args);
            let mut cq = self.uring.completion();
            cq.sync();
            let reaped = cq.by_ref().count();
            // A wait that timed out with nothing reaped: nothing is left in flight.
            if reaped == 0 && waited.is_err() {
                break;
            }
        }
    }
}

/// Bytes a ring with these sizes charges to RLIMIT_MEMLOCK (when the process lacks
/// CAP_IPC_LOCK): the SQE array, the CQ ring with the SQ index array (after a header of at most
/// one cache line pair), the provided-buffer ring and the registered arena, each in whole pages.
/// Receive buffers and header buffers are ordinary memory. Checked on Linux 6.18, which charges
/// ring memory again; 5.12..6.13 charge only the arena and buffer ring, so this is an upper bound.
pub fn memlock_bytes(
    sq_entries: u32,
    cq_entries: u32,
    recv_buffers: u16,
    arena_slots: u16,
    chunk_bytes: usize,
    page_bytes: u64,
) -> u64 {
    const SQE_BYTES: u64 = 64;
    const CQE_BYTES: u64 = 16;
    const SQ_INDEX_BYTES: u64 = 4;
    const RINGS_HEADER_BYTES: u64 = 128;
    let pages = |bytes: u64| bytes.div_ceil(page_bytes).saturating_mul(page_bytes);
    // The kernel rounds both queues up to powers of two.
    let sq = u64::from(sq_entries.next_power_of_two());
    let cq = u64::from(cq_entries.next_power_of_two());
    let entry_bytes = std::mem::size_of::<types::BufRingEntry>() as u64;
    pages(sq * SQE_BYTES)
        + pages(RINGS_HEADER_BYTES + cq * CQE_BYTES + sq * SQ_INDEX_BYTES)
        + pages(u64::from(recv_buffers) * entry_bytes)
        // The slots, and the spare buffer records are sealed into.
        + (u64::from(arena_slots) + 1).saturating_mul(pages(chunk_bytes as u64))
}

fn build_uring(sq: u32, cq: u32) -> io::Result<(IoUring, bool)> {
    let deferred = IoUring::builder()
        .setup_cqsize(cq)
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_coop_taskrun()
        .setup_submit_all()
        .build(sq);
    match deferred {
        Ok(r) => Ok((r, true)),
        // Older kernels (< 6.1) refuse DEFER_TASKRUN: fall back to a plain ring.
        Err(_) => Ok((IoUring::builder().setup_cqsize(cq).build(sq)?, false)),
    }
}

fn register_file_alloc_range(ring_fd: RawFd, offset: u32, len: u32) -> io::Result<()> {
    let range = io_uring_file_index_range {
        off: offset,
        len,
        resv: 0,
    };
    // SAFETY: the argument struct lives on this stack frame for the duration of the call; the
    // kernel copies it and keeps no reference.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_io_uring_register,
            ring_fd,
            IORING_REGISTER_FILE_ALLOC_RANGE,
            &range as *const io_uring_file_index_range,
            0,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[repr(C)]
#[allow(non_camel_case_types)]
struct io_uring_file_index_range {
    off: u32,
    len: u32,
    resv: u64,
}

/// Opcode numbers, for probing support.
pub mod opcodes {
    /// SEND_ZC.
    pub const SEND_ZC: u8 = io_uring::opcode::SendZc::CODE;
    /// Multishot-capable ACCEPT.
    pub const ACCEPT: u8 = io_uring::opcode::Accept::CODE;
}

/// One `sockaddr_in6`-sized buffer per connection slot for `SO_PEERNAME`, allocated at start-up.
/// The kernel writes a buffer only while the custody lends it (one request per slot at a time); the
/// boxed slice never moves or shrinks while the Ring lives.
struct PeerBuffers {
    bufs: Box<[[u8; crate::client::sockaddr::SOCKADDR_IN6_BYTES]]>,
}

impl PeerBuffers {
    fn new(slots: usize) -> PeerBuffers {
        PeerBuffers {
            bufs: vec![[0; crate::client::sockaddr::SOCKADDR_IN6_BYTES]; slots].into_boxed_slice(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring_api::ops::RingOps;
    use std::os::fd::AsFd;
    use std::os::unix::fs::OpenOptionsExt;

    fn small_ring(sq_entries: u32) -> Ring {
        Ring::new(&RingConfig {
            sq_entries,
            cq_entries: 256,
            socket_slots: 4,
            file_slots: 4,
            arena_slots: 2,
            chunk_bytes: 8192,
            arena_align_bytes: 4096,
            recv_buffers: 4,
            recv_buffer_bytes: 4096,
            conn_slots: 2,
            unqueued_max_entries: 100,
        })
        .expect("a small ring (needs io_uring and 32 KiB of RLIMIT_MEMLOCK)")
    }

    impl Ring {
        fn nop(&mut self, token: u64) {
            self.push(opcode::Nop::new().build().user_data(token));
        }
    }

    /// More entries than the SQ holds, with no submit in between: none is lost, none panics,
    /// and every completion comes back in submission order.
    #[test]
    fn a_full_submission_queue_parks_entries_in_order() {
        let mut ring = small_ring(8);
        ring.refuse_submits = true;
        for t in 1..=100u64 {
            ring.nop(t);
        }
        assert_eq!(
            ring.unqueued_len(),
            92,
            "8 in the SQ, the rest queued in order"
        );
        ring.refuse_submits = false;
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while got.len() < 100 && std::time::Instant::now() < deadline {
            ring.submit_and_wait(1, Some(Duration::from_millis(100)))
                .expect("submit");
            let mut batch = Vec::new();
            ring.drain_completions(&mut batch, 1000);
            got.extend(batch.iter().map(|c| c.user_data));
        }
        assert_eq!(got, (1..=100).collect::<Vec<u64>>());
        assert_eq!(ring.unqueued_len(), 0);
        assert_eq!(ring.unqueued_total, 92);
        assert_eq!(ring.cq_overflow(), 0);
    }

    /// The FIFO holds exactly its configured bound while the kernel takes nothing (the SQ of 8
    /// plus 100 waiting), and the entry past it is the bug the bound exists to catch.
    #[test]
    fn the_unqueued_fifo_holds_its_configured_bound() {
        let mut ring = small_ring(8);
        ring.refuse_submits = true;
        for t in 1..=108u64 {
            ring.nop(t);
        }
        assert_eq!(ring.unqueued_len(), 100);
        let past = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ring.nop(109)));
        let message = past.expect_err("an entry past the bound panics");
        let message = message
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert!(message.contains("past 100 entries"), "{message}");
        ring.refuse_submits = false;
    }

    /// A ring dropped with operations in flight (a poll that would never complete) cancels
    /// them and returns instead of hanging or leaving the kernel with our memory.
    #[test]
    fn drop_cancels_what_is_in_flight() {
        let mut ring = small_ring(8);
        let (a, _b) = std::os::unix::net::UnixStream::pair().expect("socketpair");
        // POLLIN on a socket nobody writes to: in flight until cancelled.
        let e = opcode::PollAdd::new(types::Fd(a.as_raw_fd()), libc::POLLIN as u32)
            .build()
            .user_data(7);
        ring.push(e);
        ring.submit_and_wait(0, None).expect("submit");
        let t0 = std::time::Instant::now();
        drop(ring);
        assert!(t0.elapsed() < DROP_DRAIN_TIMEOUT * 2, "drop hung");
    }

    fn wait_for(ring: &mut Ring, token: u64) -> i32 {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            ring.submit_and_wait(1, Some(Duration::from_millis(100)))
                .expect("submit");
            let mut batch = Vec::new();
            ring.drain_completions(&mut batch, 16);
            if let Some(c) = batch.iter().find(|c| c.user_data == token) {
                return c.result;
            }
        }
        panic!("no completion for token {token}");
    }

    /// The origin side's operations on a real ring: a request sent from an arena slot over a
    /// plain TCP socket, the answer received into the slot, the slot written to a file with
    /// O_DIRECT from the registered buffer and made durable; the file holds the bytes.
    #[test]
    fn origin_side_ops_move_bytes_socket_to_slot_to_disk() {
        use std::io::{Read, Write};
        let mut ring = small_ring(16);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let payload: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
        let sent = payload.clone();
        let peer = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().expect("accept");
            let mut req = [0u8; 5];
            s.read_exact(&mut req).expect("request");
            assert_eq!(&req, b"HELLO");
            s.write_all(&sent).expect("answer");
        });
        let sock = std::net::TcpStream::connect(addr).expect("connect");
        let fd = sock.as_fd();
        let slot = ArenaSlot::new(0);
        ring.arena_mut(slot)[..5].copy_from_slice(b"HELLO");
        ring.poll_fd(fd, libc::POLLOUT as u32, 1);
        assert!(wait_for(&mut ring, 1) & libc::POLLOUT as i32 != 0);
        ring.send_arena_fd(slot, 0, 5, fd, 2);
        assert_eq!(wait_for(&mut ring, 2), 5);
        ring.arena_done(slot);
        let mut got = 0;
        while got < payload.len() {
            ring.recv_arena_fd(slot, got, payload.len() - got, fd, 3);
            let n = wait_for(&mut ring, 3);
            ring.arena_done(slot);
            assert!(n > 0, "recv: {n}");
            got += n as usize;
        }
        assert_eq!(&ring.arena(slot)[..payload.len()], &payload[..]);
        peer.join().expect("peer");

        let dir = tempfile::Builder::new()
            .prefix("shardline-ring")
            .tempdir_in("/var/tmp")
            .expect("a temp dir on disk");
        let path = dir.path().join("block");
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .expect("an O_DIRECT file (needs a file system that takes O_DIRECT)");
        ring.write_arena_fd(slot, payload.len(), file.as_fd(), 4096, 4);
        assert_eq!(wait_for(&mut ring, 4), payload.len() as i32);
        ring.arena_done(slot);
        ring.fsync_fd(file.as_fd(), 5);
        assert_eq!(wait_for(&mut ring, 5), 0);
        let on_disk = std::fs::read(&path).expect("read back");
        assert_eq!(on_disk.len(), 4096 + payload.len());
        assert_eq!(&on_disk[4096..], &payload[..]);
    }
}
