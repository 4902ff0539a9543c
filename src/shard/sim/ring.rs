//! The fake ring: the shard's `RingOps` over plain memory, modelled sockets (`Net`) and real
//! files read with `pread`, driven by a seed. Submitted operations wait in an in-flight table;
//! each wait runs the modelled kernel, which completes what can complete in a random order,
//! sometimes later than it could (reordering), sometimes not at all this round (SQ full), and
//! hands completions back in random batches. Time is virtual: it moves a little per
//! operation and per wait, and a wait with nothing to do jumps to the next client action or
//! its timeout, so every timer of the shard fires without sleeping.

use std::collections::VecDeque;
use std::io;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

use super::net::Net;
use super::origin::OriginRecv;
use super::rng::Rng;
use crate::ring_api::ops::RingOps;
use crate::ring_api::slots::{ArenaSlot, ConnSlot, FileSlot, SocketSlot};
use crate::shard::ring::{Completion, RingConfig};

/// CQE flag: a provided buffer was used (its id in the upper 16 bits).
const CQE_F_BUFFER: u32 = 1;
/// CQE flag: more completions follow for this submission.
const CQE_F_MORE: u32 = 2;
/// CQE flag: this is a SEND_ZC notification.
const CQE_F_NOTIF: u32 = 8;
/// Where the buffer id sits in the CQE flags.
const CQE_BUFFER_SHIFT: u32 = 16;
/// Longest a wait without a timeout may sleep in virtual time before it gives up.
const WAIT_FOREVER_CAP: Duration = Duration::from_secs(10);
/// Smallest step of the virtual clock when a wait finds nothing to do.
const IDLE_STEP: Duration = Duration::from_micros(50);

/// Fault rates of one run, in percent per opportunity.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// A receive finds no provided buffer although one is free.
    pub enobufs_pct: u64,
    /// A file read returns fewer bytes than asked.
    pub short_read_pct: u64,
    /// A file read fails with EIO.
    pub read_eio_pct: u64,
    /// The kernel takes no new submissions in a wait (a full SQ / EBUSY).
    pub sq_full_pct: u64,
    /// A completion that could be posted is held back to a later wait (reordering).
    pub defer_pct: u64,
    /// A writability poll ends with ECANCELED instead of readiness (a spurious wake).
    pub poll_cancel_pct: u64,
    /// Completion queue entries: beyond them completions wait in an overflow list (in order,
    /// as with IORING_FEAT_NODROP) until the shard drains.
    pub cq_entries: usize,
}

/// How often the modelled kernel took each interesting path (to see that a run explores).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Paths {
    /// Chunk sends refused with EAGAIN (a full socket).
    pub eagain: u64,
    /// Sends that took only part of what was offered.
    pub short_sends: u64,
    /// Writability polls armed.
    pub polls: u64,
    /// SEND_ZC sends.
    pub zc_sends: u64,
    /// Receives failed with ENOBUFS.
    pub enobufs: u64,
    /// Short file reads.
    pub short_reads: u64,
    /// Operations cancelled.
    pub cancelled: u64,
    /// Completions that overflowed the CQ.
    pub cq_overflows: u64,
    /// File reads failed with EIO.
    pub read_eios: u64,
    /// Operations of a failing cache disk that failed (`DiskFault`).
    pub disk_fault_ops: u64,
    /// Waits in which the kernel took no new submission (a full SQ).
    pub sq_full_waits: u64,
    /// Completions held back to a later wait.
    pub deferred: u64,
    /// Writability polls ended with a spurious ECANCELED.
    pub spurious_poll_cancels: u64,
    /// Arrivals a multishot receive posted and stayed armed after.
    pub multishot_recvs: u64,
    /// Multishot receives cancelled by the connection (its unread bytes at their bound).
    pub recv_cancels: u64,
}

impl Paths {
    /// Adds `o`'s counts to these.
    pub fn add(&mut self, o: &Paths) {
        self.eagain += o.eagain;
        self.short_sends += o.short_sends;
        self.polls += o.polls;
        self.zc_sends += o.zc_sends;
        self.enobufs += o.enobufs;
        self.short_reads += o.short_reads;
        self.cancelled += o.cancelled;
        self.cq_overflows += o.cq_overflows;
        self.read_eios += o.read_eios;
        self.disk_fault_ops += o.disk_fault_ops;
        self.sq_full_waits += o.sq_full_waits;
        self.deferred += o.deferred;
        self.spurious_poll_cancels += o.spurious_poll_cancels;
        self.multishot_recvs += o.multishot_recvs;
        self.recv_cancels += o.recv_cancels;
    }
}

/// What an in-flight operation does.
#[derive(Clone, Debug)]
enum SimOp {
    Recv {
        socket: SocketSlot,
        multishot: bool,
    },
    SendTx {
        conn: ConnSlot,
        socket: SocketSlot,
        from: usize,
    },
    SendArena {
        slot: ArenaSlot,
        off: usize,
        len: usize,
        socket: SocketSlot,
        zc: bool,
    },
    ZcNotif {
        socket: SocketSlot,
    },
    SendStatic {
        socket: SocketSlot,
        bytes: &'static [u8],
    },
    Read {
        slot: ArenaSlot,
        buf_off: usize,
        len: usize,
        file: u32,
        off: u64,
    },
    PollOut {
        socket: SocketSlot,
    },
    Shutdown {
        socket: SocketSlot,
    },
    Close {
        slot: SocketSlot,
    },
    CancelSocket {
        socket: SocketSlot,
    },
    CancelToken {
        target: u64,
    },
    LogWrite {
        len: usize,
    },
    /// A connect's writability poll on origin socket `fd` (`sock`: a duplicate, to see
    /// whether the filler shut it down).
    OriginConnect {
        sock: Arc<TcpStream>,
    },
    /// A send to the simulated origin on socket `fd`.
    OriginSend {
        slot: ArenaSlot,
        off: usize,
        len: usize,
        fd: i32,
        sock: Arc<TcpStream>,
    },
    /// A receive from the simulated origin on socket `fd`.
    OriginRecv {
        slot: ArenaSlot,
        off: usize,
        len: usize,
        fd: i32,
        sock: Arc<TcpStream>,
        /// MSG_DONTWAIT: -EAGAIN instead of waiting.
        nowait: bool,
    },
    /// A block write to a cache data file (a duplicate without O_DIRECT: the simulated
    /// arena is not aligned).
    BlockWrite {
        slot: ArenaSlot,
        len: usize,
        file: Arc<std::fs::File>,
        off: u64,
        /// The file's path, for the disk model.
        path: std::path::PathBuf,
    },
    /// An fdatasync of a cache data file (its path, for the disk model).
    Fsync {
        path: std::path::PathBuf,
    },
    GetPeer {
        conn: ConnSlot,
        socket: SocketSlot,
        len: usize,
    },
}

