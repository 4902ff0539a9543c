//! What an origin's reply says about caching it (RFC 9111, RFC 9213): whether a shared cache
//! may store it, how long it is fresh, how old it already is, what must be validated, and
//! which of its header fields go with the stored bytes to every client.
//!
//! `HeadFields::collect` takes the fields from a reply's head (once per fetch; bounded);
//! `Contract::of` reads them at the moment the reply arrived. The fill keeps the result with
//! the version (`cache::record::Freshness`, the stored header lines) and the shard serves hits
//! by it.

pub use crate::cache::record::MAX_STORED_HEADER_BYTES;
/// Longest value of a field the contract reads (Cache-Control, Expires, ...); a longer one is
/// read as absent (a Cache-Control that long is not an origin's contract).
pub const MAX_POLICY_FIELD_BYTES: usize = 1024;
/// The heuristic freshness (RFC 9111 §4.2.2) of a reply with a Last-Modified and no explicit
/// expiry: this fraction (in percent) of the time since it was last modified.
pub const HEURISTIC_PERCENT: u64 = 10;
/// The shortest heuristic freshness: a patch published a minute ago is not revalidated on
/// every request of its launch (the heuristic is the cache's to choose, RFC 9111 §4.2.2).
pub const HEURISTIC_MIN_S: u64 = 300;

/// Fields never kept with a version: hop-by-hop ones (RFC 9110 §7.6.1; and any the reply's
/// `Connection` names), those every response writes itself (framing, validators, type, date,
/// age), Set-Cookie (one client's: kept apart, `HeadFields::own`), and the ones meant for the
/// edge alone. Every other field of the reply is its end-to-end head, sent with its bytes.
pub const UNSTORED_FIELDS: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "content-range",
    "content-type",
    "etag",
    "last-modified",
    "server",
    "age",
    "accept-ranges",
    "cache-status",
    "surrogate-control",
    "surrogate-key",
    "cache-tag",
    "set-cookie",
    "set-cookie2",
];

/// The fields of a reply's head the contract reads, and the lines kept to replay on hits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeadFields {
    /// Every Cache-Control field, combined into one list.
    pub cache_control: String,
    /// CDN-Cache-Control (RFC 9213), combined.
    pub cdn_cache_control: String,
    /// Expires.
    pub expires: String,
    /// Date.
    pub date: String,
    /// Age.
    pub age: String,
    /// Vary, combined.
    pub vary: String,
    /// Content-Encoding, combined.
    pub content_encoding: String,
    /// The end-to-end lines (`Name: value\r\n`, all but `UNSTORED_FIELDS`), at most
    /// `MAX_STORED_HEADER_BYTES`.
    pub stored: String,
    /// Set-Cookie lines: sent to the one client whose own fetch this was, never stored.
    pub own: String,
    /// Surrogate-Key values, combined with spaces (the purge tags, `cache::tags`; never sent
    /// to a client). Bounded by the head's own bound.
    pub surrogate_key: String,
    /// Cache-Tag values, combined with commas (as `surrogate_key`).
    pub cache_tag: String,
}

impl HeadFields {
    /// The fields of `head` (a whole response head: the status line, fields, the empty line).
    /// Interim (1xx) heads before the final one are skipped as `response::parse` does.
    pub fn collect(head: &[u8]) -> HeadFields {
        let mut out = HeadFields::default();
        let mut fields = [httparse::EMPTY_HEADER; super::response::MAX_RESPONSE_HEADERS];
        let mut at = 0;
        loop {
            let mut resp = httparse::Response::new(&mut fields);
            let Ok(httparse::Status::Complete(n)) = resp.parse(&head[at..]) else {
                return out;
            };
            if resp.code.is_some_and(|c| (100..200).contains(&c)) {
                at += n;
                continue;
            }
            // Fields the reply's Connection names are hop-by-hop too.
            let hop = |name: &str| {
                resp.headers.iter().any(|h| {
                    h.name.eq_ignore_ascii_case("connection")
                        && h.value
                            .split(|&b| b == b',')
                            .any(|t| t.trim_ascii().eq_ignore_ascii_case(name.as_bytes()))
                })
            };
            for h in resp.headers.iter() {
                let Ok(value) = std::str::from_utf8(h.value).map(str::trim) else {
                    continue;
                };
                let name = h.name.to_ascii_lowercase();
                let list = match name.as_str() {
                    "cache-control" => Some(&mut out.cache_control),
                    "cdn-cache-control" => Some(&mut out.cdn_cache_control),
                    "vary" => Some(&mut out.vary),
                    "content-encoding" => Some(&mut out.content_encoding),
                    "expires" => Some(&mut out.expires),
                    "date" => Some(&mut out.date),
                    "age" => Some(&mut out.age),
                    _ => None,
                };
                // Purge tags: bounded by the head (`MAX_RESPONSE_HEAD_BYTES`); `cache::tags`
                // bounds what is kept.
                let tags = match name.as_str() {
                    "surrogate-key" => Some((&mut out.surrogate_key, ' ')),
                    "cache-tag" => Some((&mut out.cache_tag, ',')),
                    _ => None,
                };
                if let Some((tags, separator)) = tags {
                    if !tags.is_empty() {
                        tags.push(separator);
                    }
                    tags.push_str(value);
                }
                if let Some(list) = list {
                    // Age lines combine as a list whose first member counts (the
                    // cache-tests' age-parse-*-twoline): only the first is read.
                    let single = matches!(name.as_str(), "expires" | "date");
                    push_value(list, value, single);
                }
                let own = name == "set-cookie";
                if value.is_empty()
                    || (!own && UNSTORED_FIELDS.contains(&name.as_str()))
                    || hop(&name)
                {
                    continue;
                }
                let lines = if own { &mut out.own } else { &mut out.stored };
                if lines.len() + h.name.len() + value.len() + 4 <= MAX_STORED_HEADER_BYTES {
                    lines.push_str(h.name);
                    lines.push_str(": ");
                    lines.push_str(value);
                    lines.push_str("\r\n");
                }
            }
            return out;
        }
    }
}

