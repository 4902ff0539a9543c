//! The world outside the fake ring: modelled sockets, the files being served (with every
//! version they had), and the clients, each with its own pace, that parse what they receive
//! and check every body byte against the file.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

pub use super::model::{per_client_body, redirect_location, take_front, SimFile};
use super::rng::Rng;

/// One TCP connection as both ends see it.
#[derive(Debug, Default)]
pub struct SimSocket {
    /// Request bytes the client wrote and the server has not received.
    pub to_server: VecDeque<u8>,
    /// The client shut its write side (the server's receive returns 0 once drained).
    pub client_fin: bool,
    /// Bytes the server sent and the client has not read: the socket's send buffer.
    pub to_client: VecDeque<u8>,
    /// Room of the send buffer: a full one makes sends short or EAGAIN.
    pub sndbuf_bytes: usize,
    /// The server shut its write side.
    pub server_shut: bool,
    /// The server closed the socket.
    pub server_closed: bool,
    /// The client vanished (reset): the server's operations fail.
    pub reset: bool,
    /// Bytes the server sent in all.
    pub written_total: u64,
    /// Bytes the client read in all (SEND_ZC notifications wait for them).
    pub read_total: u64,
}

/// A change to a file while it may be served.
#[derive(Clone, Copy, Debug)]
pub enum FileFault {
    /// New bytes written in place (same size, new mtime).
    Rewrite,
    /// Cut to a shorter length.
    Truncate,
    /// A new file renamed over it (the old inode keeps serving open responses).
    Replace,
}

/// What a request asks for.
#[derive(Clone, Debug)]
pub enum Target {
    /// `files[i]`.
    File(usize),
    /// A path that does not exist: 404.
    Missing,
    /// A malformed Host field: 400 and a lingering close.
    BadHost,
    /// `n` zero bytes from the diagnostic endpoint (generated in the arena, no file).
    Zero(u64),
}

/// One request of a client.
#[derive(Clone, Debug)]
pub struct Request {
    /// What it asks for.
    pub target: Target,
    /// `Range` value (without `bytes=`... included as written).
    pub range: Option<String>,
    /// `Connection: close`.
    pub close: bool,
    /// Bytes of an `X-Pad` header (a large head: pipelined ones fill the multishot
    /// receive's bound, `RX_MULTISHOT_MAX_BYTES`).
    pub pad_bytes: usize,
}

/// How a client behaves.
#[derive(Clone, Debug)]
pub struct ClientPlan {
    /// When it connects (virtual µs).
    pub start_us: u64,
    /// Its requests, in order.
    pub requests: Vec<Request>,
    /// Writes every request at once instead of one after each response.
    pub pipelined: bool,
    /// Bytes it reads per read.
    pub read_bytes: usize,
    /// Pause between its reads and writes (µs).
    pub gap_us: u64,
    /// Request bytes per write.
    pub write_piece: usize,
    /// Stops reading after this many bytes, for this long (µs; `u64::MAX`: for good).
    pub stall: Option<(u64, u64)>,
    /// Resets the connection at this time.
    pub vanish_us: Option<u64>,
    /// Its socket's send-buffer size.
    pub sndbuf_bytes: usize,
    /// After its last response it stays idle (the server's idle timeout ends it).
    pub idle_at_end: bool,
    /// Shuts its write side as soon as every request is written (and still reads).
    pub half_close: bool,
    /// Speaks HTTPS to the TLS listener (a rustls client on this side).
    pub tls: bool,
}

/// A parsed response head.
#[derive(Clone, Debug)]
struct Head {
    status: u16,
    content_length: Option<u64>,
    content_range: Option<(u64, u64, u64)>,
    boundary: Option<String>,
    close: bool,
    /// Content-Encoding, if any.
    content_encoding: Option<String>,
    /// Location, if any.
    location: Option<String>,
}

enum Parse {
    Head(Vec<u8>),
    Body {
        head: Head,
        body: Vec<u8>,
        left: u64,
    },
}

