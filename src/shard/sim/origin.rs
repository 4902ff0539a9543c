//! The origin of a simulated edge (issue 20): an HTTP/1.1 server modelled per origin socket,
//! which the fake ring's plain-descriptor operations (connect poll, send, receive) talk to.
//!
//! The shard's filler makes real non-blocking sockets connected to a real loopback listener
//! (held here, its connections accepted and kept, so every socket stays connected); no byte
//! crosses them. What the filler sends is parsed here as a request, and the answer, built
//! from the object's current version in `Net::files`, comes back in random splits: a 206 for
//! the range asked, or, as faults, a 200 with the whole object, a 503, a first byte held
//! past the fetch's timeout, a reset or a short body partway, a `Connection: close`. An
//! object may change version at a scheduled moment (a new ETag and new bytes): every
//! response a client gets must still come from one version.
//!
//! Each object's replies carry its `Contract`'s fields (issue 42): Cache-Control, Vary,
//! Content-Encoding, or a 302 or 410 instead; an object that may not be stored is answered
//! with the bytes of the client its request names (`X-Client`, `per_client_body`).

use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, TcpListener, TcpStream};

use super::model::{per_client_body, redirect_location, take_front, SimFile};
use super::rng::Rng;

/// Longest the origin holds a slow response's first byte (µs): past the filler's first-byte
/// timeout in the simulation, so some fetches time out and are tried again.
const SLOW_FIRST_BYTE_MAX_US: u64 = 3_000_000;
/// Longest after a reply that its trailing bytes may arrive (µs), when they come late.
const TRAILING_LATE_MAX_US: u64 = 50_000;
/// What a poisoning origin sends past a reply: a reply of its own, which must never be taken
/// as the answer to the next request on that connection.
const POISON: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Length: 16\r\nETag: \"evil\"\r\n\r\nPOISONPOISONPOIS";

/// Fault rates of the origin and of the cache's disk, in percent per opportunity.
#[derive(Clone, Debug, Default)]
pub struct OriginFaults {
    /// A response's first byte is held for up to `SLOW_FIRST_BYTE_MAX_US`.
    pub slow_pct: u64,
    /// The connection is reset partway through a response.
    pub reset_pct: u64,
    /// A body ends before its Content-Length, and the connection closes.
    pub short_pct: u64,
    /// A 503 instead of the object.
    pub error_pct: u64,
    /// A 200 with the whole object, to a Range request.
    pub whole_pct: u64,
    /// `Connection: close` after a whole response.
    pub close_pct: u64,
    /// A block write to the cache's disk fails with ENOSPC (the fill passes through).
    pub disk_full_pct: u64,
    /// A read of a cached block returns one flipped byte (its checksum must catch it).
    pub corrupt_pct: u64,
    /// A whole reply is followed by `POISON`, in the same write or later while the connection
    /// is idle (issue 45).
    pub trailing_pct: u64,
    /// A reply's head carries repeated or odd fields: some the filler must accept (a repeated
    /// equal Content-Length, interim 1xx replies before it), some it must refuse (a second
    /// Content-Range, Transfer-Encoding beside Content-Length, a signed Content-Length).
    pub odd_fields_pct: u64,
}

impl OriginFaults {
    /// Whether any fault can make a pulled response fail or end early.
    pub fn any(&self) -> bool {
        self.slow_pct
            + self.reset_pct
            + self.short_pct
            + self.error_pct
            + self.close_pct
            + self.whole_pct
            + self.disk_full_pct
            + self.corrupt_pct
            + self.odd_fields_pct
            > 0
    }
}

