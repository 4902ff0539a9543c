//! The response plan: from a parsed request, what the open-file cache knows about its file and
//! the limits, to the status, the head and the body as a short list of parts, without touching
//! a ring, a buffer pool or a file.
//!
//! The shard resolves the path and opens the file (side effects), hands the facts to
//! [`plan_response`], writes [`ResponsePlan::write_head`] into the connection's header buffer
//! and turns [`ResponsePlan::parts`] into chunk work. Every decision (304/412/416, ranges,
//! multipart framing, HEAD, the health path, the diagnostic zero endpoint, whether a small
//! head shares its body's chunk) is made here and unit-tested here.
//!
//! How a part's bytes are produced is [`BodySource`]: the one place where a new kind of body
//! (an upstream fill, a TLS or chunked-framing stage) is named. Generated parts (multipart
//! framing, zeros) are rendered by [`ResponsePlan::render`] straight into a caller's slice, so
//! no part owns a buffer of its own.

use crate::http::conditional::{self, Conditions, Precondition, Validators};
use crate::http::range::{parse_range, ByteRange, RangeOutcome};
use crate::http::request::{Method, Request};
use crate::http::response::{self, Boundary, ByteCounter, ContentRange, Head, Sink, SliceSink};

/// Largest body the network-only diagnostic endpoint will generate.
pub const DIAG_ZERO_MAX_BYTES: u64 = 1 << 40;
/// Path of the network-only diagnostic endpoint (`GET /__shardline/zero?bytes=N`).
pub const DIAG_ZERO_PATH: &[u8] = b"/__shardline/zero";

/// Content-Type of the diagnostic endpoint's zeros.
const DIAG_ZERO_CONTENT_TYPE: &str = "application/octet-stream";

/// How the file's bytes are read, as the open-file cache chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileRead {
    /// O_DIRECT with this offset/length alignment: never touches the page cache.
    Direct {
        /// Offset and length alignment from statx (or the block device).
        align: u32,
    },
    /// Buffered with RWF_DONTCACHE: pages the read brought in are dropped afterwards.
    DontCache,
    /// Plain buffered reads (small, hot files; or where nothing better works).
    Buffered,
}

impl FileRead {
    /// Label used in logs and metrics.
    pub fn label(self) -> &'static str {
        match self {
            FileRead::Direct { .. } => "direct",
            FileRead::DontCache => "dontcache",
            FileRead::Buffered => "buffered",
        }
    }
}

/// What the open-file cache knows about the file a request names.
#[derive(Clone, Copy, Debug)]
pub struct FileFacts<'a> {
    /// Size at open, bytes.
    pub size: u64,
    /// Strong ETag, quotes included.
    pub etag: &'a [u8],
    /// `Last-Modified` value (IMF-fixdate).
    pub last_modified: &'a [u8],
    /// Modification time, whole seconds (for If-Modified-Since and friends).
    pub mtime_secs: i64,
    /// How its bytes are read.
    pub read: FileRead,
    /// Content-Type of the representation.
    pub content_type: &'a str,
    /// Further header lines (`Head::extra`): a response from the cache's `Age`,
    /// `Cache-Status` and its origin's stored fields; empty for a local file.
    pub extra: &'a [u8],
}

/// Configured limits and switches the plan obeys.
#[derive(Clone, Copy, Debug)]
pub struct PlanLimits<'a> {
    /// Most range specs honoured in one Range header (`max_ranges`).
    pub max_ranges: usize,
    /// Bytes of one registered chunk: a head and body that fit one go out in one send.
    pub chunk_bytes: usize,
    /// Serve [`DIAG_ZERO_PATH`].
    pub diag_endpoint: bool,
    /// Health-check path (empty: none).
    pub health_path: &'a [u8],
}

/// The moment's facts of the shard the plan depends on.
#[derive(Clone, Copy, Debug)]
pub struct PlanContext<'a> {
    /// The 29-byte `Date` value.
    pub date: &'a [u8],
    /// Leaving rotation or draining: health answers 503, connections close.
    pub leaving: bool,
    /// Seed for a multipart boundary (differs per shard, connection and moment).
    pub boundary_seed: u64,
}

/// One piece of a response body, in send order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyPart {
    /// File bytes `[start, end)`.
    File {
        /// First byte.
        start: u64,
        /// End (exclusive).
        end: u64,
    },
    /// The delimiter and headers before multipart range `index` (of [`ResponsePlan::ranges`]).
    PartHeader {
        /// Which range the header announces.
        index: usize,
    },
    /// The closing multipart delimiter.
    Closing,
    /// `len` zero bytes.
    Zero {
        /// Bytes.
        len: u64,
    },
}

/// How a part's bytes are produced; a new kind of body (upstream, TLS, framing) is added here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodySource {
    /// Read from the response's file with its [`FileRead`] mode.
    FileRead,
    /// Rendered by [`ResponsePlan::render`] and copied into the chunk.
    MemoryCopy,
    /// Zero-filled.
    Zeros,
}

