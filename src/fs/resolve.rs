//! Request path -> relative file path beneath the document root.
//!
//! This is the first fence against path traversal; the second is the kernel: files are opened
//! with openat2 `RESOLVE_BENEATH`, which refuses `..` escapes and absolute symlinks whatever
//! this module lets through. Here we make sure the name we hand over is already harmless and
//! canonical, so logs, caches and the open-file cache key see one spelling per file.
//!
//! Rules, in the order they are checked (the first failure is reported):
//! 1. Percent-decode exactly once, left to right. `%` must be followed by two hex digits
//!    (`%g1`, truncated `%2`, `%%32%65` -> BadEncoding). `%252e` becomes the literal name
//!    `%2e`; it is never decoded again.
//! 2. NUL, raw or `%00` -> NulByte. Raw `\` -> BadEncoding (on Linux it is an ordinary name
//!    byte, but other tools and any Windows origin treat it as a separator: refusing it is
//!    safer than guessing). `%2f` / `%5c` -> EncodedSlash: a segment must not hide a separator.
//!    Other control bytes (raw or decoded, 0x01-0x1f and 0x7f) -> BadEncoding: no real update
//!    file has one, and a decoded CR/LF could otherwise end up in a log line or a `Location`
//!    header.
//! 3. The decoded bytes must be UTF-8 (so overlong `%c0%af` -> NotUtf8), checked before `..`
//!    handling so a popped segment cannot smuggle bad bytes past it.
//! 4. Segments: empty and `.` are dropped, `..` pops one, popping above the root -> Escapes.
//!    Other dot-names (`.well-known`, `...`) are ordinary names and allowed, as in nginx; hide
//!    dot-files with file permissions or keep them out of the root.
//! 5. Length: more than MAX_PATH_BYTES in the result, or a segment over MAX_SEGMENT_BYTES
//!    -> TooLong (the kernel's PATH_MAX and NAME_MAX; no point opening what must fail).

/// Longest relative path we resolve, in bytes (Linux PATH_MAX).
pub const MAX_PATH_BYTES: usize = 4096;

/// Longest single path segment, in bytes (Linux NAME_MAX).
pub const MAX_SEGMENT_BYTES: usize = 255;

/// A request path made safe to open beneath the root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// Decoded, normalised path relative to the root: "" for the root itself, no leading '/',
    /// segments joined with single '/', none of them empty, `.` or `..`.
    pub rel_path: String,
    /// The target names a directory: it ended in '/' (or in a `.`/`..` segment, which resolves
    /// to a directory the same way).
    pub wants_dir: bool,
}

/// Why a request path was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResolveError {
    /// Malformed percent escape, raw backslash or control byte (400).
    BadEncoding,
    /// NUL byte, raw or `%00` (400).
    NulByte,
    /// `%2f` or `%5c`: a separator hidden inside a segment (400).
    EncodedSlash,
    /// `..` would climb above the root (400).
    Escapes,
    /// Decoded bytes are not valid UTF-8 (400).
    NotUtf8,
    /// Path or one segment too long (414).
    TooLong,
}

