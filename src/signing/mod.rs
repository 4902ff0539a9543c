//! Signed URLs: per path prefix, a request must carry an expiry, a key id and an
//! HMAC-SHA256 signature over the path, the expiry and the key id, made with one of the
//! publisher's keys (a key file with several keys named by id, so keys rotate).
//!
//! The signed message is `PATH "\n" EXPIRES "\n" KEY_ID`, where PATH is the canonical path
//! the edge serves (`/` + the resolved relative path: percent-decoded once, `.`/`..`
//! applied), so `/free/../beta/x` is judged, and signed, as `/beta/x`. EXPIRES is Unix
//! seconds in decimal, exactly as in the URL. The signature is base64url without padding.
//! `shardline sign` makes such URLs. Query parameters never choose the file: the path does.

pub mod keys;

use std::path::PathBuf;

use aws_lc_rs::{constant_time, hmac};
use base64::Engine as _;

use crate::fs::resolve::ResolvedRef;
use crate::http::request::query_param;

pub use crate::config::rules::{RuleConfig, MAX_SIGNED_URL_RULES};
pub use keys::KeyRing;

/// Longest query string looked at for the signing parameters.
pub const MAX_QUERY_BYTES: usize = 4096;

/// Why a request to a signed prefix was refused (403); the metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A signing parameter is missing (or repeated).
    Missing,
    /// The key id is not in the key file.
    UnknownKey,
    /// The signature does not match (or the expiry is not a number).
    BadSignature,
    /// The signature matches, and the expiry has passed.
    Expired,
}

impl Refusal {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Missing => "missing",
            Refusal::UnknownKey => "unknown_key",
            Refusal::BadSignature => "bad_signature",
            Refusal::Expired => "expired",
        }
    }
}

/// The rules in force, with their keys loaded (`rings[i]` holds `rules[i]`'s keys).
#[derive(Debug, Default)]
pub struct Signing {
    rules: Vec<RuleConfig>,
    rings: Vec<KeyRing>,
}

/// The rule covering `path` and its index: the longest covering prefix (a more specific
/// rule wins).
pub fn covering_rule<'a>(
    rules: &'a [RuleConfig],
    path: &ResolvedRef<'_>,
) -> Option<(usize, &'a RuleConfig)> {
    rules
        .iter()
        .enumerate()
        .filter(|(_, r)| path.is_under(&r.prefix))
        .max_by_key(|(_, r)| r.prefix.len())
}

/// The MAC of `PATH "\n" EXPIRES "\n" KEY_ID` for the canonical path of `path`, fed in
/// pieces (no buffer).
fn mac(key: &hmac::Key, path: &ResolvedRef<'_>, expires: &[u8], key_id: &[u8]) -> hmac::Tag {
    let mut ctx = hmac::Context::with_key(key);
    ctx.update(b"/");
    ctx.update(path.rel_path.as_bytes());
    if path.wants_dir && !path.rel_path.is_empty() {
        ctx.update(b"/");
    }
    for piece in [&b"\n"[..], expires, b"\n", key_id] {
        ctx.update(piece);
    }
    ctx.sign()
}

/// A key file that could not be used: which, and why.
#[derive(Debug)]
pub struct LoadError {
    /// The file.
    pub file: PathBuf,
    /// What is wrong with it.
    pub message: String,
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.file.display(), self.message)
    }
}