impl BodyPart {
    /// Where this part's bytes come from.
    pub fn source(self) -> BodySource {
        match self {
            BodyPart::File { .. } => BodySource::FileRead,
            BodyPart::PartHeader { .. } | BodyPart::Closing => BodySource::MemoryCopy,
            BodyPart::Zero { .. } => BodySource::Zeros,
        }
    }
}

/// What follows the head.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Planned {
    /// Nothing (HEAD, 304, 412, 416, an empty file, a zero-length zero body).
    Empty,
    /// The short status text of an error response, written with the head.
    StatusText,
    /// One file range (200 or single-range 206).
    File(ByteRange),
    /// Zero bytes (diagnostic endpoint).
    Zero(u64),
    /// multipart/byteranges over these ranges of the file, in request order.
    Multipart(Vec<ByteRange>),
}

/// A planned response: its head, its body parts, and where its head goes.
#[derive(Clone, Debug)]
pub struct ResponsePlan<'a> {
    /// The head; for multipart its Content-Type is patched in by `head()` (the boundary lives
    /// in the plan, so the head cannot borrow it here).
    head: Head<'a>,
    boundary: Option<Boundary>,
    /// Content-Type of each multipart part, and the file size in their Content-Range.
    part_type: &'a str,
    total: u64,
    body: Planned,
    inline_head: bool,
}

impl<'a> ResponsePlan<'a> {
    fn new(head: Head<'a>, body: Planned) -> Self {
        Self {
            head,
            boundary: None,
            part_type: "",
            total: 0,
            body,
            inline_head: false,
        }
    }

    /// Makes a whole 200 the origin's `status`: a reply passed on as it is (a redirect, a
    /// refusal), its body the origin's, no range of it served.
    pub fn pass_status(&mut self, status: u16) {
        assert_eq!(self.head.status, 200, "only a whole reply is passed on");
        self.head.status = status;
        self.head.accept_ranges = false;
    }

    /// Status code.
    pub fn status(&self) -> u16 {
        self.head.status
    }

    /// Whether the connection stays open after this response.
    pub fn keep_alive(&self) -> bool {
        self.head.keep_alive
    }

    /// The head fields.
    pub fn head(&self) -> Head<'_> {
        let mut head = self.head;
        if let Some(boundary) = &self.boundary {
            head.content_type = Some(boundary.content_type());
        }
        head
    }

    /// Writes the head, and for a status response its short text, into `out` (the bytes the
    /// header buffer sends before the body parts, or in front of the first chunk when
    /// [`Self::inline_head`]).
    pub fn write_head(&self, out: &mut (impl Sink + ?Sized)) {
        if self.body == Planned::StatusText {
            response::write_error(self.head.status, self.head.keep_alive, self.head.date, out);
        } else {
            response::write_head(&self.head(), out);
        }
    }

    /// Bytes [`Self::write_head`] writes.
    pub fn head_len(&self) -> usize {
        let mut counter = ByteCounter::default();
        self.write_head(&mut counter);
        counter.bytes
    }

    /// The head waits to be copied in front of the body's single chunk (one send for both).
    pub fn inline_head(&self) -> bool {
        self.inline_head
    }

    /// The multipart ranges (empty for any other body).
    pub fn ranges(&self) -> &[ByteRange] {
        match &self.body {
            Planned::Multipart(ranges) => ranges,
            _ => &[],
        }
    }

    /// The body parts after the head, in send order.
    pub fn parts(&self) -> Parts<'_> {
        Parts {
            body: &self.body,
            next: 0,
        }
    }

    /// Some part reads the file: the response holds its open-file entry until done.
    pub fn reads_file(&self) -> bool {
        matches!(self.body, Planned::File(_) | Planned::Multipart(_))
    }

    /// Bytes of all body parts (what a GET of this plan sends after `write_head`).
    pub fn body_len(&self) -> u64 {
        self.parts()
            .fold(0u64, |sum, p| sum.saturating_add(self.part_len(p)))
    }

    /// Bytes of one part.
    pub fn part_len(&self, part: BodyPart) -> u64 {
        match part {
            BodyPart::File { start, end } => end.saturating_sub(start),
            BodyPart::Zero { len } => len,
            BodyPart::PartHeader { .. } | BodyPart::Closing => {
                let mut counter = ByteCounter::default();
                self.write_framing(part, &mut counter);
                counter.bytes as u64
            }
        }
    }

    /// Writes bytes `[skip, skip + out.len())` of a generated part (framing, zeros) into
    /// `out`; returns how many were written (fewer when the part ends first). File parts are
    /// read, not rendered: 0.
    pub fn render(&self, part: BodyPart, skip: u64, out: &mut [u8]) -> usize {
        match part.source() {
            BodySource::FileRead => 0,
            BodySource::Zeros => {
                let left = self.part_len(part).saturating_sub(skip);
                let n = out.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                if let Some(dst) = out.get_mut(..n) {
                    dst.fill(0);
                }
                n
            }
            BodySource::MemoryCopy => {
                let skip = usize::try_from(skip).unwrap_or(usize::MAX);
                let mut sink = SliceSink::new(out, skip);
                self.write_framing(part, &mut sink);
                sink.written()
            }
        }
    }

    /// Appends a whole generated part to `out` (for callers that keep framing in a buffer).
    pub fn render_to(&self, part: BodyPart, out: &mut (impl Sink + ?Sized)) {
        match part {
            BodyPart::Zero { len } => {
                let zeros = [0u8; 64];
                let mut left = len;
                while left > 0 {
                    let n = left.min(zeros.len() as u64) as usize;
                    out.put(zeros.get(..n).unwrap_or_default());
                    left -= n as u64;
                }
            }
            _ => self.write_framing(part, out),
        }
    }

    fn write_framing(&self, part: BodyPart, out: &mut (impl Sink + ?Sized)) {
        let Some(boundary) = &self.boundary else {
            return;
        };
        match part {
            BodyPart::PartHeader { index } => {
                if let Some(r) = self.ranges().get(index) {
                    response::write_part_header(
                        boundary.as_str(),
                        self.part_type,
                        r.start,
                        r.end_inclusive(),
                        self.total,
                        out,
                    );
                }
            }
            BodyPart::Closing => response::write_closing_boundary(boundary.as_str(), out),
            BodyPart::File { .. } | BodyPart::Zero { .. } => {}
        }
    }
}