impl ResolveError {
    /// HTTP status to answer with.
    pub fn status(self) -> u16 {
        match self {
            ResolveError::TooLong => 414,
            ResolveError::BadEncoding
            | ResolveError::NulByte
            | ResolveError::EncodedSlash
            | ResolveError::Escapes
            | ResolveError::NotUtf8 => 400,
        }
    }
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Percent-decodes `raw` once (a query parameter's value); None for a bad escape or a NUL.
pub fn percent_decode(raw: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while let Some(&b) = raw.get(i) {
        let byte = if b == b'%' {
            let hi = raw.get(i + 1).copied().and_then(hex_value)?;
            let lo = raw.get(i + 2).copied().and_then(hex_value)?;
            i += 3;
            (hi << 4) | lo
        } else {
            i += 1;
            b
        };
        if byte == 0 {
            return None;
        }
        out.push(byte);
    }
    Some(out)
}

fn is_control(b: u8) -> bool {
    b < 0x20 || b == 0x7f
}

/// Percent-decodes `raw` once into `out`, keeping raw '/' as the only separator.
fn decode(raw: &[u8], out: &mut Vec<u8>) -> Result<(), ResolveError> {
    let mut i = 0;
    while let Some(&b) = raw.get(i) {
        let byte = match b {
            b'%' => {
                let hi = raw.get(i.saturating_add(1)).copied().and_then(hex_value);
                let lo = raw.get(i.saturating_add(2)).copied().and_then(hex_value);
                let (Some(hi), Some(lo)) = (hi, lo) else {
                    return Err(ResolveError::BadEncoding);
                };
                i = i.saturating_add(3);
                match (hi << 4) | lo {
                    0 => return Err(ResolveError::NulByte),
                    b'/' | b'\\' => return Err(ResolveError::EncodedSlash),
                    d => d,
                }
            }
            0 => return Err(ResolveError::NulByte),
            b'\\' => return Err(ResolveError::BadEncoding),
            _ => {
                i = i.saturating_add(1);
                b
            }
        };
        if is_control(byte) {
            return Err(ResolveError::BadEncoding);
        }
        out.push(byte);
    }
    Ok(())
}

/// A reusable buffer that request paths are resolved into, one per shard, so that resolving
/// allocates nothing: the decoded and normalised path is built in place (it is never longer
/// than the raw path), and the buffer only grows for a raw path longer than any before it.
#[derive(Debug, Default)]
pub struct ResolveScratch {
    buf: Vec<u8>,
}

impl ResolveScratch {
    /// A scratch that resolves raw paths of up to `raw_max_bytes` without allocating (size it
    /// to the longest request target the parser accepts).
    pub fn with_capacity(raw_max_bytes: usize) -> ResolveScratch {
        ResolveScratch {
            buf: Vec::with_capacity(raw_max_bytes),
        }
    }

    /// Longest raw path resolved without growing the buffer.
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// The path of the last successful resolve (empty after a refused one), for logs.
    pub fn resolved(&self) -> &str {
        std::str::from_utf8(&self.buf).unwrap_or("")
    }
}

/// A resolved path borrowed from a [`ResolveScratch`] (valid until the next resolve into it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResolvedRef<'a> {
    /// As [`Resolved::rel_path`].
    pub rel_path: &'a str,
    /// As [`Resolved::wants_dir`].
    pub wants_dir: bool,
}

impl ResolvedRef<'_> {
    /// Whether the canonical path (`/` + the resolved path, `/` after a directory) starts
    /// with `prefix` (which starts with `/`): `/beta/` covers `/beta/x` and the directory
    /// `/beta/`; `/beta` covers `/beta` and `/beta-2`.
    pub fn is_under(&self, prefix: &str) -> bool {
        let want = prefix.as_bytes().get(1..).unwrap_or_default();
        let rel = self.rel_path.as_bytes();
        let slash = self.wants_dir && !rel.is_empty();
        match want.len().checked_sub(rel.len()) {
            // The prefix ends inside the resolved path.
            None => rel.starts_with(want),
            Some(0) => want == rel,
            // One byte more: the directory's trailing '/'.
            Some(1) => slash && want.starts_with(rel) && want.ends_with(b"/"),
            Some(_) => false,
        }
    }

    /// An owned copy (allocates; for tests, fuzzers and tools, not the request path).
    pub fn to_owned(self) -> Resolved {
        Resolved {
            rel_path: self.rel_path.to_owned(),
            wants_dir: self.wants_dir,
        }
    }
}

/// Turns a raw request path (query already stripped, still percent-encoded) into a safe
/// relative path, allocating the result. See the module docs for the rules; the request path
/// uses [`resolve_into`] with a reused [`ResolveScratch`] instead.
pub fn resolve_target(raw_path: &[u8]) -> Result<Resolved, ResolveError> {
    let mut scratch = ResolveScratch::with_capacity(raw_path.len());
    resolve_into(raw_path, &mut scratch).map(ResolvedRef::to_owned)
}