/// A client: a plan and how far it got.
pub struct Client {
    /// What it does.
    pub plan: ClientPlan,
    /// Its socket, once connected.
    pub sock: Option<usize>,
    next_us: u64,
    out: Vec<u8>,
    written: usize,
    queued_requests: usize,
    parse: Parse,
    /// Responses received whole.
    pub responses: usize,
    /// Statuses received.
    pub statuses: Vec<u16>,
    /// The connection ended before every response arrived whole.
    pub cut_short: bool,
    /// Finished (the connection is over for it).
    pub done: bool,
    /// Body and head bytes read.
    pub received: u64,
    stalled_until: Option<u64>,
    fin_sent: bool,
    /// The client's TLS (rustls): requests go in as plaintext, `out` holds its records.
    tls: Option<Box<rustls::ClientConnection>>,
    /// The server's close_notify arrived.
    close_notify: bool,
    /// The TLS port refused it (over the connection cap).
    pub refused: bool,
}

impl Client {
    /// A client that has not connected yet.
    pub fn new(plan: ClientPlan) -> Client {
        Client {
            next_us: plan.start_us,
            plan,
            sock: None,
            out: Vec::new(),
            written: 0,
            queued_requests: 0,
            parse: Parse::Head(Vec::new()),
            responses: 0,
            statuses: Vec::new(),
            cut_short: false,
            done: false,
            received: 0,
            stalled_until: None,
            fin_sent: false,
            tls: None,
            close_notify: false,
            refused: false,
        }
    }

    /// Moves the records rustls has for the server into `out`.
    fn drain_tls_out(&mut self) {
        if let Some(tls) = self.tls.as_mut() {
            while tls.wants_write() {
                if tls.write_tls(&mut self.out).is_err() {
                    break;
                }
            }
        }
    }

    /// Everything the client means to send has been sent (for a TLS client: past the
    /// handshake, nothing left inside rustls).
    fn all_written(&self) -> bool {
        self.written == self.out.len()
            && self
                .tls
                .as_ref()
                .is_none_or(|t| !t.is_handshaking() && !t.wants_write())
    }

    fn stalled(&self, now: u64) -> bool {
        self.stalled_until.is_some_and(|t| now < t)
    }

    /// When this client next has something to do on its own (not waiting for the server).
    fn next_event_us(&self, socks: &[SimSocket], now: u64) -> Option<u64> {
        if self.done {
            return None;
        }
        let Some(id) = self.sock else {
            return Some(self.plan.start_us);
        };
        let s = &socks[id];
        let mut t: Option<u64> = self.plan.vanish_us;
        let mut wake = |at: u64| t = Some(t.map_or(at, |x| x.min(at)));
        if let Some(until) = self.stalled_until.filter(|&u| u > now && u != u64::MAX) {
            wake(until);
        }
        let can_read =
            !self.stalled(now) && (!s.to_client.is_empty() || s.server_closed || s.server_shut);
        if self.written < self.out.len() || can_read {
            wake(self.next_us.max(now));
        }
        t
    }
}

/// Sockets, files and clients.
pub struct Net {
    /// Every socket ever opened (ids are indices).
    pub socks: Vec<SimSocket>,
    /// Connections waiting to be accepted: (socket, on the TLS listener).
    pub backlog: VecDeque<(usize, bool)>,
    /// What TLS clients trust and offer (None: no TLS listener in this run).
    pub tls_client: Option<Arc<rustls::ClientConfig>>,
    /// The clients.
    pub clients: Vec<Client>,
    /// The served files.
    pub files: Vec<SimFile>,
    /// File changes to make: (when, file, what), in time order.
    pub file_faults: VecDeque<(u64, usize, FileFault)>,
    /// File changes made.
    pub file_faults_done: usize,
    /// Wrong bytes, wrong statuses and other failures seen by clients.
    pub failures: Vec<String>,
    /// The origin of the pulled files (None: the run has no `[[origin]]`).
    pub origin: Option<super::origin::Origin>,
    /// Origin versions changed.
    pub origin_changes_done: usize,
    /// Whole 200/206 responses of pulled files.
    pub pulled_responses: usize,
    /// Issue 42's checks passed: responses of objects answered per client (each client's
    /// own bytes), of gzip-stored objects (labelled), and redirects or 4xx passed on.
    pub contract_checked: [usize; 3],
    rng: Rng,
}