/// Iterator over a plan's body parts; allocates nothing.
#[derive(Clone, Debug)]
pub struct Parts<'p> {
    body: &'p Planned,
    next: usize,
}

impl Iterator for Parts<'_> {
    type Item = BodyPart;

    fn next(&mut self) -> Option<BodyPart> {
        let i = self.next;
        self.next = i.saturating_add(1);
        let file = |r: &ByteRange| BodyPart::File {
            start: r.start,
            end: r.end,
        };
        match self.body {
            Planned::Empty | Planned::StatusText => None,
            Planned::File(r) => (i == 0).then(|| file(r)),
            Planned::Zero(len) => (i == 0).then_some(BodyPart::Zero { len: *len }),
            // Header 0, range 0, header 1, range 1, ..., closing delimiter.
            Planned::Multipart(ranges) => match (i / 2, i % 2) {
                (k, 0) if k < ranges.len() => Some(BodyPart::PartHeader { index: k }),
                (k, _) if k < ranges.len() => ranges.get(k).map(file),
                (k, 0) if k == ranges.len() => Some(BodyPart::Closing),
                _ => None,
            },
        }
    }
}

/// A status response with no file: the short text (or, for HEAD, only its head); a 405
/// carries `Allow` and no text. `keep_alive` is what the caller allows; leaving closes anyway.
pub fn plan_status<'a>(
    status: u16,
    keep_alive: bool,
    head_only: bool,
    ctx: &PlanContext<'a>,
) -> ResponsePlan<'a> {
    let keep_alive = keep_alive && !ctx.leaving;
    if status == 405 {
        let head = Head {
            status,
            keep_alive,
            date: ctx.date,
            content_length: Some(0),
            content_type: None,
            last_modified: None,
            etag: None,
            content_range: None,
            accept_ranges: false,
            allow: true,
            extra: b"",
        };
        return ResponsePlan::new(head, Planned::Empty);
    }
    let head = response::error_head(status, keep_alive, ctx.date);
    let body = if head_only {
        Planned::Empty
    } else {
        Planned::StatusText
    };
    ResponsePlan::new(head, body)
}

/// Plans the requests answered without the file store: the diagnostic zero endpoint and the
/// health path. None: the request names a file, to be resolved and opened, then planned with
/// [`plan_response`].
pub fn plan_without_file<'a>(
    req: &Request<'_>,
    limits: &PlanLimits<'_>,
    ctx: &PlanContext<'a>,
) -> Option<ResponsePlan<'a>> {
    let head_only = req.method == Method::Head;
    let keep_alive = req.keep_alive && !ctx.leaving;
    if limits.diag_endpoint && req.path == DIAG_ZERO_PATH {
        let Some(n) = zero_bytes_param(req.query) else {
            return Some(plan_status(400, false, head_only, ctx));
        };
        let head = Head {
            status: 200,
            keep_alive,
            date: ctx.date,
            content_length: Some(n),
            content_type: Some(DIAG_ZERO_CONTENT_TYPE),
            last_modified: None,
            etag: None,
            content_range: None,
            accept_ranges: false,
            allow: false,
            extra: b"",
        };
        let body = if head_only || n == 0 {
            Planned::Empty
        } else {
            Planned::Zero(n)
        };
        return Some(ResponsePlan::new(head, body));
    }
    if !limits.health_path.is_empty() && req.path == limits.health_path {
        // For the balancer: no file is touched, so a slow disk cannot fail the check.
        let status = if ctx.leaving { 503 } else { 200 };
        return Some(plan_status(status, keep_alive, head_only, ctx));
    }
    None
}

