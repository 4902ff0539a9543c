//! HTTPS checks: AES instructions (the record layer's cost per byte), whether the kernel
//! offers kTLS (the `tls` ULP: a seam for later, not used yet), and for every configured
//! certificate that it loads, matches its key and is not about to expire; the ticket key file.

use super::host::Tree;
use super::{Check, Status};
use crate::config::Config;

/// Days before expiry from which a certificate is a warning.
pub const CERT_WARN_DAYS: i64 = 30;
/// Days before expiry from which a certificate is a failure (renewal has not happened).
pub const CERT_FAIL_DAYS: i64 = 7;

/// The CPU's AES support, from `/proc/cpuinfo` flags.
pub fn cpu_aes(tree: &Tree) -> Check {
    let info = tree.read("proc/cpuinfo").unwrap_or_default();
    let flags: Vec<&str> = info
        .lines()
        .find(|l| l.starts_with("flags") || l.starts_with("Features"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, f)| f.split_whitespace().collect())
        .unwrap_or_default();
    let has = |f: &str| flags.contains(&f);
    let aesni = (has("aes") && has("pclmulqdq")) || (has("aes") && has("pmull"));
    let vaes = has("vaes") && has("vpclmulqdq");
    let (status, current) = match (aesni, vaes) {
        (true, true) => (Status::Ok, "AES-NI + VAES/VPCLMULQDQ (wide AES-GCM)"),
        (true, false) => (Status::Ok, "AES-NI + PCLMULQDQ"),
        (false, _) if flags.is_empty() => (Status::Warn, "unknown (no flags in /proc/cpuinfo)"),
        (false, _) => (Status::Warn, "no AES instructions"),
    };
    Check::new(
        "tls.cpu_aes",
        status,
        current,
        "AES-NI and PCLMULQDQ (VAES for the widest AES-GCM)",
        "every HTTPS byte is sealed with AES-GCM on the shard thread: ~12 GB/s per core with \
         AES-NI, a fraction of that without",
    )
}

/// Whether the kernel has the `tls` ULP (kTLS).
pub fn ktls(tree: &Tree) -> Check {
    let ulps = tree
        .read("proc/sys/net/ipv4/tcp_available_ulp")
        .unwrap_or_default();
    let has = ulps.split_whitespace().any(|u| u == "tls");
    let current = if has {
        "tls ULP available".to_string()
    } else if ulps.trim().is_empty() {
        "tcp_available_ulp unreadable".to_string()
    } else {
        format!("no tls ULP (available: {})", ulps.trim())
    };
    Check::new(
        "tls.ktls",
        Status::Ok,
        current,
        "informational: records are sealed in user space (one pass, into arena slots)",
        "kTLS would move sealing into the kernel (and a capable NIC); shardline does not use \
         it yet (docs/HTTPS.md)",
    )
}

