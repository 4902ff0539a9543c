//! `[[origin]]`: one origin entry's settings and the checks of their shape. What they
//! resolve to (addresses, TLS roots) is `fill::route`'s.

use serde::Deserialize;

/// Most `[[origin]]` entries.
pub const MAX_ORIGINS: usize = 64;
/// Most fetches one origin may have at once (over all shards).
pub const MAX_ORIGIN_FETCHES: usize = 256;
/// The lowest origin bandwidth cap (`max_bytes_per_s`) accepted: below it one receive would
/// wait longer than an origin's idle timeout is likely to allow.
pub const MIN_ORIGIN_BYTES_PER_S: u64 = 1 << 20;

/// One `[[origin]]` entry.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OriginConfig {
    /// Canonical path prefix filled from this origin (starts with '/').
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// Only requests with this Host (case-insensitive, port ignored); None: any (unless
    /// `hosts` names some).
    #[serde(default)]
    pub host: Option<String>,
    /// More Host names this entry answers, sharing one key space with `host` (a chunk served
    /// under several CDN names is cached once).
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Query parameters that are part of the cache key, in this order; the default (none)
    /// keeps per-session tokens from splitting an object. The whole query still goes to the
    /// origin.
    #[serde(default)]
    pub key_query: Vec<String>,
    /// The origin: `http://host:port` (no path; the request path is sent as it came).
    pub url: String,
    /// The Host header sent to the origin (default: the url's host).
    #[serde(default)]
    pub host_header: Option<String>,
    /// Fetches at once from this origin over all shards (`origin::pool::FetchBudget`).
    #[serde(default = "default_max_fetches")]
    pub max_fetches: usize,
    /// Connect timeout.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// From the request sent to the head's end.
    #[serde(default = "default_first_byte_timeout_ms")]
    pub first_byte_timeout_ms: u64,
    /// Between two receives of a body.
    #[serde(default = "default_idle_timeout_ms")]
    pub idle_timeout_ms: u64,
    /// Most bytes per second received from this origin over all shards (0: no cap). Paced
    /// by not posting a fetch's next receive until its turn, so TCP slows the origin down.
    #[serde(default)]
    pub max_bytes_per_s: u64,
    /// An `https://` origin's trusted roots (PEM); default: the system's bundle
    /// (`SYSTEM_CA_FILES`).
    #[serde(default)]
    pub ca_file: Option<std::path::PathBuf>,
    /// Whose word decides what is stored and for how long: the origin's (RFC 9111, the
    /// default) or the operator's (`override`: every reply stored for `ttl_s`, as lancache
    /// does for origins that forbid caching; never a `private` one, nor one to Authorization).
    #[serde(default)]
    pub cache_policy: CachePolicy,
    /// The lifetime under `cache_policy = "override"` (default: `cache_revalidate_s`).
    #[serde(default)]
    pub ttl_s: Option<u64>,
    /// Request paths never stored (each client's own fetch): patterns on the path, `*`
    /// standing for any run of characters (`/pull/*/latest.json`).
    #[serde(default)]
    pub never_cache: Vec<String>,
    /// Seconds past its lifetime a cached version is still served when its origin cannot be
    /// reached or answers 5xx, where the origin gave no `stale-if-error` (RFC 5861);
    /// `must-revalidate` and `no-cache` versions never are.
    #[serde(default = "default_stale_if_error_s")]
    pub stale_if_error_s: u64,
    /// The reply field whose tags `POST /cache/purge?tag=` purges by: `Surrogate-Key`
    /// (space-separated; the default) or `Cache-Tag` (comma-separated). Never sent to clients.
    #[serde(default = "default_purge_tag_header")]
    pub purge_tag_header: String,
}

fn default_purge_tag_header() -> String {
    TagHeader::default().name().into()
}

/// Default `stale_if_error_s`: 30 days (a cached copy outlives an origin's outage).
pub const DEFAULT_STALE_IF_ERROR_S: u64 = 30 * 86_400;

fn default_stale_if_error_s() -> u64 {
    DEFAULT_STALE_IF_ERROR_S
}

/// `[[origin]] cache_policy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CachePolicy {
    /// The origin's Cache-Control, CDN-Cache-Control and Expires decide (RFC 9111).
    #[default]
    Origin,
    /// Every reply but a `private` one is stored for `ttl_s`, whatever the origin says.
    Override,
}

/// Which field of a reply names its tags (`[[origin]] purge_tag_header`). Only these two:
/// both are in the contract's unstored fields, so the field never reaches a client.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TagHeader {
    /// `Surrogate-Key`: tags separated by spaces.
    #[default]
    SurrogateKey,
    /// `Cache-Tag`: tags separated by commas.
    CacheTag,
}

