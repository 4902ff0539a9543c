//! From a parsed request to a planned response: path resolution, the open-file cache,
//! validators, ranges, and the header — then the body as segments for the chunk pipeline.

use std::collections::VecDeque;

use super::conn::{Body, Segment, Source};
use super::files::{ReadMode, TargetError};
use super::{access_log, ring, RingOps, Shard};
use crate::config::DIAG_ZERO_MAX_BYTES;
use crate::http::conditional::{self, Conditions, Precondition, Validators};
use crate::http::mime;
use crate::http::range::{parse_range, ByteRange, RangeOutcome};
use crate::http::request::{parse_request, Method, Parsed, Request};
use crate::http::response::{self, Boundary, ContentRange, Head};

impl<R: RingOps> Shard<R> {
    /// Parses the next request in the connection's buffer and starts its response, or arms a
    /// receive when the head is not complete yet.
    pub(super) fn start_request(&mut self, c: u32) {
        let rx = std::mem::take(&mut self.conns[c as usize].rx);
        let parsed = parse_request(&rx);
        if !matches!(parsed, Parsed::Partial) {
            self.note_request(c, &rx, &parsed);
        }
        let consumed = match parsed {
            Parsed::Partial => 0,
            Parsed::Rejected(reject) => {
                self.respond_status(c, reject.status, false, false);
                0
            }
            Parsed::Complete { request, head_len } => {
                self.respond(c, &request);
                head_len
            }
        };
        let conn = &mut self.conns[c as usize];
        conn.rx = rx;
        conn.rx.drain(..consumed);
        self.drive(c, |m, _, out| m.need_more_request(out));
    }

    /// Seed for a multipart boundary: differs per shard, connection and moment.
    fn boundary_seed(&self, c: u32) -> u64 {
        (self.index as u64) << 48 ^ u64::from(c) << 24 ^ self.now_ms ^ self.metrics_requests()
    }

    /// Starts the clock of a request and keeps what the access log needs.
    fn note_request(&mut self, c: u32, rx: &[u8], parsed: &Parsed<'_>) {
        let cx = self.cx();
        let logging = self.access_log.is_some();
        let conn = &mut self.conns[c as usize];
        let method = match parsed {
            Parsed::Complete { request, .. } => Some(request.method),
            _ => None,
        };
        conn.request_parsed(method, &cx);
        if !logging {
            return;
        }
        conn.log_request.clear();
        conn.log_range.clear();
        // The request line as received (up to CR/LF), sanitised and capped.
        let line_end = rx
            .iter()
            .position(|&b| b == b'\r' || b == b'\n')
            .unwrap_or(rx.len());
        access_log::sanitize_into(
            &mut conn.log_request,
            &rx[..line_end],
            access_log::LOG_TARGET_MAX_BYTES,
        );
        if let Parsed::Complete { request, .. } = parsed {
            if let Some(r) = request.range {
                access_log::sanitize_into(&mut conn.log_range, r, access_log::LOG_TARGET_MAX_BYTES);
            }
        }
    }

    /// Hands the planned response to the connection's machine (the head is in the header
    /// buffer).
    fn begin_response(&mut self, c: u32, status: u16, keep_alive: bool, body: Option<Body>) {
        let cx = self.cx();
        let head_len = self.ring.tx_len(c as usize);
        self.conns[c as usize].begin_response(status, keep_alive, head_len, body, &cx);
    }

    /// A response with no file body (errors, 405, 304-less statuses): header and a short text,
    /// or only the header when answering a HEAD request.
    pub(super) fn respond_status(&mut self, c: u32, status: u16, keep_alive: bool, head: bool) {
        // A client whose request was malformed may have sent anything after it: close.
        let keep_alive = keep_alive && !self.leaving();
        let tx = self.ring.tx_mut(c as usize);
        tx.clear();
        if status == 405 {
            let head = Head {
                status,
                keep_alive,
                date: self.date.header_value(),
                content_length: Some(0),
                content_type: None,
                last_modified: None,
                etag: None,
                content_range: None,
                accept_ranges: false,
                allow: true,
            };
            response::write_head(&head, tx);
        } else if head {
            response::write_error_head(status, keep_alive, self.date.header_value(), tx);
        } else {
            response::write_error(status, keep_alive, self.date.header_value(), tx);
        }
        self.begin_response(c, status, keep_alive, None);
    }

