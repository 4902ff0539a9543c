//! Who may use the admin listener's control endpoints (every path under `/cache/`: purge,
//! pin, prefill and its lease and status, object state), and how often. `/metrics` and
//! `/healthz` never come here: they stay open to a scraper and a load balancer.
//!
//! The credential is a bearer token (`Authorization: Bearer TOKEN`) read from
//! `admin_token_file` (mode 0600, `fs::secret`), compared in constant time. Without a token
//! file control is off: every control request gets 403. The checks are cheap (a header scan
//! and one compare over at most `fs::secret::MAX_TOKEN_BYTES`), and only requests that pass
//! them draw on the token bucket, so a flood of unauthenticated requests cannot take the
//! operator's turns. Every refusal is counted by reason.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::metrics::write_family_header;

/// Whether `path` is a control endpoint: `/cache` and everything beneath it.
pub fn is_control(path: &[u8]) -> bool {
    path == b"/cache" || path.starts_with(b"/cache/")
}

/// Why a control request was refused (the `reason` of `shardline_admin_refused_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization` header.
    NoCredential,
    /// A header that is not one `Bearer` token, or not the right one.
    BadCredential,
    /// No `admin_token_file`: control is off.
    ControlOff,
    /// Over `admin_control_per_s`.
    RateLimited,
}

impl Refusal {
    /// Every reason, in the order they are rendered.
    pub const ALL: [Refusal; 4] = [
        Refusal::NoCredential,
        Refusal::BadCredential,
        Refusal::ControlOff,
        Refusal::RateLimited,
    ];

    /// Its label value.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::NoCredential => "no_credential",
            Refusal::BadCredential => "bad_credential",
            Refusal::ControlOff => "control_off",
            Refusal::RateLimited => "rate_limited",
        }
    }
}

/// The admin token; its Debug never shows it.
pub struct AdminToken(Vec<u8>);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(..)")
    }
}

impl AdminToken {
    /// A token from its text (as `fs::secret::read_token_file` returns it).
    pub fn new(token: String) -> AdminToken {
        AdminToken(token.into_bytes())
    }

    /// The token of `admin_token_file` (None: control off); Err names what is wrong.
    pub fn load(file: Option<&std::path::Path>) -> Result<Option<AdminToken>, String> {
        file.map(|f| crate::fs::secret::read_token_file(f).map(AdminToken::new))
            .transpose()
    }

    /// Whether `presented` is this token, in time that depends on the token's length only.
    pub fn matches(&self, presented: &[u8]) -> bool {
        ct_eq(&self.0, presented)
    }
}

/// `secret == presented`, without an early exit: the time depends on `secret.len()` alone,
/// never on how many leading bytes were right.
pub fn ct_eq(secret: &[u8], presented: &[u8]) -> bool {
    let mut diff = u8::from(secret.len() != presented.len());
    for (i, &s) in secret.iter().enumerate() {
        // Whether `presented` is shorter is the caller's own knowledge, not the secret's.
        let p = presented.get(i).copied().unwrap_or(0);
        // black_box: the optimiser may not turn the loop into one that stops at a difference.
        diff = std::hint::black_box(diff | (s ^ p));
    }
    diff == 0
}

/// The token in force: replaced when SIGHUP reloads `admin_token_file`.
#[derive(Default)]
pub struct TokenSlot(Mutex<Option<Arc<AdminToken>>>);

impl TokenSlot {
    /// A slot holding `token` (None: control off).
    pub fn new(token: Option<AdminToken>) -> TokenSlot {
        TokenSlot(Mutex::new(token.map(Arc::new)))
    }

    /// Makes `token` the one control requests must carry from now on.
    pub fn set(&self, token: Option<AdminToken>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = token.map(Arc::new);
    }

    /// The token in force.
    pub fn get(&self) -> Option<Arc<AdminToken>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// What a request head presents as its credential.
#[derive(Debug, PartialEq, Eq)]
enum Credential<'a> {
    None,
    /// Several `Authorization` headers, another scheme, or no token after `Bearer`.
    Malformed,
    Bearer(&'a [u8]),
}

/// The `Authorization` header of a complete, already validated head.
fn credential(head: &[u8]) -> Credential<'_> {
    let mut found = None;
    for line in head.split(|&b| b == b'\n').skip(1) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        if !line[..colon].eq_ignore_ascii_case(b"authorization") {
            continue;
        }
        if found.is_some() {
            return Credential::Malformed;
        }
        found = Some(line[colon + 1..].trim_ascii());
    }
    let Some(value) = found else {
        return Credential::None;
    };
    let Some(space) = value.iter().position(|&b| b == b' ') else {
        return Credential::Malformed;
    };
    let (scheme, token) = (&value[..space], value[space..].trim_ascii());
    if !scheme.eq_ignore_ascii_case(b"bearer") || token.is_empty() {
        return Credential::Malformed;
    }
    Credential::Bearer(token)
}

