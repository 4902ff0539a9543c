//! The origin client on the shard's ring (issue 20): `Filler` runs a shard's block fetches
//! (`origin::fetch::BlockFetch`) over keep-alive connections to its origins, each fetch in
//! one arena slot the caller lends it, with every operation on the shard's ring.
//!
//! The caller owns the cache's bookkeeping: it gives each fetch its plan, slot and the
//! version's data file (opened O_DIRECT), and gets back `FillEvent`s in order: the head's
//! facts, each block committed (durable, with its CRC, to be journaled now), then the end
//! with the slot. Connections are bounded per origin (`origin::pool::Pool`); a fetch that
//! cannot get one is refused with its slot (`Begin::Wait`), never queued here.
//!
//! A connect is a non-blocking `connect(2)` on the shard thread (it returns at once), then a
//! poll through the ring for the socket to become writable. A stage past its deadline shuts
//! the socket down, which ends the operation in flight at once; the fetch ends when that
//! completion arrives, so the slot and the descriptor are never released under the kernel.

pub mod cache_fill;
pub mod edge;
pub mod route;

use std::fs::File;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;

use socket2::{Domain, Protocol, SockRef, Socket, Type};

use crate::origin::fetch::{BlockFetch, FetchError, HeadFacts, Io, Output, Plan, Timeouts};
use crate::origin::pool::{Grant, Pool};
use crate::origin::request::Fetch;
use crate::origin::response::Unusable;
use crate::shard::ring_ops::RingOps;
use crate::shard::slots::ArenaSlot;
use crate::shard::token::Token;

/// One origin as a shard's filler reaches it.
#[derive(Clone, Debug)]
pub struct OriginTarget {
    /// Where to connect: the address found at start-up, until `resolved` publishes others.
    pub addr: SocketAddr,
    /// The origin's name as the resolver thread looks it up again after its TTL (the
    /// published set and this origin's index in it); None: `addr` always.
    pub resolved: Option<(Arc<crate::origin::resolve::Addresses>, usize)>,
    /// The Host header to send.
    pub host: String,
    /// Most fetches at once from this shard.
    pub max_fetches: usize,
    /// Most idle keep-alive connections kept by this shard.
    pub max_idle: usize,
    /// Timeouts of each fetch.
    pub timeouts: Timeouts,
}

/// What a fetch told the caller, in order.
#[derive(Debug)]
pub enum FillEvent {
    /// The origin's head was accepted for fetch `job`.
    Head {
        /// The caller's id of the fetch.
        job: u64,
        /// What the head said.
        facts: HeadFacts,
    },
    /// Block `block` of `job` is durable with `crc`.
    Committed {
        /// The caller's id.
        job: u64,
        /// Block number.
        block: u32,
        /// Its CRC-32C.
        crc: u32,
    },
    /// `job` ended: `error` is None when every block of its run was committed. The slot is
    /// the caller's again.
    Ended {
        /// The caller's id.
        job: u64,
        /// Why it ended early, if it did.
        error: Option<FetchError>,
        /// The slot lent at `begin`.
        slot: ArenaSlot,
    },
}

/// Why `begin` did not start a fetch.
#[derive(Debug)]
pub enum Begin {
    /// The origin has `max_fetches` in flight, or every fetch slot is taken: try again when a
    /// fetch ends. The slot is handed back.
    Wait(ArenaSlot),
    /// The request could not be written (a path with a CR/LF, too long) or the socket could
    /// not be made: the fetch cannot be made at all.
    Refused(ArenaSlot, String),
}

/// A fetch in flight.
struct Running {
    job: u64,
    origin: usize,
    conn: u32,
    machine: BlockFetch,
    slot: ArenaSlot,
    file: Arc<File>,
    head_len: usize,
    /// The operation the ring holds now (every fetch has exactly one until it ends).
    io: Option<Io>,
    /// Set when a deadline passed: the error the fetch ends with once `io` completes.
    timed_out: Option<FetchError>,
    /// When `begin` started it (ms), until the origin's head came.
    started_ms: Option<u64>,
}

struct FetchSlot {
    generation: u16,
    run: Option<Running>,
}