/// One row per configured certificate (loads, matches its key, days to expiry) and one for
/// the ticket key file; `now_unix` is the time compared with.
pub fn certificates(cfg: &Config, now_unix: i64) -> Vec<Check> {
    let mut out = Vec::new();
    if cfg.tls_listen.is_none() {
        return out;
    }
    let provider = crate::tls::provider();
    for spec in &cfg.tls_certificate {
        let name = format!("tls.cert.{}", spec.cert.display());
        let check = match crate::tls::certs::load(spec, &provider) {
            Err(e) => Check::new(
                name,
                Status::Fail,
                e.to_string(),
                "a PEM chain and its private key",
                "the TLS listener refuses to start (or a reload keeps the old one) with it",
            ),
            Ok(c) => {
                let names = c.names.join(",");
                match c.not_after_unix {
                    None => Check::new(
                        name,
                        Status::Warn,
                        format!("key matches; names {names}; expiry unreadable"),
                        "a readable notAfter",
                        "an expired certificate fails every handshake",
                    ),
                    Some(end) => {
                        let days = (end - now_unix).div_euclid(86_400);
                        let status = if days < CERT_FAIL_DAYS {
                            Status::Fail
                        } else if days < CERT_WARN_DAYS {
                            Status::Warn
                        } else {
                            Status::Ok
                        };
                        let when = if days < 0 {
                            format!("EXPIRED {} days ago", -days)
                        } else {
                            format!("{days} days to expiry")
                        };
                        Check::new(
                            name,
                            status,
                            format!("key matches; names {names}; {when}"),
                            format!("more than {CERT_WARN_DAYS} days to expiry"),
                            "renew, replace the files and send SIGHUP; an expired certificate \
                             fails every handshake",
                        )
                    }
                }
            }
        };
        out.push(check);
    }
    let tickets = match &cfg.tls_ticket_key_file {
        None => Check::new(
            "tls.ticket_keys",
            Status::Warn,
            "random keys per process (no tls_ticket_key_file)",
            "a key file shared by every edge behind the balancer",
            "a client resumes its session only on the edge that issued its ticket",
        ),
        Some(path) => {
            match crate::tls::tickets::FileTicketer::load(path, cfg.tls_ticket_lifetime_s) {
                Ok(_) => {
                    let keys = std::fs::metadata(path).map_or(0, |m| m.len() as usize)
                        / crate::tls::tickets::TICKET_KEY_BYTES;
                    Check::new(
                        "tls.ticket_keys",
                        Status::Ok,
                        format!("{}: {keys} key(s)", path.display()),
                        "current and previous key, the same file on every edge",
                        "tickets from any edge resume on this one",
                    )
                }
                Err(e) => Check::new(
                    "tls.ticket_keys",
                    Status::Fail,
                    e.to_string(),
                    "48 or 96 bytes (shardline tls new-ticket-key FILE)",
                    "the TLS listener refuses to start (or a reload keeps the old keys)",
                ),
            }
        }
    };
    out.push(tickets);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::testing::{self, KeyKind};

    fn tree_with(cpuinfo: &str, ulp: &str) -> (tempfile::TempDir, Tree) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("proc/sys/net/ipv4")).unwrap();
        std::fs::write(dir.path().join("proc/cpuinfo"), cpuinfo).unwrap();
        std::fs::write(dir.path().join("proc/sys/net/ipv4/tcp_available_ulp"), ulp).unwrap();
        let tree = Tree::new(dir.path());
        (dir, tree)
    }

    #[test]
    fn aes_and_ktls_are_read_from_the_tree() {
        let (_d, t) = tree_with(
            "processor\t: 0\nflags\t\t: fpu aes pclmulqdq vaes vpclmulqdq\n",
            "mptcp\n",
        );
        let c = cpu_aes(&t);
        assert_eq!(c.status, Status::Ok);
        assert!(c.current.contains("VAES"), "{}", c.current);
        let k = ktls(&t);
        assert!(
            k.current.contains("no tls ULP (available: mptcp)"),
            "{}",
            k.current
        );
        let (_d, t) = tree_with("flags\t\t: fpu sse2\n", "mptcp tls\n");
        assert_eq!(cpu_aes(&t).status, Status::Warn);
        assert_eq!(ktls(&t).current, "tls ULP available");
    }

    #[test]
    fn certificates_are_graded_by_key_match_and_expiry() {
        let dir = tempfile::tempdir().unwrap();
        let good = testing::write_cert(dir.path(), "good", KeyKind::EcdsaP256, &["a.test"]);
        let other = testing::write_cert(dir.path(), "other", KeyKind::EcdsaP256, &["b.test"]);
        let mismatched = crate::config::TlsCertificate {
            key: other.key.clone(),
            ..good.clone()
        };
        let keys = dir.path().join("tickets");
        let two: Vec<u8> = (0..96u8).collect();
        std::fs::write(&keys, two).unwrap();
        let cfg = Config {
            tls_listen: Some("127.0.0.1:0".parse().unwrap()),
            tls_certificate: vec![good.clone(), mismatched],
            tls_ticket_key_file: Some(keys),
            ..Config::default()
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let checks = certificates(&cfg, now);
        assert_eq!(checks.len(), 3);
        assert_eq!(checks[0].status, Status::Ok, "{checks:?}");
        let days: i64 = checks[0]
            .current
            .split("; ")
            .last()
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!((363..=365).contains(&days), "{}", checks[0].current);
        assert_eq!(checks[1].status, Status::Fail);
        assert!(
            checks[1].current.contains("does not match"),
            "{}",
            checks[1].current
        );
        assert_eq!(checks[2].status, Status::Ok);
        assert!(checks[2].current.contains("2 key(s)"));
        // The same certificate 340 days later: a warning; 360: a failure; 400: expired.
        let later = |days: i64| {
            certificates(
                &Config {
                    tls_certificate: vec![good.clone()],
                    ..cfg.clone()
                },
                now + days * 86_400,
            )
        };
        assert_eq!(later(340)[0].status, Status::Warn);
        assert_eq!(later(360)[0].status, Status::Fail);
        assert!(later(400)[0].current.contains("EXPIRED"));
        assert!(certificates(&Config::default(), now).is_empty());
    }
}
