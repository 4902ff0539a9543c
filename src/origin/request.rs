//! The request a fill sends to the origin: a GET of one byte range (a run of blocks), kept
//! alive, with the validators of the version it revalidates.

use std::fmt::Write as _;

/// Longest origin request head written (path, host and validators are bounded below it).
pub const MAX_REQUEST_HEAD_BYTES: usize = 8 * 1024;

/// What to ask the origin for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fetch<'a> {
    /// The request target at the origin (path and query, already as it is to be sent).
    pub path: &'a str,
    /// The Host header to send.
    pub host: &'a str,
    /// First and last byte (inclusive) wanted; None: the whole object (its size is unknown).
    pub range: Option<(u64, u64)>,
    /// Revalidate: `If-None-Match` with this ETag.
    pub if_none_match: Option<&'a str>,
    /// Revalidate: `If-Modified-Since` with this date (when the origin gave no ETag).
    pub if_modified_since: Option<&'a str>,
    /// The client's `Authorization`, forwarded on a request the cache does not serve (its
    /// reply is that client's alone).
    pub authorization: Option<&'a str>,
    /// The client's end-to-end field lines to forward (`forwardable`), each ending in CRLF.
    pub forward: &'a str,
}

/// Most bytes of a client's field lines forwarded to an origin (lines past it are left out).
pub const MAX_FORWARDED_BYTES: usize = 2048;

/// Request fields never forwarded: hop-by-hop ones (RFC 9110 §7.6.1), those the edge writes
/// itself (Host, the range and conditionals of its own fetch, Accept-Encoding: identity),
/// the credentials of one client on a shared fill (Authorization is sent only with its own
/// fetch; Cookie too, `with_cookie`), and the client-address fields the edge judges itself.
const NOT_FORWARDED: &[&str] = &[
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "expect",
    "range",
    "if-match",
    "if-none-match",
    "if-modified-since",
    "if-unmodified-since",
    "if-range",
    "accept-encoding",
    "user-agent",
    "authorization",
    "x-forwarded-for",
    "forwarded",
];

/// Appends to `out` the end-to-end lines of a client's head `fields` (each `Name: value`
/// ending in CRLF, as `Request::fields` holds them) that its origin request carries: all but
/// `NOT_FORWARDED` and the ones its `Connection` names; `Cookie` only `with_cookie` (the
/// client's own fetch). At most `MAX_FORWARDED_BYTES`; a line that is not plain ASCII text
/// is left out.
pub fn forwardable(fields: &[u8], with_cookie: bool, out: &mut String) {
    let lines = || {
        fields
            .split(|&b| b == b'\n')
            .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
            .filter_map(|l| std::str::from_utf8(l).ok())
            .filter_map(|l| l.split_once(':'))
    };
    let named_by_connection = |name: &str| {
        lines().any(|(n, v)| {
            n.trim().eq_ignore_ascii_case("connection")
                && v.split(',').any(|t| t.trim().eq_ignore_ascii_case(name))
        })
    };
    for (name, value) in lines() {
        let (name, value) = (name.trim(), value.trim());
        let lower = name.to_ascii_lowercase();
        if name.is_empty()
            || NOT_FORWARDED.contains(&lower.as_str())
            || (lower == "cookie" && !with_cookie)
            || !clean(name)
            || !clean(value)
            || !value
                .bytes()
                .all(|b| b == b'\t' || (0x20..0x7f).contains(&b))
            || named_by_connection(name)
        {
            continue;
        }
        if out.len() + name.len() + value.len() + 4 <= MAX_FORWARDED_BYTES {
            out.push_str(name);
            out.push_str(": ");
            out.push_str(value);
            out.push_str("\r\n");
        }
    }
}

/// Whether a client's head `fields` (as `Request::fields` holds them) carry a Cookie.
pub fn carries_cookie(fields: &[u8]) -> bool {
    fields
        .split(|&b| b == b'\n')
        .filter_map(|l| l.iter().position(|&b| b == b':').map(|i| &l[..i]))
        .any(|name| name.trim_ascii().eq_ignore_ascii_case(b"cookie"))
}

/// Why a request could not be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestError {
    /// A field holds a byte that would end the line or the head (CR, LF, NUL), or the path
    /// does not start with '/'.
    BadField,
    /// The head would pass `MAX_REQUEST_HEAD_BYTES`.
    TooLong,
}

fn clean(v: &str) -> bool {
    !v.bytes().any(|b| matches!(b, b'\r' | b'\n' | 0))
}

