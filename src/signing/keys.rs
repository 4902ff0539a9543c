//! The publisher's signing keys: a file of `KEY_ID HEX_SECRET` lines (`#` starts a comment),
//! read at start-up and at every SIGHUP. Several ids let keys rotate: sign with the new id,
//! keep the old line until the URLs it signed have expired, then remove it.

use aws_lc_rs::hmac;

/// Fewest secret bytes a key may have (HMAC-SHA256's output size).
pub const MIN_KEY_BYTES: usize = 32;
/// Most keys one file may hold.
pub const MAX_KEYS: usize = 64;
/// Longest key id.
pub const MAX_KEY_ID_BYTES: usize = 32;
/// Largest key file read.
pub const MAX_KEY_FILE_BYTES: u64 = 64 * 1024;

/// Keys by id.
pub struct KeyRing {
    keys: Vec<(String, hmac::Key)>,
}

impl std::fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secrets.
        let ids: Vec<&str> = self.keys.iter().map(|(id, _)| id.as_str()).collect();
        f.debug_struct("KeyRing").field("ids", &ids).finish()
    }
}

impl KeyRing {
    /// Reads and parses `path`.
    pub fn load(path: &std::path::Path) -> Result<KeyRing, String> {
        let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
        if meta.len() > MAX_KEY_FILE_BYTES {
            return Err(format!("larger than {MAX_KEY_FILE_BYTES} bytes"));
        }
        let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
        KeyRing::parse(&text)
    }

    /// Parses key file text.
    pub fn parse(text: &str) -> Result<KeyRing, String> {
        let mut keys: Vec<(String, hmac::Key)> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut parts = line.split_whitespace();
            let (Some(id), Some(secret), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(format!("line {}: wants KEY_ID HEX_SECRET", n + 1));
            };
            let id_ok = id.len() <= MAX_KEY_ID_BYTES
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if !id_ok {
                return Err(format!(
                    "line {}: a key id is 1-{MAX_KEY_ID_BYTES} of A-Z a-z 0-9 - _",
                    n + 1
                ));
            }
            let secret = hex_decode(secret)
                .ok_or_else(|| format!("line {}: the secret is not hex", n + 1))?;
            if secret.len() < MIN_KEY_BYTES {
                return Err(format!(
                    "line {}: the secret has {} bytes; at least {MIN_KEY_BYTES}",
                    n + 1,
                    secret.len()
                ));
            }
            if keys.iter().any(|(k, _)| k == id) {
                return Err(format!("line {}: key id '{id}' twice", n + 1));
            }
            if keys.len() == MAX_KEYS {
                return Err(format!("more than {MAX_KEYS} keys"));
            }
            keys.push((id.to_string(), hmac::Key::new(hmac::HMAC_SHA256, &secret)));
        }
        if keys.is_empty() {
            return Err("no keys".into());
        }
        Ok(KeyRing { keys })
    }

    /// The key named `id`.
    pub fn get(&self, id: &str) -> Option<&hmac::Key> {
        self.keys.iter().find(|(k, _)| k == id).map(|(_, key)| key)
    }
}

fn hex_decode(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_files_are_checked_line_by_line() {
        let k = KeyRing::parse(&format!(
            "a {}\n\n# old\nb-2 {} # comment\n",
            "ab".repeat(32),
            "cd".repeat(40)
        ))
        .unwrap();
        assert!(k.get("a").is_some() && k.get("b-2").is_some() && k.get("c").is_none());
        assert!(
            !format!("{k:?}").contains("abab"),
            "Debug never shows a secret"
        );
        for (bad, why) in [
            ("", "no keys"),
            ("a\n", "wants"),
            (&format!("a {}", "ab".repeat(31)) as &str, "at least 32"),
            (&format!("a {}", "zz".repeat(32)), "not hex"),
            (&format!("a/b {}", "ab".repeat(32)), "key id"),
            (&format!("a {0}\na {0}", "ab".repeat(32)), "twice"),
        ] {
            let e = KeyRing::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }
}