/// One origin connection as the origin sees it.
#[derive(Debug, Default)]
struct OriginConn {
    /// Request bytes received and not yet answered.
    request: Vec<u8>,
    /// Response bytes not yet received by the filler.
    response: VecDeque<u8>,
    /// No response byte leaves before this (virtual µs).
    ready_at_us: u64,
    /// Response bytes left before the connection is reset (None: no reset planned).
    reset_after: Option<usize>,
    /// The origin closes the connection once `response` is drained.
    eof_after: bool,
    /// The connection was reset.
    reset: bool,
    /// Bytes past the last reply that arrive at this moment (µs), unless a request comes
    /// first.
    late: Option<(u64, &'static [u8])>,
}

/// What a receive on an origin socket finds.
pub enum OriginRecv {
    /// Nothing yet: the receive waits.
    Pending,
    /// Bytes (at most the room asked for).
    Data(Vec<u8>),
    /// The origin closed the connection.
    Eof,
    /// The connection was reset.
    Reset,
}

/// The simulated origin (see the module doc).
pub struct Origin {
    listener: TcpListener,
    /// Connections accepted from the listener, kept open for the run (no byte is read).
    accepted: Vec<TcpStream>,
    /// Per origin socket (by the filler's descriptor number, new at each connect).
    conns: HashMap<i32, OriginConn>,
    /// Indices into `Net::files` of the objects it serves (their URL is the origin path).
    pub objects: Vec<usize>,
    /// Fault rates.
    pub faults: OriginFaults,
    /// Version changes to make: (when, index into `objects`), in time order.
    pub changes: VecDeque<(u64, usize)>,
    /// Requests answered.
    pub requests: u64,
    /// Body bytes of 200 and 206 answers of storable objects queued (the coalescing check
    /// counts them; each client's own answers are not shared, so not counted).
    pub body_bytes: u64,
    /// Responses that carried a fault.
    pub faults_done: u64,
    rng: Rng,
    /// The framing faults' own stream (trailing bytes, odd fields), so adding them left every
    /// other draw of a seed as it was.
    framing_rng: Rng,
}

impl Origin {
    /// An origin on a fresh loopback listener serving `objects` (indices into the files).
    pub fn new(
        objects: Vec<usize>,
        faults: OriginFaults,
        changes: VecDeque<(u64, usize)>,
        seed: u64,
    ) -> std::io::Result<Origin> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        Ok(Origin {
            listener,
            accepted: Vec::new(),
            conns: HashMap::new(),
            objects,
            faults,
            changes,
            requests: 0,
            body_bytes: 0,
            faults_done: 0,
            rng: Rng::new(seed ^ 0x0419_1e55),
            framing_rng: Rng::new(seed ^ 0x0045_f7a3),
        })
    }

    /// Where the filler connects.
    pub fn addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accepts what reached the listener (so no connect waits on a full backlog).
    pub fn accept_pending(&mut self) {
        while let Ok((s, _)) = self.listener.accept() {
            self.accepted.push(s);
        }
    }

    /// A new connection on descriptor `fd` (an earlier one with that number is over).
    pub fn connect(&mut self, fd: i32) {
        self.conns.insert(fd, OriginConn::default());
    }

    /// The origin receives `bytes` on `fd`; returns how many it took (a prefix, at least one)
    /// or None when the connection was reset.
    pub fn send(&mut self, fd: i32, bytes: &[u8], files: &[SimFile], now_us: u64) -> Option<usize> {
        let n = self.rng.split(bytes.len());
        let conn = self.conns.entry(fd).or_default();
        if conn.reset {
            return None;
        }
        if conn.late.is_some_and(|(at, _)| at > now_us) {
            // Bytes past a reply that would arrive after the next request was sent cannot be
            // told from its answer by anyone: the model sends them only while the connection
            // is idle.
            conn.late = None;
        }
        conn.request.extend_from_slice(&bytes[..n]);
        while let Some(end) = find(&self.conns[&fd].request, b"\r\n\r\n") {
            let conn = self.conns.get_mut(&fd).expect("present");
            let head: Vec<u8> = conn.request.drain(..end + 4).collect();
            self.answer(fd, &String::from_utf8_lossy(&head), files, now_us);
        }
        Some(n)
    }

    /// A receive of at most `room` bytes on `fd`.
    pub fn recv(&mut self, fd: i32, room: usize, now_us: u64) -> OriginRecv {
        let split = self.rng.split(room.max(1));
        let Some(conn) = self.conns.get_mut(&fd) else {
            return OriginRecv::Pending;
        };
        if conn.reset {
            return OriginRecv::Reset;
        }
        if let Some((_, bytes)) = conn.late.take_if(|(at, _)| *at <= now_us) {
            conn.response.extend(bytes);
        }
        if conn.response.is_empty() {
            return if conn.eof_after {
                OriginRecv::Eof
            } else {
                OriginRecv::Pending
            };
        }
        if now_us < conn.ready_at_us {
            return OriginRecv::Pending;
        }
        let mut n = split.min(conn.response.len());
        if let Some(left) = conn.reset_after {
            if left == 0 {
                conn.reset = true;
                conn.response.clear();
                return OriginRecv::Reset;
            }
            n = n.min(left);
            conn.reset_after = Some(left - n);
        }
        OriginRecv::Data(take_front(&mut conn.response, n))
    }