impl Fetch<'_> {
    /// Writes the request head into `out` (cleared first).
    pub fn write(&self, out: &mut String) -> Result<(), RequestError> {
        out.clear();
        let fields = [
            Some(self.path),
            Some(self.host),
            self.if_none_match,
            self.if_modified_since,
            self.authorization,
        ];
        if !self.path.starts_with('/') || !fields.iter().flatten().all(|f| clean(f)) {
            return Err(RequestError::BadField);
        }
        let _ = write!(
            out,
            "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: shardline/{}\r\nAccept-Encoding: identity\r\n",
            self.path,
            self.host,
            env!("CARGO_PKG_VERSION")
        );
        if let Some((first, last)) = self.range {
            assert!(first <= last, "an empty range");
            let _ = write!(out, "Range: bytes={first}-{last}\r\n");
        }
        if let Some(etag) = self.if_none_match {
            let _ = write!(out, "If-None-Match: {etag}\r\n");
        } else if let Some(date) = self.if_modified_since {
            let _ = write!(out, "If-Modified-Since: {date}\r\n");
        }
        if let Some(credentials) = self.authorization {
            let _ = write!(out, "Authorization: {credentials}\r\n");
        }
        if !self.forward.split_terminator("\r\n").all(clean) {
            out.clear();
            return Err(RequestError::BadField);
        }
        out.push_str(self.forward);
        out.push_str("\r\n");
        if out.len() > MAX_REQUEST_HEAD_BYTES {
            out.clear();
            return Err(RequestError::TooLong);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clients_end_to_end_fields_are_forwarded_and_no_others() {
        let fields = b"Host: edge\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\n\
                       Range: bytes=0-9\r\nIf-None-Match: \"a\"\r\nCookie: s=1\r\n\
                       Authorization: Bearer t\r\nReq-Num: 3\r\nCache-Control: no-cache\r\n\
                       Accept-Encoding: gzip\r\nX-Client-Build: 7\r\n\r\n";
        let mut shared = String::new();
        forwardable(fields, false, &mut shared);
        assert_eq!(
            shared,
            "Req-Num: 3\r\nCache-Control: no-cache\r\nX-Client-Build: 7\r\n"
        );
        let mut own = String::new();
        forwardable(fields, true, &mut own);
        assert!(own.starts_with("Cookie: s=1\r\n"), "{own}");
        let mut long = String::new();
        let many = format!("X-Big: {}\r\n", "v".repeat(MAX_FORWARDED_BYTES)).into_bytes();
        forwardable(&many, false, &mut long);
        assert!(long.is_empty(), "past the bound: left out");
    }

    #[test]
    fn a_block_run_is_one_ranged_get_with_its_validator() {
        let mut out = String::new();
        Fetch {
            path: "/game/v2/data.pak",
            host: "origin.example",
            range: Some((1 << 20, (3 << 20) - 1)),
            if_none_match: Some("\"v2\""),
            if_modified_since: Some("Tue, 01 Dec 2026 00:00:00 GMT"),
            authorization: None,
            forward: "",
        }
        .write(&mut out)
        .unwrap();
        assert!(out.starts_with("GET /game/v2/data.pak HTTP/1.1\r\nHost: origin.example\r\n"));
        assert!(out.contains("\r\nRange: bytes=1048576-3145727\r\n"));
        assert!(out.contains("\r\nIf-None-Match: \"v2\"\r\n"));
        assert!(
            !out.contains("If-Modified-Since"),
            "the ETag is the stronger validator"
        );
        assert!(out.ends_with("\r\n\r\n"));
        let mut parsed = [httparse::EMPTY_HEADER; 16];
        let mut req = httparse::Request::new(&mut parsed);
        assert!(req.parse(out.as_bytes()).unwrap().is_complete());
    }

    #[test]
    fn fields_that_would_split_the_head_are_refused() {
        let mut out = String::new();
        let ok = Fetch {
            path: "/a",
            host: "h",
            range: None,
            if_none_match: None,
            if_modified_since: None,
            authorization: None,
            forward: "",
        };
        for bad in [
            Fetch {
                host: "h\r\nX-Evil: 1",
                ..ok
            },
            Fetch { path: "a", ..ok },
            Fetch {
                if_none_match: Some("\"x\"\n"),
                ..ok
            },
            Fetch {
                authorization: Some("Bearer a\r\nX-Evil: 1"),
                ..ok
            },
        ] {
            assert_eq!(bad.write(&mut out), Err(RequestError::BadField));
        }
        let long = "/".to_string() + &"x".repeat(MAX_REQUEST_HEAD_BYTES);
        assert_eq!(
            Fetch { path: &long, ..ok }.write(&mut out),
            Err(RequestError::TooLong)
        );
        assert!(ok.write(&mut out).is_ok() && !out.contains("Range"));
        let with = Fetch {
            authorization: Some("Bearer abc"),
            ..ok
        };
        assert!(with.write(&mut out).is_ok() && out.contains("\r\nAuthorization: Bearer abc\r\n"));
    }
}