/// Marks a field read as unusable: too long, or a single-valued one given twice.
const UNUSABLE: &str = "\u{0}";

/// Adds `value` to the field `list` (a list field combines, RFC 9110 §5.3); a single-valued
/// field given twice, or a field past `MAX_POLICY_FIELD_BYTES`, becomes `UNUSABLE`.
fn push_value(list: &mut String, value: &str, single: bool) {
    if list == UNUSABLE {
        return;
    }
    if list.len() + value.len() + 2 > MAX_POLICY_FIELD_BYTES || (single && !list.is_empty()) {
        list.clear();
        list.push_str(UNUSABLE);
        return;
    }
    if !list.is_empty() {
        list.push_str(", ");
    }
    list.push_str(value);
}

/// Cache-Control directives a shared cache acts on (RFC 9111 §5.2.2; RFC 5861).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Directives {
    /// `no-store`.
    pub no_store: bool,
    /// `no-cache` (unqualified, or with field names: either way every use is validated).
    pub no_cache: bool,
    /// `private` (a shared cache never stores it).
    pub private: bool,
    /// `public`.
    pub public: bool,
    /// `must-revalidate` or `proxy-revalidate`: never served stale.
    pub must_revalidate: bool,
    /// `max-age`.
    pub max_age: Option<u64>,
    /// `s-maxage`.
    pub s_maxage: Option<u64>,
    /// `stale-while-revalidate`.
    pub stale_while_revalidate: Option<u64>,
    /// `stale-if-error`.
    pub stale_if_error: Option<u64>,
}

impl Directives {
    /// Reads a Cache-Control list: unknown directives are ignored; a directive whose argument
    /// does not parse is read as its strictest meaning (a bad max-age is 0: stale at once).
    pub fn parse(list: &str) -> Directives {
        let mut d = Directives::default();
        for item in split_list(list) {
            let (name, arg) = match item.split_once('=') {
                Some((n, a)) => (n.trim(), Some(a.trim().trim_matches('"'))),
                None => (item, None),
            };
            let secs = || Some(arg.and_then(delta_seconds).unwrap_or(0));
            match name.to_ascii_lowercase().as_str() {
                "no-store" => d.no_store = true,
                "no-cache" => d.no_cache = true,
                "private" => d.private = true,
                "public" => d.public = true,
                "must-revalidate" | "proxy-revalidate" => d.must_revalidate = true,
                // The first occurrence counts (RFC 9111 §4.2.1: duplicates are invalid; the
                // stricter reading would be stale, which the lower of two gives too).
                "max-age" => d.max_age = min_opt(d.max_age, secs()),
                "s-maxage" => d.s_maxage = min_opt(d.s_maxage, secs()),
                "stale-while-revalidate" => {
                    d.stale_while_revalidate = arg.and_then(delta_seconds);
                }
                "stale-if-error" => d.stale_if_error = arg.and_then(delta_seconds),
                _ => {}
            }
        }
        // For a shared cache s-maxage also means proxy-revalidate (RFC 9111 §5.2.2.10).
        d.must_revalidate |= d.s_maxage.is_some();
        d
    }
}

