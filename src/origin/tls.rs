//! TLS to an `https://` origin as a sans-IO layer: rustls's unbuffered client connection
//! runs the handshake and seals and opens records in buffers the caller owns (parts of the
//! fetch's arena slot), so the fetch machine (`origin::fetch`) only ever sees plaintext. The
//! caller (`fill::Filler`) moves the bytes with the ring.
//!
//! Received records are opened in place; their plaintext is copied to where the machine asked
//! for it (one pass over each byte: the AEAD leaves it in the record, between its header and
//! tag). A record whose plaintext does not fit the room asked for leaves the rest here, at
//! most one record's worth, for the next read.

use std::sync::Arc;

use rustls::client::UnbufferedClientConnection;
use rustls::pki_types::ServerName;
use rustls::unbuffered::{ConnectionState, UnbufferedStatus};
use rustls::ClientConfig;

/// Most plaintext held back between two reads (the rest of one record).
pub const MAX_CARRY_BYTES: usize = 16 * 1024 + 256;
/// Most rounds of rustls's state machine one call runs (each round consumes input or
/// produces output; a peer cannot make a call loop for ever).
const ROUNDS_MAX: usize = 64;
/// Room for TLS bytes rustls produces outside a write (a KeyUpdate answer).
const QUEUED_OUT_MAX_BYTES: usize = 1024;

/// One TLS connection to an origin.
pub struct OriginTls {
    conn: UnbufferedClientConnection,
    established: bool,
    /// Opened plaintext the caller had no room for yet.
    carry: Vec<u8>,
    /// TLS bytes rustls produced while reading (sent before the next request's records).
    queued_out: Vec<u8>,
    /// The origin sent close_notify.
    closed: bool,
}

impl std::fmt::Debug for OriginTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OriginTls")
            .field("established", &self.established)
            .field("carry", &self.carry.len())
            .field("closed", &self.closed)
            .finish()
    }
}

/// What the handshake needs next.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Send the first `n` bytes written into `out`, then call `handshake` again (or, once
    /// `established`, go on to the request).
    Send(usize),
    /// Receive more bytes after the ones kept.
    NeedInput,
    /// The handshake is done: requests may be sealed.
    Established,
    /// The handshake failed (why).
    Failed(String),
}

/// What one `read` did.
#[derive(Debug, PartialEq, Eq)]
pub struct Read {
    /// Received bytes used from the front of `incoming` (the caller drops them).
    pub consumed: usize,
    /// Plaintext bytes written to the front of `dest`.
    pub delivered: usize,
    /// The origin closed the connection with close_notify (nothing more will come).
    pub closed: bool,
}

impl OriginTls {
    /// A connection to `name` under `config`.
    pub fn new(config: Arc<ClientConfig>, name: ServerName<'static>) -> Result<OriginTls, String> {
        Ok(OriginTls {
            conn: UnbufferedClientConnection::new(config, name).map_err(|e| e.to_string())?,
            established: false,
            carry: Vec::new(),
            queued_out: Vec::new(),
            closed: false,
        })
    }

    /// Whether the handshake is done.
    pub fn established(&self) -> bool {
        self.established
    }

    /// Nothing received is left over (no held-back plaintext, no close): the connection
    /// may carry another request.
    pub fn idle(&self) -> bool {
        self.carry.is_empty() && !self.closed
    }

    /// Runs the handshake over `incoming` (the bytes received and not yet used), writing
    /// what is to be sent into `out`. Returns how many incoming bytes were used (the caller
    /// drops them from the front) and what is next.
    pub fn handshake(&mut self, incoming: &mut [u8], out: &mut [u8]) -> (usize, Step) {
        let mut used = 0;
        let mut written = 0;
        for _ in 0..ROUNDS_MAX {
            let UnbufferedStatus { discard, state } =
                self.conn.process_tls_records(&mut incoming[used..]);
            let next = match state {
                Err(e) => Some(Step::Failed(e.to_string())),
                Ok(ConnectionState::EncodeTlsData(mut enc)) => {
                    match enc.encode(&mut out[written..]) {
                        Ok(n) => {
                            written += n;
                            None
                        }
                        Err(e) => Some(Step::Failed(format!("handshake flight: {e}"))),
                    }
                }
                // The bytes wait in `out`; rustls needs nothing more of them.
                Ok(ConnectionState::TransmitTlsData(t)) => {
                    t.done();
                    None
                }
                Ok(ConnectionState::BlockedHandshake) if written > 0 => Some(Step::Send(written)),
                Ok(ConnectionState::BlockedHandshake) => Some(Step::NeedInput),
                // Records after the handshake (a ticket, the answer) are `read`'s.
                Ok(ConnectionState::WriteTraffic(_) | ConnectionState::ReadTraffic(_)) => {
                    self.established = true;
                    Some(if written > 0 {
                        Step::Send(written)
                    } else {
                        Step::Established
                    })
                }
                Ok(ConnectionState::PeerClosed | ConnectionState::Closed) => Some(Step::Failed(
                    "the origin closed during the handshake".into(),
                )),
                Ok(other) => Some(Step::Failed(format!("unexpected TLS state {other:?}"))),
            };
            used += discard;
            if let Some(step) = next {
                return (used, step);
            }
        }
        (used, Step::Failed("the handshake did not progress".into()))
    }

