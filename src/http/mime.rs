//! Content-Type by file extension: a short fixed table, no allocation, no mime database.
//!
//! Game-update CDNs serve mostly opaque packages; the table covers what launchers, web
//! front-ends and streaming players fetch. Unknown means `application/octet-stream`, which
//! browsers will not sniff into something executable.

/// Content-Type for files whose extension is not in the table.
pub const DEFAULT_CONTENT_TYPE: &str = "application/octet-stream";

/// Longest extension looked up; longer ones cannot be in the table.
pub const MAX_EXTENSION_BYTES: usize = 8;

/// (lowercase extension, Content-Type). Text types say UTF-8 so browsers need not guess.
const TABLE: &[(&[u8], &str)] = &[
    (b"html", "text/html; charset=utf-8"),
    (b"htm", "text/html; charset=utf-8"),
    (b"txt", "text/plain; charset=utf-8"),
    (b"css", "text/css; charset=utf-8"),
    // RFC 9239 made text/javascript the one registered type.
    (b"js", "text/javascript; charset=utf-8"),
    (b"mjs", "text/javascript; charset=utf-8"),
    (b"json", "application/json"),
    (b"xml", "application/xml"),
    (b"png", "image/png"),
    (b"jpg", "image/jpeg"),
    (b"jpeg", "image/jpeg"),
    (b"gif", "image/gif"),
    (b"svg", "image/svg+xml"),
    (b"ico", "image/x-icon"),
    (b"webp", "image/webp"),
    (b"wasm", "application/wasm"),
    (b"pdf", "application/pdf"),
    (b"zip", "application/zip"),
    // A .gz is served as the gzip file itself, never with Content-Encoding: clients must get
    // the exact bytes whose hash the update manifest lists.
    (b"gz", "application/gzip"),
    (b"tar", "application/x-tar"),
    (b"7z", "application/x-7z-compressed"),
    (b"xz", "application/x-xz"),
    (b"zst", "application/zstd"),
    (b"bin", DEFAULT_CONTENT_TYPE),
    (b"pak", DEFAULT_CONTENT_TYPE),
    // application/x-iso9660-image exists but some browsers try to mount it; keep it opaque.
    (b"iso", DEFAULT_CONTENT_TYPE),
    (b"mp4", "video/mp4"),
    (b"webm", "video/webm"),
    (b"m3u8", "application/vnd.apple.mpegurl"),
    // On a CDN `.ts` is an MPEG transport-stream segment (HLS), not TypeScript.
    (b"ts", "video/mp2t"),
    // `.manifest` files are launcher-specific formats (not always JSON): stay opaque.
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
    TABLE
        .iter()
        .find(|(e, _)| e.eq_ignore_ascii_case(ext))
        .map_or(DEFAULT_CONTENT_TYPE, |(_, t)| t)
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
            "/x.verylongextension",
            "/a.html/b",
            "\u{0}.html\u{0}",
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