/// Plans the response to a GET or HEAD of an opened file: validators, Range, multipart.
pub fn plan_response<'a>(
    req: &Request<'_>,
    file: &FileFacts<'a>,
    limits: &PlanLimits<'_>,
    ctx: &PlanContext<'a>,
) -> ResponsePlan<'a> {
    let keep_alive = req.keep_alive && !ctx.leaving;
    let validators = Validators {
        etag: file.etag,
        mtime_secs: file.mtime_secs,
    };
    let conditions = Conditions {
        if_match: req.if_match,
        if_unmodified_since: req.if_unmodified_since,
        if_none_match: req.if_none_match,
        if_modified_since: req.if_modified_since,
        if_range: req.if_range,
        has_range: req.range.is_some(),
    };
    let mut head = Head {
        status: 200,
        keep_alive,
        date: ctx.date,
        content_length: None,
        content_type: Some(file.content_type),
        last_modified: Some(file.last_modified),
        etag: Some(file.etag),
        content_range: None,
        accept_ranges: true,
        allow: false,
        extra: file.extra,
    };
    let mut plan = match conditional::evaluate(&conditions, &validators) {
        // Both carry the validators (so a client can tell which version is current) and
        // no body; a 412 is a complete answer, so the connection may stay open.
        Precondition::NotModified => {
            head.status = 304;
            ResponsePlan::new(head, Planned::Empty)
        }
        Precondition::Failed => {
            head.status = 412;
            head.content_type = None;
            head.content_length = Some(0);
            ResponsePlan::new(head, Planned::Empty)
        }
        Precondition::Proceed { use_range } => {
            let outcome = match req.range {
                Some(range) if use_range => parse_range(range, file.size, limits.max_ranges),
                _ => RangeOutcome::Full,
            };
            plan_ranges(head, outcome, file, ctx.boundary_seed)
        }
    };
    if req.method == Method::Head {
        // Same head as the GET, no body.
        plan.body = Planned::Empty;
    }
    plan.inline_head = plan.boundary.is_none()
        && file.read == FileRead::Buffered
        && matches!(plan.body, Planned::File(_))
        && (plan.head_len() as u64).saturating_add(plan.body_len()) <= limits.chunk_bytes as u64;
    plan
}

/// The 200 / 206 / 416 plan for a range outcome on `file`.
fn plan_ranges<'a>(
    mut head: Head<'a>,
    outcome: RangeOutcome,
    file: &FileFacts<'a>,
    seed: u64,
) -> ResponsePlan<'a> {
    let size = file.size;
    match outcome {
        RangeOutcome::Full => {
            head.content_length = Some(size);
            let body = if size == 0 {
                Planned::Empty
            } else {
                Planned::File(ByteRange {
                    start: 0,
                    end: size,
                })
            };
            ResponsePlan::new(head, body)
        }
        RangeOutcome::Single(r) => {
            head.status = 206;
            head.content_length = Some(r.len());
            head.content_range = ContentRange::from_range(r, size);
            ResponsePlan::new(head, Planned::File(r))
        }
        RangeOutcome::Unsatisfiable => {
            head.status = 416;
            head.content_type = None;
            head.content_length = Some(0);
            head.content_range = Some(ContentRange::Unsatisfied { total: size });
            ResponsePlan::new(head, Planned::Empty)
        }
        RangeOutcome::Multi(ranges) => {
            let boundary = Boundary::new(seed);
            let Some(len) =
                response::multipart_length(boundary.as_str(), file.content_type, &ranges, size)
            else {
                return plan_ranges(head, RangeOutcome::Full, file, seed);
            };
            head.status = 206;
            head.content_length = Some(len);
            let mut plan = ResponsePlan::new(head, Planned::Multipart(ranges));
            plan.boundary = Some(boundary);
            plan.part_type = file.content_type;
            plan.total = size;
            plan
        }
    }
}

