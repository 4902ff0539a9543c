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
        let header = self
            .host_header
            .clone()
            .map_or_else(|| self.url_host(), Ok)?;
        if header.is_empty() || header.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err(format!("host_header '{header}' is not a host"));
        }
        Ok(())
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
