//! Session-ticket keys shared by every edge behind the balancer, so a client resumes on any
//! of them (TLS 1.3 and 1.2 alike: rustls uses one ticketer for both).
//!
//! `tls_ticket_key_file` holds one or two keys of `TICKET_KEY_BYTES` each, raw (`openssl rand
//! 48 > key`, or `shardline tls new-ticket-key FILE`, which keeps the old current key as the
//! previous one): the first encrypts and decrypts, the second only decrypts, so tickets issued
//! before a rotation still resume. Rotate by replacing the file on every edge and sending
//! SIGHUP. A ticket is `name (16) | nonce (12) | AES-256-GCM(session) | tag (16)` with the
//! name as additional data; the nonce is random because several processes share the key.

use std::path::Path;

use aws_lc_rs::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};

use super::TlsError;

/// Bytes of one ticket key in the key file: a 16-byte name and a 32-byte AES-256-GCM key.
pub const TICKET_KEY_BYTES: usize = 48;
/// Bytes of a key's name (sent in every ticket, so the right key is found).
const KEY_NAME_BYTES: usize = 16;
/// Bytes of a ticket's nonce.
const NONCE_BYTES: usize = 12;
/// Bytes of a ticket's tag.
const TAG_BYTES: usize = 16;
/// Largest ticket accepted for decryption (rustls's own tickets are a few hundred bytes).
pub const TICKET_MAX_BYTES: usize = 4096;

struct TicketKey {
    name: [u8; KEY_NAME_BYTES],
    aead: LessSafeKey,
}

impl TicketKey {
    fn from_bytes(raw: &[u8]) -> Option<TicketKey> {
        let (name, key) = raw.split_at(KEY_NAME_BYTES);
        Some(TicketKey {
            name: name.try_into().ok()?,
            aead: LessSafeKey::new(UnboundKey::new(&aead::AES_256_GCM, key).ok()?),
        })
    }
}

/// Ticket keys from `tls_ticket_key_file`: the current one and, optionally, the previous.
pub struct FileTicketer {
    current: TicketKey,
    previous: Option<TicketKey>,
    lifetime_s: u32,
}

impl std::fmt::Debug for FileTicketer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileTicketer")
            .field("previous", &self.previous.is_some())
            .field("lifetime_s", &self.lifetime_s)
            .finish_non_exhaustive()
    }
}

impl FileTicketer {
    /// Reads `path` (48 or 96 bytes); tickets are announced as valid for `lifetime_s`.
    pub fn load(path: &Path, lifetime_s: u32) -> Result<FileTicketer, TlsError> {
        let raw = std::fs::read(path).map_err(|e| TlsError::file(path, e.to_string()))?;
        FileTicketer::from_bytes(&raw, lifetime_s).ok_or_else(|| {
            TlsError::file(
                path,
                format!(
                    "{} bytes; a ticket key file holds {TICKET_KEY_BYTES} bytes (current key) or \
                     {} (current, then previous)",
                    raw.len(),
                    2 * TICKET_KEY_BYTES
                ),
            )
        })
    }

    /// Keys from the file's bytes; None unless one or two whole keys with distinct names.
    pub fn from_bytes(raw: &[u8], lifetime_s: u32) -> Option<FileTicketer> {
        let (current, previous) = match raw.len() {
            TICKET_KEY_BYTES => (TicketKey::from_bytes(raw)?, None),
            n if n == 2 * TICKET_KEY_BYTES => {
                let (a, b) = raw.split_at(TICKET_KEY_BYTES);
                (TicketKey::from_bytes(a)?, Some(TicketKey::from_bytes(b)?))
            }
            _ => return None,
        };
        if previous.as_ref().is_some_and(|p| p.name == current.name) {
            return None;
        }
        Some(FileTicketer {
            current,
            previous,
            lifetime_s,
        })
    }
}

impl rustls::server::ProducesTickets for FileTicketer {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        self.lifetime_s
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let mut nonce = [0u8; NONCE_BYTES];
        aws_lc_rs::rand::fill(&mut nonce).ok()?;
        let mut out = Vec::with_capacity(KEY_NAME_BYTES + NONCE_BYTES + plain.len() + TAG_BYTES);
        out.extend_from_slice(&self.current.name);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(plain);
        let body = &mut out[KEY_NAME_BYTES + NONCE_BYTES..];
        let tag = self
            .current
            .aead
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(self.current.name),
                body,
            )
            .ok()?;
        out.extend_from_slice(tag.as_ref());
        Some(out)
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        if cipher.len() < KEY_NAME_BYTES + NONCE_BYTES + TAG_BYTES
            || cipher.len() > TICKET_MAX_BYTES
        {
            return None;
        }
        let (name, rest) = cipher.split_at(KEY_NAME_BYTES);
        let key = [Some(&self.current), self.previous.as_ref()]
            .into_iter()
            .flatten()
            .find(|k| k.name == name)?;
        let (nonce, sealed) = rest.split_at(NONCE_BYTES);
        let nonce: [u8; NONCE_BYTES] = nonce.try_into().ok()?;
        let mut buf = sealed.to_vec();
        let plain = key
            .aead
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(key.name),
                &mut buf,
            )
            .ok()?;
        let n = plain.len();
        buf.truncate(n);
        Some(buf)
    }
}

