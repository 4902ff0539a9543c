//! Content-Type by file extension: `mime_guess`'s table, with a short list of overrides where
//! a CDN's clients need something else. No allocation.
//!
//! Game-update CDNs serve mostly opaque packages; the overrides cover what launchers, web
//! front-ends and streaming players fetch and the general table gets wrong for them (or
//! lacks). Unknown means `application/octet-stream`, which browsers will not sniff into
//! something executable.

/// Content-Type for files whose extension is in neither table.
pub const DEFAULT_CONTENT_TYPE: &str = "application/octet-stream";

/// Longest extension looked up. Real ones are short; bounding it keeps a hostile path from
/// costing a long comparison, and a lookup over the limit is `DEFAULT_CONTENT_TYPE`.
pub const MAX_EXTENSION_BYTES: usize = 16;

/// (lowercase extension, Content-Type) looked up before `mime_guess`.
const OVERRIDES: &[(&[u8], &str)] = &[
    // The bulk of a game CDN's traffic, first: answered without the general table's
    // case-insensitive binary search, which costs several times more per lookup.
    (b"bin", DEFAULT_CONTENT_TYPE),
    (b"pak", DEFAULT_CONTENT_TYPE),
    // Text types say UTF-8 so browsers need not guess (mime_guess gives no parameters).
    (b"html", "text/html; charset=utf-8"),
    (b"htm", "text/html; charset=utf-8"),
    (b"txt", "text/plain; charset=utf-8"),
    (b"css", "text/css; charset=utf-8"),
    // RFC 9239 made text/javascript the one registered type (mime_guess: application/ for mjs).
    (b"js", "text/javascript; charset=utf-8"),
    (b"mjs", "text/javascript; charset=utf-8"),
    // RFC 7303 prefers application/xml (mime_guess: text/xml).
    (b"xml", "application/xml"),
    // Missing from mime_guess.
    (b"zst", "application/zstd"),
    // A .gz is served as the gzip file itself, never with Content-Encoding: clients must get
    // the exact bytes whose hash the update manifest lists. (mime_guess agrees; pinned here
    // because a change would break that promise.)
    (b"gz", "application/gzip"),
    // application/x-iso9660-image exists but some browsers try to mount it; keep it opaque.
    (b"iso", DEFAULT_CONTENT_TYPE),
    // The HLS types of RFC 8216 (mime_guess: audio/x-mpegurl, video/vnd.dlna.mpeg-tts). On a
    // CDN `.ts` is an MPEG transport-stream segment, not TypeScript.
    (b"m3u8", "application/vnd.apple.mpegurl"),
    (b"ts", "video/mp2t"),
    // `.manifest` files are launcher-specific formats (not always JSON), not the Windows
    // application manifests mime_guess means: stay opaque.
    (b"manifest", DEFAULT_CONTENT_TYPE),
];

/// Content-Type for a path by the extension of its last segment, case-insensitively.
///
/// Works on raw or resolved paths; dot-files such as `.htaccess` have no extension.
pub fn content_type_for(path: &[u8]) -> &'static str {
    let name = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
    let Some(dot) = name.iter().rposition(|&b| b == b'.') else {
        return DEFAULT_CONTENT_TYPE;
    };
    if dot == 0 {
        return DEFAULT_CONTENT_TYPE;
    }
    let ext = name.get(dot.saturating_add(1)..).unwrap_or_default();
    if ext.is_empty() || ext.len() > MAX_EXTENSION_BYTES {
        return DEFAULT_CONTENT_TYPE;
    }
    if let Some((_, t)) = OVERRIDES.iter().find(|(e, _)| e.eq_ignore_ascii_case(ext)) {
        return t;
    }
    // The table's extensions are ASCII; anything else cannot be in it.
    let Some(ext) = std::str::from_utf8(ext).ok().filter(|e| e.is_ascii()) else {
        return DEFAULT_CONTENT_TYPE;
    };
    mime_guess::from_ext(ext)
        .first_raw()
        .unwrap_or(DEFAULT_CONTENT_TYPE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn by_extension() {
        for (path, want) in [
            ("/index.html", "text/html; charset=utf-8"),
            ("/INDEX.HTM", "text/html; charset=utf-8"),
            ("a/b/readme.txt", "text/plain; charset=utf-8"),
            ("/app.Js", "text/javascript; charset=utf-8"),
            ("/v1/manifest.json", "application/json"),
            ("/logo.PNG", "image/png"),
            ("/photo.jpeg", "image/jpeg"),
            ("/icon.svg", "image/svg+xml"),
            ("/game.wasm", "application/wasm"),
            ("/patch-1.2.3.tar.gz", "application/gzip"),
            ("/data.tar", "application/x-tar"),
            ("/pack.7z", "application/x-7z-compressed"),
            ("/pack.zst", "application/zstd"),
            ("/pack.xz", "application/x-xz"),
            ("/stream/index.m3u8", "application/vnd.apple.mpegurl"),
            ("/stream/seg001.ts", "video/mp2t"),
            ("/trailer.mp4", "video/mp4"),
            ("/game.manifest", DEFAULT_CONTENT_TYPE),
            ("/chunk.pak", DEFAULT_CONTENT_TYPE),
            ("/disc.iso", DEFAULT_CONTENT_TYPE),
            ("/feed.XML", "application/xml"),
            ("/mod.mjs", "text/javascript; charset=utf-8"),
            // From the general table, beyond the overrides.
            ("/doc.csv", "text/csv"),
            ("/font.woff2", "font/woff2"),
            ("/clip.mkv", "video/x-matroska"),
            ("/song.MP3", "audio/mpeg"),
            ("/photo.avif", "image/avif"),
            ("/data.webmanifest", "application/manifest+json"),
        ] {
            assert_eq!(content_type_for(path.as_bytes()), want, "{path}");
        }
    }

    #[test]
    fn defaults() {
        for path in [
            "",
            "/",
            "/noext",
            "/.htaccess",
            "/dir.html/",
            "/file.",
            "/file.unknown",
            "/x.muchtoolongextension",
            "/a.html/b",
            "\u{0}.html\u{0}",
            "/file.caf\u{e9}",
            "/file.h\u{0}tml",
        ] {
            assert_eq!(
                content_type_for(path.as_bytes()),
                DEFAULT_CONTENT_TYPE,
                "{path}"
            );
        }
        assert_eq!(content_type_for(&[0xff, b'.', 0xfe]), DEFAULT_CONTENT_TYPE);
    }

    proptest! {
        #[test]
        fn never_panics(path in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = content_type_for(&path);
        }
    }
}
