//! The shard's side of a response: parse the request, resolve its path and acquire the file
//! (side effects), hand what the cache knows to the pure `http::plan`, write the plan's head
//! into the connection's header buffer and its body parts into the chunk pipeline's segments.

use super::conn::{Body, BodyBuffers, Segment, Source};
use super::files::{ReadMode, TargetError};
use super::slots::{ConnSlot, FileSlot};
use super::{access_log, ring, RingOps, Shard};
use crate::http::date::DateCache;
use crate::http::plan::{self, BodyPart, FileFacts, PlanContext, PlanLimits, ResponsePlan};
use crate::http::request::{parse_request, Method, Parsed, Request};
use crate::metrics::ShardMetrics;
use crate::tls::sniff::FirstBytes;

/// The answer to a TLS ClientHello on the cleartext port, then a close.
pub static TLS_ON_CLEARTEXT_PORT: &[u8] = b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 64\r\nConnection: close\r\n\r\nA TLS handshake was sent to a plain HTTP port: use http:// here\n";

/// The answer to a request on a connection over `max_connections_per_client`, then a close
/// (`Retry-After` is `client::cap::CLIENT_CAP_RETRY_AFTER_S`).
pub static CLIENT_OVER_CAP: &[u8] = b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 5\r\nContent-Type: text/plain\r\nContent-Length: 51\r\nConnection: close\r\n\r\nToo many connections from this client: retry later\n";

impl<R: RingOps> Shard<R> {
    /// Parses the next request in the connection's buffer and starts its response, or arms a
    /// receive when the head is not complete yet.
    pub(super) fn start_request(&mut self, c: ConnSlot) {
        let conn = &mut self.conns[c.index()];
        // The parse runs only when it can say more than Partial.
        if !conn.head_may_be_complete() {
            self.drive(c, |m, cx, out| m.need_more_request(cx, out));
            return;
        }
        let rx = conn.take_rx();
        ShardMetrics::add(&self.metrics.head_parses, 1);
        let parsed = parse_request(&rx);
        // A request resumed after its fill was noted when it first arrived (its clock runs
        // from then).
        if !matches!(parsed, Parsed::Partial) && !self.cache.pulls.resuming {
            self.note_request(c, &rx, &parsed);
        }
        let over_cap = self.conns[c.index()].over_cap();
        let consumed = match parsed {
            Parsed::Partial => 0,
            _ if over_cap => {
                self.respond_canned(c, 429, CLIENT_OVER_CAP);
                0
            }
            Parsed::Rejected(_) if crate::tls::sniff::classify(&rx) == FirstBytes::TlsHandshake => {
                self.respond_canned(c, 400, TLS_ON_CLEARTEXT_PORT);
                0
            }
            Parsed::Rejected(reject) => {
                self.respond_status(c, reject.status, false, false);
                0
            }
            Parsed::Complete { request, head_len } => {
                self.respond(c, &request);
                // A request waiting for the cache fill stays in `rx`, to be parsed again.
                if self.conns[c.index()].awaiting_fill() {
                    0
                } else {
                    head_len
                }
            }
        };
        self.conns[c.index()].return_rx(rx, consumed);
        self.drive(c, |m, cx, out| m.need_more_request(cx, out));
    }

    /// Seed for a multipart boundary: differs per shard, connection and moment.
    pub(super) fn boundary_seed(&self, c: ConnSlot) -> u64 {
        (self.index as u64) << 48
            ^ u64::from(c.raw()) << 24
            ^ self.clock.now_ms
            ^ self.metrics_requests()
    }

    /// Starts the clock of a request and keeps what the access log needs.
    fn note_request(&mut self, c: ConnSlot, rx: &[u8], parsed: &Parsed<'_>) {
        let cx = self.cx();
        let logging = self.access_log.is_some();
        let conn = &mut self.conns[c.index()];
        let method = match parsed {
            Parsed::Complete { request, .. } => Some(request.method),
            _ => None,
        };
        conn.request_parsed(method, &cx);
        // The request's client: the connection's (PROXY-given or peer), or the right-most
        // untrusted hop of X-Forwarded-For / Forwarded when that one is a trusted proxy.
        let request_client = conn.client().addr().map(|a| match parsed {
            Parsed::Complete { request, .. } => crate::client::forwarded::client_ip(
                a.ip(),
                request.x_forwarded_for.lines(),
                request.forwarded.lines(),
                &self.policy.trusted,
            ),
            _ => a.ip(),
        });
        conn.set_request_client(request_client);
        if !logging {
            return;
        }
        let (log_request, log_range) = conn.log_fields_cleared();
        // The request line as received (up to CR/LF), sanitised and capped.
        let line_end = rx
            .iter()
            .position(|&b| b == b'\r' || b == b'\n')
            .unwrap_or(rx.len());
        access_log::sanitize_into(
            log_request,
            &rx[..line_end],
            access_log::LOG_TARGET_MAX_BYTES,
        );
        if let Parsed::Complete { request, .. } = parsed {
            if let Some(r) = request.range {
                access_log::sanitize_into(log_range, r, access_log::LOG_TARGET_MAX_BYTES);
            }
        }
    }