impl SimOp {
    /// The socket slot this operation acts on, if any.
    fn socket(&self) -> Option<SocketSlot> {
        match *self {
            SimOp::Recv { socket, .. }
            | SimOp::SendTx { socket, .. }
            | SimOp::SendArena { socket, .. }
            | SimOp::ZcNotif { socket, .. }
            | SimOp::SendStatic { socket, .. }
            | SimOp::PollOut { socket }
            | SimOp::GetPeer { socket, .. }
            | SimOp::Shutdown { socket } => Some(socket),
            SimOp::Close { slot } => Some(slot),
            _ => None,
        }
    }

    /// Writes to the socket's byte stream: they complete in submission order.
    fn is_stream_write(&self) -> bool {
        matches!(
            self,
            SimOp::SendTx { .. }
                | SimOp::SendArena { .. }
                | SimOp::SendStatic { .. }
                | SimOp::Shutdown { .. }
                | SimOp::Close { .. }
        )
    }
}

struct InFlight {
    token: u64,
    op: SimOp,
    seq: u64,
    /// The modelled kernel has taken it from the SQ.
    submitted: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RecvBuf {
    /// In the provided-buffer ring.
    Provided,
    /// Named by a posted completion, not yet claimed.
    Posted,
    /// Claimed by the shard.
    Lent,
}

/// The fake ring (see the module doc).
pub struct SimRing {
    rng: Rng,
    now: Duration,
    /// Sockets, clients and files: the world outside the ring.
    pub net: Net,
    /// Fault rates.
    pub faults: Faults,
    /// Whether SEND_ZC is offered.
    pub zerocopy: bool,
    /// The cache's block size: a short read of a cache data file ends on a multiple of it.
    pub cache_read_align: usize,
    /// The cache's directory: files registered from beneath it are cache data files.
    pub cache_dir: Option<std::path::PathBuf>,
    /// The disk model the block writes and fsyncs are told to (power-loss runs).
    pub disk: Option<Arc<super::disk::PowerDisk>>,
    socket_slots: u32,
    arena: Vec<Vec<u8>>,
    /// The buffer an out-of-place rewrite fills (`arena_rewrite`), then swaps in.
    arena_spare: Vec<u8>,
    /// Which buffers the kernel holds: the real ring's bookkeeping and assertions.
    custody: crate::ring_api::custody::Custody,
    recv_bufs: Vec<Vec<u8>>,
    recv_state: Vec<RecvBuf>,
    recv_free: VecDeque<u16>,
    tx: crate::shard::header_buffers::HeaderBuffers,
    /// Per connection slot: the peer address a `get_peer` wrote, and whether one is pending.
    peers: Vec<[u8; crate::client::sockaddr::SOCKADDR_IN6_BYTES]>,
    log_in_flight: Option<Vec<u8>>,
    files: Vec<Option<std::fs::File>>,
    /// Per file slot: it holds a cache data file (opened O_DIRECT by the fill).
    cache_files: Vec<bool>,
    /// One cache disk that fails (issue 43), and per file slot whether the file is on it.
    pub disk_fault: Option<super::cache_disks::DiskFault>,
    fault_files: Vec<bool>,
    /// Fixed socket slot -> socket id in `net`.
    fixed_sockets: Vec<Option<usize>>,
    ops: Vec<InFlight>,
    /// Completions of disk operations a stall holds (`FaultKind::Stall`).
    stalled: super::cache_disks::Stalls,
    next_seq: u64,
    cq: VecDeque<Completion>,
    /// Completions that did not fit in the CQ.
    cq_overflow: VecDeque<Completion>,
    accept: Option<u64>,
    /// The multishot accept of the TLS listener.
    accept_tls: Option<u64>,
    sqes_pushed: u64,
    enters: u64,
    /// Protocol violations seen by the ring (the run fails on any).
    pub violations: Vec<String>,
    /// Paths taken.
    pub paths: Paths,
}

impl SimRing {
    /// A ring sized like a real one for `cfg`, over `net`.
    pub fn new(cfg: &RingConfig, net: Net, seed: u64, faults: Faults, zerocopy: bool) -> SimRing {
        SimRing {
            rng: Rng::new(seed.wrapping_mul(31).wrapping_add(7)),
            now: Duration::ZERO,
            net,
            faults,
            zerocopy,
            cache_read_align: 0,
            cache_dir: None,
            disk: None,
            socket_slots: cfg.socket_slots,
            arena: (0..cfg.arena_slots)
                .map(|_| vec![0; cfg.chunk_bytes])
                .collect(),
            arena_spare: vec![0; cfg.chunk_bytes],
            custody: {
                let mut c = crate::ring_api::custody::Custody::new(
                    usize::from(cfg.arena_slots),
                    usize::from(cfg.recv_buffers),
                    cfg.conn_slots,
                    cfg.socket_slots,
                    cfg.file_slots,
                );
                // Every receive buffer starts with the kernel, as the real ring provides them.
                for bid in 0..cfg.recv_buffers {
                    c.provide_recv(bid);
                }
                c
            },
            recv_bufs: (0..cfg.recv_buffers)
                .map(|_| vec![0; cfg.recv_buffer_bytes])
                .collect(),
            recv_state: vec![RecvBuf::Provided; usize::from(cfg.recv_buffers)],
            recv_free: (0..cfg.recv_buffers).collect(),
            tx: crate::shard::header_buffers::HeaderBuffers::new(cfg.conn_slots),
            peers: vec![[0; crate::client::sockaddr::SOCKADDR_IN6_BYTES]; cfg.conn_slots],
            log_in_flight: None,
            files: (0..cfg.file_slots).map(|_| None).collect(),
            cache_files: vec![false; cfg.file_slots as usize],
            disk_fault: None,
            fault_files: vec![false; cfg.file_slots as usize],
            fixed_sockets: vec![None; cfg.socket_slots as usize],
            ops: Vec::new(),
            stalled: Default::default(),
            next_seq: 0,
            cq: VecDeque::new(),
            cq_overflow: VecDeque::new(),
            accept: None,
            accept_tls: None,
            sqes_pushed: 0,
            enters: 0,
            violations: Vec::new(),
            paths: Paths::default(),
        }
    }