/// A shard's origin fetches (see the module doc).
pub struct Filler {
    origins: Vec<OriginTarget>,
    pools: Vec<Pool>,
    /// Origin connections by id (the pools hold ids of idle ones).
    conns: Vec<Option<Socket>>,
    free_conns: Vec<u32>,
    fetches: Vec<FetchSlot>,
    free_fetches: Vec<u32>,
    out: Vec<Output>,
    request: String,
    events: Vec<FillEvent>,
    /// Bytes received from origins (heads and bodies), since start.
    received_bytes: u64,
    /// Times from a fetch's start to its origin's head (ms), not yet taken.
    first_byte_ms: Vec<u64>,
    /// Per origin: the resolver's publication last read, its addresses, and the next to use
    /// (new connections go round them).
    addrs: Vec<OriginAddrs>,
}

/// What a filler last read of an origin's published addresses.
struct OriginAddrs {
    epoch: u64,
    addrs: Vec<SocketAddr>,
    next: usize,
}

impl Filler {
    /// A filler for `origins` running at most `max_fetches` fetches at once in all.
    pub fn new(origins: Vec<OriginTarget>, max_fetches: usize) -> Filler {
        assert!(max_fetches > 0 && max_fetches < (1 << 24));
        let n_origins = origins.len();
        let pools = origins
            .iter()
            .map(|o| Pool::new(o.max_fetches, o.max_idle))
            .collect();
        let max_conns = origins
            .iter()
            .map(|o| o.max_fetches + o.max_idle)
            .sum::<usize>();
        Filler {
            origins,
            pools,
            conns: (0..max_conns).map(|_| None).collect(),
            free_conns: (0..max_conns as u32).rev().collect(),
            fetches: (0..max_fetches)
                .map(|_| FetchSlot {
                    generation: 0,
                    run: None,
                })
                .collect(),
            free_fetches: (0..max_fetches as u32).rev().collect(),
            out: Vec::with_capacity(8),
            request: String::with_capacity(crate::origin::request::MAX_REQUEST_HEAD_BYTES),
            events: Vec::with_capacity(16),
            received_bytes: 0,
            first_byte_ms: Vec::with_capacity(max_fetches),
            addrs: (0..n_origins)
                .map(|_| OriginAddrs {
                    epoch: u64::MAX,
                    addrs: Vec::new(),
                    next: 0,
                })
                .collect(),
        }
    }

    /// The address a new connection to `origin` goes to: the resolver's latest addresses in
    /// turn (read again only when it published), or the start-up address while it has none.
    pub fn next_addr(&mut self, origin: usize) -> SocketAddr {
        let target = &self.origins[origin];
        let cache = &mut self.addrs[origin];
        if let Some((published, i)) = &target.resolved {
            let epoch = published.epoch();
            if epoch != cache.epoch {
                cache.epoch = epoch;
                cache.addrs.clone_from(&published.get(*i).addrs);
            }
        }
        if cache.addrs.is_empty() {
            return target.addr;
        }
        cache.next = cache.next.wrapping_add(1);
        cache.addrs[cache.next % cache.addrs.len()]
    }

    /// Bytes received from origins since start.
    pub fn received_bytes(&self) -> u64 {
        self.received_bytes
    }

    /// Moves the times from fetch start to origin head (ms) observed since the last call into
    /// `out` (at most one per fetch begun).
    pub fn take_first_byte_ms(&mut self, out: &mut Vec<u64>) {
        out.append(&mut self.first_byte_ms);
    }

    /// Fetches in flight.
    pub fn running(&self) -> usize {
        self.fetches.len() - self.free_fetches.len()
    }

    /// Origin connections open (busy and idle).
    pub fn connections(&self) -> usize {
        self.conns.len() - self.free_conns.len()
    }

