//! Purge tags (surrogate keys): the names an origin gives a reply in its `Surrogate-Key`
//! (space-separated, Fastly's and Varnish xkey's) or `Cache-Tag` (comma-separated,
//! Cloudflare's) field, kept with each version in its journal record, so that
//! `POST /cache/purge?tag=T` retires every version carrying `T` in one call.
//!
//! Bounded: at most `MAX_TAGS_PER_VERSION` tags of at most `MAX_TAG_BYTES` each and
//! `MAX_TAGS_BYTES` in all per version; what is past a bound is dropped (and counted), never
//! a reason to refuse the reply. Tags are compared exactly as the origin sent them.
//!
//! In memory a version holds its tags as one shared string (`Tags`, a thin `Arc`: 8 bytes in
//! the version, nothing on the heap when it has no tags; a tagged one adds the `Arc`'s block,
//! 16 bytes of counts and the `String`'s 24, and the text), so cloning a version on a hit
//! never copies them.

use std::sync::Arc;

/// Most tags one version keeps (Fastly allows a 16 KiB field; a release pipeline tags an
/// object with a build, a product and a few groups).
pub const MAX_TAGS_PER_VERSION: usize = 32;
/// Longest tag kept.
pub const MAX_TAG_BYTES: usize = 256;
/// Most bytes of tags one version keeps (the tags joined by single spaces): the journal
/// record's share for them.
pub const MAX_TAGS_BYTES: usize = 2048;

const _: () = assert!(MAX_TAG_BYTES <= MAX_TAGS_BYTES);

pub use crate::config::origin::TagHeader;

/// Whether `tag` may be a tag: 1 to `MAX_TAG_BYTES` visible ASCII characters (no space,
/// which separates tags in the record).
pub fn is_tag(tag: &str) -> bool {
    (1..=MAX_TAG_BYTES).contains(&tag.len()) && tag.bytes().all(|b| b.is_ascii_graphic())
}

/// A version's tags: none, or distinct tags joined by single spaces (`is_tag` each, within
/// the bounds).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tags(Option<Arc<String>>);

impl Tags {
    /// The tags of a field `value` (every line of the field, combined) as `header` separates
    /// them; and how many were dropped: not a tag (too long, not visible ASCII), or past
    /// `MAX_TAGS_PER_VERSION` or `MAX_TAGS_BYTES`. Repeats are kept once.
    pub fn parse(header: TagHeader, value: &str) -> (Tags, u32) {
        let mut text = String::new();
        let (mut count, mut dropped) = (0, 0u32);
        let members: Box<dyn Iterator<Item = &str>> = match header {
            TagHeader::SurrogateKey => Box::new(value.split_ascii_whitespace()),
            TagHeader::CacheTag => Box::new(value.split(',').map(str::trim)),
        };
        for tag in members.filter(|t| !t.is_empty()) {
            if !is_tag(tag) {
                dropped += 1;
                continue;
            }
            if text.split(' ').any(|t| t == tag) {
                continue;
            }
            let more = usize::from(!text.is_empty()) + tag.len();
            if count == MAX_TAGS_PER_VERSION || text.len() + more > MAX_TAGS_BYTES {
                dropped += 1;
                continue;
            }
            if !text.is_empty() {
                text.push(' ');
            }
            text.push_str(tag);
            count += 1;
        }
        (Tags::from_valid(text), dropped)
    }

    /// The tags a record holds (`as_str`'s text); None when it breaks a rule `parse` keeps.
    pub fn from_text(text: &str) -> Option<Tags> {
        if text.is_empty() {
            return Some(Tags::default());
        }
        Tags::is_text(text).then(|| Tags::from_valid(text.to_string()))
    }

    /// Whether `text` is a list `from_text` takes (checked in place: replay's).
    pub fn is_text(text: &str) -> bool {
        text.is_empty()
            || text.len() <= MAX_TAGS_BYTES
                && text.split(' ').count() <= MAX_TAGS_PER_VERSION
                && text
                    .split(' ')
                    .enumerate()
                    .all(|(i, tag)| is_tag(tag) && !text.split(' ').take(i).any(|t| t == tag))
    }

    /// `text` as it is, valid or not: replay holds what a record says so that
    /// `ObjectVersion::validate` refuses it as the writer would have.
    pub(crate) fn unchecked(text: String) -> Tags {
        Tags::from_valid(text)
    }

