//! `[[origin]]`: which requests are filled from which origin, and the cache's own settings.
//! A request matches the origin whose `prefix` covers its canonical path (longest first),
//! among those whose `host` (if set) equals its Host; a request matching none is served
//! from the local root, so pre-positioned and pulled content live on the same edge.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;

use crate::origin::fetch::Timeouts;

use crate::config::origin::split_authority_bytes;
pub use crate::config::origin::{
    OriginConfig, MAX_CA_FILE_BYTES, MAX_KEY_QUERY_PARAMS, MAX_ORIGINS, MAX_ORIGIN_FETCHES,
    MAX_ORIGIN_HOSTS, MIN_ORIGIN_BYTES_PER_S, SYSTEM_CA_FILES,
};
impl OriginConfig {
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
            cache_policy: Default::default(),
            ttl_s: None,
            never_cache: Vec::new(),
            stale_if_error_s: crate::config::origin::DEFAULT_STALE_IF_ERROR_S,
            purge_tag_header: "Surrogate-Key".into(),
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
