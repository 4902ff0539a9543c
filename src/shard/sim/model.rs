//! What the simulated network and the simulated origin share: the files served (with every
//! version they had) and the byte queues both ends drain.

use std::collections::VecDeque;
use std::path::PathBuf;

/// A file under the served root, with every content it has had.
pub struct SimFile {
    /// URL path (`/name`).
    pub url: String,
    /// Where it lives.
    pub path: PathBuf,
    /// Contents, oldest first: a response must match one of them throughout.
    pub versions: Vec<Vec<u8>>,
    /// Served by the simulated origin through the pull-through cache (`path` is not used).
    pub pulled: bool,
    /// What its origin says about caching it (pulled files; issue 42).
    pub contract: Contract,
}

/// What a pulled object's origin says about storing it (RFC 9111), the same in every reply
/// (issue 42's simulator target).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Storing {
    /// No caching field (the edge's default lifetime).
    #[default]
    Plain,
    /// `Cache-Control: max-age=0`: every use is revalidated (a 304).
    MaxAgeZero,
    /// `Cache-Control: max-age=3600`.
    MaxAgeLong,
    /// `Vary: Accept-Encoding` (the edge asks for identity always: stored).
    VaryEncoding,
    /// `Cache-Control: private`: each client's own, never stored.
    Private,
    /// `Cache-Control: no-store`: each client's own.
    NoStore,
    /// `Vary: X-Client` (the field the simulated clients name themselves in): stored as the
    /// variant of the client that fetched it, and served only to that client.
    VaryClient,
    /// A 302 to `redirect_location(url)`, to every request.
    Redirect,
    /// A 410, to every request.
    Gone,
}

impl Storing {
    /// Every kind, in the order a run draws them.
    pub const ALL: [Storing; 9] = [
        Storing::Plain,
        Storing::MaxAgeZero,
        Storing::MaxAgeLong,
        Storing::VaryEncoding,
        Storing::Private,
        Storing::NoStore,
        Storing::VaryClient,
        Storing::Redirect,
        Storing::Gone,
    ];
}

/// A pulled object's contract: its storing kind, and whether its bytes are stored encoded
/// (`Content-Encoding: gzip` whatever the request asks, as S3 sends such an object).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Contract {
    /// What may be stored, and for how long.
    pub storing: Storing,
    /// Every reply says `Content-Encoding: gzip`.
    pub gzip: bool,
}

impl Contract {
    /// The fields its replies carry (each line with its CRLF).
    pub fn fields(&self) -> String {
        let mut out = String::from(match self.storing {
            Storing::Plain | Storing::Redirect | Storing::Gone => "",
            Storing::MaxAgeZero => "Cache-Control: max-age=0\r\n",
            Storing::MaxAgeLong => "Cache-Control: max-age=3600\r\n",
            Storing::VaryEncoding => "Vary: Accept-Encoding\r\n",
            Storing::Private => "Cache-Control: private, max-age=3600\r\n",
            Storing::NoStore => "Cache-Control: no-store\r\n",
            Storing::VaryClient => "Vary: X-Client\r\n",
        });
        if self.gzip {
            out.push_str("Content-Encoding: gzip\r\n");
        }
        out
    }

    /// Its replies may not be stored, or vary on the client: each client gets a body of its
    /// own (`per_client_body`), and one client's must never reach another.
    pub fn per_client(&self) -> bool {
        matches!(
            self.storing,
            Storing::Private | Storing::NoStore | Storing::VaryClient
        )
    }

    /// The status every reply has, when it is not the object (302, 410).
    pub fn status(&self) -> Option<u16> {
        match self.storing {
            Storing::Redirect => Some(302),
            Storing::Gone => Some(410),
            _ => None,
        }
    }
}

/// Where a redirected object's 302 points.
pub fn redirect_location(url: &str) -> String {
    format!("/moved{url}")
}

/// The body of `content` the origin sends to client `client` (None: a request that names no
/// client) for an object whose replies are each client's own: every byte masked with the
/// client's own value, so any two clients' bodies differ at every byte.
pub fn per_client_body(content: &[u8], client: Option<usize>) -> Vec<u8> {
    let mask = client.map_or(0xff, |c| (c % 255) as u8 + 1);
    content.iter().map(|b| b ^ mask).collect()
}

/// The first `n` bytes of `queue`, taken off it (by slices: a byte at a time is slow in a
/// debug build, and the simulator moves every byte of every response).
pub fn take_front(queue: &mut VecDeque<u8>, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n);
    let (a, b) = queue.as_slices();
    let from_a = n.min(a.len());
    out.extend_from_slice(&a[..from_a]);
    out.extend_from_slice(&b[..n - from_a]);
    queue.drain(..n);
    out
}