impl Net {
    /// A world of `files` and `clients`.
    pub fn new(
        files: Vec<SimFile>,
        clients: Vec<Client>,
        file_faults: VecDeque<(u64, usize, FileFault)>,
        seed: u64,
    ) -> Net {
        Net {
            socks: Vec::new(),
            backlog: VecDeque::new(),
            tls_client: None,
            clients,
            files,
            file_faults,
            file_faults_done: 0,
            failures: Vec::new(),
            origin: None,
            origin_changes_done: 0,
            pulled_responses: 0,
            contract_checked: [0; 3],
            rng: Rng::new(seed.wrapping_add(0x6e65_7400)),
        }
    }

    /// The earliest time something outside the server happens on its own.
    pub fn next_event_us(&self, now: u64) -> Option<u64> {
        let clients = self
            .clients
            .iter()
            .filter_map(|c| c.next_event_us(&self.socks, now));
        let faults = self.file_faults.front().map(|f| f.0);
        let origin = self.origin.as_ref().and_then(|o| o.next_event_us(now));
        clients.chain(faults).chain(origin).min()
    }

    /// Everything due at `now`: file changes, then each client's reads and writes.
    pub fn act(&mut self, now: u64) {
        while self.file_faults.front().is_some_and(|f| f.0 <= now) {
            let (_, file, fault) = self.file_faults.pop_front().expect("checked");
            self.change_file(file, fault);
        }
        self.change_origin_objects(now);
        for i in 0..self.clients.len() {
            self.client_act(i, now);
        }
    }