/// Resolves a raw request path into `scratch` and borrows the result from it: no allocation
/// when the scratch's capacity covers `raw_path`. Same rules and errors as [`resolve_target`].
pub fn resolve_into<'a>(
    raw_path: &[u8],
    scratch: &'a mut ResolveScratch,
) -> Result<ResolvedRef<'a>, ResolveError> {
    let buf = &mut scratch.buf;
    buf.clear();
    let wants_dir = match decode_and_normalise(raw_path, buf) {
        Ok(wants_dir) => wants_dir,
        Err(e) => {
            buf.clear();
            return Err(e);
        }
    };
    // Cut only at '/' of valid UTF-8, so still valid; the error cannot happen.
    let rel_path = std::str::from_utf8(buf).map_err(|_| ResolveError::NotUtf8)?;
    Ok(ResolvedRef {
        rel_path,
        wants_dir,
    })
}

/// Rules 1-5 into `buf` (empty on entry): leaves the resolved path there and returns whether
/// it names a directory.
fn decode_and_normalise(raw_path: &[u8], buf: &mut Vec<u8>) -> Result<bool, ResolveError> {
    decode(raw_path, buf)?;
    std::str::from_utf8(buf).map_err(|_| ResolveError::NotUtf8)?;
    let (rel_len, wants_dir) = normalise_in_place(buf)?;
    buf.truncate(rel_len);
    if rel_len > MAX_PATH_BYTES
        || buf
            .split(|&b| b == b'/')
            .any(|s| s.len() > MAX_SEGMENT_BYTES)
    {
        return Err(ResolveError::TooLong);
    }
    Ok(wants_dir)
}