    fn from_valid(text: String) -> Tags {
        Tags((!text.is_empty()).then(|| Arc::new(text)))
    }

    /// The tags joined by single spaces ("" when none): what the record holds.
    pub fn as_str(&self) -> &str {
        self.0.as_deref().map_or("", String::as_str)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// Whether `tag` is one of them.
    pub fn contains(&self, tag: &str) -> bool {
        self.iter().any(|t| t == tag)
    }

    /// Each tag.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.as_deref().into_iter().flat_map(|t| t.split(' '))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(header: TagHeader, value: &str) -> (Vec<String>, u32) {
        let (t, dropped) = Tags::parse(header, value);
        (t.iter().map(str::to_string).collect(), dropped)
    }

    #[test]
    fn each_header_has_its_separator() {
        assert_eq!(
            tags(
                TagHeader::SurrogateKey,
                "  build-1234 \t game/x  build-1234 "
            ),
            (vec!["build-1234".to_string(), "game/x".into()], 0)
        );
        assert_eq!(
            tags(TagHeader::CacheTag, "build-1234, game/x,,other ,build-1234"),
            (
                vec!["build-1234".to_string(), "game/x".into(), "other".into()],
                0
            )
        );
        // A comma-list member with a space inside is no tag; a Surrogate-Key keeps commas.
        assert_eq!(
            tags(TagHeader::CacheTag, "a b, c"),
            (vec!["c".to_string()], 1)
        );
        assert_eq!(
            tags(TagHeader::SurrogateKey, "a,b c"),
            (vec!["a,b".to_string(), "c".into()], 0)
        );
        assert_eq!(tags(TagHeader::SurrogateKey, ""), (vec![], 0));
        assert!(Tags::parse(TagHeader::CacheTag, " , ").0.is_empty());
        assert_eq!(TagHeader::from_name("cache-TAG"), Some(TagHeader::CacheTag));
        assert_eq!(TagHeader::from_name("X-Tags"), None);
    }

    #[test]
    fn tags_past_a_bound_are_dropped_and_counted() {
        let long = "x".repeat(MAX_TAG_BYTES + 1);
        let just = "y".repeat(MAX_TAG_BYTES);
        assert_eq!(
            tags(
                TagHeader::SurrogateKey,
                &format!("a {long} {just} caf\u{e9}")
            ),
            (vec!["a".to_string(), just.clone()], 2)
        );
        let many: Vec<String> = (0..MAX_TAGS_PER_VERSION + 5)
            .map(|i| format!("t{i}"))
            .collect();
        let (kept, dropped) = tags(TagHeader::SurrogateKey, &many.join(" "));
        assert_eq!((kept.len(), dropped), (MAX_TAGS_PER_VERSION, 5));
        assert_eq!(kept, many[..MAX_TAGS_PER_VERSION]);
        // Long tags fill the byte bound before the count's.
        let big: Vec<String> = (0..20).map(|i| format!("{i:0>200}")).collect();
        let (t, dropped) = Tags::parse(TagHeader::CacheTag, &big.join(","));
        assert!(t.as_str().len() <= MAX_TAGS_BYTES);
        assert_eq!(t.iter().count() + dropped as usize, 20);
        assert!(dropped > 0);
    }

    #[test]
    fn the_record_text_round_trips_and_bad_text_is_refused() {
        let (t, _) = Tags::parse(TagHeader::SurrogateKey, "build-1234 other");
        assert_eq!(t.as_str(), "build-1234 other");
        assert!(t.contains("other") && !t.contains("build") && !t.contains(""));
        assert_eq!(Tags::from_text(t.as_str()), Some(t));
        assert_eq!(Tags::from_text(""), Some(Tags::default()));
        for bad in ["a  b", " a", "a ", "a a", "a\tb", "caf\u{e9}"] {
            assert_eq!(Tags::from_text(bad), None, "{bad:?}");
        }
        let too_many: Vec<String> = (0..=MAX_TAGS_PER_VERSION)
            .map(|i| format!("t{i}"))
            .collect();
        assert_eq!(Tags::from_text(&too_many.join(" ")), None);
        assert!(is_tag("build-1234") && !is_tag("") && !is_tag("a b"));
        // What every version pays in memory, tagged or not.
        assert_eq!(std::mem::size_of::<Tags>(), 8);
    }
}