    /// Starts fetching `plan` of `path` from origin `origin` into `slot`, writing the data
    /// file `file`; `job` names it in the events.
    #[allow(clippy::too_many_arguments)]
    pub fn begin<R: RingOps>(
        &mut self,
        ring: &mut R,
        job: u64,
        origin: usize,
        path: &str,
        plan: Plan,
        slot: ArenaSlot,
        file: Arc<File>,
        now_ms: u64,
    ) -> Result<(), Begin> {
        let target = &self.origins[origin];
        let fetch = Fetch {
            path,
            host: &target.host,
            range: Some(plan.range()),
            if_none_match: plan.etag.as_deref().filter(|_| plan.revalidate),
            if_modified_since: plan.last_modified.as_deref().filter(|_| plan.revalidate),
        };
        if let Err(e) = fetch.write(&mut self.request) {
            return Err(Begin::Refused(slot, format!("origin request: {e:?}")));
        }
        let head_len = self.request.len();
        let timeouts = target.timeouts;
        assert!(head_len <= plan.slot_bytes);
        let Some(&index) = self.free_fetches.last() else {
            return Err(Begin::Wait(slot));
        };
        let (conn, reused) = match self.pools[origin].acquire() {
            Grant::Wait => return Err(Begin::Wait(slot)),
            Grant::Reuse(c) => (c, true),
            Grant::Connect => match self.connect(origin) {
                Ok(c) => (c, false),
                Err(e) => {
                    // The acquire counted a fetch that will not run.
                    let _ = self.pools[origin].release(u32::MAX, false);
                    return Err(Begin::Refused(slot, format!("origin socket: {e}")));
                }
            },
        };
        self.free_fetches.pop();
        ring.arena_mut(slot)[..head_len].copy_from_slice(self.request.as_bytes());
        self.out.clear();
        let machine = BlockFetch::start(plan, timeouts, reused, head_len, now_ms, &mut self.out);
        let f = &mut self.fetches[index as usize];
        f.generation = f.generation.wrapping_add(1);
        f.run = Some(Running {
            job,
            origin,
            conn,
            machine,
            slot,
            file,
            head_len,
            io: None,
            timed_out: None,
            started_ms: Some(now_ms),
        });
        self.carry_out(ring, index, now_ms);
        Ok(())
    }