    /// The configured limits the response plan obeys on connection `c` (a TLS chunk
    /// carries less plaintext: its records' framing must fit the slot).
    pub(super) fn plan_limits(&self, c: ConnSlot) -> PlanLimits<'_> {
        let chunk_bytes = if self.conns[c.index()].tls().is_some() {
            crate::tls::record::chunk_plaintext_capacity(
                self.cfg.chunk_bytes,
                self.cfg.tls_record_bytes,
            )
        } else {
            self.cfg.chunk_bytes
        };
        PlanLimits {
            max_ranges: self.cfg.max_ranges,
            chunk_bytes,
            diag_endpoint: self.cfg.diag_endpoint,
            health_path: self.cfg.health_path.as_bytes(),
        }
    }

    /// A response with no file body (errors, 405, health): header and a short text, or only
    /// the header when answering a HEAD request.
    pub(super) fn respond_status(
        &mut self,
        c: ConnSlot,
        status: u16,
        keep_alive: bool,
        head: bool,
    ) {
        let ctx = plan_context(&self.clock.date, self.leaving(), self.boundary_seed(c));
        let plan = plan::plan_status(status, keep_alive, head, &ctx);
        let bufs = self.pools.body_pool.pop().unwrap_or_default();
        let started = start_plan(self.ring.tx_mut(c), &plan, bufs);
        self.install(c, started, None, self.default_rate());
    }

    /// A fixed answer (wrong protocol on this port), then a close.
    fn respond_canned(&mut self, c: ConnSlot, status: u16, bytes: &'static [u8]) {
        self.respond_bytes_then_close(c, status, |tx| tx.extend_from_slice(bytes));
    }

    /// `503` with `Retry-After: retry_after_s`, then a close: a pulled request that waited
    /// its `cache_wait_timeout_ms` for an origin that asked the edge to wait.
    pub(super) fn respond_retry_later(&mut self, c: ConnSlot, retry_after_s: u64, head: bool) {
        const BODY: &str = "The origin asked this edge to wait: retry later\n";
        let mut date = [0u8; crate::http::date::HTTP_DATE_BYTES];
        date.copy_from_slice(self.clock.date.header_value());
        self.respond_bytes_then_close(c, 503, |tx| {
            use std::io::Write;
            tx.extend_from_slice(b"HTTP/1.1 503 Service Unavailable\r\nDate: ");
            tx.extend_from_slice(&date);
            let _ = write!(
                tx,
                "\r\nRetry-After: {retry_after_s}\r\nContent-Type: text/plain\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n",
                BODY.len()
            );
            if !head {
                tx.extend_from_slice(BODY.as_bytes());
            }
        });
    }

    /// An answer written whole into the connection's send buffer by `write`, then a close.
    fn respond_bytes_then_close(
        &mut self,
        c: ConnSlot,
        status: u16,
        write: impl FnOnce(&mut Vec<u8>),
    ) {
        let tx = self.ring.tx_mut(c);
        tx.clear();
        write(tx);
        let bufs = self.pools.body_pool.pop().unwrap_or_default();
        let started = Started {
            status,
            keep_alive: false,
            inline_head: false,
            reads_file: false,
            buffers: bufs,
        };
        self.install(c, started, None, self.default_rate());
    }

    fn respond(&mut self, c: ConnSlot, req: &Request<'_>) {
        // A new response: whatever the last one streamed is over (a request parsed again
        // after its fill keeps what its first parse noted).
        self.cache.pulls.streams.remove(self.conn_ref(c));
        self.fill_reads_end(c);
        if !self.cache.pulls.resuming {
            self.conns[c.index()].set_cache_label(None);
            self.conns[c.index()].set_cache_origin(None);
        }
        let keep_alive = req.keep_alive && !self.leaving();
        let head_only = req.method == Method::Head;
        let limits = self.plan_limits(c);
        let ctx = plan_context(&self.clock.date, self.leaving(), self.boundary_seed(c));
        if let Some(plan) = plan::plan_without_file(req, &limits, &ctx) {
            let bufs = self.pools.body_pool.pop().unwrap_or_default();
            let started = start_plan(self.ring.tx_mut(c), &plan, bufs);
            return self.install(c, started, None, self.default_rate());
        }
        let (signature, rate) = self.path_rules(req);
        if let Err(refusal) = signature {
            self.count(super::machine::Counter::SignedUrl(refusal), 1);
            return self.respond_status(c, 403, keep_alive, head_only);
        }
        if self.respond_pulled(c, req, rate) {
            return;
        }
        let idx = match self
            .files
            .acquire_target(&mut self.ring, req.path, self.clock.now_ms)
        {
            Ok(idx) => idx,
            Err(TargetError::Path(e)) => {
                let status = e.status();
                return self.respond_status(c, status, keep_alive && status < 400, head_only);
            }
            Err(TargetError::Open(e)) => {
                if let super::files::OpenError::Other(errno) = e {
                    let path = self.files.target_path();
                    tracing::warn!(shard = self.index, errno, path, "open failed");
                }
                return self.respond_status(c, e.status(), keep_alive, head_only);
            }
        };
        let limits = self.plan_limits(c);
        let ctx = plan_context(&self.clock.date, self.leaving(), self.boundary_seed(c));
        let f = self.files.get(idx);
        let facts = FileFacts {
            size: f.size,
            etag: f.etag(),
            last_modified: &f.last_modified,
            mtime_secs: f.mtime_secs,
            read: f.mode,
            content_type: f.content_type,
            extra: b"",
        };
        let plan = plan::plan_response(req, &facts, &limits, &ctx);
        let bufs = self.pools.body_pool.pop().unwrap_or_default();
        let started = start_plan(self.ring.tx_mut(c), &plan, bufs);
        if !started.reads_file {
            self.files.release(&mut self.ring, idx);
            return self.install(c, started, None, self.default_rate());
        }
        self.install(c, started, Some(idx), rate);
    }

    /// The server-wide per-response rate (`limit_rate_bytes_per_s`).
    fn default_rate(&self) -> crate::limits::RateSpec {
        crate::limits::RateSpec {
            rate_bytes_per_s: self.cfg.limit_rate_bytes_per_s,
            after_bytes: self.cfg.limit_rate_after_bytes,
        }
    }

    /// What the rules on the request's canonical path decide before the file is opened: its
    /// signature's verdict (`[[signed_url]]`) and its rate (`[[rate_limit]]`, else the
    /// server-wide one). The path is resolved once, into the shard's scratch, and only when a
    /// rule exists; a path that does not resolve is left to `acquire_target`'s own answer.
    fn path_rules(
        &mut self,
        req: &Request<'_>,
    ) -> (Result<(), crate::signing::Refusal>, crate::limits::RateSpec) {
        let default = self.default_rate();
        if self.policy.signing.is_empty() && self.cfg.rate_limit.is_empty() {
            return (Ok(()), default);
        }
        let mut scratch = std::mem::take(&mut self.policy.path_scratch);
        let rules = match crate::fs::resolve::resolve_into(req.path, &mut scratch) {
            Ok(path) => {
                let signature = if self.policy.signing.is_empty() {
                    Ok(())
                } else {
                    let now_s = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs());
                    self.policy.signing.check(&path, req.query, now_s)
                };
                let rate = crate::limits::rate::rate_for(&self.cfg.rate_limit, &path, default);
                (signature, rate)
            }
            Err(_) => (Ok(()), default),
        };
        self.policy.path_scratch = scratch;
        rules
    }

    /// Starts a planned response on the connection: its state, where its head is sent from,
    /// and its body work. `file` is the open-file entry the body reads (held until it is done).
    pub(super) fn install(
        &mut self,
        c: ConnSlot,
        started: Started,
        file: Option<FileSlot>,
        rate: crate::limits::RateSpec,
    ) {
        let (file_fixed, align, rw_flags, source) = match file {
            Some(idx) => {
                let f = self.files.get(idx);
                let (align, rw_flags, source) = read_params(f.mode);
                (self.ring.file_fixed_index(f.fixed), align, rw_flags, source)
            }
            None => (0, 1, 0, Source::Memory),
        };
        let bufs = started.buffers;
        let body = if bufs.segments.is_empty() {
            self.pools.body_pool.push(bufs);
            None
        } else {
            Some(Body {
                file,
                file_fixed,
                align,
                rw_flags,
                source,
                segments: bufs.segments,
                framing: bufs.framing,
                chunks: bufs.chunks,
                inline_head: started.inline_head,
                small: started.inline_head,
                read_ahead: super::READ_AHEAD_START_CHUNKS,
                read_size_bytes: self.cfg.chunk_bytes,
                limit_cap_bytes: usize::MAX,
                readable_end: u64::MAX,
                awaiting_block: false,
                relay: false,
            })
        };
        let cx = self.cx();
        if !started.inline_head {
            // Over TLS the head leaves as records of its own (a small response's head is
            // sealed with its body, in the chunk).
            if let Some(tls) = self.conns[c.index()].tls_mut() {
                tls.seal_tail(self.ring.tx_mut(c), 0, self.cfg.tls_record_bytes as u32);
            }
        }
        let head_len = self.ring.tx_len(c);
        self.conns[c.index()].begin_response(
            started.status,
            started.keep_alive,
            head_len,
            body,
            rate,
            &cx,
        );
    }
}