fn min_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// `delta-seconds` (RFC 9111 §1.2.2): digits; too many is "a very long time" (2^31).
fn delta_seconds(v: &str) -> Option<u64> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(v.parse::<u64>().unwrap_or(1 << 31).min(1 << 31))
}

/// The members of a comma-separated list, trimmed, empty ones skipped (a comma inside a
/// quoted string does not split).
fn split_list(list: &str) -> impl Iterator<Item = &str> {
    let mut items = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (i, c) in list.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&list[start..]);
    items.into_iter().map(str::trim).filter(|s| !s.is_empty())
}

/// Whether a CDN-Cache-Control value is a Structured Fields dictionary of directives (RFC
/// 9213 §2: one that is not is ignored, as if absent).
fn is_sf_dictionary(v: &str) -> bool {
    split_list(v).all(|member| {
        let member = member.split(';').next().unwrap_or("").trim();
        let (key, value) = match member.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (member, None),
        };
        let key_ok = key
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b == b'*')
            && key
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-.*".contains(&b));
        let value_ok = value.is_none_or(|v| {
            (!v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                || (v.len() >= 2 && v.starts_with('"') && v.ends_with('"'))
                || v.bytes()
                    .next()
                    .is_some_and(|b| b.is_ascii_alphabetic() || b == b'*')
                || v == "?1"
                || v == "?0"
        });
        // A directive that counts seconds must be an Integer (RFC 9213 §2.1): a field that
        // gives it another type is invalid whole, and ignored.
        let seconds = matches!(
            key,
            "max-age" | "s-maxage" | "stale-while-revalidate" | "stale-if-error"
        );
        let type_ok = !seconds
            || value.is_some_and(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()));
        key_ok && value_ok && type_ok
    })
}

/// The lines of a request's field lines `request` (`Name: value\r\n` each) that a reply
/// with `vary` varies on, one `name: value` line per field it names (its lines combined;
/// `name:` when the request had none), lower-case names in `vary`'s order: what a later
/// request must match to be answered with the stored reply (RFC 9111 §4.1).
/// Accept-Encoding is left out: the edge asks every origin for `identity`, whoever asks it.
/// Lines past `MAX_STORED_HEADER_BYTES`, or a value that is not plain text, give
/// `UNMATCHABLE`: the reply is stored but no request selects it.
pub fn selecting_lines(vary: &str, request: &str) -> String {
    let mut out = String::new();
    for name in split_list(vary) {
        let name = name.to_ascii_lowercase();
        if name == "accept-encoding" || out.contains(&format!("{name}:")) {
            continue;
        }
        let value = field_value(request.as_bytes(), &name);
        let plain = |t: &str| t.bytes().all(|b| b == b'\t' || (0x20..0x7f).contains(&b));
        if out.len() + name.len() + value.len() + 4 > MAX_STORED_HEADER_BYTES
            || !plain(&value)
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return UNMATCHABLE.to_owned();
        }
        out.push_str(&name);
        out.push_str(": ");
        out.push_str(&value);
        out.push_str("\r\n");
    }
    out
}

/// The request lines a fetch of a stored variant sends (its `selecting_lines` with a value):
/// every block of it, and a pass-through of it, is asked for as the request that got it
/// was, so one version never mixes two variants' bytes.
pub fn variant_request_lines(selecting: &str) -> String {
    if selecting == UNMATCHABLE {
        return String::new();
    }
    selecting
        .split_inclusive("\r\n")
        .filter(|l| !l.trim_end().ends_with(':'))
        .collect()
}

/// Most variants of one key stored beside its first (RFC 9111 §4.1): a request whose values
/// of the fields a stored reply's `Vary` names differ from it is filled under one of these
/// keys (`variant_key`), so a key holds at most `1 + MAX_VARIANTS_PER_KEY` versions.
pub const MAX_VARIANTS_PER_KEY: u64 = 4;

/// What a variant's key adds to its key: a space, which no request target holds, so no
/// request's own key is ever a variant key.
const VARIANT_MARK: &[u8] = b" variant=";