    /// Arena slots the kernel holds now.
    pub fn arena_owned(&self, slot: ArenaSlot) -> bool {
        self.custody.arena_in_flight(slot)
    }

    /// Receive buffers not in the provided ring (held by the shard or in a posted completion).
    pub fn recv_buffers_out(&self) -> usize {
        self.recv_state
            .iter()
            .filter(|s| **s != RecvBuf::Provided)
            .count()
    }

    /// Operations in flight, not counting the multishot accept.
    pub fn ops_in_flight(&self) -> usize {
        self.ops.len() + self.stalled.len()
    }

    /// Completions posted and not yet drained.
    pub fn cq_len(&self) -> usize {
        self.cq.len() + self.cq_overflow.len()
    }

    fn push(&mut self, token: u64, op: SimOp) {
        self.sqes_pushed += 1;
        if let Some(slot) = op.socket() {
            if self.socket_id(slot).is_none() {
                self.violations.push(format!(
                    "{op:?} submitted on socket slot {slot}, which is closed"
                ));
            }
        }
        // Building and queueing an entry takes a little time (the tick budget sees it).
        self.now += Duration::from_micros(self.rng.below(20));
        self.ops.push(InFlight {
            token,
            op,
            seq: self.next_seq,
            submitted: false,
        });
        self.next_seq += 1;
    }

    fn post(&mut self, user_data: u64, result: i32, flags: u32) {
        let cqe = Completion {
            user_data,
            result,
            flags,
        };
        if self.cq.len() >= self.faults.cq_entries.max(1) || !self.cq_overflow.is_empty() {
            self.paths.cq_overflows += 1;
            self.cq_overflow.push_back(cqe);
        } else {
            self.cq.push_back(cqe);
        }
    }

    /// Moves overflowed completions into the CQ as room frees up.
    fn flush_overflow(&mut self) {
        while self.cq.len() < self.faults.cq_entries.max(1) {
            let Some(cqe) = self.cq_overflow.pop_front() else {
                return;
            };
            self.cq.push_back(cqe);
        }
    }

    fn socket_id(&self, slot: SocketSlot) -> Option<usize> {
        self.fixed_sockets.get(slot.index()).copied().flatten()
    }

    fn take_arena(&mut self, slot: ArenaSlot, offset: usize, len: usize) {
        let i = slot.index();
        assert!(
            offset + len <= self.arena[i].len(),
            "arena access out of bounds"
        );
        self.custody.lend_arena(slot);
    }

    /// One round of the modelled kernel: clients act, submissions are taken (unless the SQ is
    /// "full" this round), and every operation that can complete does, in a random order.
    fn run_kernel(&mut self) {
        for (token, res) in self.stalled.due(self.now) {
            self.post(token, res, 0);
        }
        let now_us = self.now.as_micros() as u64;
        self.net.act(now_us);
        if let Some(origin) = self.net.origin.as_mut() {
            origin.accept_pending();
        }
        self.accept_ready();
        let take_new = !self.rng.chance(self.faults.sq_full_pct);
        if !take_new && self.ops.iter().any(|o| !o.submitted) {
            self.paths.sq_full_waits += 1;
        }
        if take_new {
            for op in &mut self.ops {
                op.submitted = true;
            }
        }
        // A random order of the submitted operations.
        let mut order: Vec<u64> = self
            .ops
            .iter()
            .filter(|o| o.submitted)
            .map(|o| o.seq)
            .collect();
        for i in (1..order.len()).rev() {
            let j = self.rng.below(i as u64 + 1) as usize;
            order.swap(i, j);
        }
        for seq in order {
            let Some(i) = self.ops.iter().position(|o| o.seq == seq) else {
                continue; // completed by a cancel meanwhile
            };
            if self.blocked_by_earlier_write(i) {
                continue;
            }
            if self.rng.chance(self.faults.defer_pct) {
                self.paths.deferred += 1;
                continue;
            }
            self.try_complete(i);
        }
    }

    /// Writes to one socket leave in submission order.
    fn blocked_by_earlier_write(&self, i: usize) -> bool {
        let op = &self.ops[i];
        if !op.op.is_stream_write() {
            return false;
        }
        let socket = op.op.socket();
        self.ops
            .iter()
            .any(|o| o.seq < op.seq && o.op.is_stream_write() && o.op.socket() == socket)
    }

    fn accept_ready(&mut self) {
        while let Some(&(id, tls)) = self.net.backlog.front() {
            let armed = if tls {
                &mut self.accept_tls
            } else {
                &mut self.accept
            };
            let Some(token) = *armed else {
                return;
            };
            let Some(slot) = self.fixed_sockets.iter().position(|s| s.is_none()) else {
                // No fixed slot left: the multishot accept ends with ENFILE.
                *armed = None;
                self.post(token, -libc::ENFILE, 0);
                return;
            };
            self.net.backlog.pop_front();
            self.fixed_sockets[slot] = Some(id);
            self.post(token, slot as i32, CQE_F_MORE);
        }
    }

