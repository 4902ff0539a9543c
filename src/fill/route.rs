//! `[[origin]]`: which requests are filled from which origin, and the cache's own settings.
//! A request matches the origin whose `prefix` covers its canonical path (longest first),
//! among those whose `host` (if set) equals its Host; a request matching none is served
//! from the local root, so pre-positioned and pulled content live on the same edge.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;

use serde::Deserialize;

use crate::origin::fetch::Timeouts;

/// Most `[[origin]]` entries (a limit the config checks, so it lives there).
pub use crate::config::MAX_ORIGINS;
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

    /// TLS to an `https://` origin: its roots (`ca_file`, else the system's bundle), TLS 1.3
    /// and 1.2, ALPN `http/1.1`, and the url's host as the name its certificate must carry.
    /// None for `http://`.
    pub fn tls_target(&self) -> Result<Option<super::OriginTlsTarget>, String> {
        if !self.is_https() {
            return Ok(None);
        }
        use rustls::pki_types::pem::PemObject;
        let path = match &self.ca_file {
            Some(p) => p.clone(),
            None => SYSTEM_CA_FILES
                .iter()
                .map(std::path::PathBuf::from)
                .find(|p| p.is_file())
                .ok_or_else(|| {
                    format!(
                        "origin {}: no system CA bundle ({}): set ca_file",
                        self.url,
                        SYSTEM_CA_FILES.join(", ")
                    )
                })?,
        };
        let ca = |e: String| format!("origin {} ca_file {}: {e}", self.url, path.display());
        let len = std::fs::metadata(&path)
            .map_err(|e| ca(e.to_string()))?
            .len();
        if len > MAX_CA_FILE_BYTES {
            return Err(ca(format!("larger than {MAX_CA_FILE_BYTES} bytes")));
        }
        let pem = std::fs::read(&path).map_err(|e| ca(e.to_string()))?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|e| ca(e.to_string()))?;
            roots.add(cert).map_err(|e| ca(e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(ca("no certificate in it".into()));
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let (host, _) = self.name_and_port()?;
        let name = rustls::pki_types::ServerName::try_from(host)
            .map_err(|e| format!("origin {}: {e}", self.url))?;
        Ok(Some(super::OriginTlsTarget {
            config: Arc::new(config),
            name,
        }))
    }

    /// The url's host (no port), the default Host header.
    fn url_host(&self) -> Result<String, String> {
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

    /// Resolves the origin (at start-up, on the main thread) into what a shard's filler uses.
    pub fn target(&self) -> Result<super::OriginTarget, String> {
        let (host, port) = self.name_and_port()?;
        let with_port = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let addr: SocketAddr = with_port
            .to_socket_addrs()
            .map_err(|e| format!("origin {}: {e}", self.url))?
            .next()
            .ok_or_else(|| format!("origin {}: no address", self.url))?;
        Ok(super::OriginTarget {
            addr,
            resolved: None,
            tls: self.tls_target()?,
            host: self
                .host_header
                .clone()
                .map_or_else(|| self.url_host(), Ok)?,
            max_fetches: self.max_fetches,
            budget: None,
            bandwidth: None,
            max_idle: self.max_fetches,
            timeouts: Timeouts {
                connect_ms: self.connect_timeout_ms,
                first_byte_ms: self.first_byte_timeout_ms,
                idle_ms: self.idle_timeout_ms,
            },
        })
    }
}

/// `host[:port]` or `[v6][:port]` -> (host, port).
fn split_authority(a: &str) -> (&str, Option<u16>) {
    let (h, p) = split_authority_bytes(a.as_bytes());
    // `h` is a sub-slice of `a` on character boundaries ('[', ']' and ':' are ASCII).
    let start = h.as_ptr() as usize - a.as_ptr() as usize;
    (&a[start..start + h.len()], p)
}

fn split_authority_bytes(a: &[u8]) -> (&[u8], Option<u16>) {
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

/// The origin `path` (resolved) and `host` (the request's Host, if any) are filled from:
/// the longest covering prefix among entries whose host matches. A Host that is a bare IP
/// address (v4 or v6, with or without a port: Delivery Optimization's URLs) is routed like a
/// request without one, by prefix among the entries that name no host.
pub fn origin_for(
    origins: &[OriginConfig],
    path: &crate::fs::resolve::ResolvedRef<'_>,
    host: Option<&[u8]>,
) -> Option<usize> {
    let host = host
        .map(|h| split_authority_bytes(h).0)
        .filter(|h| !is_ip_literal(h));
    origins
        .iter()
        .enumerate()
        .filter(|(_, o)| path.is_under(&o.prefix))
        .filter(|(_, o)| {
            let mut names = o.host.iter().chain(&o.hosts).peekable();
            if names.peek().is_none() {
                return true;
            }
            host.is_some_and(|got| names.any(|want| want.as_bytes().eq_ignore_ascii_case(got)))
        })
        .max_by_key(|(_, o)| o.prefix.len())
        .map(|(i, _)| i)
}

/// Whether a Host (port already split off, brackets removed) is an IPv4 or IPv6 address.
fn is_ip_literal(host: &[u8]) -> bool {
    std::str::from_utf8(host).is_ok_and(|h| h.parse::<std::net::IpAddr>().is_ok())
}

/// The cache key of `rel` (a resolved path under origin entry `origin`): the entry's number,
/// the path, then each `key_query` parameter the request's query has (`\0name=value`; a
/// resolved path holds no NUL), so two requests differing only in other parameters (tokens)
/// share an object.
pub fn cache_key(origin: usize, rel: &str, query: Option<&[u8]>, key_query: &[String]) -> Vec<u8> {
    let mut key = Vec::with_capacity(rel.len() + 4);
    key.extend_from_slice(&(origin as u16).to_be_bytes());
    key.extend_from_slice(rel.as_bytes());
    for name in key_query {
        if let Some(v) = query.and_then(|q| crate::http::request::query_param(q, name)) {
            key.push(0);
            key.extend_from_slice(name.as_bytes());
            key.push(b'=');
            key.extend_from_slice(v);
        }
    }
    key
}

/// The request target sent to the origin: the resolved path, and the client's whole query
/// (tokens the origin may ask for) when it is plain ASCII.
pub fn origin_path(rel: &str, query: Option<&[u8]>) -> String {
    match query.and_then(|q| std::str::from_utf8(q).ok()) {
        Some(q) if !q.is_empty() && q.bytes().all(|b| b.is_ascii_graphic()) => {
            format!("/{rel}?{q}")
        }
        _ => format!("/{rel}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(prefix: &str, host: Option<&str>, url: &str) -> OriginConfig {
        OriginConfig {
            prefix: prefix.into(),
            host: host.map(Into::into),
            hosts: Vec::new(),
            key_query: Vec::new(),
            url: url.into(),
            host_header: None,
            max_fetches: 8,
            connect_timeout_ms: 1000,
            first_byte_timeout_ms: 1000,
            idle_timeout_ms: 1000,
            max_bytes_per_s: 0,
            ca_file: None,
        }
    }

    #[test]
    fn urls_are_checked() {
        assert!(origin("/", None, "http://10.0.0.1:8080").validate().is_ok());
        assert!(origin("/", None, "http://cdn.example").validate().is_ok());
        assert!(origin("/", None, "http://[::1]:81/").validate().is_ok());
        assert!(origin("/", None, "https://cdn.example").validate().is_ok());
        let mut o = origin("/", None, "http://a");
        o.ca_file = Some("/x.pem".into());
        assert!(o.validate().is_err(), "ca_file on http://");
        for bad in ["ftp://a", "http://", "http://a/b", "http://u@a"] {
            assert!(origin("/", None, bad).validate().is_err(), "{bad}");
        }
        assert!(origin("x", None, "http://a").validate().is_err());
        let mut o = origin("/", None, "http://a");
        o.max_fetches = 0;
        assert!(o.validate().is_err());
        let mut o = origin("/", None, "http://a");
        o.max_bytes_per_s = MIN_ORIGIN_BYTES_PER_S - 1;
        assert!(o.validate().is_err(), "a cap under the floor");
        o.max_bytes_per_s = MIN_ORIGIN_BYTES_PER_S;
        assert!(o.validate().is_ok());
    }

    #[test]
    fn targets_resolve_with_the_default_port_and_host_header() {
        let t = origin("/", None, "http://127.0.0.1").target().unwrap();
        assert_eq!(t.addr, "127.0.0.1:80".parse().unwrap());
        assert_eq!(t.host, "127.0.0.1");
        let t = origin("/", None, "http://[::1]:8081").target().unwrap();
        assert_eq!(t.addr, "[::1]:8081".parse().unwrap());
        assert_eq!(t.host, "::1");
        let mut o = origin("/", None, "http://127.0.0.1:9");
        o.host_header = Some("cdn.example".into());
        assert_eq!(o.target().unwrap().host, "cdn.example");
    }

    #[test]
    fn the_longest_prefix_with_a_matching_host_wins() {
        let rules = vec![
            origin("/", None, "http://a"),
            origin("/games/", None, "http://b"),
            origin("/games/", Some("beta.example"), "http://c"),
        ];
        let mut scratch = crate::fs::resolve::ResolveScratch::with_capacity(64);
        let mut pick = |path: &[u8], host: Option<&[u8]>| {
            let p = crate::fs::resolve::resolve_into(path, &mut scratch).unwrap();
            origin_for(&rules, &p, host)
        };
        assert_eq!(pick(b"/x", None), Some(0));
        assert_eq!(pick(b"/games/g.pak", Some(b"cdn.example")), Some(1));
        assert_eq!(pick(b"/games/g.pak", Some(b"BETA.example:443")), Some(2));
        assert_eq!(pick(b"/games/g.pak", None), Some(1));
        let only_host = vec![origin("/", Some("a.example"), "http://a")];
        let p = crate::fs::resolve::resolve_into(b"/x", &mut scratch).unwrap();
        assert_eq!(origin_for(&only_host, &p, Some(b"b.example")), None);
    }

    #[test]
    fn host_aliases_share_an_entry_and_bare_ip_hosts_route_by_prefix() {
        let mut steam = origin("/depot/", Some("cache1.steamcontent.example"), "http://s");
        steam.hosts = vec![
            "cache2.steamcontent.example".into(),
            "lancache.example".into(),
        ];
        let rules = vec![origin("/", None, "http://any"), steam];
        let mut scratch = crate::fs::resolve::ResolveScratch::with_capacity(64);
        let mut pick = |host: Option<&[u8]>| {
            let p = crate::fs::resolve::resolve_into(b"/depot/1/chunk/ab", &mut scratch).unwrap();
            origin_for(&rules, &p, host)
        };
        assert_eq!(pick(Some(b"cache1.steamcontent.example")), Some(1));
        assert_eq!(pick(Some(b"CACHE2.steamcontent.example:80")), Some(1));
        assert_eq!(pick(Some(b"lancache.example")), Some(1));
        assert_eq!(pick(Some(b"other.example")), Some(0));
        // Bare addresses, with or without a port: like no Host at all.
        for ip in [
            &b"10.1.2.3"[..],
            b"10.1.2.3:8080",
            b"[2001:db8::1]",
            b"[2001:db8::1]:80",
        ] {
            assert_eq!(
                pick(Some(ip)),
                pick(None),
                "{}",
                String::from_utf8_lossy(ip)
            );
        }
        assert_eq!(pick(None), Some(0));
        let mut o = origin("/", None, "http://x");
        o.hosts = vec!["bad host".into()];
        assert!(o.validate().is_err());
        o.hosts = vec!["ok.example".into()];
        o.key_query = vec!["a=b".into()];
        assert!(o.validate().is_err());
        o.key_query = vec!["v".into()];
        assert!(o.validate().is_ok());
    }

    #[test]
    fn keys_hold_only_the_named_query_parameters_and_the_origin_gets_the_whole_query() {
        let none: &[String] = &[];
        let key = |q: &str, kq: &[String]| cache_key(3, "depot/1/chunk/ab", Some(q.as_bytes()), kq);
        // Tokens never split an object.
        assert_eq!(key("l=1&e=2&sid=9&h=x", none), key("sid=7", none));
        assert_eq!(
            key("sid=7", none),
            cache_key(3, "depot/1/chunk/ab", None, none)
        );
        assert_eq!(&key("", none)[..2], &[0, 3], "the entry's number first");
        // A named parameter does, in the configured order, whatever the query's order.
        let kq = vec!["v".to_string(), "lang".to_string()];
        assert_eq!(key("v=2&sid=1&lang=en", &kq), key("lang=en&v=2&sid=5", &kq));
        assert_ne!(key("v=2", &kq), key("v=3", &kq));
        assert_ne!(key("v=2", &kq), key("", &kq));
        assert!(key("v=2", &kq).ends_with(b"ab\0v=2"));
        assert_eq!(
            origin_path("a/b.bin", Some(b"sid=1&h=x")),
            "/a/b.bin?sid=1&h=x"
        );
        assert_eq!(origin_path("a/b.bin", Some(b"")), "/a/b.bin");
        assert_eq!(origin_path("a/b.bin", None), "/a/b.bin");
        assert_eq!(
            origin_path("a/b.bin", Some(b"x=\xff")),
            "/a/b.bin",
            "not ASCII: dropped"
        );
    }
}