/// The key a request whose field lines `fields` do not select the reply stored under `key`
/// (its `selecting` lines) is filled and served under: `key`, the mark, and one of
/// `MAX_VARIANTS_PER_KEY` places drawn from the request's values of the fields `selecting`
/// names. Two sets of values may share a place: a reply stored there for the other one does
/// not select this request, which then makes its own fetch. None for a reply that selects no
/// request (`UNMATCHABLE`) and for a key that is a variant's already.
pub fn variant_key(key: &[u8], selecting: &str, fields: &[u8]) -> Option<Vec<u8>> {
    if selecting == UNMATCHABLE || key.windows(VARIANT_MARK.len()).any(|w| w == VARIANT_MARK) {
        return None;
    }
    let mut values = String::new();
    for line in selecting.split_terminator("\r\n") {
        let (name, _) = line.split_once(':').unwrap_or((line, ""));
        values.push_str(&field_value(fields, name));
        values.push('\n');
    }
    let place = crate::cache::placement::key_hash(values.as_bytes()) % MAX_VARIANTS_PER_KEY;
    let mut out = Vec::with_capacity(key.len() + VARIANT_MARK.len() + 2);
    out.extend_from_slice(key);
    out.extend_from_slice(VARIANT_MARK);
    out.extend_from_slice(place.to_string().as_bytes());
    Some(out)
}

/// The selecting lines of a reply no request may be answered with (`selecting_lines`).
pub const UNMATCHABLE: &str = "shardline-unmatchable: \r\n";

/// Whether a client's field lines `fields` (as `Request::fields` holds them) carry what
/// `selecting` (a stored reply's `selecting_lines`) names, field by field.
pub fn selects(selecting: &str, fields: &[u8]) -> bool {
    if selecting == UNMATCHABLE {
        return false;
    }
    selecting.split_terminator("\r\n").all(|line| {
        let (name, value) = line.split_once(':').unwrap_or((line, ""));
        field_value(fields, name) == value.trim()
    })
}

/// The value of field `name` (lower-case) in field lines `lines`: its lines combined with
/// ", ", each trimmed ("" when absent).
fn field_value(lines: &[u8], name: &str) -> String {
    let mut value = String::new();
    for line in lines.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        if !line[..colon]
            .trim_ascii()
            .eq_ignore_ascii_case(name.as_bytes())
        {
            continue;
        }
        let v = String::from_utf8_lossy(line[colon + 1..].trim_ascii());
        if !value.is_empty() {
            value.push_str(", ");
        }
        value.push_str(&v);
    }
    value
}

/// Statuses a cache may store with a heuristic lifetime (RFC 9110 §15.1), 200 and 206
/// aside.
pub const HEURISTIC_STATUSES: [u16; 10] = [203, 204, 300, 301, 308, 404, 405, 410, 414, 501];

/// Why a reply is not stored (the `Cache-Status` detail and the counter's label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotStored {
    /// `no-store`.
    NoStore,
    /// `private`.
    Private,
    /// The request carried `Authorization` and the reply does not allow sharing it.
    Authorization,
    /// `Vary: *`, or a Vary on request fields other than Accept-Encoding (the edge asks for
    /// `identity` always, so that one is the same for every client).
    Vary,
    /// A status the cache does not keep (other than 200 and 206).
    Status,
}

impl NotStored {
    /// Every reason, in the metric's order.
    pub const ALL: [NotStored; 5] = [
        NotStored::NoStore,
        NotStored::Private,
        NotStored::Authorization,
        NotStored::Vary,
        NotStored::Status,
    ];

    /// The label: the `detail` of `Cache-Status` and the counter's `reason`.
    pub fn label(self) -> &'static str {
        match self {
            NotStored::NoStore => "no-store",
            NotStored::Private => "private",
            NotStored::Authorization => "authorization",
            NotStored::Vary => "vary",
            NotStored::Status => "status",
        }
    }
}

/// What the reply's fields allow, read at the moment it arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Contract {
    /// The directives in force (CDN-Cache-Control's when it is there, RFC 9213).
    pub directives: Directives,
    /// Seconds it is fresh for from its origin (RFC 9111 §4.2.1), when the origin said; None:
    /// no explicit expiry.
    pub explicit_lifetime_s: Option<u64>,
    /// How old it already was when it arrived (§4.2.3 `corrected_initial_age`, taking the
    /// response delay as nil).
    pub initial_age_s: u64,
}