    /// The earliest moment a held response becomes ready (µs), after `now_us`.
    pub fn next_event_us(&self, now_us: u64) -> Option<u64> {
        let ready = self
            .conns
            .values()
            .filter(|c| !c.response.is_empty() && c.ready_at_us > now_us)
            .map(|c| c.ready_at_us);
        let late = self
            .conns
            .values()
            .filter_map(|c| c.late.map(|(at, _)| at))
            .filter(|&at| at > now_us);
        let ready = ready.chain(late);
        ready.chain(self.changes.front().map(|c| c.0)).min()
    }

    /// Queues the answer to request `head` on `fd`.
    fn answer(&mut self, fd: i32, head: &str, files: &[SimFile], now_us: u64) {
        self.requests += 1;
        let (path, range, if_none_match) = parse_request(head);
        let object = self.objects.iter().copied().find(|&f| files[f].url == path);
        let Some(f) = object else {
            return self.queue(
                fd,
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec(),
            );
        };
        let contract = files[f].contract;
        if std::env::var_os("SHARDLINE_SIM_VERBOSE").is_some() {
            eprintln!(
                "origin at {now_us} µs, fd {fd}: {path} range {range:?} client {:?}",
                client_of(head)
            );
        }
        if let Some(status) = contract.status() {
            // A redirect or a 4xx, whatever was asked: the client must get it as it is.
            let head = match status {
                302 => format!(
                    "HTTP/1.1 302 Found\r\nLocation: {}\r\nContent-Length: 6\r\n\r\nmoved\n",
                    redirect_location(&path)
                ),
                _ => "HTTP/1.1 410 Gone\r\nContent-Length: 5\r\n\r\ngone\n".to_string(),
            };
            return self.queue(fd, head.into_bytes());
        }
        let version = files[f].versions.len() - 1;
        // Each client's own answer (private, no-store, Vary: X-Client) is made for the
        // client its request names: no other may ever receive it.
        let own;
        let content: &[u8] = if contract.per_client() {
            own = per_client_body(&files[f].versions[version], client_of(head));
            &own
        } else {
            &files[f].versions[version]
        };
        let size = content.len() as u64;
        let etag = format!("\"o{f}v{version}\"");
        let validators = format!(
            "ETag: {etag}\r\nLast-Modified: Mon, 01 Jan 2024 00:00:{version:02} GMT\r\n{}",
            contract.fields()
        );
        if if_none_match.as_deref() == Some(etag.as_str()) {
            let head = format!("HTTP/1.1 304 Not Modified\r\n{validators}\r\n");
            return self.queue(fd, head.into_bytes());
        }
        let faults = self.faults.clone();
        if self.rng.chance(faults.error_pct) {
            self.faults_done += 1;
            return self.queue(
                fd,
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy".to_vec(),
            );
        }
        let whole = range.is_none() || self.rng.chance(faults.whole_pct);
        let close = self.rng.chance(faults.close_pct);
        let connection = if close { "Connection: close\r\n" } else { "" };
        let (head, body) = match range {
            Some((first, _)) if !whole && first >= size => {
                let head = format!(
                    "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{size}\r\n\
                     Content-Length: 0\r\n{connection}\r\n"
                );
                (head, &content[..0])
            }
            Some((first, last)) if !whole => {
                let last = last.min(size - 1);
                let body = &content[first as usize..=last as usize];
                let head = format!(
                    "HTTP/1.1 206 Partial Content\r\nContent-Type: application/octet-stream\r\n\
                     Content-Length: {}\r\nContent-Range: bytes {first}-{last}/{size}\r\n\
                     {validators}{connection}\r\n",
                    body.len()
                );
                (head, body)
            }
            _ => {
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n\
                     Content-Length: {size}\r\n{validators}{connection}\r\n"
                );
                (head, content)
            }
        };
        if !contract.per_client() {
            self.body_bytes += body.len() as u64;
        }
        if whole && range.is_some() {
            self.faults_done += 1;
        }
        let head = self.odd_fields(head, !whole);
        let mut bytes = head.into_bytes();
        let head_len = bytes.len();
        bytes.extend_from_slice(body);
        let mut late = None;
        if self.framing_rng.chance(faults.trailing_pct) {
            self.faults_done += 1;
            if self.framing_rng.chance(50) {
                bytes.extend_from_slice(POISON);
            } else {
                late = Some((
                    now_us + self.framing_rng.range(1, TRAILING_LATE_MAX_US),
                    POISON,
                ));
            }
        }
        let short = !body.is_empty() && self.rng.chance(faults.short_pct);
        if short {
            // A wrong length: the body ends early and the origin closes.
            self.faults_done += 1;
            bytes.truncate(head_len + self.rng.below(body.len() as u64) as usize);
        }
        let reset = self.rng.chance(faults.reset_pct);
        let slow = self.rng.chance(faults.slow_pct);
        let reset_after = reset.then(|| self.rng.below(bytes.len() as u64) as usize);
        let held_us = if slow {
            self.rng.range(1000, SLOW_FIRST_BYTE_MAX_US)
        } else {
            0
        };
        self.faults_done += u64::from(reset) + u64::from(slow);
        self.queue(fd, bytes);
        let conn = self.conns.get_mut(&fd).expect("queued above");
        conn.ready_at_us = now_us + held_us;
        conn.reset_after = reset_after;
        conn.eof_after |= close || short;
        conn.late = late.map(|(at, b)| (at + held_us, b));
    }

    /// `head` (a whole head, its empty line last) with an odd field, as `odd_fields_pct`
    /// asks: harmless ones the filler must accept, or ones it must refuse (counted as faults).
    fn odd_fields(&mut self, head: String, ranged: bool) -> String {
        if !self.framing_rng.chance(self.faults.odd_fields_pct) {
            return head;
        }
        let body_start = head.len() - 2;
        let with = |field: &str| format!("{}{field}\r\n\r\n", &head[..body_start]);
        let length = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .unwrap_or("0")
            .to_owned();
        match self.framing_rng.below(6) {
            0 => format!("HTTP/1.1 100 Continue\r\n\r\n{head}"),
            1 => format!("HTTP/1.1 103 Early Hints\r\nLink: </x>; rel=preload\r\n\r\n{head}"),
            2 => with(&format!("Content-Length: {length}")),
            3 if ranged => {
                self.faults_done += 1;
                with("Content-Range: bytes 0-0/1")
            }
            3 | 4 => {
                self.faults_done += 1;
                with("Transfer-Encoding: identity")
            }
            _ => {
                self.faults_done += 1;
                head.replace("Content-Length: ", "Content-Length: +")
            }
        }
    }

    fn queue(&mut self, fd: i32, bytes: Vec<u8>) {
        self.conns.entry(fd).or_default().response.extend(bytes);
    }
}