/// A token bucket: `per_s` turns a second, at most `per_s` saved up (a one-second burst).
#[derive(Debug)]
pub struct Bucket {
    per_s: f64,
    turns: f64,
    last: Instant,
}

impl Bucket {
    /// A full bucket of `per_s` turns a second (at least 1).
    pub fn new(per_s: u32, now: Instant) -> Bucket {
        let per_s = f64::from(per_s.max(1));
        Bucket {
            per_s,
            turns: per_s,
            last: now,
        }
    }

    /// Takes a turn if there is one.
    pub fn take(&mut self, now: Instant) -> bool {
        let earned = now.saturating_duration_since(self.last).as_secs_f64() * self.per_s;
        self.turns = (self.turns + earned).min(self.per_s);
        self.last = now;
        if self.turns >= 1.0 {
            self.turns -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The admin listener's gate in front of the control endpoints, with its refusal counters.
pub struct Gate {
    token: Arc<TokenSlot>,
    bucket: Mutex<Bucket>,
    refused: [AtomicU64; Refusal::ALL.len()],
}

impl Gate {
    /// A gate letting in requests carrying `token`'s token, `per_s` a second.
    pub fn new(token: Arc<TokenSlot>, per_s: u32) -> Gate {
        Gate {
            token,
            bucket: Mutex::new(Bucket::new(per_s, Instant::now())),
            refused: Default::default(),
        }
    }

    /// Whether the control request with this head may go on; a refusal is counted.
    pub fn check(&self, head: &[u8], now: Instant) -> Result<(), Refusal> {
        let verdict = self.judge(head, now);
        if let Err(why) = verdict {
            self.refused[why as usize].fetch_add(1, Ordering::Relaxed);
        }
        verdict
    }

    fn judge(&self, head: &[u8], now: Instant) -> Result<(), Refusal> {
        let Some(token) = self.token.get() else {
            return Err(Refusal::ControlOff);
        };
        match credential(head) {
            Credential::None => return Err(Refusal::NoCredential),
            Credential::Malformed => return Err(Refusal::BadCredential),
            Credential::Bearer(t) if !token.matches(t) => return Err(Refusal::BadCredential),
            Credential::Bearer(_) => {}
        }
        let mut bucket = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
        if bucket.take(now) {
            Ok(())
        } else {
            Err(Refusal::RateLimited)
        }
    }

    /// Refusals so far for `why`.
    pub fn refused(&self, why: Refusal) -> u64 {
        self.refused[why as usize].load(Ordering::Relaxed)
    }

    /// Appends `shardline_admin_refused_total{reason}` (every reason, zeros too).
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write as _;
        write_family_header(
            out,
            "shardline_admin_refused_total",
            "counter",
            "Admin control requests refused, by reason (no or a wrong token, control off, over \
             admin_control_per_s).",
        );
        for why in Refusal::ALL {
            let _ = writeln!(
                out,
                "shardline_admin_refused_total{{reason=\"{}\"}} {}",
                why.label(),
                self.refused(why)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const TOKEN: &str = "0123456789abcdef0123456789abcdef";

    fn head(auth: &[&str]) -> Vec<u8> {
        let mut h = String::from("GET /cache/object HTTP/1.1\r\nHost: a\r\n");
        for a in auth {
            h.push_str(&format!("Authorization: {a}\r\n"));
        }
        h.push_str("\r\n");
        h.into_bytes()
    }

    #[test]
    fn the_compare_is_equality_whatever_the_lengths() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(ct_eq(b"", b""));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"xbc"));
        assert!(!ct_eq(b"abc", b"ab"));
        assert!(!ct_eq(b"abc", b"abcd"));
        assert!(!ct_eq(b"abc", b""));
        assert!(!ct_eq(b"", b"a"));
        // A shorter presented token padded with what the secret has there is still wrong.
        assert!(!ct_eq(b"ab\0", b"ab"));
        let t = AdminToken::new(TOKEN.into());
        assert!(t.matches(TOKEN.as_bytes()));
        assert!(!t.matches(&TOKEN.as_bytes()[1..]));
        assert_eq!(format!("{t:?}"), "AdminToken(..)");
    }

    #[test]
    fn control_paths_are_everything_under_cache() {
        for p in [
            "/cache",
            "/cache/",
            "/cache/purge",
            "/cache/prefill/begin",
            "/cache/x",
        ] {
            assert!(is_control(p.as_bytes()), "{p}");
        }
        for p in ["/metrics", "/healthz", "/", "/cachex", "/x/cache/purge"] {
            assert!(!is_control(p.as_bytes()), "{p}");
        }
    }

    #[test]
    fn the_credential_is_one_bearer_header() {
        assert_eq!(credential(&head(&[])), Credential::None);
        assert_eq!(
            credential(&head(&["Bearer abc"])),
            Credential::Bearer(b"abc")
        );
        assert_eq!(
            credential(&head(&["bearer   abc  "])),
            Credential::Bearer(b"abc")
        );
        let lower = b"GET / HTTP/1.1\r\nauthorization: Bearer x\r\n\r\n";
        assert_eq!(credential(lower), Credential::Bearer(b"x"));
        for bad in ["Basic YTpi", "Bearer", "Bearer ", "abc"] {
            assert_eq!(credential(&head(&[bad])), Credential::Malformed, "{bad}");
        }
        assert_eq!(
            credential(&head(&["Bearer a", "Bearer b"])),
            Credential::Malformed
        );
    }

    #[test]
    fn the_gate_refuses_and_counts_by_reason() {
        let slot = Arc::new(TokenSlot::new(None));
        let gate = Gate::new(slot.clone(), 1000);
        let now = Instant::now();
        let ok = format!("Bearer {TOKEN}");
        assert_eq!(
            gate.check(&head(&[&ok]), now),
            Err(Refusal::ControlOff),
            "no token file: control is off"
        );
        slot.set(Some(AdminToken::new(TOKEN.into())));
        assert_eq!(gate.check(&head(&[]), now), Err(Refusal::NoCredential));
        let wrong = format!("Bearer {}x", &TOKEN[1..]);
        assert_eq!(
            gate.check(&head(&[&wrong]), now),
            Err(Refusal::BadCredential)
        );
        assert_eq!(
            gate.check(&head(&["Basic YTpi"]), now),
            Err(Refusal::BadCredential)
        );
        assert_eq!(gate.check(&head(&[&ok]), now), Ok(()));
        // A reload to another token: the old one is refused.
        slot.set(Some(AdminToken::new("another-token-0123456789".into())));
        assert_eq!(gate.check(&head(&[&ok]), now), Err(Refusal::BadCredential));
        let counts: Vec<u64> = Refusal::ALL.iter().map(|&r| gate.refused(r)).collect();
        assert_eq!(counts, [1, 3, 1, 0]);
        let mut out = String::new();
        gate.render(&mut out);
        let samples = crate::metrics::parse_exposition(&out).unwrap();
        assert_eq!(samples.len(), 4);
        assert!(out.contains("shardline_admin_refused_total{reason=\"bad_credential\"} 3\n"));
    }

    #[test]
    fn the_bucket_allows_a_second_of_burst_then_its_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::new(5, t0);
        assert_eq!((0..10).filter(|_| b.take(t0)).count(), 5);
        assert!(!b.take(t0 + Duration::from_millis(100)));
        assert!(
            b.take(t0 + Duration::from_millis(250)),
            "one earned in 200 ms"
        );
        assert!(!b.take(t0 + Duration::from_millis(260)));
        // Idle for long: no more than a second's worth is saved up.
        let later = t0 + Duration::from_secs(60);
        assert_eq!((0..10).filter(|_| b.take(later)).count(), 5);
        // Only authenticated requests draw on it: refusals leave it alone.
        let slot = Arc::new(TokenSlot::new(Some(AdminToken::new(TOKEN.into()))));
        let gate = Gate::new(slot, 2);
        let now = Instant::now();
        for _ in 0..50 {
            assert_eq!(gate.check(&head(&[]), now), Err(Refusal::NoCredential));
        }
        let ok = format!("Bearer {TOKEN}");
        assert_eq!(gate.check(&head(&[&ok]), now), Ok(()));
        assert_eq!(gate.check(&head(&[&ok]), now), Ok(()));
        assert_eq!(gate.check(&head(&[&ok]), now), Err(Refusal::RateLimited));
        assert_eq!(gate.refused(Refusal::RateLimited), 1);
    }
}