/// A fresh key file's bytes: a new random key, then `old`'s current key (if it holds one)
/// as the previous, so tickets issued before the rotation keep resuming.
pub fn rotated_key_file(old: Option<&[u8]>) -> Result<Vec<u8>, TlsError> {
    let mut out = vec![0u8; TICKET_KEY_BYTES];
    aws_lc_rs::rand::fill(&mut out)
        .map_err(|_| TlsError::file(Path::new("-"), "no random bytes from the system"))?;
    if let Some(old) =
        old.filter(|o| o.len() == TICKET_KEY_BYTES || o.len() == 2 * TICKET_KEY_BYTES)
    {
        out.extend_from_slice(&old[..TICKET_KEY_BYTES]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::server::ProducesTickets;

    fn key(fill: u8) -> Vec<u8> {
        (0..TICKET_KEY_BYTES as u8).map(|i| i ^ fill).collect()
    }

    #[test]
    fn tickets_round_trip_and_survive_one_rotation() {
        let a = FileTicketer::from_bytes(&key(1), 3600).unwrap();
        let t = a.encrypt(b"session state").unwrap();
        assert_eq!(a.decrypt(&t).unwrap(), b"session state");
        // Rotated: new current, old as previous; the old ticket still opens.
        let mut file = key(2);
        file.extend_from_slice(&key(1));
        let b = FileTicketer::from_bytes(&file, 3600).unwrap();
        assert_eq!(b.decrypt(&t).unwrap(), b"session state");
        let t2 = b.encrypt(b"new").unwrap();
        assert_eq!(&t2[..KEY_NAME_BYTES], &key(2)[..KEY_NAME_BYTES]);
        assert!(
            a.decrypt(&t2).is_none(),
            "an edge without the new key cannot resume it"
        );
        // Rotated again: the first key is gone.
        let mut file = key(3);
        file.extend_from_slice(&key(2));
        let c = FileTicketer::from_bytes(&file, 3600).unwrap();
        assert!(c.decrypt(&t).is_none());
        assert_eq!(c.decrypt(&t2).unwrap(), b"new");
    }

    #[test]
    fn tampered_short_and_oversized_tickets_are_refused() {
        let a = FileTicketer::from_bytes(&key(1), 60).unwrap();
        let mut t = a.encrypt(b"x").unwrap();
        let last = t.len() - 1;
        t[last] ^= 1;
        assert!(a.decrypt(&t).is_none());
        assert!(a.decrypt(&t[..20]).is_none());
        assert!(a.decrypt(&vec![0u8; TICKET_MAX_BYTES + 1]).is_none());
        assert!(a.decrypt(&[]).is_none());
    }

    #[test]
    fn key_files_of_the_wrong_size_or_duplicate_names_are_refused() {
        assert!(FileTicketer::from_bytes(&[0u8; 47], 1).is_none());
        assert!(FileTicketer::from_bytes(&[0u8; 95], 1).is_none());
        let mut dup = key(1);
        dup.extend_from_slice(&key(1));
        assert!(FileTicketer::from_bytes(&dup, 1).is_none());
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k");
        std::fs::write(&p, b"short").unwrap();
        let e = FileTicketer::load(&p, 1).unwrap_err();
        assert_eq!(e.file, p);
        assert!(e.message.contains("48 bytes"), "{e}");
    }

    #[test]
    fn rotation_keeps_the_old_current_key_as_previous() {
        let first = rotated_key_file(None).unwrap();
        assert_eq!(first.len(), TICKET_KEY_BYTES);
        let second = rotated_key_file(Some(&first)).unwrap();
        assert_eq!(second.len(), 2 * TICKET_KEY_BYTES);
        assert_eq!(&second[TICKET_KEY_BYTES..], &first[..]);
        let third = rotated_key_file(Some(&second)).unwrap();
        assert_eq!(&third[TICKET_KEY_BYTES..], &second[..TICKET_KEY_BYTES]);
        FileTicketer::from_bytes(&third, 1).unwrap();
    }
}