    /// Completes operation `i` if it can complete now (it stays in flight otherwise).
    fn try_complete(&mut self, i: usize) {
        let (token, seq) = (self.ops[i].token, self.ops[i].seq);
        let op = self.ops[i].op.clone();
        let done = match op {
            SimOp::Recv { socket, multishot } => self.complete_recv(token, socket, multishot),
            SimOp::SendTx { conn, socket, from } => {
                let bytes = self.tx.in_flight(conn.index(), from).to_vec();
                self.complete_send(token, socket, &bytes, true, false, true)
            }
            SimOp::SendArena {
                slot,
                off,
                len,
                socket,
                zc,
            } => {
                let bytes = self.arena[slot.index()][off..off + len].to_vec();
                let done = self.complete_send(token, socket, &bytes, false, zc, true);
                if done && zc {
                    // SEND_ZC: the buffer comes back with a notification, later.
                    self.ops.push(InFlight {
                        token,
                        op: SimOp::ZcNotif { socket },
                        seq: self.next_seq,
                        submitted: true,
                    });
                    self.next_seq += 1;
                }
                done
            }
            SimOp::ZcNotif { .. } => {
                // The peer's kernel acknowledges soon, whether or not its reader keeps up.
                let acked = self.rng.chance(50);
                if acked {
                    self.post(token, 0, CQE_F_NOTIF);
                }
                acked
            }
            SimOp::SendStatic { socket, bytes } => {
                // A canned answer goes into a fresh socket: the kernel takes it whole.
                self.complete_send(token, socket, bytes, true, false, false)
            }
            SimOp::Read {
                slot,
                buf_off,
                len,
                file,
                off,
            } => {
                self.complete_read(token, slot, buf_off, len, file, off);
                true
            }
            SimOp::PollOut { socket } => self.complete_poll(token, socket),
            SimOp::Shutdown { socket } => {
                if let Some(id) = self.socket_id(socket) {
                    self.net.socks[id].server_shut = true;
                }
                self.post(token, 0, 0);
                true
            }
            SimOp::Close { slot } => {
                self.complete_close(token, slot);
                true
            }
            SimOp::CancelSocket { socket } => {
                let n = self.cancel_where(|o| {
                    o.op.socket() == Some(socket)
                        && !matches!(o.op, SimOp::ZcNotif { .. } | SimOp::Close { .. })
                });
                self.post(token, if n > 0 { n as i32 } else { -libc::ENOENT }, 0);
                true
            }
            SimOp::CancelToken { target } => {
                if self
                    .ops
                    .iter()
                    .any(|o| o.token == target && matches!(o.op, SimOp::Recv { .. }))
                {
                    self.paths.recv_cancels += 1;
                }
                let mut n = self.cancel_where(|o| o.token == target);
                for tls in [false, true] {
                    let armed = if tls {
                        &mut self.accept_tls
                    } else {
                        &mut self.accept
                    };
                    if *armed == Some(target) {
                        *armed = None;
                        self.post(target, -libc::ECANCELED, 0);
                        n += 1;
                    }
                }
                self.post(token, if n > 0 { 0 } else { -libc::ENOENT }, 0);
                true
            }
            SimOp::LogWrite { len } => {
                self.post(token, len as i32, 0);
                true
            }
            SimOp::OriginConnect { sock, .. } => {
                let events = if shut_down(&sock) {
                    libc::POLLOUT | libc::POLLHUP
                } else {
                    libc::POLLOUT
                };
                self.post(token, i32::from(events), 0);
                true
            }
            SimOp::OriginSend {
                slot,
                off,
                len,
                fd,
                sock,
            } => {
                let res = if shut_down(&sock) {
                    -libc::EPIPE
                } else {
                    let bytes = self.arena[slot.index()][off..off + len].to_vec();
                    let now_us = self.now.as_micros() as u64;
                    let net = &mut self.net;
                    let origin = net
                        .origin
                        .as_mut()
                        .expect("an origin socket without an origin");
                    match origin.send(fd, &bytes, &net.files, now_us) {
                        Some(n) => n as i32,
                        None => -libc::ECONNRESET,
                    }
                };
                self.post(token, res, 0);
                true
            }
            SimOp::OriginRecv {
                slot,
                off,
                len,
                fd,
                sock,
                nowait,
            } => {
                if shut_down(&sock) {
                    self.post(token, 0, 0);
                    return self.finish(seq);
                }
                let now_us = self.now.as_micros() as u64;
                let origin = self
                    .net
                    .origin
                    .as_mut()
                    .expect("an origin socket without an origin");
                match origin.recv(fd, len, now_us) {
                    OriginRecv::Pending if nowait => {
                        self.post(token, -libc::EAGAIN, 0);
                        true
                    }
                    OriginRecv::Pending => false,
                    OriginRecv::Data(bytes) => {
                        self.arena[slot.index()][off..off + bytes.len()].copy_from_slice(&bytes);
                        self.post(token, bytes.len() as i32, 0);
                        true
                    }
                    OriginRecv::Eof => {
                        self.post(token, 0, 0);
                        true
                    }
                    OriginRecv::Reset => {
                        self.post(token, -libc::ECONNRESET, 0);
                        true
                    }
                }
            }
            SimOp::BlockWrite {
                slot,
                len,
                file,
                off,
                path,
            } => {
                let full = self
                    .net
                    .origin
                    .as_ref()
                    .map_or(0, |o| o.faults.disk_full_pct);
                let fault = self.disk_fault.as_mut().and_then(|f| f.hit(&path, true));
                if fault.is_some() {
                    self.paths.disk_fault_ops += 1;
                }
                let stall = fault.filter(|h| h.holds());
                let res = if let Some(super::cache_disks::FaultHit::Eio) = fault {
                    -libc::EIO
                } else if let Some(super::cache_disks::FaultHit::Short) = fault {
                    // Half of it reached the disk (a short write; the fill takes it as full).
                    let half = (len / 2).max(1);
                    match file.write_at(&self.arena[slot.index()][..half], off) {
                        Ok(n) => n as i32,
                        Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
                    }
                } else if self.rng.chance(full) {
                    -libc::ENOSPC
                } else {
                    let bytes = &self.arena[slot.index()][..len];
                    match file.write_at(bytes, off) {
                        Ok(n) => {
                            if let Some(d) = &self.disk {
                                crate::cache::watch::DiskWatch::wrote(
                                    &**d,
                                    &path,
                                    off,
                                    &bytes[..n],
                                );
                            }
                            n as i32
                        }
                        Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
                    }
                };
                if let Some(hit) = stall {
                    self.stalled.hold(hit, self.now, token, res);
                } else {
                    self.post(token, res, 0);
                }
                true
            }
            SimOp::Fsync { path } => {
                let fault = self.disk_fault.as_mut().and_then(|f| f.hit(&path, false));
                if fault.is_some() {
                    self.paths.disk_fault_ops += 1;
                }
                if let Some(hit) = fault.filter(|h| h.holds()) {
                    if let Some(d) = &self.disk {
                        crate::cache::watch::DiskWatch::synced(&**d, &path);
                    }
                    self.stalled.hold(hit, self.now, token, 0);
                } else if fault.is_some() {
                    self.post(token, -libc::EIO, 0);
                } else {
                    if let Some(d) = &self.disk {
                        crate::cache::watch::DiskWatch::synced(&**d, &path);
                    }
                    self.post(token, 0, 0);
                }
                true
            }
            SimOp::GetPeer { conn, socket, len } => {
                // Each simulated client has its own address: 10.x.y.z from its socket id.
                let res = match self.socket_id(socket) {
                    Some(id) if len >= crate::client::sockaddr::SOCKADDR_IN_BYTES => {
                        let id = id as u32 + 1;
                        let ip = std::net::Ipv4Addr::from(0x0a00_0000 | (id & 0x00ff_ffff));
                        let addr =
                            std::net::SocketAddr::new(ip.into(), 40_000 + (id % 20_000) as u16);
                        let mut b = [0u8; crate::client::sockaddr::SOCKADDR_IN6_BYTES];
                        let n = crate::client::sockaddr::encode(addr, &mut b);
                        self.peers[conn.index()][..n].copy_from_slice(&b[..n]);
                        n as i32
                    }
                    Some(_) => -libc::EINVAL,
                    None => -libc::ENOTCONN,
                };
                self.post(token, res, 0);
                true
            }
        };
        if done {
            self.finish(seq);
        }
    }