    fn respond(&mut self, c: u32, req: &Request<'_>) {
        let keep_alive = req.keep_alive && !self.leaving();
        let head_only = req.method == Method::Head;
        if self.cfg.diag_endpoint && req.path == DIAG_ZERO_PATH {
            return self.respond_zero(c, req, keep_alive);
        }
        if !self.cfg.health_path.is_empty() && req.path == self.cfg.health_path.as_bytes() {
            // For the balancer: no file is touched, so a slow disk cannot fail the check.
            let status = if self.leaving() { 503 } else { 200 };
            return self.respond_status(c, status, keep_alive, head_only);
        }
        let idx = match self
            .files
            .acquire_target(&mut self.ring, req.path, self.now_ms)
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
        let f = self.files.get(idx);
        let size = f.size;
        let validators = Validators {
            etag: f.etag(),
            mtime_secs: f.mtime_secs,
        };
        let conditions = Conditions {
            if_match: req.if_match,
            if_unmodified_since: req.if_unmodified_since,
            if_none_match: req.if_none_match,
            if_modified_since: req.if_modified_since,
            if_range: req.if_range,
            has_range: req.range.is_some(),
        };
        let precondition = conditional::evaluate(&conditions, &validators);
        let content_type = mime::content_type_for(f.opened_path().as_bytes());
        let (status, content_range, body_len, segments, framing, multipart) = match precondition {
            // Both carry the validators (so a client can tell which version is current) and
            // no body; a 412 is a complete answer, so the connection may stay open.
            Precondition::NotModified => (304, None, 0, VecDeque::new(), Vec::new(), None),
            Precondition::Failed => (412, None, 0, VecDeque::new(), Vec::new(), None),
            Precondition::Proceed { use_range } => {
                let outcome = match req.range {
                    Some(range) if use_range => parse_range(range, size, self.cfg.max_ranges),
                    _ => RangeOutcome::Full,
                };
                plan_body(outcome, size, content_type, self.boundary_seed(c))
            }
        };
        let f = self.files.get(idx);
        let head = Head {
            status,
            keep_alive,
            date: self.date.header_value(),
            content_length: if status == 304 { None } else { Some(body_len) },
            content_type: match &multipart {
                Some(boundary) => Some(boundary.content_type()),
                None if status == 416 || status == 412 => None,
                None => Some(content_type),
            },
            last_modified: Some(&f.last_modified),
            etag: Some(f.etag()),
            content_range,
            accept_ranges: true,
            allow: false,
        };
        let tx = self.ring.tx_mut(c as usize);
        tx.clear();
        response::write_head(&head, tx);
        let head_len = tx.len();

        if req.method == Method::Head || body_len == 0 {
            self.files.release(&mut self.ring, idx);
            return self.begin_response(c, status, keep_alive, None);
        }
        let (align, rw_flags, source) = match f.mode {
            ReadMode::Direct { align } => (u64::from(align), 0, Source::Direct),
            ReadMode::DontCache => (1, ring::RWF_DONTCACHE, Source::DontCache),
            ReadMode::Buffered => (1, 0, Source::Buffered),
        };
        let inline_head = multipart.is_none()
            && f.mode == ReadMode::Buffered
            && head_len as u64 + body_len <= self.cfg.chunk_bytes as u64;
        let body = Body {
            file: Some(idx),
            file_fixed: self.ring.file_fixed_index(f.fixed),
            align,
            rw_flags,
            source,
            segments,
            framing,
            chunks: VecDeque::with_capacity(self.cfg.pipeline_depth),
            inline_head,
            small: inline_head,
            read_ahead: super::READ_AHEAD_START_CHUNKS,
            read_size_bytes: self.cfg.chunk_bytes,
        };
        self.begin_response(c, status, keep_alive, Some(body));
    }
}

/// Path of the network-only diagnostic endpoint.
pub const DIAG_ZERO_PATH: &[u8] = b"/__shardline/zero";

/// `bytes=N` from a query string.
fn zero_bytes_param(query: Option<&[u8]>) -> Option<u64> {
    let q = std::str::from_utf8(query?).ok()?;
    let v = q.split('&').find_map(|kv| kv.strip_prefix("bytes="))?;
    if v.is_empty() || v.len() > 20 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok().filter(|&n| n <= DIAG_ZERO_MAX_BYTES)
}