impl Contract {
    /// The contract of a reply with `fields`, arrived at `now_unix_s`.
    pub fn of(fields: &HeadFields, now_unix_s: i64) -> Contract {
        let cdn = (!fields.cdn_cache_control.is_empty()
            && fields.cdn_cache_control != UNUSABLE
            && is_sf_dictionary(&fields.cdn_cache_control))
        .then(|| Directives::parse(&fields.cdn_cache_control));
        let mut cc = Directives::parse(&fields.cache_control);
        // A Cache-Control that cannot be read whole may say private: the safe reading.
        cc.no_store |= fields.cache_control == UNUSABLE;
        let date = parse_date(&fields.date).unwrap_or(now_unix_s);
        let explicit_lifetime_s = match cdn {
            // The targeted field alone decides: Cache-Control and Expires are ignored.
            Some(d) => d.s_maxage.or(d.max_age),
            None => cc.s_maxage.or(cc.max_age).or_else(|| {
                (!fields.expires.is_empty()).then(|| {
                    // An Expires that does not parse is in the past (§5.3).
                    parse_date(&fields.expires)
                        .map_or(0, |e| u64::try_from(e.saturating_sub(date)).unwrap_or(0))
                })
            }),
        };
        let apparent = u64::try_from(now_unix_s.saturating_sub(date)).unwrap_or(0);
        let age = split_list(&fields.age)
            .next()
            .and_then(delta_seconds)
            .unwrap_or(0);
        Contract {
            directives: cdn.unwrap_or(cc),
            explicit_lifetime_s,
            initial_age_s: apparent.max(age),
        }
    }

    /// Whether a shared cache may store a reply with `fields` to a request without
    /// `Authorization` (which the edge never stores, `Request::authorization`): no clock
    /// needed, so the fetch decides at the head, before a byte is written.
    pub fn storable_fields(fields: &HeadFields) -> Result<(), NotStored> {
        Contract::of(fields, 0).storable(fields, false)
    }

    /// Whether a reply with `fields` may be stored under the operator's override
    /// (`cache_policy = "override"`): anything but a `private` one (its contents are one
    /// user's, whatever the operator says).
    pub fn shareable_fields(fields: &HeadFields) -> Result<(), NotStored> {
        let d = Contract::of(fields, 0).directives;
        if d.private {
            return Err(NotStored::Private);
        }
        Ok(())
    }

    /// Whether a reply with `status` other than 200/206 may be stored at all (RFC 9111 §3,
    /// §4.2.2): with explicit freshness, or, for a heuristically cacheable status
    /// (`HEURISTIC_STATUSES`, or any with `public`), a `Last-Modified` to reckon a lifetime
    /// from (the origin entry's default lifetime is for objects, never for a 404). Its other
    /// rules (`storable_fields`) still apply.
    pub fn storable_status(fields: &HeadFields, status: u16, last_modified: bool) -> bool {
        let c = Contract::of(fields, 0);
        let heuristic = HEURISTIC_STATUSES.contains(&status) || c.directives.public;
        crate::cache::record::is_storable_status(status)
            && (c.explicit_lifetime_s.is_some() || (heuristic && last_modified))
    }

    /// Whether a shared cache may store the reply to a request with (`authorization`) or
    /// without an `Authorization` field (RFC 9111 §3, §3.5).
    pub fn storable(&self, fields: &HeadFields, authorization: bool) -> Result<(), NotStored> {
        let d = &self.directives;
        if d.no_store {
            return Err(NotStored::NoStore);
        }
        if d.private {
            return Err(NotStored::Private);
        }
        if authorization && !(d.public || d.s_maxage.is_some() || d.must_revalidate) {
            return Err(NotStored::Authorization);
        }
        // A Vary on request fields is stored with the request's (`selecting_lines`); `*`
        // varies on what no field says.
        if split_list(&fields.vary).any(|f| f == "*") || fields.vary == UNUSABLE {
            return Err(NotStored::Vary);
        }
        Ok(())
    }

    /// Seconds the reply is fresh for (§4.2.1, §4.2.2): its explicit lifetime; else a
    /// heuristic `HEURISTIC_PERCENT` of its age since `last_modified` at `date_unix_s` (at
    /// least `HEURISTIC_MIN_S`, at most `heuristic_max_s`); else None: the edge's default
    /// (`cache_revalidate_s`), read when it is used.
    pub fn lifetime_s(
        &self,
        last_modified: Option<i64>,
        date_unix_s: i64,
        heuristic_max_s: u64,
    ) -> Option<u64> {
        if let Some(s) = self.explicit_lifetime_s {
            return Some(s);
        }
        let lm = last_modified.filter(|&lm| lm < date_unix_s)?;
        let since = u64::try_from(date_unix_s - lm).unwrap_or(0);
        Some(
            (since / 100 * HEURISTIC_PERCENT)
                .max(HEURISTIC_MIN_S)
                .min(heuristic_max_s),
        )
    }
}

