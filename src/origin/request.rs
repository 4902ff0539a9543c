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
    fn a_block_run_is_one_ranged_get_with_its_validator() {
        let mut out = String::new();
        Fetch {
            path: "/game/v2/data.pak",
            host: "origin.example",
            range: Some((1 << 20, (3 << 20) - 1)),
            if_none_match: Some("\"v2\""),
            if_modified_since: Some("Tue, 01 Dec 2026 00:00:00 GMT"),
            authorization: None,
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