    /// A new non-blocking connection to `origin` (the connect is under way when this returns).
    fn connect(&mut self, origin: usize) -> std::io::Result<u32> {
        let addr = self.next_addr(origin);
        let socket = Socket::new(
            Domain::for_address(addr),
            Type::STREAM.nonblocking().cloexec(),
            Some(Protocol::TCP),
        )?;
        socket.set_tcp_nodelay(true)?;
        match socket.connect(&addr.into()) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => return Err(e),
        }
        let id = self
            .free_conns
            .pop()
            .expect("connections are bounded by the pools");
        self.conns[id as usize] = Some(socket);
        Ok(id)
    }

    /// Runs the machine's outputs for fetch `index`: submits its next operation, or ends it.
    fn carry_out<R: RingOps>(&mut self, ring: &mut R, index: u32, now_ms: u64) {
        let generation = self.fetches[index as usize].generation;
        let token = Token::fetch(index, generation).encode();
        let outputs = std::mem::take(&mut self.out);
        for o in outputs.iter().cloned() {
            let run = self.fetches[index as usize]
                .run
                .as_mut()
                .expect("a running fetch");
            match o {
                Output::Io(io) => {
                    assert!(run.io.is_none(), "two operations of one fetch");
                    run.io = Some(io);
                    let socket = self.conns[run.conn as usize]
                        .as_ref()
                        .expect("the fetch's connection");
                    match io {
                        Io::Connect => ring.poll_fd(socket.as_fd(), libc::POLLOUT as u32, token),
                        Io::Send { offset, len } => {
                            ring.send_arena_fd(run.slot, offset, len, socket.as_fd(), token)
                        }
                        Io::Recv { offset, len } => {
                            ring.recv_arena_fd(run.slot, offset, len, socket.as_fd(), token)
                        }
                        Io::Write { len, file_offset } => {
                            ring.write_arena_fd(run.slot, len, run.file.as_fd(), file_offset, token)
                        }
                        Io::Sync => ring.fsync_fd(run.file.as_fd(), token),
                    }
                }
                Output::Head(facts) => {
                    if let Some(t) = run.started_ms.take() {
                        self.first_byte_ms.push(now_ms.saturating_sub(t));
                    }
                    self.events.push(FillEvent::Head {
                        job: run.job,
                        facts,
                    })
                }
                Output::Committed { block, crc } => self.events.push(FillEvent::Committed {
                    job: run.job,
                    block,
                    crc,
                }),
                Output::Done { keep_alive } => self.end(index, keep_alive, None),
                Output::Failed(e) => {
                    // A 304 or a refusal is an answer too: its time counts.
                    let answered = matches!(
                        e,
                        FetchError::NotModified | FetchError::Unusable(Unusable::Status(_))
                    );
                    if let Some(t) = run.started_ms.take().filter(|_| answered) {
                        self.first_byte_ms.push(now_ms.saturating_sub(t));
                    }
                    self.end(index, false, Some(e))
                }
            }
        }
        let mut outputs = outputs;
        outputs.clear();
        self.out = outputs;
    }

    /// Fetch `index` ended: its connection goes idle or is closed, its slot goes back.
    fn end(&mut self, index: u32, keep_alive: bool, error: Option<FetchError>) {
        let run = self.fetches[index as usize]
            .run
            .take()
            .expect("a running fetch");
        assert!(
            run.io.is_none(),
            "a fetch ended with an operation in flight"
        );
        if let Some(close) = self.pools[run.origin].release(run.conn, keep_alive) {
            self.close_conn(close);
        }
        self.free_fetches.push(index);
        self.events.push(FillEvent::Ended {
            job: run.job,
            error,
            slot: run.slot,
        });
    }

    fn close_conn(&mut self, conn: u32) {
        if self.conns[conn as usize].take().is_some() {
            self.free_conns.push(conn);
        }
    }

    /// The completion of fetch `index`'s operation (`token` decoded by the caller).
    pub fn on_completion<R: RingOps>(&mut self, ring: &mut R, token: Token, res: i32, now_ms: u64) {
        let index = token.fetch_index();
        let Some(f) = self.fetches.get_mut(index as usize) else {
            panic!("origin completion {token:?} for no fetch");
        };
        assert_eq!(f.generation, token.generation, "a stale origin completion");
        let run = f.run.as_mut().expect("a completion for a running fetch");
        let io = run.io.take().expect("a completion with nothing in flight");
        if !matches!(io, Io::Connect | Io::Sync) {
            ring.arena_done(run.slot);
        }
        self.out.clear();
        if let Some(e) = run.timed_out.take() {
            self.out.push(Output::Failed(e));
            return self.carry_out(ring, index, now_ms);
        }
        match io {
            Io::Connect => {
                let socket = self.conns[run.conn as usize].as_ref().expect("connection");
                let err = if res < 0 {
                    -res
                } else {
                    match socket.take_error() {
                        Ok(None) => 0,
                        Ok(Some(e)) | Err(e) => e.raw_os_error().unwrap_or(libc::EIO),
                    }
                };
                run.machine
                    .on_connected(err, run.head_len, now_ms, &mut self.out);
            }
            Io::Send { .. } => run.machine.on_sent(res, now_ms, &mut self.out),
            Io::Recv { .. } => {
                self.received_bytes += u64::from(res.max(0).unsigned_abs());
                let slot = ring.arena_mut(run.slot);
                run.machine.on_received(res, slot, now_ms, &mut self.out);
            }
            Io::Write { .. } => {
                let slot = ring.arena_mut(run.slot);
                run.machine.on_written(res, slot, now_ms, &mut self.out);
            }
            Io::Sync => {
                let slot = ring.arena_mut(run.slot);
                run.machine.on_synced(res, slot, now_ms, &mut self.out);
            }
        }
        self.carry_out(ring, index, now_ms);
    }

    /// Ends every stage past its deadline: the socket is shut down, so the operation in
    /// flight completes at once and the fetch ends with the timeout then.
    pub fn expire(&mut self, now_ms: u64) {
        for f in &mut self.fetches {
            let Some(run) = f.run.as_mut() else { continue };
            if run.timed_out.is_some() || run.machine.deadline_ms().is_none_or(|d| d > now_ms) {
                continue;
            }
            let mut out = Vec::new();
            run.machine.on_timeout(&mut out);
            if let Some(Output::Failed(e)) = out.pop() {
                run.timed_out = Some(e);
                if let Some(s) = self.conns[run.conn as usize].as_ref() {
                    let _ = SockRef::from(s).shutdown(std::net::Shutdown::Both);
                }
            }
        }
    }

    /// The earliest deadline of any fetch (ms), for the loop's sleep.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        self.fetches
            .iter()
            .filter_map(|f| f.run.as_ref())
            .filter(|r| r.timed_out.is_none())
            .filter_map(|r| r.machine.deadline_ms())
            .min()
    }

    /// Moves the events since the last call into `out`.
    pub fn take_events(&mut self, out: &mut Vec<FillEvent>) {
        out.append(&mut self.events);
    }
}

#[cfg(test)]
mod tests;
