//! Secrets kept in files only their owner may read (mode 0600): the admin listener's bearer
//! token (`admin_token_file`), read by the server and by `shardline cache purge|prefill`. A file
//! its group or others may read is refused, as ssh refuses such a private key: a token every
//! user of the host can read keeps no one out.

use std::io::Read;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Shortest token taken (16 bytes: `head -c 32 /dev/urandom | base64` gives 44).
pub const MIN_TOKEN_BYTES: usize = 16;
/// Longest token taken: it travels in one header line of the admin listener's bounded head.
pub const MAX_TOKEN_BYTES: usize = 256;
/// Mode bits that let the file's group or others at it.
const GROUP_OTHER_MODE_BITS: u32 = 0o077;
/// Bytes past the token read at most (its line end and stray blanks, trimmed).
const TRAILING_SLACK_BYTES: u64 = 16;

/// The token in `path`, its surrounding blanks and line end trimmed; Err says what is wrong
/// (never the file's content).
pub fn read_token_file(path: &Path) -> Result<String, String> {
    // O_NONBLOCK: a FIFO put in its place cannot hang start-up (it is refused below).
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // The opened file's own metadata: what is judged is what is read.
    let meta = file
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{}: not a regular file", path.display()));
    }
    let mode = meta.permissions().mode();
    if mode & GROUP_OTHER_MODE_BITS != 0 {
        return Err(format!(
            "{}: mode {:04o} lets group or others read it; chmod 600 it",
            path.display(),
            mode & 0o7777
        ));
    }
    let limit = MAX_TOKEN_BYTES as u64 + TRAILING_SLACK_BYTES;
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() as u64 > limit {
        return Err(format!(
            "{}: longer than {MAX_TOKEN_BYTES} bytes",
            path.display()
        ));
    }
    parse_token(&bytes).map_err(|why| format!("{}: {why}", path.display()))
}

/// The token of a token file's bytes; Err says what is wrong with it.
pub fn parse_token(bytes: &[u8]) -> Result<String, String> {
    let token = bytes.trim_ascii();
    if token.is_empty() {
        return Err("empty: put a random token in it (head -c 32 /dev/urandom | base64)".into());
    }
    if token.len() > MAX_TOKEN_BYTES {
        return Err(format!("the token is longer than {MAX_TOKEN_BYTES} bytes"));
    }
    if token.len() < MIN_TOKEN_BYTES {
        return Err(format!(
            "the token has {} bytes; at least {MIN_TOKEN_BYTES}",
            token.len()
        ));
    }
    // It is sent in a header: visible ASCII only (base64 and hex are).
    if !token.iter().all(u8::is_ascii_graphic) {
        return Err("the token must be one word of visible ASCII (as base64 or hex)".into());
    }
    Ok(String::from_utf8_lossy(token).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(dir: &Path, name: &str, text: &[u8], mode: u32) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn a_private_file_gives_its_trimmed_token() {
        let dir = tempfile::tempdir().unwrap();
        let token = "q0n8M1tXk2w5vUu7ZP3s9yGf4hAaB6cD+/eE=";
        let p = file_with(dir.path(), "t", format!("{token}\n").as_bytes(), 0o600);
        assert_eq!(read_token_file(&p).unwrap(), token);
        let p = file_with(dir.path(), "r", b"  0123456789abcdef\r\n", 0o400);
        assert_eq!(read_token_file(&p).unwrap(), "0123456789abcdef");
    }

    #[test]
    fn a_file_others_may_read_or_a_bad_token_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for mode in [0o644, 0o640, 0o604, 0o660, 0o602] {
            let p = file_with(dir.path(), "t", b"0123456789abcdef\n", mode);
            let e = read_token_file(&p).unwrap_err();
            assert!(
                e.contains("group or others") && e.contains("chmod 600"),
                "{e}"
            );
        }
        let refused = |text: &[u8]| {
            let p = file_with(dir.path(), "b", text, 0o600);
            read_token_file(&p).unwrap_err()
        };
        assert!(refused(b"").contains("empty"));
        assert!(refused(b" \n\n").contains("empty"));
        assert!(refused(b"short\n").contains("at least"));
        assert!(refused(b"0123456789 abcdef\n").contains("visible ASCII"));
        assert!(refused("0123456789abcdéf".as_bytes()).contains("visible ASCII"));
        let long = "a".repeat(MAX_TOKEN_BYTES + 1);
        assert!(refused(long.as_bytes()).contains("longer than"));
        let huge = "a".repeat(64 * 1024);
        assert!(refused(huge.as_bytes()).contains("longer than"));
        assert!(read_token_file(&dir.path().join("missing")).is_err());
        let e = read_token_file(dir.path()).unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
    }
}