    fn change_file(&mut self, i: usize, fault: FileFault) {
        let f = &mut self.files[i];
        let old = f.versions.last().expect("a file has a version").clone();
        let n = f.versions.len() as u64;
        // A visible change: a new mtime each time (a rewrite within the kernel's timestamp
        // granularity would otherwise look unchanged, to nginx as well).
        let mtime = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000 + n * 1000);
        let result = match fault {
            FileFault::Rewrite => {
                let new = self.rng.bytes(old.len());
                let r = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&f.path)
                    .and_then(|file| {
                        file.write_all_at(&new, 0)?;
                        file.set_modified(mtime)
                    });
                f.versions.push(new);
                r
            }
            FileFault::Truncate => {
                let len = self.rng.below(old.len() as u64 + 1);
                let r = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&f.path)
                    .and_then(|file| {
                        file.set_len(len)?;
                        file.set_modified(mtime)
                    });
                f.versions.push(old[..len as usize].to_vec());
                r
            }
            FileFault::Replace => {
                let len = self.rng.range(1, old.len() as u64 + 4096) as usize;
                let new = self.rng.bytes(len);
                let tmp = f.path.with_extension("new");
                let r = std::fs::write(&tmp, &new)
                    .and_then(|_| std::fs::File::options().write(true).open(&tmp))
                    .and_then(|file| file.set_modified(mtime))
                    .and_then(|_| std::fs::rename(&tmp, &f.path));
                f.versions.push(new);
                r
            }
        };
        if let Err(e) = result {
            self.failures.push(format!("changing {}: {e}", f.url));
        }
        self.file_faults_done += 1;
    }

    /// The origin's scheduled version changes due at `now`: new bytes (sometimes a new
    /// size) under the same URL, which the origin serves with a new ETag from then on.
    fn change_origin_objects(&mut self, now: u64) {
        let Some(origin) = self.origin.as_mut() else {
            return;
        };
        while origin.changes.front().is_some_and(|c| c.0 <= now) {
            let (_, k) = origin.changes.pop_front().expect("checked");
            let f = &mut self.files[origin.objects[k]];
            let old = f.versions.last().expect("a file has a version").len() as u64;
            let len = if self.rng.chance(50) {
                old
            } else {
                self.rng.range(1, old + 64 * 1024)
            };
            let new = self.rng.bytes(len as usize);
            f.versions.push(new);
            self.origin_changes_done += 1;
        }
    }

    /// Whether a pulled response may fail or end early in this run (origin or disk faults,
    /// or a version change under way).
    pub fn origin_disturbed(&self) -> bool {
        self.origin.as_ref().is_some_and(|o| {
            o.faults.any() || self.origin_changes_done > 0 || !o.changes.is_empty()
        })
    }

    fn client_act(&mut self, i: usize, now: u64) {
        let c = &mut self.clients[i];
        if c.done || now < c.next_us {
            return;
        }
        let Some(id) = c.sock else {
            let id = self.socks.len();
            self.socks.push(SimSocket {
                sndbuf_bytes: c.plan.sndbuf_bytes,
                ..SimSocket::default()
            });
            let tls = c.plan.tls;
            if tls {
                let cfg = self
                    .tls_client
                    .clone()
                    .expect("a TLS client in a run without TLS");
                let name = rustls::pki_types::ServerName::try_from("sim.test").expect("name");
                c.tls = Some(Box::new(
                    rustls::ClientConnection::new(cfg, name).expect("client"),
                ));
            }
            self.backlog.push_back((id, tls));
            c.sock = Some(id);
            self.queue_requests(i);
            return;
        };
        if c.plan.vanish_us.is_some_and(|t| now >= t) {
            let s = &mut self.socks[id];
            s.reset = true;
            s.to_client.clear();
            c.done = true;
            c.cut_short = c.responses < c.plan.requests.len();
            return;
        }
        let s = &mut self.socks[id];
        let mut acted = false;
        if c.written < c.out.len() && !s.server_closed {
            let n = c.plan.write_piece.min(c.out.len() - c.written);
            s.to_server.extend(&c.out[c.written..c.written + n]);
            c.written += n;
            acted = true;
            if c.plan.half_close && c.all_written() && c.queued_requests == c.plan.requests.len() {
                s.client_fin = true;
            }
        }
        if c.stalled_until.is_some_and(|t| now >= t) {
            c.stalled_until = None;
            c.plan.stall = None;
        }
        if c.stalled(now) {
            // A stalled client notices only that the server gave up on it.
            if s.server_closed {
                c.done = true;
                c.cut_short = c.responses < c.plan.requests.len();
            }
            return;
        }
        let n = c.plan.read_bytes.min(s.to_client.len());
        if n > 0 {
            let bytes = take_front(&mut s.to_client, n);
            s.read_total += n as u64;
            c.received += n as u64;
            acted = true;
            match self.clients[i].tls.is_some() {
                true => self.feed_tls(i, &bytes),
                false => self.feed(i, &bytes),
            }
            let c = &mut self.clients[i];
            if let Some((after, for_us)) = c.plan.stall {
                if c.received >= after && c.stalled_until.is_none() {
                    c.stalled_until = Some(now.saturating_add(for_us));
                }
            }
        }
        let c = &mut self.clients[i];
        let s = &mut self.socks[id];
        let all_answered = c.responses >= c.plan.requests.len();
        if s.to_client.is_empty() && (s.server_closed || s.server_shut) {
            // Every response arrived whole and the server ended the connection: over TLS a
            // clean end says so.
            let clean = all_answered && matches!(&c.parse, Parse::Head(h) if h.is_empty());
            if c.tls.is_some() && clean && !c.close_notify && !c.done {
                self.fail(
                    i,
                    "the server closed a finished TLS connection without close_notify".into(),
                );
                return;
            }
            let c = &mut self.clients[i];
            // End of the stream.
            if !matches!(&c.parse, Parse::Head(h) if h.is_empty()) || !all_answered {
                c.cut_short = true;
                self.end_of_stream(i);
            }
            let c = &mut self.clients[i];
            let s = &mut self.socks[id];
            s.client_fin = true;
            c.done = true;
            return;
        }
        if all_answered && !c.plan.idle_at_end && !c.fin_sent {
            c.fin_sent = true;
            s.client_fin = true;
        }
        if acted {
            c.next_us = now + c.plan.gap_us;
        }
    }

    /// Puts the requests the client may send now into its output.
    fn queue_requests(&mut self, i: usize) {
        let c = &mut self.clients[i];
        let upto = if c.plan.pipelined {
            c.plan.requests.len()
        } else {
            (c.responses + 1).min(c.plan.requests.len())
        };
        while c.queued_requests < upto {
            let r = &c.plan.requests[c.queued_requests];
            let (path, host) = match r.target {
                Target::File(f) => (self.files[f].url.clone(), "sim"),
                Target::Missing => ("/missing.bin".to_string(), "sim"),
                Target::BadHost => ("/".to_string(), "a b"),
                Target::Zero(n) => (format!("/__shardline/zero?bytes={n}"), "sim"),
            };
            let mut req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n");
            if let Some(range) = &r.range {
                req.push_str(&format!("Range: {range}\r\n"));
            }
            if r.close {
                req.push_str("Connection: close\r\n");
            }
            // An object whose answers are each client's own: the origin makes this client's.
            if matches!(r.target, Target::File(f) if self.files[f].contract.per_client()) {
                req.push_str(&format!("X-Client: {i}\r\n"));
            }
            if r.pad_bytes > 0 {
                req.push_str("X-Pad: ");
                req.extend(std::iter::repeat_n('p', r.pad_bytes));
                req.push_str("\r\n");
            }
            req.push_str("\r\n");
            match c.tls.as_mut() {
                // rustls holds the plaintext until its handshake is done.
                Some(tls) => tls
                    .writer()
                    .write_all(req.as_bytes())
                    .expect("rustls buffers it"),
                None => c.out.extend_from_slice(req.as_bytes()),
            }
            c.queued_requests += 1;
        }
        c.drain_tls_out();
    }

    /// TLS bytes from the server: through rustls (which checks every record), then the
    /// plaintext is parsed like any response; whatever rustls answers goes out.
    fn feed_tls(&mut self, i: usize, mut bytes: &[u8]) {
        let mut plain = Vec::new();
        while !bytes.is_empty() {
            let c = &mut self.clients[i];
            let tls = c.tls.as_mut().expect("a TLS client");
            match tls.read_tls(&mut bytes) {
                // Nothing more is read after the server's close_notify.
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => return self.fail(i, format!("TLS read: {e}")),
            }
            match tls.process_new_packets() {
                // Over the connection cap the TLS port answers with a plaintext alert (the
                // cleartext port's 503): a refusal, not a fault.
                Err(rustls::Error::AlertReceived(rustls::AlertDescription::InternalError))
                    if c.responses == 0 =>
                {
                    c.refused = true;
                    c.done = true;
                    return;
                }
                Err(e) => return self.fail(i, format!("TLS error from the server's records: {e}")),
                Ok(_) => {}
            }
            match tls.reader().read_to_end(&mut plain) {
                Ok(_) => c.close_notify = true,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return self.fail(i, format!("TLS plaintext: {e}")),
            }
        }
        self.clients[i].drain_tls_out();
        self.feed(i, &plain);
        self.clients[i].drain_tls_out();
    }

    fn feed(&mut self, i: usize, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let c = &mut self.clients[i];
            match &mut c.parse {
                Parse::Head(buf) => {
                    let before = buf.len();
                    buf.extend_from_slice(bytes);
                    let Some(end) = find(buf, b"\r\n\r\n") else {
                        return;
                    };
                    let head_len = end + 4;
                    bytes = &bytes[head_len - before..];
                    let text = String::from_utf8_lossy(&buf[..end]).into_owned();
                    let head = match parse_head(&text) {
                        Ok(h) => h,
                        Err(e) => {
                            self.fail(i, format!("unparsable response head ({e}): {text:?}"));
                            return;
                        }
                    };
                    let Some(len) = head.content_length else {
                        self.fail(i, format!("response without Content-Length: {text:?}"));
                        return;
                    };
                    c.statuses.push(head.status);
                    c.parse = Parse::Body {
                        head,
                        body: Vec::new(),
                        left: len,
                    };
                    self.maybe_finish_response(i);
                }
                Parse::Body { body, left, .. } => {
                    let n = (*left).min(bytes.len() as u64) as usize;
                    body.extend_from_slice(&bytes[..n]);
                    *left -= n as u64;
                    bytes = &bytes[n..];
                    self.maybe_finish_response(i);
                }
            }
        }
    }

    fn maybe_finish_response(&mut self, i: usize) {
        let c = &mut self.clients[i];
        let Parse::Body { left: 0, .. } = &c.parse else {
            return;
        };
        let Parse::Body { head, body, .. } =
            std::mem::replace(&mut c.parse, Parse::Head(Vec::new()))
        else {
            unreachable!()
        };
        self.check_response(i, &head, &body, true);
        let c = &mut self.clients[i];
        c.responses += 1;
        if head.close && c.responses < c.plan.requests.len() {
            // The server ends the connection here: the remaining requests go unanswered.
            c.plan.requests.truncate(c.responses);
        }
        self.queue_requests(i);
    }

    /// The stream ended inside a response (or before all were answered): what arrived must
    /// still be right.
    fn end_of_stream(&mut self, i: usize) {
        let c = &mut self.clients[i];
        if let Parse::Body { head, body, .. } =
            std::mem::replace(&mut c.parse, Parse::Head(Vec::new()))
        {
            self.check_response(i, &head, &body, false);
        }
    }

    fn fail(&mut self, i: usize, what: String) {
        let c = &mut self.clients[i];
        c.done = true;
        let detail = if std::env::var_os("SHARDLINE_SIM_VERBOSE").is_some() {
            format!(
                " [plan {:?}; {} responses, statuses {:?}, received {}]",
                c.plan, c.responses, c.statuses, c.received
            )
        } else {
            String::new()
        };
        self.failures.push(format!("client {i}: {what}{detail}"));
    }

    /// Checks a response (`whole`: all of its body arrived) against the request and the file.
    fn check_response(&mut self, i: usize, head: &Head, body: &[u8], whole: bool) {
        let c = &self.clients[i];
        let Some(req) = c.plan.requests.get(c.responses) else {
            return self.fail(i, format!("a response no request asked for: {head:?}"));
        };
        let req = req.clone();
        // Over the connection cap, or every open-file entry held: a refusal is fine anywhere.
        if head.status == 503 {
            return;
        }
        // A pulled file's fill may fail on an origin fault: 502 (unusable answer, reset) or
        // 504 (timeout), or the origin's own 5xx passed on.
        let pulled_failure = matches!(req.target, Target::File(f) if self.files[f].pulled)
            && (500..600).contains(&head.status)
            && self.origin_disturbed();
        if pulled_failure {
            return;
        }
        let file = match req.target {
            Target::Missing if head.status == 404 => return,
            Target::BadHost if head.status == 400 && head.close => return,
            Target::Zero(n) if head.status == 200 => {
                let right = head.content_length == Some(n) && body.iter().all(|&b| b == 0);
                if !right {
                    self.fail(
                        i,
                        format!("wrong zero body ({} bytes) for {req:?}", body.len()),
                    );
                }
                return;
            }
            Target::File(f) => f,
            _ => return self.fail(i, format!("status {} for {req:?}", head.status)),
        };
        let contract = self.files[file].contract;
        if let Some(want) = contract.status() {
            // The origin's redirect or 4xx reaches the client as the origin gave it.
            let location = (want == 302).then(|| redirect_location(&self.files[file].url));
            if head.status == want && head.location == location {
                self.contract_checked[2] += 1;
            } else {
                self.fail(
                    i,
                    format!(
                        "the origin answers {want} (Location {location:?}) for {req:?}; the client got {} (Location {:?})",
                        head.status, head.location
                    ),
                );
            }
            return;
        }
        // No byte goes out under another encoding than its object's (issue 42).
        let encoding = contract.gzip.then_some("gzip");
        if matches!(head.status, 200 | 206) && head.content_encoding.as_deref() != encoding {
            return self.fail(
                i,
                format!(
                    "WRONG ENCODING: bytes of {} (stored with Content-Encoding {encoding:?}) went out under {:?} (status {}, {req:?})",
                    self.files[file].url, head.content_encoding, head.status
                ),
            );
        }
        // Each client's own answer: this client's bodies only (never another client's).
        let own: Vec<Vec<u8>>;
        let versions = if contract.per_client() {
            own = self.files[file]
                .versions
                .iter()
                .map(|v| per_client_body(v, Some(i)))
                .collect();
            &own
        } else {
            &self.files[file].versions
        };
        let ok_status = match (&req.range, head.status) {
            (_, 200) | (Some(_), 206) | (Some(_), 416) => true,
            // Only a file that shrank (or was replaced) turns a range unsatisfiable.
            _ => false,
        };
        if !ok_status {
            return self.fail(i, format!("status {} for {req:?}", head.status));
        }
        let result = match (head.status, &head.boundary) {
            (416, _) => Ok(()),
            (200, _) => match_any(versions, |v| {
                head.content_length == Some(v.len() as u64)
                    && v.len() >= body.len()
                    && v[..body.len()] == *body
            }),
            (206, None) => {
                let Some((a, b, total)) = head.content_range else {
                    return self.fail(i, "206 without Content-Range".into());
                };
                match_any(versions, |v| matches_part(v, a, b, total, body)).map_err(|e| {
                    let v = versions.last().expect("a version");
                    let at = (0..body.len().min(v.len().saturating_sub(a as usize)))
                        .find(|&k| v[a as usize + k] != body[k]);
                    format!("{e} (bytes {a}-{b}/{total}; the newest version of {} bytes differs first at body byte {at:?})", v.len())
                })
            }
            (206, Some(boundary)) => {
                let parts = split_parts(body, boundary, whole);
                match parts {
                    Err(e) => Err(e),
                    Ok(parts) => match_any(versions, |v| {
                        parts
                            .iter()
                            .all(|&(a, b, total, data)| matches_part(v, a, b, total, data))
                    }),
                }
            }
            (status, _) => Err(format!("unexpected status {status}")),
        };
        let pulled = self.files[file].pulled && whole && matches!(head.status, 200 | 206);
        if pulled && result.is_ok() {
            self.pulled_responses += 1;
            self.contract_checked[0] += usize::from(contract.per_client());
            self.contract_checked[1] += usize::from(contract.gzip);
        }
        if let Err(e) = result {
            if contract.per_client() {
                if let Some(other) = self.whose_body(file, i, body) {
                    return self.fail(
                        i,
                        format!(
                            "PRIVATE LEAK: client {i} received {other}'s answer of {} ({:?}: made for that request alone; status {}, {req:?})",
                            self.files[file].url, contract.storing, head.status
                        ),
                    );
                }
            }
            self.fail(
                i,
                format!(
                    "wrong body for {req:?} (status {}, {} bytes{}): {e}",
                    head.status,
                    body.len(),
                    if whole { "" } else { ", cut short" }
                ),
            );
        }
    }
}