    /// Removes the completed operation `seq` from the in-flight table.
    fn finish(&mut self, seq: u64) {
        // By sequence number: a cancel may have removed entries before it meanwhile.
        if let Some(j) = self.ops.iter().position(|o| o.seq == seq) {
            self.ops.remove(j);
        }
    }

    /// Completes every in-flight operation matching `pred` with ECANCELED; returns how many.
    fn cancel_where(&mut self, pred: impl Fn(&InFlight) -> bool) -> usize {
        let mut n = 0;
        let mut i = 0;
        while i < self.ops.len() {
            if pred(&self.ops[i]) {
                // A cancelled SEND_ZC never took the buffer: no notification follows.
                let o = self.ops.remove(i);
                self.paths.cancelled += 1;
                self.post(o.token, -libc::ECANCELED, 0);
                n += 1;
            } else {
                i += 1;
            }
        }
        n
    }

    /// A multishot receive stays in flight after each arrival it posts (with
    /// `IORING_CQE_F_MORE`); it ends with its last completion (no buffer, EOF, an error), and
    /// when the CQ has no room for another, as the kernel ends one it cannot post for.
    fn complete_recv(&mut self, token: u64, socket: SocketSlot, multishot: bool) -> bool {
        let Some(id) = self.socket_id(socket) else {
            self.post(token, -libc::EBADF, 0);
            return true;
        };
        let s = &self.net.socks[id];
        if s.reset {
            self.post(token, -libc::ECONNRESET, 0);
            return true;
        }
        if s.to_server.is_empty() {
            if s.client_fin {
                self.post(token, 0, 0);
                return true;
            }
            return false;
        }
        let no_buffer = self.recv_free.is_empty() || self.rng.chance(self.faults.enobufs_pct);
        if no_buffer {
            self.paths.enobufs += 1;
            self.post(token, -libc::ENOBUFS, 0);
            return true;
        }
        let bid = self.recv_free.pop_front().expect("checked");
        let cap = self.recv_bufs[usize::from(bid)].len();
        let avail = self.net.socks[id].to_server.len().min(cap);
        let n = self.rng.split(avail);
        let s = &mut self.net.socks[id];
        let bytes = super::net::take_front(&mut s.to_server, n);
        self.recv_bufs[usize::from(bid)][..n].copy_from_slice(&bytes);
        self.recv_state[usize::from(bid)] = RecvBuf::Posted;
        let cq_full =
            self.cq.len() + 1 >= self.faults.cq_entries.max(1) || !self.cq_overflow.is_empty();
        let more = multishot && !cq_full;
        if more {
            self.paths.multishot_recvs += 1;
        }
        self.post(
            token,
            n as i32,
            CQE_F_BUFFER | (u32::from(bid) << CQE_BUFFER_SHIFT) | if more { CQE_F_MORE } else { 0 },
        );
        !more
    }

    /// A send into the client's modelled socket buffer. `blocking` sends (the header buffer,
    /// sent without MSG_DONTWAIT) wait for room; the others take what fits or fail with EAGAIN.
    /// With `may_split`, the socket may take any prefix of what fits.
    fn complete_send(
        &mut self,
        token: u64,
        socket: SocketSlot,
        bytes: &[u8],
        blocking: bool,
        zc: bool,
        may_split: bool,
    ) -> bool {
        let more = if zc { CQE_F_MORE } else { 0 };
        let Some(id) = self.socket_id(socket) else {
            self.post(token, -libc::EBADF, more);
            return true;
        };
        let s = &mut self.net.socks[id];
        if s.reset {
            self.post(token, -libc::ECONNRESET, more);
            return true;
        }
        if s.server_shut {
            self.post(token, -libc::EPIPE, more);
            return true;
        }
        let room = s.sndbuf_bytes.saturating_sub(s.to_client.len());
        if room == 0 {
            if blocking {
                return false;
            }
            self.paths.eagain += 1;
            self.post(token, -libc::EAGAIN, more);
            return true;
        }
        let n = if may_split {
            self.rng.split(bytes.len().min(room))
        } else {
            bytes.len().min(room)
        };
        if n < bytes.len() {
            self.paths.short_sends += 1;
        }
        if zc {
            self.paths.zc_sends += 1;
        }
        let s = &mut self.net.socks[id];
        s.to_client.extend(&bytes[..n]);
        s.written_total += n as u64;
        self.post(token, n as i32, more);
        true
    }