/// Rule 4 over the decoded bytes, compacting the kept segments to the front of `buf`: returns
/// the length of the joined result and whether it names a directory. In place is safe because
/// every kept name is written at or before where it was read: the output puts at most one '/'
/// before a name, the input at least one (none before the first name of either).
fn normalise_in_place(buf: &mut [u8]) -> Result<(usize, bool), ResolveError> {
    let len = buf.len();
    let mut written = 0;
    let mut wants_dir;
    let mut start = 0;
    loop {
        let end = buf[start..]
            .iter()
            .position(|&b| b == b'/')
            .map_or(len, |p| start + p);
        match &buf[start..end] {
            b"" | b"." => wants_dir = true,
            b".." => {
                wants_dir = true;
                if written == 0 {
                    return Err(ResolveError::Escapes);
                }
                written = buf[..written].iter().rposition(|&b| b == b'/').unwrap_or(0);
            }
            _ => {
                wants_dir = false;
                if written > 0 {
                    buf[written] = b'/';
                    written += 1;
                }
                buf.copy_within(start..end, written);
                written += end - start;
            }
        }
        if end == len {
            return Ok((written, wants_dir));
        }
        start = end + 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use ResolveError::*;

    fn ok(raw: &str, rel: &str, wants_dir: bool) {
        assert_eq!(
            resolve_target(raw.as_bytes()),
            Ok(Resolved {
                rel_path: rel.to_string(),
                wants_dir
            }),
            "{raw}"
        );
    }

    fn err(raw: &[u8], e: ResolveError) {
        assert_eq!(
            resolve_target(raw),
            Err(e),
            "{}",
            String::from_utf8_lossy(raw)
        );
    }

    #[test]
    fn normal_paths() {
        ok("/", "", true);
        ok("", "", true);
        ok("/a", "a", false);
        ok("/a/", "a", true);
        ok("/a/b/c.pak", "a/b/c.pak", false);
        ok("//a///b//", "a/b", true);
        ok("/./a/./b", "a/b", false);
        ok("/a/.", "a", true);
        ok("/a/b/..", "a", true);
        ok("/a/b/../c", "a/c", false);
        ok("/a/..", "", true);
        ok("/..a/...", "..a/...", false);
        ok("/.well-known/x", ".well-known/x", false);
        ok("/%41%62c", "Abc", false);
        ok("/caf%C3%A9", "caf\u{e9}", false);
        ok("/caf\u{e9}", "caf\u{e9}", false);
        ok("/a%20b+c", "a b+c", false);
        ok("/%2e", "", true);
        ok("/a/%2E%2e", "", true);
    }

    #[test]
    fn query_values_decode_once_and_refuse_bad_escapes() {
        assert_eq!(
            percent_decode(b"/a%3Fv%3D1").as_deref(),
            Some(&b"/a?v=1"[..])
        );
        assert_eq!(percent_decode(b"%2541").as_deref(), Some(&b"%41"[..]));
        assert_eq!(percent_decode(b"%4"), None);
        assert_eq!(percent_decode(b"%zz"), None);
        assert_eq!(percent_decode(b"a%00"), None);
    }

    #[test]
    fn decoded_exactly_once() {
        ok("/%252e%252e/x", "%2e%2e/x", false);
        ok("/%2525", "%25", false);
    }

    #[test]
    fn traversal_encodings() {
        err(b"/../", Escapes);
        err(b"/..", Escapes);
        err(b"/a/../../etc/passwd", Escapes);
        err(b"/%2e%2e/", Escapes);
        err(b"/%2E%2E/etc", Escapes);
        err(b"/.%2e/", Escapes);
        err(b"/%2e./", Escapes);
        err(b"/%%32%65", BadEncoding);
        err(b"/%%32%65%%32%65/", BadEncoding);
        err(b"/..\\", BadEncoding);
        err(b"/a\\..\\..\\x", BadEncoding);
        err(b"/%c0%af", NotUtf8);
        err(b"/%c0%ae%c0%ae/", NotUtf8);
        err(b"/%e0%80%af", NotUtf8);
        err(b"/a%00b", NulByte);
        err(b"/a\x00b", NulByte);
        err(b"/..%2f..%2fetc", EncodedSlash);
        err(b"/..%2F", EncodedSlash);
        err(b"/..%5c..%5c", EncodedSlash);
        err(b"/%5C", EncodedSlash);
    }

    #[test]
    fn malformed_escapes() {
        err(b"/%", BadEncoding);
        err(b"/%2", BadEncoding);
        err(b"/%g1", BadEncoding);
        err(b"/%1g", BadEncoding);
        err(b"/a%", BadEncoding);
        err(b"/%+1", BadEncoding);
        err(b"/%0d%0aSet-Cookie:x", BadEncoding);
        err(b"/a\tb", BadEncoding);
        err(b"/%7f", BadEncoding);
        err(b"/\xff", NotUtf8);
    }

    #[test]
    fn first_failure_wins() {
        err(b"/%zz/%00", BadEncoding);
        err(b"/%00/%zz", NulByte);
        err(b"/../%ff", NotUtf8);
    }

    #[test]
    fn length_limits() {
        let seg = "a".repeat(MAX_SEGMENT_BYTES);
        ok(&format!("/{seg}"), &seg, false);
        err(format!("/{seg}a").as_bytes(), TooLong);
        // A long segment that `..` removes never reaches the kernel.
        ok(&format!("/{seg}a/../b"), "b", false);
        let path = vec![seg.as_str(); 16].join("/");
        assert_eq!(path.len(), 16 * 255 + 15);
        ok(&format!("/{path}"), &path, false);
        let too_long = vec![seg.as_str(); 17].join("/");
        err(format!("/{too_long}").as_bytes(), TooLong);
        assert_eq!(TooLong.status(), 414);
        assert_eq!(Escapes.status(), 400);
    }

    fn check_ok(r: &Resolved) -> Result<(), TestCaseError> {
        prop_assert!(!r.rel_path.starts_with('/'));
        prop_assert!(!r.rel_path.contains('\0'));
        prop_assert!(!r.rel_path.contains('\\'));
        prop_assert!(r.rel_path.len() <= MAX_PATH_BYTES);
        if !r.rel_path.is_empty() {
            for seg in r.rel_path.split('/') {
                prop_assert!(
                    !seg.is_empty() && seg != "." && seg != "..",
                    "{:?}",
                    r.rel_path
                );
                prop_assert!(seg.len() <= MAX_SEGMENT_BYTES);
            }
        }
        Ok(())
    }

    /// The allocating implementation this module had before `resolve_into`, kept as the
    /// model the in-place one must agree with byte for byte.
    fn model_resolve(raw_path: &[u8]) -> Result<Resolved, ResolveError> {
        let mut decoded = Vec::with_capacity(raw_path.len());
        decode(raw_path, &mut decoded)?;
        let decoded = String::from_utf8(decoded).map_err(|_| ResolveError::NotUtf8)?;
        let mut rel = String::with_capacity(decoded.len());
        let mut wants_dir = true;
        for segment in decoded.split('/') {
            match segment {
                "" | "." => wants_dir = true,
                ".." => {
                    wants_dir = true;
                    if rel.is_empty() {
                        return Err(ResolveError::Escapes);
                    }
                    let cut = rel.rfind('/').unwrap_or(0);
                    rel.truncate(cut);
                }
                name => {
                    wants_dir = false;
                    if !rel.is_empty() {
                        rel.push('/');
                    }
                    rel.push_str(name);
                }
            }
        }
        if rel.len() > MAX_PATH_BYTES || rel.split('/').any(|s| s.len() > MAX_SEGMENT_BYTES) {
            return Err(ResolveError::TooLong);
        }
        Ok(Resolved {
            rel_path: rel,
            wants_dir,
        })
    }

    #[test]
    fn one_scratch_reused_gives_what_a_fresh_one_gives() {
        let mut scratch = ResolveScratch::with_capacity(64);
        let long = format!("/{}/x", "a".repeat(40));
        let targets: [&[u8]; 9] = [
            long.as_bytes(),
            b"/b",
            b"/%zz",
            b"/a/../../x",
            b"/c/",
            b"/",
            b"/%c0%af",
            b"//a///b//../c",
            b"/d.pak",
        ];
        for raw in targets {
            let got = resolve_into(raw, &mut scratch).map(ResolvedRef::to_owned);
            assert_eq!(got, model_resolve(raw), "{}", String::from_utf8_lossy(raw));
        }
        assert_eq!(scratch.capacity(), 64, "no target outgrew the scratch");
    }

    proptest! {
        #[test]
        fn arbitrary_bytes(raw in proptest::collection::vec(any::<u8>(), 0..96)) {
            if let Ok(r) = resolve_target(&raw) {
                check_ok(&r)?;
            }
        }

        #[test]
        fn in_place_agrees_with_the_model(parts in proptest::collection::vec(
            prop_oneof![
                Just("/"), Just(".."), Just("."), Just("%2e"), Just("%25"), Just("%2f"),
                Just("\\"), Just("a"), Just("bc"), Just("%00"), Just("%ff"), Just("%c3%a9"),
                Just("%"), Just("\u{e9}"),
            ], 0..32)) {
            let raw = parts.concat();
            let mut scratch = ResolveScratch::default();
            let got = resolve_into(raw.as_bytes(), &mut scratch).map(ResolvedRef::to_owned);
            prop_assert_eq!(got, model_resolve(raw.as_bytes()), "{:?}", raw);
        }

        #[test]
        fn path_like_strings(parts in proptest::collection::vec(
            prop_oneof![
                Just("/"), Just(".."), Just("."), Just("%2e"), Just("%2E"), Just("%25"),
                Just("%2f"), Just("%5c"), Just("\\"), Just("a"), Just("b.c"), Just("%00"),
                Just("%c0%af"), Just("%"), Just("2"), Just("e"), Just("%c3%a9"),
            ], 0..24)) {
            let raw = parts.concat();
            if let Ok(r) = resolve_target(raw.as_bytes()) {
                check_ok(&r)?;
                // Resolving the result again (as a path) is a fixed point, unless it has a
                // literal '%' that the second pass would now decode.
                if !r.rel_path.contains('%') {
                    let again = resolve_target(format!("/{}", r.rel_path).as_bytes());
                    prop_assert_eq!(again.map(|a| a.rel_path), Ok(r.rel_path.clone()));
                }
            }
        }
    }
}