impl Net {
    /// Whose answer `body` (the start of one, or of a range of one) is, for a client other
    /// than `me` of an object answered per client: "client N", or "no client" (a request
    /// that named none); None when it is no one's.
    fn whose_body(&self, file: usize, me: usize, body: &[u8]) -> Option<String> {
        let probe = &body[..body.len().min(64)];
        let others = (0..self.clients.len())
            .filter(|&c| c != me)
            .map(Some)
            .chain([None]);
        for who in others {
            let found = self.files[file].versions.iter().any(|v| {
                let theirs = per_client_body(v, who);
                !probe.is_empty() && theirs.windows(probe.len()).any(|w| w == probe)
            });
            if found {
                return Some(who.map_or("no client".into(), |c| format!("client {c}")));
            }
        }
        None
    }
}

/// Ok when some version satisfies `pred`.
fn match_any(versions: &[Vec<u8>], pred: impl Fn(&[u8]) -> bool) -> Result<(), String> {
    if versions.iter().any(|v| pred(v)) {
        Ok(())
    } else {
        Err("matches no version of the file".into())
    }
}

/// `data` is a prefix of bytes `a..=b` of `v`, and `v` has `total` bytes.
fn matches_part(v: &[u8], a: u64, b: u64, total: u64, data: &[u8]) -> bool {
    let (a, b) = (a as usize, b as usize);
    total == v.len() as u64
        && a <= b
        && b < v.len()
        && data.len() <= b - a + 1
        && v[a..a + data.len()] == *data
}