impl TagHeader {
    /// The header named `name` (case-insensitive); None for any other field.
    pub fn from_name(name: &str) -> Option<TagHeader> {
        if name.eq_ignore_ascii_case("surrogate-key") {
            Some(TagHeader::SurrogateKey)
        } else if name.eq_ignore_ascii_case("cache-tag") {
            Some(TagHeader::CacheTag)
        } else {
            None
        }
    }

    /// The field's name.
    pub fn name(self) -> &'static str {
        match self {
            TagHeader::SurrogateKey => "Surrogate-Key",
            TagHeader::CacheTag => "Cache-Tag",
        }
    }
}

/// Most `never_cache` patterns one `[[origin]]` entry may list.
pub const MAX_NEVER_CACHE_PATTERNS: usize = 64;
/// Longest `never_cache` pattern.
pub const MAX_PATTERN_BYTES: usize = 256;
/// Longest `ttl_s` (ten years).
pub const MAX_TTL_S: u64 = 10 * 365 * 86_400;

/// Whether `path` matches `pattern`, where `*` stands for any run of bytes (none included).
/// Greedy with one backtrack point (the last star): at most pattern x path steps, whatever
/// the path a client sends.
pub fn path_matches(pattern: &[u8], path: &[u8]) -> bool {
    let (mut p, mut s) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while s < path.len() {
        if pattern.get(p) == Some(&b'*') {
            star = Some((p, s));
            p += 1;
        } else if pattern.get(p) == Some(&path[s]) {
            p += 1;
            s += 1;
        } else if let Some((sp, ss)) = star {
            // The last star takes one more byte.
            p = sp + 1;
            s = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&b| b == b'*')
}

/// Where the system's CA bundle is looked for (Debian's first).
pub const SYSTEM_CA_FILES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
];
/// Largest CA file read.
pub const MAX_CA_FILE_BYTES: u64 = 4 << 20;
/// Most Host aliases (`hosts`) one `[[origin]]` entry may list.
pub const MAX_ORIGIN_HOSTS: usize = 64;
/// Most query parameters (`key_query`) one `[[origin]]` entry may key on.
pub const MAX_KEY_QUERY_PARAMS: usize = 16;

fn default_prefix() -> String {
    "/".into()
}
fn default_max_fetches() -> usize {
    8
}
fn default_connect_timeout_ms() -> u64 {
    3_000
}
fn default_first_byte_timeout_ms() -> u64 {
    15_000
}
fn default_idle_timeout_ms() -> u64 {
    15_000
}

impl OriginConfig {
    /// `host:port` of the url, or why it is not one shardline can fill from.
    pub fn authority(&self) -> Result<&str, String> {
        let rest = self
            .url
            .strip_prefix("http://")
            .or_else(|| self.url.strip_prefix("https://"))
            .ok_or_else(|| {
                format!(
                    "origin url '{}' must start with http:// or https://",
                    self.url
                )
            })?;
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.is_empty() || authority.contains('/') || authority.contains('@') {
            return Err(format!(
                "origin url '{}' must be http[s]://host[:port] with no path",
                self.url
            ));
        }
        Ok(authority)
    }

    /// Whether the origin speaks TLS (`https://`).
    pub fn is_https(&self) -> bool {
        self.url.starts_with("https://")
    }

    /// The url's host (no port), the default Host header.
    pub fn url_host(&self) -> Result<String, String> {
        Ok(split_authority(self.authority()?).0.to_string())
    }