impl Signing {
    /// Reads every rule's key file.
    pub fn load(rules: &[RuleConfig]) -> Result<Signing, LoadError> {
        let rings = rules
            .iter()
            .map(|r| {
                KeyRing::load(&r.key_file).map_err(|message| LoadError {
                    file: r.key_file.clone(),
                    message,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Signing {
            rules: rules.to_vec(),
            rings,
        })
    }

    /// Whether any prefix is signed (if not, requests skip the check entirely).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Judges a request for resolved path `path` with query `query` at Unix time `now_s`:
    /// Ok when no rule covers the path or its signature is good.
    pub fn check(
        &self,
        path: &ResolvedRef<'_>,
        query: Option<&[u8]>,
        now_s: u64,
    ) -> Result<(), Refusal> {
        let Some((i, rule)) = covering_rule(&self.rules, path) else {
            return Ok(());
        };
        let ring = &self.rings[i];
        let query = query.unwrap_or_default();
        let query = &query[..query.len().min(MAX_QUERY_BYTES)];
        let (Some(expires), Some(key_id), Some(sig)) = (
            query_param(query, &rule.expires_param),
            query_param(query, &rule.key_id_param),
            query_param(query, &rule.signature_param),
        ) else {
            return Err(Refusal::Missing);
        };
        let key_id = std::str::from_utf8(key_id).map_err(|_| Refusal::UnknownKey)?;
        let key = ring.get(key_id).ok_or(Refusal::UnknownKey)?;
        let sig = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(sig)
            .map_err(|_| Refusal::BadSignature)?;
        let expires_s = std::str::from_utf8(expires)
            .ok()
            .filter(|e| !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|e| e.parse::<u64>().ok())
            .ok_or(Refusal::BadSignature)?;
        let tag = mac(key, path, expires, key_id.as_bytes());
        // Constant time.
        constant_time::verify_slices_are_equal(tag.as_ref(), &sig)
            .map_err(|_| Refusal::BadSignature)?;
        if now_s > expires_s {
            return Err(Refusal::Expired);
        }
        Ok(())
    }
}

/// The query string that signs `path` until `expires_s` with key `key_id`, under `rule`'s
/// parameter names.
pub fn sign_query(
    rule: &RuleConfig,
    path: &ResolvedRef<'_>,
    key_id: &str,
    key: &hmac::Key,
    expires_s: u64,
) -> String {
    let expires = expires_s.to_string();
    let tag = mac(key, path, expires.as_bytes(), key_id.as_bytes());
    format!(
        "{}={expires}&{}={key_id}&{}={}",
        rule.expires_param,
        rule.key_id_param,
        rule.signature_param,
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(tag.as_ref())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `raw` resolved, checked against `s`.
    fn check(s: &Signing, raw: &str, q: Option<&[u8]>, now: u64) -> Result<(), Refusal> {
        let r = crate::fs::resolve::resolve_target(raw.as_bytes()).unwrap();
        s.check(&path_of(&r), q, now)
    }

    fn path_of(r: &crate::fs::resolve::Resolved) -> ResolvedRef<'_> {
        ResolvedRef {
            rel_path: &r.rel_path,
            wants_dir: r.wants_dir,
        }
    }

    fn setup() -> (tempfile::TempDir, Signing, RuleConfig) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("keys");
        std::fs::write(
            &file,
            format!(
                "# publisher keys\nk1 {}\nk2 {}\n",
                "11".repeat(32),
                "22".repeat(32)
            ),
        )
        .unwrap();
        let rule = RuleConfig {
            prefix: "/beta/".into(),
            key_file: file,
            expires_param: crate::config::rules::default_expires_param(),
            key_id_param: crate::config::rules::default_key_id_param(),
            signature_param: crate::config::rules::default_signature_param(),
        };
        let s = Signing::load(std::slice::from_ref(&rule)).unwrap();
        (dir, s, rule)
    }

    #[test]
    fn a_signed_url_passes_until_it_expires_and_any_change_breaks_it() {
        let (_d, s, rule) = setup();
        let key = s.rings[0].get("k2").unwrap();
        let game = crate::fs::resolve::resolve_target(b"/beta/game.pak").unwrap();
        let q = sign_query(&rule, &path_of(&game), "k2", key, 1000);
        assert_eq!(check(&s, "/beta/game.pak", Some(q.as_bytes()), 999), Ok(()));
        assert_eq!(
            check(&s, "/beta/game.pak", Some(q.as_bytes()), 1000),
            Ok(())
        );
        assert_eq!(
            check(&s, "/beta/game.pak", Some(q.as_bytes()), 1001),
            Err(Refusal::Expired)
        );
        // Another path, a later expiry, another key id: the signature no longer matches.
        assert_eq!(
            check(&s, "/beta/other.pak", Some(q.as_bytes()), 999),
            Err(Refusal::BadSignature)
        );
        let later = q.replace("expires=1000", "expires=9000");
        assert_eq!(
            check(&s, "/beta/game.pak", Some(later.as_bytes()), 999),
            Err(Refusal::BadSignature)
        );
        let other_kid = q.replace("key_id=k2", "key_id=k1");
        assert_eq!(
            check(&s, "/beta/game.pak", Some(other_kid.as_bytes()), 999),
            Err(Refusal::BadSignature)
        );
        let unknown = q.replace("key_id=k2", "key_id=k9");
        assert_eq!(
            check(&s, "/beta/game.pak", Some(unknown.as_bytes()), 999),
            Err(Refusal::UnknownKey)
        );
        // Extra parameters are fine; missing or repeated ones are not.
        let extra = format!("x=1&{q}&y=2");
        assert_eq!(
            check(&s, "/beta/game.pak", Some(extra.as_bytes()), 999),
            Ok(())
        );
        assert_eq!(
            check(&s, "/beta/game.pak", None, 999),
            Err(Refusal::Missing)
        );
        let twice = format!("{q}&expires=1000");
        assert_eq!(
            check(&s, "/beta/game.pak", Some(twice.as_bytes()), 999),
            Err(Refusal::Missing)
        );
        // The canonical path decides: a detour into the prefix is judged as the prefix, and
        // the directory itself is covered.
        assert_eq!(
            check(&s, "/free/../beta/game.pak", Some(q.as_bytes()), 999),
            Ok(())
        );
        assert_eq!(check(&s, "/beta/", None, 999), Err(Refusal::Missing));
        assert_eq!(
            check(&s, "/beta//game.pak", None, 999),
            Err(Refusal::Missing)
        );
        // Outside the prefix nothing is asked.
        assert_eq!(check(&s, "/free/game.pak", None, 999), Ok(()));
        assert_eq!(
            check(&s, "/beta", None, 999),
            Ok(()),
            "the prefix is /beta/"
        );
    }

    #[test]
    fn bad_rules_are_refused() {
        let (_d, _s, rule) = setup();
        let mut r = rule.clone();
        r.prefix = "beta/".into();
        assert!(r.validate().is_err());
        let mut r = rule.clone();
        r.key_id_param = "expires".into();
        assert!(r.validate().is_err());
        let mut r = rule;
        r.signature_param = "a&b".into();
        assert!(r.validate().is_err());
    }
}