    fn complete_poll(&mut self, token: u64, socket: SocketSlot) -> bool {
        let Some(id) = self.socket_id(socket) else {
            self.post(token, -libc::EBADF, 0);
            return true;
        };
        if self.rng.chance(self.faults.poll_cancel_pct) {
            self.paths.spurious_poll_cancels += 1;
            self.post(token, -libc::ECANCELED, 0);
            return true;
        }
        let s = &self.net.socks[id];
        if s.reset {
            self.post(token, (libc::POLLERR | libc::POLLHUP) as i32, 0);
            return true;
        }
        let room = s.sndbuf_bytes.saturating_sub(s.to_client.len());
        if room * 2 >= s.sndbuf_bytes {
            self.post(token, libc::POLLOUT as i32, 0);
            return true;
        }
        false
    }

    fn complete_read(
        &mut self,
        token: u64,
        slot: ArenaSlot,
        buf_off: usize,
        len: usize,
        file: u32,
        off: u64,
    ) {
        let index = file.checked_sub(self.socket_slots);
        let Some(f) = index
            .and_then(|i| self.files.get(i as usize))
            .and_then(|f| f.as_ref())
        else {
            self.violations
                .push(format!("read on file slot {file}, which holds no file"));
            self.post(token, -libc::EBADF, 0);
            return;
        };
        if self.rng.chance(self.faults.read_eio_pct) {
            self.paths.read_eios += 1;
            self.post(token, -libc::EIO, 0);
            return;
        }
        let on_fault_disk = index.is_some_and(|i| self.fault_files[i as usize]);
        let fault = on_fault_disk
            .then(|| self.disk_fault.as_mut()?.read())
            .flatten();
        let stall = fault.filter(|h| h.holds());
        if fault.is_some() {
            self.paths.disk_fault_ops += 1;
        }
        if fault.is_some() && stall.is_none() {
            self.post(token, -libc::EIO, 0);
            return;
        }
        let cache_file = index.is_some_and(|i| self.cache_files[i as usize]);
        let want = if self.rng.chance(self.faults.short_read_pct) {
            self.paths.short_reads += 1;
            let n = self.rng.split(len);
            // An O_DIRECT read comes back short only on its alignment (a cache data file's
            // reads are whole blocks, and the shard checks that a short one ends on one).
            match self.cache_read_align {
                a if cache_file && a > 0 && n >= a => n / a * a,
                _ if cache_file => len,
                _ => n,
            }
        } else {
            len
        };
        let buf = &mut self.arena[slot.index()][buf_off..buf_off + want];
        let res = match f.read_at(buf, off) {
            Ok(n) => n as i32,
            Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
        };
        // A cached block that went bad on the disk: its checksum must catch it.
        let corrupt = self.net.origin.as_ref().map_or(0, |o| o.faults.corrupt_pct);
        if cache_file && res > 0 && self.rng.chance(corrupt) {
            let at = buf_off + self.rng.below(res as u64) as usize;
            self.arena[slot.index()][at] ^= 0x5a;
        }
        if let Some(hit) = stall {
            self.stalled.hold(hit, self.now, token, res);
        } else {
            self.post(token, res, 0);
        }
    }

    fn complete_close(&mut self, token: u64, slot: SocketSlot) {
        if slot.raw() < self.socket_slots {
            let others = self
                .ops
                .iter()
                .filter(|o| o.op.socket() == Some(slot) && !matches!(o.op, SimOp::Close { .. }))
                .count();
            if others > 0 {
                self.violations.push(format!(
                    "socket slot {slot} closed with {others} operations in flight"
                ));
            }
            match self.fixed_sockets[slot.index()].take() {
                Some(id) => self.net.socks[id].server_closed = true,
                None => self
                    .violations
                    .push(format!("close of socket slot {slot}, which is empty")),
            }
        }
        self.post(token, 0, 0);
    }