/// The client a request names (`X-Client`, which the simulated clients send for objects
/// whose answers are each client's own, and the edge forwards).
fn client_of(head: &str) -> Option<usize> {
    head.split("\r\n")
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("x-client"))
        .and_then(|(_, v)| v.trim().parse().ok())
}

/// The path, range and If-None-Match of a request head the filler sent.
fn parse_request(head: &str) -> (String, Option<(u64, u64)>, Option<String>) {
    let mut lines = head.split("\r\n");
    let path = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .unwrap_or("")
        .to_string();
    let (mut range, mut inm) = (None, None);
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match name.to_ascii_lowercase().as_str() {
            "range" => {
                range = value
                    .strip_prefix("bytes=")
                    .and_then(|r| r.split_once('-'))
                    .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
            }
            "if-none-match" => inm = Some(value.to_string()),
            _ => {}
        }
    }
    (path, range, inm)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filler_s_request_is_parsed() {
        let (path, range, inm) = parse_request(
            "GET /pull/f1.bin HTTP/1.1\r\nHost: o\r\nRange: bytes=65536-131071\r\n\
             If-None-Match: \"o1v0\"\r\n\r\n",
        );
        assert_eq!(path, "/pull/f1.bin");
        assert_eq!(range, Some((65536, 131071)));
        assert_eq!(inm.as_deref(), Some("\"o1v0\""));
    }
}