/// `bytes=N` from a query string, at most `DIAG_ZERO_MAX_BYTES`.
fn zero_bytes_param(query: Option<&[u8]>) -> Option<u64> {
    let q = std::str::from_utf8(query?).ok()?;
    let v = q.split('&').find_map(|kv| kv.strip_prefix("bytes="))?;
    if v.is_empty() || v.len() > 20 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok().filter(|&n| n <= DIAG_ZERO_MAX_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::request::Version;

    const DATE: &[u8] = b"Sun, 06 Nov 1994 08:49:37 GMT";
    const ETAG: &[u8] = b"\"5f-3e8\"";
    const CHUNK_BYTES: usize = 512 * 1024;

    fn get(path: &'static [u8]) -> Request<'static> {
        Request {
            method: Method::Get,
            version: Version::Http11,
            path,
            query: None,
            keep_alive: true,
            range: None,
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

    fn ranged(range: &'static str) -> Request<'static> {
        Request {
            range: Some(range.as_bytes()),
            ..get(b"/f.bin")
        }
    }

    fn head_of(req: Request<'static>) -> Request<'static> {
        Request {
            method: Method::Head,
            ..req
        }
    }

    fn facts(size: u64) -> FileFacts<'static> {
        FileFacts {
            size,
            etag: ETAG,
            last_modified: DATE,
            mtime_secs: 784_111_777,
            read: FileRead::Direct { align: 4096 },
            content_type: "application/octet-stream",
            extra: b"",
        }
    }

    fn limits() -> PlanLimits<'static> {
        PlanLimits {
            max_ranges: 16,
            chunk_bytes: CHUNK_BYTES,
            diag_endpoint: true,
            health_path: b"/healthz",
        }
    }

    fn ctx(leaving: bool) -> PlanContext<'static> {
        PlanContext {
            date: DATE,
            leaving,
            boundary_seed: 42,
        }
    }

    /// The file whose facts the tests plan for: byte i is i mod 251.
    fn content(size: u64) -> Vec<u8> {
        (0..size).map(|i| (i % 251) as u8).collect()
    }

    fn plan_file(req: &Request<'_>, size: u64) -> ResponsePlan<'static> {
        plan_response(req, &facts(size), &limits(), &ctx(false))
    }

    /// (status, headers, head length) of the bytes `write_head` produced.
    fn parse(bytes: &[u8]) -> (u16, Vec<(String, String)>, usize) {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        let n = match resp.parse(bytes).expect("valid response head") {
            httparse::Status::Complete(n) => n,
            httparse::Status::Partial => panic!("incomplete head"),
        };
        let code = resp.code.expect("status");
        let hs = resp
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_ascii_lowercase(),
                    String::from_utf8(h.value.to_vec()).expect("ascii"),
                )
            })
            .collect();
        (code, hs, n)
    }

    fn field<'h>(hs: &'h [(String, String)], name: &str) -> Option<&'h str> {
        hs.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    fn head_bytes(plan: &ResponsePlan<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        plan.write_head(&mut out);
        assert_eq!(out.len(), plan.head_len());
        out
    }

    /// What a client receives for a GET of this plan: head, then every part's bytes (file
    /// parts from `file`, generated parts rendered in uneven pieces as into chunks).
    fn wire(plan: &ResponsePlan<'_>, file: &[u8]) -> Vec<u8> {
        let mut out = head_bytes(plan);
        for part in plan.parts() {
            let before = out.len();
            match part {
                BodyPart::File { start, end } => {
                    out.extend_from_slice(&file[start as usize..end as usize]);
                }
                _ => {
                    let mut skip = 0u64;
                    loop {
                        let mut piece = [0xAAu8; 13];
                        let n = plan.render(part, skip, &mut piece);
                        if n == 0 {
                            break;
                        }
                        out.extend_from_slice(&piece[..n]);
                        skip += n as u64;
                    }
                }
            }
            assert_eq!((out.len() - before) as u64, plan.part_len(part), "{part:?}");
        }
        out
    }

    /// Head fields and the body that follows the head.
    fn response(plan: &ResponsePlan<'_>, file: &[u8]) -> (u16, Vec<(String, String)>, Vec<u8>) {
        let bytes = wire(plan, file);
        let (code, hs, n) = parse(&bytes);
        (code, hs, bytes[n..].to_vec())
    }

    fn content_length(hs: &[(String, String)]) -> Option<u64> {
        field(hs, "content-length").map(|v| v.parse().expect("number"))
    }

    #[test]
    fn full_file_is_200_with_one_file_part() {
        let file = content(1000);
        let plan = plan_file(&get(b"/f.bin"), 1000);
        assert_eq!(plan.status(), 200);
        assert!(plan.keep_alive() && plan.reads_file());
        assert_eq!(
            plan.parts().collect::<Vec<_>>(),
            [BodyPart::File {
                start: 0,
                end: 1000
            }]
        );
        let (code, hs, body) = response(&plan, &file);
        assert_eq!(code, 200);
        assert_eq!(content_length(&hs), Some(1000));
        assert_eq!(field(&hs, "content-type"), Some("application/octet-stream"));
        assert_eq!(field(&hs, "etag"), Some("\"5f-3e8\""));
        assert_eq!(field(&hs, "accept-ranges"), Some("bytes"));
        assert_eq!(field(&hs, "content-range"), None);
        assert_eq!(field(&hs, "connection"), Some("keep-alive"));
        assert_eq!(body, file);
    }

    #[test]
    fn single_range_is_206_with_content_range() {
        let file = content(1000);
        let plan = plan_file(&ranged("bytes=10-19"), 1000);
        assert_eq!(
            plan.parts().collect::<Vec<_>>(),
            [BodyPart::File { start: 10, end: 20 }]
        );
        let (code, hs, body) = response(&plan, &file);
        assert_eq!(code, 206);
        assert_eq!(field(&hs, "content-range"), Some("bytes 10-19/1000"));
        assert_eq!(content_length(&hs), Some(10));
        assert_eq!(body, &file[10..20]);
        // Ranges that coalesce into one are a single part too.
        let plan = plan_file(&ranged("bytes=0-9,10-19"), 1000);
        assert_eq!(
            plan.parts().collect::<Vec<_>>(),
            [BodyPart::File { start: 0, end: 20 }]
        );
    }

    #[test]
    fn multi_range_parts_follow_the_request_order_after_coalescing() {
        let file = content(1000);
        let plan = plan_file(&ranged("bytes=500-599,0-9,5-14,990-"), 1000);
        assert_eq!(plan.status(), 206);
        let ranges: [(usize, usize); 3] = [(500, 600), (0, 15), (990, 1000)];
        let mut want = Vec::new();
        for (i, &(start, end)) in ranges.iter().enumerate() {
            want.push(BodyPart::PartHeader { index: i });
            want.push(BodyPart::File {
                start: start as u64,
                end: end as u64,
            });
        }
        want.push(BodyPart::Closing);
        assert_eq!(plan.parts().collect::<Vec<_>>(), want);
        assert!(!plan.inline_head());

        let (code, hs, body) = response(&plan, &file);
        assert_eq!(code, 206);
        assert_eq!(content_length(&hs), Some(body.len() as u64));
        assert_eq!(content_length(&hs), Some(plan.body_len()));
        assert_eq!(field(&hs, "content-range"), None);
        let ct = field(&hs, "content-type").expect("content-type");
        let boundary = ct
            .strip_prefix("multipart/byteranges; boundary=")
            .expect("multipart type");
        // Each part: delimiter, its own headers, then exactly its bytes.
        let delim = format!("\r\n--{boundary}");
        let text = String::from_utf8_lossy(&body).into_owned();
        let pieces: Vec<&str> = text.split(&delim).collect();
        assert_eq!(pieces.len(), ranges.len() + 2);
        assert_eq!(pieces[0], "");
        assert_eq!(*pieces.last().unwrap(), "--\r\n");
        let mut at = 0;
        for (i, &(start, end)) in ranges.iter().enumerate() {
            let header = format!(
                "\r\nContent-Type: application/octet-stream\r\n\
                 Content-Range: bytes {start}-{}/1000\r\n\r\n",
                end - 1
            );
            at += delim.len();
            assert_eq!(&body[at..at + header.len()], header.as_bytes(), "part {i}");
            at += header.len();
            assert_eq!(&body[at..at + (end - start)], &file[start..end], "part {i}");
            at += end - start;
        }
    }

    #[test]
    fn multi_range_head_is_the_get_head_without_a_body() {
        let req = ranged("bytes=0-0,-1");
        let get = plan_file(&req, 1000);
        let head = plan_file(&head_of(req), 1000);
        assert_eq!(head_bytes(&get), head_bytes(&head));
        assert_eq!(head.parts().count(), 0);
        assert!(!head.reads_file());
    }

    #[test]
    fn every_head_request_has_the_get_head_and_no_body() {
        let requests = [
            get(b"/f.bin"),
            ranged("bytes=1-2"),
            ranged("bytes=0-1,5-6"),
            ranged("bytes=5000-"),
            Request {
                if_none_match: Some(ETAG),
                ..get(b"/f.bin")
            },
            Request {
                if_match: Some(b"\"other\""),
                ..get(b"/f.bin")
            },
        ];
        for req in requests {
            let get = plan_file(&req, 1000);
            let head = plan_file(&head_of(req), 1000);
            assert_eq!(head_bytes(&get), head_bytes(&head), "{req:?}");
            assert_eq!(head.parts().count(), 0, "{req:?}");
            assert!(!head.inline_head() && !head.reads_file(), "{req:?}");
            assert_eq!(head.status(), get.status());
        }
    }

    #[test]
    fn not_modified_carries_validators_and_no_body() {
        let req = Request {
            if_none_match: Some(ETAG),
            ..get(b"/f.bin")
        };
        let plan = plan_file(&req, 1000);
        let (code, hs, body) = response(&plan, &[]);
        assert_eq!(code, 304);
        assert!(body.is_empty() && !plan.reads_file());
        assert_eq!(content_length(&hs), None);
        assert_eq!(field(&hs, "etag"), Some("\"5f-3e8\""));
        assert_eq!(
            field(&hs, "last-modified"),
            Some(std::str::from_utf8(DATE).unwrap())
        );
        assert!(plan.keep_alive());
    }

    #[test]
    fn failed_precondition_is_412_with_an_empty_body() {
        let req = Request {
            if_match: Some(b"\"other\""),
            ..ranged("bytes=0-9")
        };
        let plan = plan_file(&req, 1000);
        let (code, hs, body) = response(&plan, &[]);
        assert_eq!(code, 412);
        assert!(body.is_empty() && !plan.reads_file());
        assert_eq!(content_length(&hs), Some(0));
        assert_eq!(field(&hs, "content-type"), None);
        assert_eq!(field(&hs, "content-range"), None);
        assert!(plan.keep_alive());
    }

    #[test]
    fn unsatisfiable_range_is_416_with_the_size() {
        let plan = plan_file(&ranged("bytes=1000-"), 1000);
        let (code, hs, body) = response(&plan, &[]);
        assert_eq!(code, 416);
        assert!(body.is_empty());
        assert_eq!(field(&hs, "content-range"), Some("bytes */1000"));
        assert_eq!(content_length(&hs), Some(0));
        assert_eq!(field(&hs, "content-type"), None);
    }

    #[test]
    fn ignored_ranges_send_the_whole_file() {
        // If-Range that does not match, too many specs, a malformed header.
        let mismatched = Request {
            if_range: Some(b"\"other\""),
            ..ranged("bytes=0-9")
        };
        let too_many = ranged("bytes=0-0,2-2,4-4");
        let malformed = ranged("bytes=x");
        let few = PlanLimits {
            max_ranges: 2,
            ..limits()
        };
        for req in [mismatched, too_many, malformed] {
            let plan = plan_response(&req, &facts(1000), &few, &ctx(false));
            assert_eq!(plan.status(), 200, "{req:?}");
            assert_eq!(plan.body_len(), 1000);
        }
    }

    #[test]
    fn empty_file_is_200_with_no_parts() {
        let plan = plan_file(&get(b"/empty"), 0);
        let (code, hs, body) = response(&plan, &[]);
        assert_eq!(code, 200);
        assert_eq!(content_length(&hs), Some(0));
        assert!(body.is_empty() && !plan.reads_file() && !plan.inline_head());
        // Any range of an empty file is unsatisfiable.
        assert_eq!(plan_file(&ranged("bytes=0-"), 0).status(), 416);
    }

    #[test]
    fn leaving_closes_the_connection() {
        let plan = plan_response(&get(b"/f.bin"), &facts(10), &limits(), &ctx(true));
        assert!(!plan.keep_alive());
        let (_, hs, _) = response(&plan, &content(10));
        assert_eq!(field(&hs, "connection"), Some("close"));
    }

    #[test]
    fn inline_head_decision_at_the_chunk_boundary() {
        let buffered = FileFacts {
            read: FileRead::Buffered,
            ..facts(1000)
        };
        let req = get(b"/f.bin");
        let at = |chunk_bytes: usize, f: &FileFacts<'static>, req: &Request<'_>| {
            let l = PlanLimits {
                chunk_bytes,
                ..limits()
            };
            plan_response(req, f, &l, &ctx(false))
        };
        let head_len = at(CHUNK_BYTES, &buffered, &req).head_len();
        let fits = head_len + 1000;
        assert!(at(fits, &buffered, &req).inline_head());
        assert!(!at(fits - 1, &buffered, &req).inline_head());
        // A single range counts its own bytes.
        let single = ranged("bytes=0-99");
        let single_head = at(CHUNK_BYTES, &buffered, &single).head_len();
        assert!(at(single_head + 100, &buffered, &single).inline_head());
        assert!(!at(single_head + 99, &buffered, &single).inline_head());
        // Only buffered reads (O_DIRECT and DONTCACHE reads are aligned chunks of their own),
        // never multipart, never without a body.
        assert!(!at(CHUNK_BYTES, &facts(1000), &req).inline_head());
        let dontcache = FileFacts {
            read: FileRead::DontCache,
            ..buffered
        };
        assert!(!at(CHUNK_BYTES, &dontcache, &req).inline_head());
        assert!(!at(CHUNK_BYTES, &buffered, &ranged("bytes=0-0,5-5")).inline_head());
        assert!(!at(CHUNK_BYTES, &buffered, &head_of(req)).inline_head());
    }

    #[test]
    fn diag_zero_endpoint_is_bounded() {
        let zero = |query: &'static [u8]| Request {
            query: Some(query),
            ..get(DIAG_ZERO_PATH)
        };
        let plan = plan_without_file(&zero(b"bytes=100000"), &limits(), &ctx(false)).unwrap();
        assert_eq!(plan.status(), 200);
        assert_eq!(
            plan.parts().collect::<Vec<_>>(),
            [BodyPart::Zero { len: 100_000 }]
        );
        assert!(!plan.reads_file() && !plan.inline_head());
        let (_, hs, body) = response(&plan, &[]);
        assert_eq!(content_length(&hs), Some(100_000));
        assert!(body.len() == 100_000 && body.iter().all(|&b| b == 0));

        let max = format!("bytes={DIAG_ZERO_MAX_BYTES}").leak().as_bytes();
        let plan = plan_without_file(&zero(max), &limits(), &ctx(false)).unwrap();
        assert_eq!(plan.body_len(), DIAG_ZERO_MAX_BYTES);
        let empty = plan_without_file(&zero(b"bytes=0"), &limits(), &ctx(false)).unwrap();
        assert_eq!((empty.status(), empty.parts().count()), (200, 0));
        let head = plan_without_file(&head_of(zero(b"bytes=5")), &limits(), &ctx(false)).unwrap();
        assert_eq!(head.parts().count(), 0);

        let over = format!("bytes={}", DIAG_ZERO_MAX_BYTES + 1)
            .leak()
            .as_bytes();
        for bad in [over, b"bytes=", b"bytes=-1", b"n=3"] {
            let plan = plan_without_file(&zero(bad), &limits(), &ctx(false)).unwrap();
            assert_eq!(plan.status(), 400);
            assert!(!plan.keep_alive());
        }
        // Off unless configured: then it is an ordinary path.
        let off = PlanLimits {
            diag_endpoint: false,
            ..limits()
        };
        assert!(plan_without_file(&zero(b"bytes=1"), &off, &ctx(false)).is_none());
    }

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

    #[test]
    fn zeros_render_in_windows() {
        let plan = plan_without_file(
            &Request {
                query: Some(b"bytes=10"),
                ..get(DIAG_ZERO_PATH)
            },
            &limits(),
            &ctx(false),
        )
        .unwrap();
        let part = BodyPart::Zero { len: 10 };
        let mut out = [0xAAu8; 8];
        assert_eq!(plan.render(part, 0, &mut out), 8);
        assert_eq!(plan.render(part, 8, &mut out), 2);
        assert_eq!(out[..2], [0, 0]);
        assert_eq!(plan.render(part, 10, &mut out), 0);
        assert_eq!(
            plan.render(BodyPart::File { start: 0, end: 5 }, 0, &mut out),
            0
        );
    }

    #[test]
    fn health_path_is_200_until_leaving() {
        let req = get(b"/healthz");
        let plan = plan_without_file(&req, &limits(), &ctx(false)).unwrap();
        let (code, hs, body) = response(&plan, &[]);
        assert_eq!(code, 200);
        assert_eq!(body, b"200 OK\n");
        assert_eq!(content_length(&hs), Some(7));
        assert!(plan.keep_alive() && !plan.reads_file());

        let plan = plan_without_file(&req, &limits(), &ctx(true)).unwrap();
        let (code, _, body) = response(&plan, &[]);
        assert_eq!(code, 503);
        assert_eq!(body, b"503 Service Unavailable\n");
        assert!(!plan.keep_alive());

        let head = plan_without_file(&head_of(req), &limits(), &ctx(false)).unwrap();
        let (code, hs, body) = response(&head, &[]);
        assert_eq!((code, content_length(&hs)), (200, Some(7)));
        assert!(body.is_empty());

        // Other paths, and no health path configured, need the file store.
        assert!(plan_without_file(&get(b"/f.bin"), &limits(), &ctx(false)).is_none());
        let none = PlanLimits {
            health_path: b"",
            ..limits()
        };
        assert!(plan_without_file(&req, &none, &ctx(false)).is_none());
    }

    #[test]
    fn status_responses() {
        let plan = plan_status(404, true, false, &ctx(false));
        let (code, hs, body) = response(&plan, &[]);
        assert_eq!(code, 404);
        assert_eq!(body, b"404 Not Found\n");
        assert_eq!(
            field(&hs, "content-type"),
            Some(response::ERROR_CONTENT_TYPE)
        );
        assert!(plan.keep_alive());
        let head = plan_status(404, true, true, &ctx(false));
        assert_eq!(response(&head, &[]).2, b"");
        assert_eq!(head.head_len(), plan.head_len() - body.len());

        let plan = plan_status(405, false, false, &ctx(false));
        let (code, hs, body) = response(&plan, &[]);
        assert_eq!(code, 405);
        assert!(body.is_empty());
        assert_eq!(field(&hs, "allow"), Some("GET, HEAD"));
        assert_eq!(content_length(&hs), Some(0));
        assert_eq!(field(&hs, "connection"), Some("close"));

        assert!(!plan_status(404, true, false, &ctx(true)).keep_alive());
    }
}