/// `old` header lines with `new`'s replacing every line of the same field name (RFC 9111
/// §4.3.4), at most `MAX_STORED_HEADER_BYTES` (lines past it are left out).
pub fn merge_lines(old: &str, new: &str) -> String {
    let name = |line: &str| line.split(':').next().unwrap_or("").to_ascii_lowercase();
    let replaced: Vec<String> = new.split_terminator("\r\n").map(name).collect();
    let mut out = String::with_capacity(old.len() + new.len());
    let kept = old
        .split_terminator("\r\n")
        .filter(|l| !replaced.contains(&name(l)));
    for line in kept.chain(new.split_terminator("\r\n")) {
        if out.len() + line.len() + 2 <= MAX_STORED_HEADER_BYTES {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out
}

/// An HTTP-date as Unix seconds.
pub fn parse_date(v: &str) -> Option<i64> {
    crate::http::date::parse_http_date(v.trim().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(text: &str) -> HeadFields {
        HeadFields::collect(format!("HTTP/1.1 200 OK\r\n{text}\r\n").as_bytes())
    }

    const NOW: i64 = 1_800_000_000;

    fn date(s: i64) -> String {
        String::from_utf8(crate::http::date::format_http_date(s).to_vec()).unwrap()
    }

    #[test]
    fn storability_follows_rfc_9111() {
        let cases = [
            (
                "Cache-Control: no-store\r\n",
                false,
                Err(NotStored::NoStore),
            ),
            (
                "Cache-Control: max-age=60, private\r\n",
                false,
                Err(NotStored::Private),
            ),
            (
                "Cache-Control: PRIVATE=\"x\"\r\n",
                false,
                Err(NotStored::Private),
            ),
            ("", true, Err(NotStored::Authorization)),
            (
                "Cache-Control: max-age=60\r\n",
                true,
                Err(NotStored::Authorization),
            ),
            ("Cache-Control: public\r\n", true, Ok(())),
            ("Cache-Control: s-maxage=5\r\n", true, Ok(())),
            ("Cache-Control: must-revalidate\r\n", true, Ok(())),
            ("Vary: *\r\n", false, Err(NotStored::Vary)),
            // Stored with the request's values (`selecting_lines`).
            ("Vary: Accept-Encoding, User-Agent\r\n", false, Ok(())),
            ("Vary: Accept-Language, *\r\n", false, Err(NotStored::Vary)),
            ("Vary: accept-encoding\r\n", false, Ok(())),
            ("", false, Ok(())),
            // The targeted field decides alone: Cache-Control's no-store is not read.
            (
                "Cache-Control: no-store\r\nCDN-Cache-Control: max-age=60\r\n",
                false,
                Ok(()),
            ),
            (
                "Cache-Control: max-age=60\r\nCDN-Cache-Control: no-store\r\n",
                false,
                Err(NotStored::NoStore),
            ),
            // Not a dictionary: ignored, Cache-Control decides.
            (
                "Cache-Control: no-store\r\nCDN-Cache-Control: Max-Age=60\r\n",
                false,
                Err(NotStored::NoStore),
            ),
        ];
        for (text, auth, want) in cases {
            let f = fields(text);
            assert_eq!(
                Contract::of(&f, NOW).storable(&f, auth),
                want,
                "{text:?} auth {auth}"
            );
        }
    }

    #[test]
    fn freshness_has_its_precedence_and_a_heuristic() {
        let lifetime = |text: &str| {
            let f = fields(text);
            Contract::of(&f, NOW).lifetime_s(None, NOW, 2_592_000)
        };
        let lifetime = |text: &str| lifetime(text).expect("explicit");
        assert_eq!(lifetime("Cache-Control: max-age=60\r\n"), 60);
        assert_eq!(lifetime("Cache-Control: max-age=60, s-maxage=5\r\n"), 5);
        assert_eq!(
            lifetime("Cache-Control: max-age=60\r\nCDN-Cache-Control: max-age=1\r\n"),
            1
        );
        assert_eq!(lifetime("Cache-Control: max-age=60, max-age=10\r\n"), 10);
        assert_eq!(
            lifetime("Cache-Control: max-age=x\r\n"),
            0,
            "a bad max-age is stale"
        );
        let expires = format!(
            "Date: {}\r\nExpires: {}\r\n",
            date(NOW - 10),
            date(NOW + 50)
        );
        assert_eq!(lifetime(&expires), 60, "Expires minus Date");
        assert_eq!(lifetime("Expires: 0\r\n"), 0, "an invalid Expires is past");
        let both = format!(
            "Cache-Control: max-age=7\r\nExpires: {}\r\n",
            date(NOW + 500)
        );
        assert_eq!(lifetime(&both), 7, "max-age over Expires");
        // The heuristic: a tenth of the time since Last-Modified, capped by
        // `cache_heuristic_max_s`; without a Last-Modified, the edge's default (None: read
        // when used).
        let f = fields("");
        let c = Contract::of(&f, NOW);
        assert_eq!(c.lifetime_s(None, NOW, 2_592_000), None);
        assert_eq!(c.lifetime_s(Some(NOW - 10_000), NOW, 2_592_000), Some(1000));
        assert_eq!(
            c.lifetime_s(Some(NOW - 1000), NOW, 2_592_000),
            Some(HEURISTIC_MIN_S),
            "never less than the floor"
        );
        assert_eq!(
            c.lifetime_s(Some(NOW - 1000), NOW, 0),
            Some(0),
            "nor the heuristic's cap"
        );
        assert_eq!(
            c.lifetime_s(Some(NOW - 1_000_000_000), NOW, 3600),
            Some(3600)
        );
        assert_eq!(
            c.lifetime_s(Some(NOW + 5), NOW, 3600),
            None,
            "a Last-Modified ahead"
        );
    }

    #[test]
    fn age_is_the_larger_of_age_and_the_apparent_age() {
        let f = fields(&format!("Date: {}\r\nAge: 30\r\n", date(NOW - 100)));
        assert_eq!(Contract::of(&f, NOW).initial_age_s, 100);
        let f = fields(&format!("Date: {}\r\nAge: 300\r\n", date(NOW - 100)));
        assert_eq!(Contract::of(&f, NOW).initial_age_s, 300);
        let f = fields(&format!("Date: {}\r\n", date(NOW + 100)));
        assert_eq!(
            Contract::of(&f, NOW).initial_age_s,
            0,
            "a date ahead is age 0"
        );
    }

    #[test]
    fn stored_lines_are_end_to_end_and_bounded() {
        let f = fields(
            "Cache-Control: max-age=60\r\nSet-Cookie: a=b\r\nContent-Encoding: gzip\r\n\
             Connection: keep-alive\r\nContent-Disposition: attachment; filename=\"a.bin\"\r\n\
             Surrogate-Key: k\r\n",
        );
        assert_eq!(
            f.stored,
            "Cache-Control: max-age=60\r\nContent-Encoding: gzip\r\n\
             Content-Disposition: attachment; filename=\"a.bin\"\r\n"
        );
        assert_eq!(f.own, "Set-Cookie: a=b\r\n");
        let f = fields("Connection: close, X-Hop\r\nX-Hop: 1\r\nX-End: 2\r\n");
        assert_eq!(
            f.stored, "X-End: 2\r\n",
            "a field Connection names is hop-by-hop"
        );
        let long = format!("Link: <{}>\r\n", "x".repeat(MAX_STORED_HEADER_BYTES));
        assert!(
            fields(&long).stored.is_empty(),
            "a line past the bound is left out"
        );
        // Interim replies are not the reply.
        let f = HeadFields::collect(
            b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nCache-Control: no-store\r\n\r\n",
        );
        assert_eq!(f.stored, "Cache-Control: no-store\r\n");
        // Too long a contract is never read half: it is not stored.
        let f = fields(&format!(
            "Cache-Control: max-age=9, {}\r\n",
            "a".repeat(2000)
        ));
        assert_eq!(
            Contract::of(&f, NOW).storable(&f, false),
            Err(NotStored::NoStore)
        );
        let twice = fields("Expires: 0\r\nExpires: 1\r\n");
        assert_eq!(twice.expires, UNUSABLE);
    }

    #[test]
    fn a_renewal_replaces_lines_of_the_same_name_and_keeps_the_rest() {
        let old = "Cache-Control: max-age=1\r\nX-A: 1\r\nLink: </a>\r\nLink: </b>\r\n";
        let new = "cache-control: max-age=60\r\nLink: </c>\r\nX-New: 2\r\n";
        assert_eq!(
            merge_lines(old, new),
            "X-A: 1\r\ncache-control: max-age=60\r\nLink: </c>\r\nX-New: 2\r\n"
        );
        assert_eq!(merge_lines("", ""), "");
        let long = format!("X-L: {}\r\n", "x".repeat(MAX_STORED_HEADER_BYTES));
        assert_eq!(
            merge_lines("X-A: 1\r\n", &long),
            "X-A: 1\r\n",
            "past the bound: left out"
        );
    }

    #[test]
    fn directives_parse_quoted_and_unknown_members() {
        let d = Directives::parse(
            "no-cache=\"Set-Cookie, X\", ext=\"a,b\", stale-while-revalidate=30, stale-if-error=60",
        );
        assert!(d.no_cache && !d.no_store && !d.private);
        assert_eq!(
            (d.stale_while_revalidate, d.stale_if_error),
            (Some(30), Some(60))
        );
        assert_eq!(
            Directives::parse("max-age=99999999999999").max_age,
            Some(1 << 31)
        );
    }

    #[test]
    fn a_vary_reply_selects_the_requests_with_its_requests_values() {
        let request =
            "Accept-Language: en\r\nX-Tier: gold\r\nX-Tier: beta\r\nAccept-Encoding: gzip\r\n";
        let lines = selecting_lines(
            "Accept-Encoding, Accept-Language, x-tier, X-Absent",
            request,
        );
        assert_eq!(
            lines,
            "accept-language: en\r\nx-tier: gold, beta\r\nx-absent: \r\n"
        );
        let fields = |s: &str| s.as_bytes().to_vec();
        // Field names in any case, the same values (Accept-Encoding never counts).
        assert!(selects(
            &lines,
            &fields("accept-language:  en \r\nx-tier: gold, beta\r\nAccept-Encoding: br\r\n")
        ));
        for other in [
            "Accept-Language: fr\r\nX-Tier: gold, beta\r\n",
            "X-Tier: gold, beta\r\n",
            "Accept-Language: en\r\nX-Tier: gold\r\n",
            "Accept-Language: en\r\nX-Tier: gold, beta\r\nX-Absent: 1\r\n",
        ] {
            assert!(!selects(&lines, &fields(other)), "{other:?}");
        }
        // No Vary: every request; a value that is not plain text: none.
        assert!(selects("", b"Anything: 1\r\n"));
        let odd = selecting_lines("X-Odd", "X-Odd: \u{7f}\r\n");
        assert_eq!(odd, UNMATCHABLE);
        assert!(!selects(&odd, b"X-Odd: \x7f\r\n"));
    }

    #[test]
    fn a_variant_key_is_bounded_stable_and_never_nested() {
        let lines = selecting_lines("Accept-Language", "Accept-Language: en\r\n");
        let key = b"0/pull/manifest.json".as_slice();
        let fr = variant_key(key, &lines, b"Accept-Language: fr\r\n").expect("a variant");
        assert!(fr.starts_with(key) && fr.len() == key.len() + VARIANT_MARK.len() + 1);
        // The same values, in any case of the name or spacing: the same key.
        assert_eq!(
            variant_key(key, &lines, b"accept-language:  fr \r\n"),
            Some(fr.clone())
        );
        // Many values share at most MAX_VARIANTS_PER_KEY keys.
        let keys: std::collections::HashSet<Vec<u8>> = (0..200)
            .filter_map(|i| {
                let f = format!("Accept-Language: l{i}\r\n");
                variant_key(key, &lines, f.as_bytes())
            })
            .collect();
        assert_eq!(keys.len() as u64, MAX_VARIANTS_PER_KEY);
        // A variant's key has none of its own, nor has a reply no request selects.
        assert_eq!(variant_key(&fr, &lines, b"Accept-Language: de\r\n"), None);
        assert_eq!(variant_key(key, UNMATCHABLE, b""), None);
    }

    #[test]
    fn the_first_member_of_age_counts() {
        let initial_age = |age_lines: &str| {
            let head = format!(
                "HTTP/1.1 200 OK\r\nDate: Sun, 06 Dec 2026 00:00:00 GMT\r\n{age_lines}\r\n"
            );
            let now = parse_date("Sun, 06 Dec 2026 00:00:00 GMT").unwrap();
            Contract::of(&HeadFields::collect(head.as_bytes()), now).initial_age_s
        };
        assert_eq!(initial_age("Age: 7200, 0\r\n"), 7200);
        assert_eq!(initial_age("Age: 0, 7200\r\n"), 0);
        assert_eq!(initial_age("Age: 7200\r\nAge: 0\r\n"), 7200);
        assert_eq!(initial_age("Age: 0\r\nAge: 7200\r\n"), 0);
        assert_eq!(initial_age("Age: abc\r\n"), 0);
    }

    #[test]
    fn a_cdn_cache_control_of_the_wrong_type_is_ignored_whole() {
        assert!(is_sf_dictionary("max-age=10000, stale-if-error=60"));
        for bad in [
            "max-age=\"10000\"",
            "max-age",
            "s-maxage=1.5",
            "no-store, max-age=?1",
            "Max-Age=60",
        ] {
            assert!(!is_sf_dictionary(bad), "{bad}");
        }
        // Ignored whole: Cache-Control decides (here: not stored).
        let head = "HTTP/1.1 200 OK\r\nCDN-Cache-Control: max-age=\"10000\"\r\nCache-Control: no-store\r\n\r\n";
        let fields = HeadFields::collect(head.as_bytes());
        assert_eq!(Contract::storable_fields(&fields), Err(NotStored::NoStore));
    }
}
