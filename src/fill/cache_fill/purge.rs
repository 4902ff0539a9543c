//! Purge by tag: the fill keeps each version's purge tags (`cache::tags`, from the field its
//! origin entry names) and retires every version carrying a tag in one call.

use std::sync::atomic::Ordering;

use super::{FillCore, Routed, Signals};
use crate::cache::journal::Record;
use crate::cache::tags::Tags;
use crate::origin::contract::HeadFields;

/// Where `Signals::stats` keeps the versions purged by tag (after `FillStats`' five, which
/// the lock's release publishes; these are counted in place, under the lock).
const PURGED_BY_TAG: usize = 5;
/// Where it keeps the purge tags dropped over their bounds.
const TAGS_DROPPED: usize = 6;

/// (versions purged by tag, purge tags dropped) of `signals`.
pub(super) fn counts(signals: &Signals) -> (u64, u64) {
    let load = |i: usize| signals.stats[i].load(Ordering::Relaxed);
    (load(PURGED_BY_TAG), load(TAGS_DROPPED))
}

impl<W: Clone + PartialEq + Routed> FillCore<W> {
    /// The purge tags of a reply of origin `origin` with `fields` (the field its entry's
    /// `purge_tag_header` names); those over the bounds are dropped and counted.
    pub(super) fn tags_of(&mut self, origin: usize, fields: &HeadFields) -> Tags {
        let header = self
            .cfg
            .origin_policies
            .get(origin)
            .map(|p| p.purge_tag_header)
            .unwrap_or_default();
        let value = match header {
            crate::cache::tags::TagHeader::SurrogateKey => &fields.surrogate_key,
            crate::cache::tags::TagHeader::CacheTag => &fields.cache_tag,
        };
        if value.is_empty() {
            return Tags::default();
        }
        let (tags, dropped) = Tags::parse(header, value);
        if dropped > 0 {
            tracing::debug!(
                origin = self.origin_name(origin),
                dropped,
                "purge tags over their bounds dropped"
            );
        }
        self.signals.stats[TAGS_DROPPED].fetch_add(u64::from(dropped), Ordering::Relaxed);
        tags
    }