/// What a plan leaves for the connection once its head is in the header buffer.
pub(super) struct Started {
    status: u16,
    keep_alive: bool,
    pub(super) inline_head: bool,
    pub(super) reads_file: bool,
    /// The segments and the multipart framing (every part header and the closing boundary,
    /// in one buffer), in queues from the shard's pool.
    buffers: BodyBuffers,
}

impl Started {
    /// The one file range the body reads (`pos..end`), or None when it has none or several
    /// (multipart).
    pub(super) fn single_file_range(&self) -> Option<(u64, u64)> {
        let mut files = self.buffers.segments.iter().filter_map(|s| match *s {
            Segment::File { pos, end } => Some((pos, end)),
            _ => None,
        });
        let first = files.next()?;
        files.next().is_none().then_some(first)
    }

    /// The body's queues go back to `pool` (a plan that will not be installed).
    pub(super) fn give_back(self, pool: &mut Vec<BodyBuffers>) {
        let mut bufs = self.buffers;
        bufs.segments.clear();
        bufs.chunks.clear();
        bufs.framing.clear();
        pool.push(bufs);
    }
}

/// Writes the plan's head into the connection's header buffer and turns its body parts into
/// the chunk pipeline's segments (framing rendered once into one buffer per response).
pub(super) fn start_plan(
    tx: &mut Vec<u8>,
    plan: &ResponsePlan<'_>,
    mut buffers: BodyBuffers,
) -> Started {
    tx.clear();
    plan.write_head(tx);
    let BodyBuffers {
        segments, framing, ..
    } = &mut buffers;
    for part in plan.parts() {
        segments.push_back(match part {
            BodyPart::File { start, end } => Segment::File { pos: start, end },
            BodyPart::Zero { len } => Segment::Zero { remaining: len },
            BodyPart::PartHeader { .. } | BodyPart::Closing => {
                let start = framing.len() as u32;
                plan.render_to(part, framing);
                Segment::Mem {
                    start,
                    end: framing.len() as u32,
                }
            }
        });
    }
    Started {
        status: plan.status(),
        keep_alive: plan.keep_alive(),
        inline_head: plan.inline_head(),
        reads_file: plan.reads_file(),
        buffers,
    }
}