impl<R: RingOps> Shard<R> {
    /// `GET /__shardline/zero?bytes=N`: N zero bytes from the arena, no disk I/O.
    fn respond_zero(&mut self, c: u32, req: &Request<'_>, keep_alive: bool) {
        let Some(n) = zero_bytes_param(req.query) else {
            return self.respond_status(c, 400, false, req.method == Method::Head);
        };
        let head = Head {
            status: 200,
            keep_alive,
            date: self.date.header_value(),
            content_length: Some(n),
            content_type: Some("application/octet-stream"),
            last_modified: None,
            etag: None,
            content_range: None,
            accept_ranges: false,
            allow: false,
        };
        let tx = self.ring.tx_mut(c as usize);
        tx.clear();
        response::write_head(&head, tx);
        if req.method == Method::Head || n == 0 {
            return self.begin_response(c, 200, keep_alive, None);
        }
        let body = Body {
            file: None,
            file_fixed: 0,
            align: 1,
            rw_flags: 0,
            source: Source::Memory,
            segments: VecDeque::from([Segment::Zero { remaining: n }]),
            framing: Vec::new(),
            chunks: VecDeque::with_capacity(self.cfg.pipeline_depth),
            inline_head: false,
            small: false,
            read_ahead: super::READ_AHEAD_START_CHUNKS,
            read_size_bytes: self.cfg.chunk_bytes,
        };
        self.begin_response(c, 200, keep_alive, Some(body));
    }
}

/// Status, Content-Range, body length, body segments, the framing bytes they point into and
/// the multipart boundary for a range outcome on a file of `size` bytes.
#[allow(clippy::type_complexity)]
fn plan_body(
    outcome: RangeOutcome,
    size: u64,
    content_type: &str,
    seed: u64,
) -> (
    u16,
    Option<ContentRange>,
    u64,
    VecDeque<Segment>,
    Vec<u8>,
    Option<Boundary>,
) {
    let file = |r: ByteRange| Segment::File {
        pos: r.start,
        end: r.end,
    };
    match outcome {
        RangeOutcome::Full => {
            let mut segs = VecDeque::new();
            if size > 0 {
                segs.push_back(file(ByteRange {
                    start: 0,
                    end: size,
                }));
            }
            (200, None, size, segs, Vec::new(), None)
        }
        RangeOutcome::Single(r) => (
            206,
            Some(ContentRange::Bytes {
                start: r.start,
                end_inclusive: r.end - 1,
                total: size,
            }),
            r.end - r.start,
            VecDeque::from([file(r)]),
            Vec::new(),
            None,
        ),
        RangeOutcome::Unsatisfiable => (
            416,
            Some(ContentRange::Unsatisfied { total: size }),
            0,
            VecDeque::new(),
            Vec::new(),
            None,
        ),
        RangeOutcome::Multi(ranges) => {
            let boundary = Boundary::new(seed);
            let Some(len) =
                response::multipart_length(boundary.as_str(), content_type, &ranges, size)
            else {
                return plan_body(RangeOutcome::Full, size, content_type, seed);
            };
            let mut segs = VecDeque::with_capacity(ranges.len() * 2 + 1);
            let mut framing = Vec::with_capacity(ranges.len() * 128 + 64);
            let mem = |framing: &[u8], from: usize| Segment::Mem {
                start: from as u32,
                end: framing.len() as u32,
            };
            for r in &ranges {
                let from = framing.len();
                response::write_part_header(
                    boundary.as_str(),
                    content_type,
                    r.start,
                    r.end - 1,
                    size,
                    &mut framing,
                );
                segs.push_back(mem(&framing, from));
                segs.push_back(file(*r));
            }
            let from = framing.len();
            response::write_closing_boundary(boundary.as_str(), &mut framing);
            segs.push_back(mem(&framing, from));
            (206, None, len, segs, framing, Some(boundary))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_endpoint_takes_a_bounded_byte_count() {
        assert_eq!(zero_bytes_param(Some(b"bytes=1000")), Some(1000));
        assert_eq!(zero_bytes_param(Some(b"x=1&bytes=0")), Some(0));
        assert_eq!(zero_bytes_param(Some(b"bytes=")), None);
        assert_eq!(zero_bytes_param(Some(b"bytes=-1")), None);
        assert_eq!(zero_bytes_param(Some(b"bytes=99999999999999999999")), None);
        assert_eq!(zero_bytes_param(Some(b"bytes=1099511627777")), None);
        assert_eq!(zero_bytes_param(None), None);
    }
}