    /// Seals `plain` into records in `out` (after any TLS bytes rustls queued meanwhile);
    /// returns how many bytes of `out` are to be sent.
    pub fn encrypt(&mut self, plain: &[u8], out: &mut [u8]) -> Result<usize, String> {
        let mut written = self.queued_out.len();
        if written > out.len() {
            return Err("no room for queued TLS bytes".into());
        }
        out[..written].copy_from_slice(&self.queued_out);
        self.queued_out.clear();
        for _ in 0..ROUNDS_MAX {
            let UnbufferedStatus { discard, state } = self.conn.process_tls_records(&mut []);
            debug_assert_eq!(discard, 0);
            match state.map_err(|e| e.to_string())? {
                ConnectionState::EncodeTlsData(mut enc) => {
                    written += enc.encode(&mut out[written..]).map_err(|e| e.to_string())?;
                }
                ConnectionState::TransmitTlsData(t) => t.done(),
                ConnectionState::WriteTraffic(mut w) => {
                    written += w
                        .encrypt(plain, &mut out[written..])
                        .map_err(|e| e.to_string())?;
                    return Ok(written);
                }
                other => return Err(format!("cannot write in TLS state {other:?}")),
            }
        }
        Err("sealing did not progress".into())
    }

    /// Opens the records in `incoming` and copies their plaintext to the front of `dest`,
    /// held-back plaintext first, until `dest` is full or no whole record is left.
    pub fn read(&mut self, incoming: &mut [u8], dest: &mut [u8]) -> Result<Read, String> {
        let mut got = self.carry.len().min(dest.len());
        dest[..got].copy_from_slice(&self.carry[..got]);
        self.carry.drain(..got);
        let mut used = 0;
        for _ in 0..ROUNDS_MAX {
            if got == dest.len() || self.closed {
                break;
            }
            let UnbufferedStatus { mut discard, state } =
                self.conn.process_tls_records(&mut incoming[used..]);
            let more = match state.map_err(|e| e.to_string())? {
                ConnectionState::ReadTraffic(mut r) => {
                    let mut any = false;
                    while got < dest.len() {
                        let Some(rec) = r.next_record() else { break };
                        let rec = rec.map_err(|e| e.to_string())?;
                        discard += rec.discard;
                        let n = rec.payload.len().min(dest.len() - got);
                        dest[got..got + n].copy_from_slice(&rec.payload[..n]);
                        self.carry.extend_from_slice(&rec.payload[n..]);
                        debug_assert!(self.carry.len() <= MAX_CARRY_BYTES);
                        got += n;
                        any = true;
                    }
                    any
                }
                ConnectionState::EncodeTlsData(mut enc) => {
                    let mut buf = [0u8; QUEUED_OUT_MAX_BYTES];
                    let n = enc.encode(&mut buf).map_err(|e| e.to_string())?;
                    if self.queued_out.len() + n > QUEUED_OUT_MAX_BYTES {
                        return Err("the origin makes us queue too much".into());
                    }
                    self.queued_out.extend_from_slice(&buf[..n]);
                    true
                }
                ConnectionState::TransmitTlsData(t) => {
                    t.done();
                    true
                }
                // No whole record left: more input is needed.
                ConnectionState::WriteTraffic(_) | ConnectionState::BlockedHandshake => false,
                ConnectionState::PeerClosed | ConnectionState::Closed => {
                    self.closed = true;
                    false
                }
                other => return Err(format!("unexpected TLS state {other:?}")),
            };
            used += discard;
            if !more {
                break;
            }
        }
        Ok(Read {
            consumed: used,
            delivered: got,
            closed: self.closed && self.carry.is_empty(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::testing::{client_config, generate, KeyKind};
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use std::io::{Read as _, Write as _};

    /// A rustls server (the buffered API) for `name`, and a client config that trusts it.
    fn server_and_client(name: &str) -> (rustls::ServerConnection, Arc<ClientConfig>) {
        let (cert_pem, key_pem) = generate(KeyKind::EcdsaP256, &[name]);
        let cert = CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap();
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap();
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.clone()], key)
            .unwrap();
        let server = rustls::ServerConnection::new(Arc::new(server)).unwrap();
        (server, Arc::new(client_config(&cert, None)))
    }

    /// Everything the server wants to send, as bytes.
    fn from_server(server: &mut rustls::ServerConnection) -> Vec<u8> {
        let mut out = Vec::new();
        while server.wants_write() {
            server.write_tls(&mut out).unwrap();
        }
        out
    }

    fn to_server(server: &mut rustls::ServerConnection, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let n = server.read_tls(&mut bytes).unwrap();
            assert!(n > 0);
            server.process_new_packets().unwrap();
        }
    }

    /// A handshake, a request sealed and read by the server, and an answer of several
    /// records read back through a room smaller than a record: every byte arrives, in order.
    #[test]
    fn a_handshake_a_request_and_an_answer_through_a_small_room() {
        let (mut server, config) = server_and_client("origin.test");
        let mut tls = OriginTls::new(config, ServerName::try_from("origin.test").unwrap()).unwrap();
        let mut incoming = Vec::new();
        let mut out = vec![0u8; 64 * 1024];
        for _ in 0..16 {
            let mut buf = incoming.clone();
            let (used, step) = tls.handshake(&mut buf, &mut out);
            incoming = buf[used..].to_vec();
            match step {
                Step::Send(n) => to_server(&mut server, &out[..n]),
                Step::NeedInput => incoming.extend(from_server(&mut server)),
                Step::Established => break,
                Step::Failed(e) => panic!("{e}"),
            }
            if tls.established() && !server.is_handshaking() {
                break;
            }
        }
        assert!(tls.established() && !server.is_handshaking());
        let n = tls.encrypt(b"GET / HTTP/1.1\r\n\r\n", &mut out).unwrap();
        to_server(&mut server, &out[..n]);
        let mut got = [0u8; 64];
        let len = server.reader().read(&mut got).unwrap();
        assert_eq!(&got[..len], b"GET / HTTP/1.1\r\n\r\n");
        // 40 000 bytes of answer: three records of at most 16 KiB.
        let answer: Vec<u8> = (0..40_000u32).map(|i| (i % 251) as u8).collect();
        server.writer().write_all(&answer).unwrap();
        server.send_close_notify();
        incoming.extend(from_server(&mut server));
        let mut plain = Vec::new();
        let mut room = [0u8; 7_000];
        let mut closed = false;
        for _ in 0..100 {
            let r = tls.read(&mut incoming, &mut room).unwrap();
            incoming.drain(..r.consumed);
            plain.extend_from_slice(&room[..r.delivered]);
            if r.closed {
                closed = true;
                break;
            }
        }
        assert!(closed, "close_notify seen once every byte was delivered");
        assert!(plain == answer, "{} of {} bytes", plain.len(), answer.len());
        assert!(!tls.idle());
    }

    /// A certificate for another name fails the handshake.
    #[test]
    fn a_certificate_for_another_name_is_refused() {
        let (mut server, config) = server_and_client("other.test");
        let mut tls = OriginTls::new(config, ServerName::try_from("origin.test").unwrap()).unwrap();
        let mut out = vec![0u8; 64 * 1024];
        let mut incoming = Vec::new();
        for _ in 0..16 {
            let mut buf = incoming.clone();
            let (used, step) = tls.handshake(&mut buf, &mut out);
            incoming = buf[used..].to_vec();
            match step {
                Step::Send(n) => to_server(&mut server, &out[..n]),
                Step::NeedInput => incoming.extend(from_server(&mut server)),
                Step::Established => panic!("a wrong name was accepted"),
                Step::Failed(e) => {
                    assert!(
                        e.contains("certificate") || e.contains("Certificate"),
                        "{e}"
                    );
                    return;
                }
            }
        }
        panic!("no verdict");
    }
}