    fn wait(&mut self, want: usize, timeout: Option<Duration>) {
        self.enters += 1;
        self.flush_overflow();
        self.now += Duration::from_micros(self.rng.below(200));
        self.run_kernel();
        if want == 0 || !self.cq.is_empty() {
            return;
        }
        let deadline = self.now + timeout.unwrap_or(WAIT_FOREVER_CAP);
        while self.cq.is_empty() && self.now < deadline {
            let stalled = self.stalled.next().unwrap_or(deadline);
            let net = self.net.next_event_us(self.now.as_micros() as u64);
            let next = net.map_or(deadline, Duration::from_micros).min(stalled);
            self.now = next.min(deadline).max(self.now + IDLE_STEP);
            self.run_kernel();
        }
    }
}

/// Whether the filler shut origin socket `sock` down (a stage past its deadline): a peek
/// then finds the end of the stream, where a live connection (no byte ever crosses it) has
/// nothing to read.
fn shut_down(sock: &TcpStream) -> bool {
    matches!(sock.peek(&mut [0u8; 1]), Ok(0))
}

/// A duplicate of origin socket `fd`, to peek at.
fn origin_socket(fd: BorrowedFd<'_>) -> io::Result<Arc<TcpStream>> {
    Ok(Arc::new(TcpStream::from(fd.try_clone_to_owned()?)))
}

/// A duplicate of file `fd` with O_DIRECT cleared (on the open file itself, which the
/// duplicate shares: the simulated arena is not aligned), and whether it was set.
/// The path `fd` was opened at (for the disk model; empty when it cannot be read).
fn fd_path(fd: BorrowedFd<'_>) -> std::path::PathBuf {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap_or_default()
}

fn without_direct_io(fd: BorrowedFd<'_>) -> io::Result<(std::fs::File, bool)> {
    use rustix::fs::OFlags;
    let owned: OwnedFd = fd.try_clone_to_owned()?;
    let flags = rustix::fs::fcntl_getfl(&owned)?;
    let direct = flags.contains(OFlags::DIRECT);
    if direct {
        rustix::fs::fcntl_setfl(&owned, flags - OFlags::DIRECT)?;
    }
    Ok((std::fs::File::from(owned), direct))
}

impl SimRing {
    /// A receive from the simulated origin on socket `fd` (`nowait`: MSG_DONTWAIT, answered
    /// -EAGAIN when nothing is there).
    fn origin_recv(
        &mut self,
        slot: ArenaSlot,
        offset: usize,
        len: usize,
        fd: BorrowedFd<'_>,
        nowait: bool,
        token: u64,
    ) {
        self.take_arena(slot, offset, len);
        let Ok(sock) = origin_socket(fd) else {
            return self
                .violations
                .push(format!("receive on a closed descriptor {fd:?}"));
        };
        let fd = fd.as_raw_fd();
        self.push(
            token,
            SimOp::OriginRecv {
                slot,
                off: offset,
                len,
                fd,
                sock,
                nowait,
            },
        );
    }
}

impl RingOps for SimRing {
    fn now(&self) -> Duration {
        self.now
    }
    fn clock_offset_us(&self, _epoch: std::time::Instant) -> u64 {
        0
    }
    fn probe_supports(&self, opcode: u8) -> bool {
        opcode != crate::shard::ring::opcodes::SEND_ZC || self.zerocopy
    }
    fn deferred_taskrun(&self) -> bool {
        false
    }
    fn sqes_pushed(&self) -> u64 {
        self.sqes_pushed
    }
    fn enters(&self) -> u64 {
        self.enters
    }
    fn busy(&self) -> u64 {
        0
    }
    fn unqueued_total(&self) -> u64 {
        0
    }
    fn cq_overflow(&mut self) -> u32 {
        self.cq_overflow.len() as u32
    }
    fn accept_multi(&mut self, listener: Option<BorrowedFd<'_>>, token: u64) {
        assert!(listener.is_none(), "the simulator has no listener");
        let tls = crate::ring_api::token::Token::decode(token)
            .is_some_and(|t| t.op == crate::ring_api::token::Op::AcceptTls);
        let armed = if tls {
            &mut self.accept_tls
        } else {
            &mut self.accept
        };
        assert!(armed.is_none(), "second multishot accept armed");
        *armed = Some(token);
    }
    fn recv(&mut self, socket: SocketSlot, token: u64, multishot: bool) {
        self.push(token, SimOp::Recv { socket, multishot });
    }
    fn claim_recv(&mut self, bid: u16) {
        self.custody.claim_recv(bid);
        let s = &mut self.recv_state[usize::from(bid)];
        assert_eq!(
            *s,
            RecvBuf::Posted,
            "recv buffer {bid} claimed before a completion"
        );
        *s = RecvBuf::Lent;
    }
    fn recv_data(&self, bid: u16, len: usize) -> &[u8] {
        self.custody.check_recv_held(bid);
        &self.recv_bufs[usize::from(bid)][..len]
    }
    fn recycle_recv(&mut self, bid: u16, _used: usize, kernel_keeps: bool) {
        // The simulated kernel takes a whole buffer per receive (never `buffer_more`).
        assert!(
            !kernel_keeps,
            "recv buffer {bid}: the simulator keeps no buffer"
        );
        self.custody.provide_recv(bid);
        self.recv_state[usize::from(bid)] = RecvBuf::Provided;
        self.recv_free.push_back(bid);
    }
    fn tx_mut(&mut self, conn: ConnSlot) -> &mut Vec<u8> {
        self.tx.get_mut(conn.index())
    }
    fn send_tx(
        &mut self,
        conn: ConnSlot,
        socket: SocketSlot,
        from: usize,
        _flags: i32,
        token: u64,
    ) {
        self.tx.lend(conn.index(), from);
        self.push(token, SimOp::SendTx { conn, socket, from });
    }
    fn get_peer(&mut self, conn: ConnSlot, socket: SocketSlot, len: usize, token: u64) {
        self.custody.lend_peer(conn.index());
        self.push(token, SimOp::GetPeer { conn, socket, len });
    }
    fn peer_done(&mut self, conn: ConnSlot, len: usize) -> &[u8] {
        self.custody.peer_done(conn.index());
        &self.peers[conn.index()][..len.min(crate::client::sockaddr::SOCKADDR_IN6_BYTES)]
    }
    fn tx_done(&mut self, conn: ConnSlot) {
        self.tx.done(conn.index());
    }
    fn tx_len(&self, conn: ConnSlot) -> usize {
        self.tx.len(conn.index())
    }
    fn tx_release(&mut self, conn: ConnSlot) {
        self.tx.release(conn.index());
    }
    fn arena_mut(&mut self, slot: ArenaSlot) -> &mut [u8] {
        self.custody.check_arena_free(slot, "mutated");
        &mut self.arena[slot.index()]
    }
    fn arena(&self, slot: ArenaSlot) -> &[u8] {
        self.custody.check_arena_free(slot, "read");
        &self.arena[slot.index()]
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
        let (a, b) = if i < j {
            let (lo, hi) = self.arena.split_at_mut(j);
            (&lo[i], &mut hi[0])
        } else {
            let (lo, hi) = self.arena.split_at_mut(i);
            (&hi[0], &mut lo[j])
        };
        b[to_off..to_off + len].copy_from_slice(&a[from_off..from_off + len]);
    }
    fn arena_rewrite(&mut self, slot: ArenaSlot, f: &mut dyn FnMut(&[u8], &mut [u8])) {
        self.custody.check_arena_free(slot, "rewritten");
        // Stale bytes in the spare, as on the real ring: only what `f` writes may be used.
        self.arena_spare.fill(0xa5);
        f(&self.arena[slot.index()], &mut self.arena_spare);
        std::mem::swap(&mut self.arena[slot.index()], &mut self.arena_spare);
    }
    fn read_fixed(
        &mut self,
        slot: ArenaSlot,
        buf_offset: usize,
        len: usize,
        file: u32,
        file_offset: u64,
        _rw_flags: i32,
        token: u64,
    ) {
        self.custody.check_file_index(file);
        self.take_arena(slot, buf_offset, len);
        self.push(
            token,
            SimOp::Read {
                slot,
                buf_off: buf_offset,
                len,
                file,
                off: file_offset,
            },
        );
    }
    fn send_arena(
        &mut self,
        slot: ArenaSlot,
        offset: usize,
        len: usize,
        socket: SocketSlot,
        _flags: i32,
        zerocopy: bool,
        token: u64,
    ) {
        assert!(len > 0, "empty chunk send");
        self.take_arena(slot, offset, len);
        self.push(
            token,
            SimOp::SendArena {
                slot,
                off: offset,
                len,
                socket,
                zc: zerocopy,
            },
        );
    }
    fn arena_done(&mut self, slot: ArenaSlot) {
        self.custody.arena_done(slot);
    }
    fn send_static_then_close(
        &mut self,
        socket: SocketSlot,
        bytes: &'static [u8],
        token: u64,
        close_token: u64,
    ) {
        self.push(token, SimOp::SendStatic { socket, bytes });
        self.close_fixed(socket, close_token);
    }
    fn write_log(&mut self, _fd: BorrowedFd<'_>, buf: Vec<u8>, token: u64) {
        self.custody.lend_log();
        let len = buf.len();
        self.log_in_flight = Some(buf);
        self.push(token, SimOp::LogWrite { len });
    }
    fn log_write_done(&mut self) -> Vec<u8> {
        self.custody.log_done();
        self.log_in_flight
            .take()
            .expect("the custody had a log write")
    }
    fn close_fixed(&mut self, socket: SocketSlot, token: u64) {
        self.push(token, SimOp::Close { slot: socket });
    }
    fn cancel_socket(&mut self, socket: SocketSlot, token: u64) {
        self.push(token, SimOp::CancelSocket { socket });
    }
    fn cancel_token(&mut self, target: u64, token: u64) {
        self.push(token, SimOp::CancelToken { target });
    }
    fn register_file(&mut self, index: FileSlot, fd: BorrowedFd<'_>) -> io::Result<()> {
        self.custody.check_file_slot(index);
        let (file, _) = without_direct_io(fd)?;
        let path = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
        self.files[index.index()] = Some(file);
        self.cache_files[index.index()] =
            self.cache_dir.as_ref().is_some_and(|d| path.starts_with(d));
        self.fault_files[index.index()] = self
            .disk_fault
            .as_ref()
            .is_some_and(|f| path.starts_with(&f.dir));
        Ok(())
    }
    fn unregister_file(&mut self, index: FileSlot) -> io::Result<()> {
        self.custody.check_file_slot(index);
        let busy = self.ops.iter().any(
            |o| matches!(o.op, SimOp::Read { file, .. } if file == self.socket_slots + index.raw()),
        );
        if busy {
            self.violations.push(format!(
                "file slot {index} unregistered with a read in flight"
            ));
        }
        self.files[index.index()] = None;
        Ok(())
    }
    fn file_fixed_index(&self, index: FileSlot) -> u32 {
        self.socket_slots + index.raw()
    }
    fn poll_writable(&mut self, socket: SocketSlot, token: u64) {
        self.paths.polls += 1;
        self.push(token, SimOp::PollOut { socket });
    }
    fn shutdown_write(&mut self, socket: SocketSlot, token: u64) {
        self.push(token, SimOp::Shutdown { socket });
    }
    fn poll_fd(&mut self, fd: BorrowedFd<'_>, events: u32, token: u64) {
        // Only a connect polls a plain descriptor here: the simulated shard is alone, so
        // its fill wake-up is not armed.
        if events != libc::POLLOUT as u32 {
            self.violations
                .push(format!("poll for events {events:#x} on descriptor {fd:?}"));
        }
        let Ok(sock) = origin_socket(fd) else {
            return self
                .violations
                .push(format!("poll on a closed descriptor {fd:?}"));
        };
        let fd = fd.as_raw_fd();
        match self.net.origin.as_mut() {
            Some(origin) => origin.connect(fd),
            None => self
                .violations
                .push("an origin connect without an origin".into()),
        }
        self.push(token, SimOp::OriginConnect { sock });
    }
    fn send_arena_fd(
        &mut self,
        slot: ArenaSlot,
        offset: usize,
        len: usize,
        fd: BorrowedFd<'_>,
        token: u64,
    ) {
        self.take_arena(slot, offset, len);
        let Ok(sock) = origin_socket(fd) else {
            return self
                .violations
                .push(format!("send on a closed descriptor {fd:?}"));
        };
        let fd = fd.as_raw_fd();
        self.push(
            token,
            SimOp::OriginSend {
                slot,
                off: offset,
                len,
                fd,
                sock,
            },
        );
    }
    fn recv_arena_fd(
        &mut self,
        slot: ArenaSlot,
        offset: usize,
        len: usize,
        fd: BorrowedFd<'_>,
        token: u64,
    ) {
        self.origin_recv(slot, offset, len, fd, false, token);
    }
    fn probe_arena_fd(
        &mut self,
        slot: ArenaSlot,
        offset: usize,
        len: usize,
        fd: BorrowedFd<'_>,
        token: u64,
    ) {
        self.origin_recv(slot, offset, len, fd, true, token);
    }
    fn write_arena_fd(
        &mut self,
        slot: ArenaSlot,
        len: usize,
        fd: BorrowedFd<'_>,
        file_offset: u64,
        token: u64,
    ) {
        self.take_arena(slot, 0, len);
        let path = fd_path(fd);
        let file = match without_direct_io(fd) {
            Ok((file, _)) => Arc::new(file),
            Err(e) => return self.violations.push(format!("block write on {fd:?}: {e}")),
        };
        self.push(
            token,
            SimOp::BlockWrite {
                slot,
                len,
                file,
                off: file_offset,
                path,
            },
        );
    }
    fn fsync_fd(&mut self, fd: BorrowedFd<'_>, token: u64) {
        let path = fd_path(fd);
        self.push(token, SimOp::Fsync { path });
    }
    fn submit_and_wait(&mut self, want: usize, timeout: Option<Duration>) -> io::Result<()> {
        self.wait(want, timeout);
        Ok(())
    }
    fn submit_and_wait_batched(
        &mut self,
        timeout: Duration,
        _batch: Option<(usize, Duration)>,
    ) -> io::Result<()> {
        self.wait(1, Some(timeout));
        Ok(())
    }
    fn drain_completions(&mut self, out: &mut Vec<Completion>, max: usize) {
        // Completions come back in random batches (the rest stays for the next drain).
        let n = self.cq.len().min(max);
        let n = if n > 1 && self.rng.chance(30) {
            1 + self.rng.below(n as u64) as usize
        } else {
            n
        };
        out.extend(self.cq.drain(..n));
        self.flush_overflow();
    }
}