/// The moment's facts the response plan depends on (a free function so the plan borrows only
/// the date cache, leaving the ring free for the head).
pub(super) fn plan_context(date: &DateCache, leaving: bool, boundary_seed: u64) -> PlanContext<'_> {
    PlanContext {
        date: date.header_value(),
        leaving,
        boundary_seed,
    }
}

/// Read alignment, `rw_flags` and counter label for a file body.
fn read_params(mode: ReadMode) -> (u64, i32, Source) {
    match mode {
        ReadMode::Direct { align } => (u64::from(align), 0, Source::Direct),
        ReadMode::DontCache => (1, ring::RWF_DONTCACHE, Source::DontCache),
        ReadMode::Buffered => (1, 0, Source::Buffered),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::request::Version;

    const DATE: &[u8] = b"Sun, 06 Nov 1994 08:49:37 GMT";

    fn request(range: Option<&'static [u8]>) -> Request<'static> {
        Request {
            method: Method::Get,
            version: Version::Http11,
            path: b"/f.bin",
            query: None,
            keep_alive: true,
            range,
            if_match: None,
            if_unmodified_since: None,
            if_none_match: None,
            if_modified_since: None,
            if_range: None,
            authorization: None,
            fields: b"",
            x_forwarded_for: Default::default(),
            forwarded: Default::default(),
            host: None,
        }
    }

    fn plan_for(req: &Request<'_>, read: ReadMode) -> ResponsePlan<'static> {
        let facts = FileFacts {
            size: 1000,
            etag: b"\"e\"",
            last_modified: DATE,
            mtime_secs: 0,
            read,
            content_type: "text/plain",
            extra: b"",
        };
        let limits = PlanLimits {
            max_ranges: 16,
            chunk_bytes: 512 * 1024,
            diag_endpoint: false,
            health_path: b"",
        };
        let ctx = PlanContext {
            date: DATE,
            leaving: false,
            boundary_seed: 7,
        };
        plan::plan_response(req, &facts, &limits, &ctx)
    }

    #[test]
    fn multipart_plan_becomes_framing_and_file_segments() {
        let plan = plan_for(
            &request(Some(b"bytes=0-9,100-109")),
            ReadMode::Direct { align: 512 },
        );
        let mut tx = b"left over from the last response".to_vec();
        let started = start_plan(&mut tx, &plan, BodyBuffers::default());
        let mut head = Vec::new();
        plan.write_head(&mut head);
        assert_eq!(tx, head);
        assert_eq!((started.status, started.keep_alive), (206, true));
        assert!(started.reads_file && !started.inline_head);
        // Framing, range, framing, range, closing; the bytes add up to Content-Length.
        let mut total = 0u64;
        let mut files = Vec::new();
        for (seg, part) in started.buffers.segments.iter().zip(plan.parts()) {
            match (seg, part) {
                (Segment::File { pos, end }, BodyPart::File { start, end: e }) => {
                    assert_eq!((*pos, *end), (start, e));
                    files.push((start, e));
                    total += e - start;
                }
                (Segment::Mem { start, end }, BodyPart::PartHeader { .. } | BodyPart::Closing) => {
                    let bytes = &started.buffers.framing[*start as usize..*end as usize];
                    let mut want = Vec::new();
                    plan.render_to(part, &mut want);
                    assert_eq!(bytes, want);
                    total += bytes.len() as u64;
                }
                other => panic!("segment does not match its part: {other:?}"),
            }
        }
        assert_eq!(started.buffers.segments.len(), 5);
        assert_eq!(files, [(0, 10), (100, 110)]);
        assert_eq!(total, plan.body_len());
    }

    #[test]
    fn small_buffered_file_keeps_its_head_for_the_chunk() {
        let started = start_plan(
            &mut Vec::new(),
            &plan_for(&request(None), ReadMode::Buffered),
            BodyBuffers::default(),
        );
        assert!(started.inline_head && started.reads_file);
        assert!(matches!(
            started.buffers.segments.front(),
            Some(Segment::File { pos: 0, end: 1000 })
        ));
        let head_only = Request {
            method: Method::Head,
            ..request(None)
        };
        let started = start_plan(
            &mut Vec::new(),
            &plan_for(&head_only, ReadMode::Buffered),
            BodyBuffers::default(),
        );
        assert!(started.buffers.segments.is_empty() && !started.reads_file && !started.inline_head);
    }

    #[test]
    fn canned_answers_declare_their_length() {
        for (canned, status) in [
            (TLS_ON_CLEARTEXT_PORT, 400),
            (crate::tls::session::PLAIN_HTTP_ON_TLS_PORT, 400),
            (CLIENT_OVER_CAP, 429),
        ] {
            let text = std::str::from_utf8(canned).unwrap();
            let (head, body) = text.split_once("\r\n\r\n").unwrap();
            assert!(head.starts_with(&format!("HTTP/1.1 {status} ")), "{head}");
            assert!(
                head.contains(&format!("\r\nContent-Length: {}\r\n", body.len())),
                "{head}"
            );
        }
        let retry = format!(
            "\r\nRetry-After: {}\r\n",
            crate::client::cap::CLIENT_CAP_RETRY_AFTER_S
        );
        assert!(std::str::from_utf8(CLIENT_OVER_CAP)
            .unwrap()
            .contains(&retry));
    }

    #[test]
    fn file_reads_map_to_the_pipeline_parameters() {
        assert_eq!(
            read_params(ReadMode::Direct { align: 4096 }),
            (4096, 0, Source::Direct)
        );
        assert_eq!(
            read_params(ReadMode::DontCache),
            (1, ring::RWF_DONTCACHE, Source::DontCache)
        );
        assert_eq!(read_params(ReadMode::Buffered), (1, 0, Source::Buffered));
    }
}