type Part<'a> = (u64, u64, u64, &'a [u8]);

/// The parts of a multipart/byteranges body (the last one may be cut short unless `whole`).
fn split_parts<'a>(body: &'a [u8], boundary: &str, whole: bool) -> Result<Vec<Part<'a>>, String> {
    let delim = format!("--{boundary}");
    let mut parts = Vec::new();
    let mut rest = body;
    loop {
        let Some(at) = find(rest, delim.as_bytes()) else {
            return if whole {
                Err("multipart body without a closing boundary".into())
            } else {
                Ok(parts)
            };
        };
        rest = &rest[at + delim.len()..];
        if rest.starts_with(b"--") {
            return Ok(parts);
        }
        let Some(end) = find(rest, b"\r\n\r\n") else {
            return if whole {
                Err("part head cut short".into())
            } else {
                Ok(parts)
            };
        };
        let text = String::from_utf8_lossy(&rest[..end]).into_owned();
        let range = text
            .lines()
            .find_map(|l| l.strip_prefix("Content-Range: "))
            .and_then(parse_content_range)
            .ok_or_else(|| format!("part without Content-Range: {text:?}"))?;
        rest = &rest[end + 4..];
        let len = (range.1 - range.0 + 1) as usize;
        let take = len.min(rest.len());
        parts.push((range.0, range.1, range.2, &rest[..take]));
        if take < len {
            return if whole {
                Err("part body cut short".into())
            } else {
                Ok(parts)
            };
        }
        rest = &rest[take..];
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn parse_content_range(v: &str) -> Option<(u64, u64, u64)> {
    let v = v.trim().strip_prefix("bytes ")?;
    let (range, total) = v.split_once('/')?;
    let (a, b) = range.split_once('-')?;
    Some((a.parse().ok()?, b.parse().ok()?, total.parse().ok()?))
}

fn parse_head(text: &str) -> Result<Head, String> {
    let mut lines = text.split("\r\n");
    let status_line = lines.next().ok_or("empty head")?;
    let status = status_line
        .strip_prefix("HTTP/1.1 ")
        .and_then(|s| s.get(..3))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let mut head = Head {
        status,
        content_length: None,
        content_range: None,
        boundary: None,
        close: false,
        content_encoding: None,
        location: None,
    };
    for line in lines {
        let (name, value) = line.split_once(':').ok_or("header without colon")?;
        let value = value.trim();
        match name.to_ascii_lowercase().as_str() {
            "content-length" => {
                head.content_length = Some(value.parse().map_err(|_| "bad Content-Length")?)
            }
            "content-range" => head.content_range = parse_content_range(value),
            "content-type" => {
                if let Some(b) = value.split("boundary=").nth(1) {
                    head.boundary = Some(b.trim_matches('"').to_string());
                }
            }
            "connection" => head.close = value.eq_ignore_ascii_case("close"),
            "content-encoding" => head.content_encoding = Some(value.to_string()),
            "location" => head.location = Some(value.to_string()),
            _ => {}
        }
    }
    Ok(head)
}