    /// Retires every current version tagged `tag`, over all origins: the next request for
    /// each fetches from the origin again. Each goes for good at once, in the journal too: a
    /// version still read or filled is dropped when that ends, but its `Drop` record is
    /// queued now, so a restart before then does not bring it back. Returns the versions
    /// purged.
    pub fn purge_tag(&mut self, tag: &str) -> usize {
        // Read in place under the lock: nothing decoded per version.
        let tagged: Vec<u64> = self
            .index
            .each_version_id()
            .filter(|&v| {
                self.index.view(v).is_some_and(|m| m.has_tag(tag)) && self.index.is_current(v)
            })
            .collect();
        for &v in &tagged {
            if self.pins.contains_key(&v) {
                // Replay forgets it here; the second Drop at its last unpin names nothing.
                self.queue_record(Record::Drop { version: v });
            }
            self.retire(v);
        }
        self.signals.stats[PURGED_BY_TAG].fetch_add(tagged.len() as u64, Ordering::Relaxed);
        self.flush();
        tagged.len()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{FillConfig, OriginPolicy, COMPACT_MIN_BYTES};
    use super::*;
    use crate::cache::index::ObjectVersion;
    use crate::cache::tags::TagHeader;
    use crate::config::origin::CachePolicy;

    fn core(dir: &std::path::Path) -> FillCore<usize> {
        let policy = |purge_tag_header| OriginPolicy {
            cache_policy: CachePolicy::Origin,
            ttl_s: None,
            stale_if_error_s: 0,
            purge_tag_header,
        };
        let cfg = FillConfig {
            block_bytes: 65_536,
            read_ahead_blocks: 0,
            max_run_blocks: 1,
            slot_bytes: 1 << 20,
            align_bytes: 4096,
            max_attempts: 1,
            sync_every_blocks: 1,
            max_bytes: 0,
            revalidate_s: 3600,
            heuristic_max_s: crate::config::DEFAULT_CACHE_HEURISTIC_MAX_S,
            not_found_s: 0,
            origin_names: vec!["a".into(), "b".into()],
            origin_policies: vec![policy(TagHeader::SurrogateKey), policy(TagHeader::CacheTag)],
            open_files: 1,
            compact_min_bytes: COMPACT_MIN_BYTES,
        };
        FillCore::open(dir, cfg, 1).unwrap()
    }

    /// A version of `key` tagged `tags`, journaled and indexed as a fill's head does.
    fn add(core: &mut FillCore<usize>, key: &str, version: u64, tags: Tags) {
        let meta = ObjectVersion {
            key: key.as_bytes().to_vec(),
            version,
            size: 10,
            block_bytes: 65_536,
            fetched_unix_s: 1,
            etag: String::new(),
            last_modified: String::new(),
            content_type: String::new(),
            freshness: Default::default(),
            headers: String::new(),
            status: 200,
            selecting: String::new(),
            tags,
        };
        core.queue_record(Record::Object(meta.clone()));
        assert!(core.index.apply(Record::Object(meta)));
        core.flush();
    }

    #[test]
    fn tags_come_from_the_field_the_origin_entry_names() {
        let dir = tempfile::tempdir().unwrap();
        let mut core = core(dir.path());
        let fields = HeadFields::collect(
            b"HTTP/1.1 200 OK\r\nSurrogate-Key: s1 s2\r\nCache-Tag: c1,c2\r\nCache-Tag: c3\r\n\r\n",
        );
        assert_eq!(core.tags_of(0, &fields).as_str(), "s1 s2");
        assert_eq!(core.tags_of(1, &fields).as_str(), "c1 c2 c3");
        let long = format!(
            "HTTP/1.1 200 OK\r\nSurrogate-Key: ok {}\r\n\r\n",
            "x".repeat(crate::cache::tags::MAX_TAG_BYTES + 1)
        );
        let fields = HeadFields::collect(long.as_bytes());
        assert_eq!(core.tags_of(0, &fields).as_str(), "ok");
        assert_eq!(counts(&core.signals).1, 1, "the long one, counted");
    }

    /// Every current version carrying the tag goes, in the journal too, at once: one still
    /// being read stays readable until its last unpin, but a restart before then (a replay
    /// of the journal) does not bring it back.
    #[test]
    fn a_purge_by_tag_is_journaled_at_once_even_for_a_version_being_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut core = core(dir.path());
        let t = |s: &str| Tags::parse(TagHeader::SurrogateKey, s).0;
        add(&mut core, "\0\0a", 1, t("build-1234 other"));
        add(&mut core, "\0\0b", 2, t("build-1234"));
        add(&mut core, "\0\0c", 3, t("other"));
        add(&mut core, "\0\0d", 4, Tags::default());
        core.pin(2);
        assert_eq!(core.purge_tag("build-1234"), 2);
        assert_eq!(core.purge_tag("build-1234"), 0, "already gone");
        assert_eq!(counts(&core.signals).0, 2);
        assert!(core.index.current(b"\0\0a").is_none());
        assert!(core.index.current(b"\0\0b").is_none());
        assert!(core.index.meta(2).is_some(), "still read: readable");
        assert!(core.index.current(b"\0\0c").is_some());
        let replayed = |dir: &std::path::Path| {
            let bytes = std::fs::read(dir.join("journal")).unwrap();
            crate::cache::journal::replay(&bytes).0
        };
        let index = replayed(dir.path());
        assert!(
            index.meta(1).is_none() && index.meta(2).is_none(),
            "gone after a restart"
        );
        assert_eq!(
            index.current(b"\0\0c").map(|m| m.tags.as_str().to_string()),
            Some("other".to_string())
        );
        assert!(index.current(b"\0\0d").is_some());
        core.unpin(2);
        assert!(core.index.meta(2).is_none(), "dropped at its last unpin");
        let index = replayed(dir.path());
        assert_eq!((index.keys(), index.versions()), (2, 2));
    }
}