    /// Checks the entry's shape (not whether the origin resolves).
    pub fn validate(&self) -> Result<(), String> {
        if !self.prefix.starts_with('/') {
            return Err(format!("prefix '{}' must start with '/'", self.prefix));
        }
        self.authority()?;
        if self.ca_file.is_some() && !self.is_https() {
            return Err(format!(
                "origin {}: ca_file is for https:// origins",
                self.url
            ));
        }
        if !(1..=MAX_ORIGIN_FETCHES).contains(&self.max_fetches) {
            return Err(format!(
                "max_fetches must be 1..={MAX_ORIGIN_FETCHES}, not {}",
                self.max_fetches
            ));
        }
        for (name, v) in [
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("first_byte_timeout_ms", self.first_byte_timeout_ms),
            ("idle_timeout_ms", self.idle_timeout_ms),
        ] {
            if !(1..=3_600_000).contains(&v) {
                return Err(format!("{name} must be 1..=3600000 ms, not {v}"));
            }
        }
        if self.max_bytes_per_s != 0 && self.max_bytes_per_s < MIN_ORIGIN_BYTES_PER_S {
            return Err(format!(
                "max_bytes_per_s must be 0 (no cap) or at least {MIN_ORIGIN_BYTES_PER_S}, not {}",
                self.max_bytes_per_s
            ));
        }
        if self.hosts.len() > MAX_ORIGIN_HOSTS {
            return Err(format!("hosts may list at most {MAX_ORIGIN_HOSTS} names"));
        }
        for h in self.host.iter().chain(&self.hosts) {
            if h.is_empty() || h.bytes().any(|b| b <= b' ' || b == 0x7f || b == b'/') {
                return Err(format!("host '{h}' is not a host name"));
            }
        }
        if self.key_query.len() > MAX_KEY_QUERY_PARAMS {
            return Err(format!(
                "key_query may list at most {MAX_KEY_QUERY_PARAMS} parameters"
            ));
        }
        for k in &self.key_query {
            if k.is_empty()
                || k.bytes()
                    .any(|b| matches!(b, b'&' | b'=' | b'#') || b <= b' ')
            {
                return Err(format!("key_query '{k}' is not a query parameter name"));
            }
        }
        if self.ttl_s.is_some() && self.cache_policy != CachePolicy::Override {
            return Err("ttl_s is for cache_policy = \"override\"".into());
        }
        if self.ttl_s.is_some_and(|t| t > MAX_TTL_S) {
            return Err(format!("ttl_s must be at most {MAX_TTL_S}"));
        }
        if self.stale_if_error_s > MAX_TTL_S {
            return Err(format!("stale_if_error_s must be at most {MAX_TTL_S}"));
        }
        if self.never_cache.len() > MAX_NEVER_CACHE_PATTERNS {
            return Err(format!(
                "never_cache may list at most {MAX_NEVER_CACHE_PATTERNS} patterns"
            ));
        }
        for p in &self.never_cache {
            if !p.starts_with('/') || p.len() > MAX_PATTERN_BYTES {
                return Err(format!(
                    "never_cache '{p}' must start with '/' and be at most {MAX_PATTERN_BYTES} bytes"
                ));
            }
        }
        if TagHeader::from_name(&self.purge_tag_header).is_none() {
            return Err(format!(
                "purge_tag_header must be Surrogate-Key or Cache-Tag, not '{}'",
                self.purge_tag_header
            ));
        }
        let header = self
            .host_header
            .clone()
            .map_or_else(|| self.url_host(), Ok)?;
        if header.is_empty() || header.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err(format!("host_header '{header}' is not a host"));
        }
        Ok(())
    }

    /// `purge_tag_header` as the fill reads it (the default when it is not one: `validate`
    /// refuses that config first).
    pub fn tag_header(&self) -> TagHeader {
        TagHeader::from_name(&self.purge_tag_header).unwrap_or_default()
    }

    /// The url's host (without brackets) and port (80 when none), as the resolver looks it up.
    pub fn name_and_port(&self) -> Result<(String, u16), String> {
        let (host, port) = split_authority(self.authority()?);
        let default = if self.is_https() { 443 } else { 80 };
        Ok((host.to_string(), port.unwrap_or(default)))
    }
}

/// `host[:port]` or `[v6][:port]` -> (host, port).
pub(crate) fn split_authority(a: &str) -> (&str, Option<u16>) {
    let (h, p) = split_authority_bytes(a.as_bytes());
    // `h` is a sub-slice of `a` on character boundaries ('[', ']' and ':' are ASCII).
    let start = h.as_ptr() as usize - a.as_ptr() as usize;
    (&a[start..start + h.len()], p)
}

pub fn split_authority_bytes(a: &[u8]) -> (&[u8], Option<u16>) {
    if let Some(rest) = a.strip_prefix(b"[") {
        let Some(end) = rest.iter().position(|&b| b == b']') else {
            return (a, None);
        };
        let port = rest[end + 1..]
            .strip_prefix(b":")
            .and_then(|p| std::str::from_utf8(p).ok()?.parse().ok());
        return (&rest[..end], port);
    }
    match a.iter().rposition(|&b| b == b':') {
        Some(i) if !a[..i].contains(&b':') => {
            let port = std::str::from_utf8(&a[i + 1..])
                .ok()
                .and_then(|p| p.parse().ok());
            (&a[..i], port)
        }
        _ => (a, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_cache_patterns_match_with_stars() {
        let m = |p: &str, s: &str| path_matches(p.as_bytes(), s.as_bytes());
        assert!(m("/pull/latest.json", "/pull/latest.json"));
        assert!(!m("/pull/latest.json", "/pull/latest.json2"));
        assert!(m("/pull/*/latest.json", "/pull/game/v2/latest.json"));
        assert!(m("/pull/*", "/pull/"));
        assert!(m("*.manifest", "/a/b.manifest"));
        assert!(!m("*.manifest", "/a/b.manifest.bak"));
        assert!(m("/a*b*c", "/aXbYbZc"));
        assert!(!m("/a*b*c", "/aXbYbZ"));
        // A hostile path against many stars stays linear-ish (this returns at once).
        let long = "/".to_string() + &"a".repeat(4000);
        assert!(!m("/*a*a*a*a*a*a*b", &long));
    }
}
