//! One connection's TLS: the handshake driven through rustls's unbuffered (sans-IO) API, then
//! the record state of `record.rs` (keys, sequence numbers, what is due next).
//!
//! The connection machine owns a `TlsSession` and calls it with the bytes it received; what
//! the session wants sent goes to `outgoing`, which the shard swaps into the connection's
//! header buffer and sends. After the handshake, rustls is kept only as a
//! `KernelConnection` (it computes the next traffic secret at a TLS 1.3 KeyUpdate); every
//! record is sealed and opened here.

use std::sync::Arc;

use rustls::kernel::KernelConnection;
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncodeError, UnbufferedStatus};
use rustls::{HandshakeKind, ProtocolVersion, ServerConfig, SupportedCipherSuite};

use super::record::{
    alert, RecordCut, RecordError, RecordKey, CONTENT_ALERT, CONTENT_APPLICATION_DATA,
    CONTENT_HANDSHAKE, MAX_PLAINTEXT_BYTES, RECORD_HEADER_BYTES,
};
use super::sniff::{self, FirstBytes};

/// Most TLS bytes a connection buffers before its handshake completes: the largest handshake
/// message rustls accepts (`MAX_HANDSHAKE_SIZE`, 64 KiB; OpenSSL's ClientHello limit is
/// 128 KiB), with the headers of the records it spans and room behind it. Post-quantum key
/// shares make ClientHellos grow (one ML-KEM share is ~1.2 KiB, hybrids and lists more). More
/// is refused with a handshake_failure alert.
pub const HANDSHAKE_INCOMING_MAX_BYTES: usize = 72 * 1024;
/// Longest handshake message rustls takes (its `MAX_HANDSHAKE_SIZE`, 64 KiB); a ClientHello
/// that says it is longer gets decode_error from our precheck, where rustls would close without
/// an alert: what OpenSSL answers a ClientHello whose body is longer than its content
/// (tlsfuzzer's test-truncating-of-client-hello pads one past 64 KiB and expects it). OpenSSL
/// takes ClientHellos up to 128 KiB: the bound is rustls's deframer's, which the transcript
/// hash keeps us from working around (the message must reach it whole).
pub const HANDSHAKE_MESSAGE_MAX_BYTES: u32 = 0xffff;
/// Largest plaintext record fragment (2^14, RFC 8446 5.1); a longer plaintext handshake
/// record gets record_overflow.
const PLAINTEXT_RECORD_MAX_BYTES: usize = 16 * 1024;
/// Highest ClientHello `legacy_version` refused with protocol_version (SSL 3.0, RFC 8446
/// D.5).
const LEGACY_VERSION_REFUSED_MAX: u16 = 0x0300;
/// Most TLS bytes buffered after the handshake: one whole record of the largest size, plus a
/// receive buffer's worth that arrived behind it.
pub const INCOMING_MAX_BYTES: usize = super::record::MAX_RECORD_BYTES + 4096;
/// Records of our own per key before a TLS 1.3 KeyUpdate is sent (half of AES-GCM's
/// confidentiality limit of 2^24 full records, RFC 8446 5.5), or before a TLS 1.2 connection
/// stops keeping alive (it has no KeyUpdate).
pub const RECORDS_PER_KEY_SOFT_MAX: u64 = 1 << 23;
/// Consecutive empty application-data records or warning alerts accepted from a client
/// (they cost work and carry nothing).
pub const EMPTY_RECORDS_MAX: u32 = 32;
/// Rounds of one handshake turn at most (each processes a message or emits a record; a
/// full TLS 1.3 flight is under 10).
const HANDSHAKE_ROUNDS_MAX: usize = 64;
/// Handshake message type of a KeyUpdate (RFC 8446 4).
const HANDSHAKE_KEY_UPDATE: u8 = 24;

/// Longest post-handshake message a client may send us, header included: a KeyUpdate (4 + 1
/// bytes) is the only one we accept (no post-handshake authentication), so anything longer is
/// refused as soon as its header says so.
pub const POST_HANDSHAKE_MESSAGE_MAX_BYTES: usize = 5;

/// A TLS 1.3 KeyUpdate handshake message (type 24, length 1, update_not_requested).
const KEY_UPDATE_NOT_REQUESTED: [u8; 5] = [24, 0, 0, 1, 0];

/// The answer to cleartext HTTP on the TLS port (nginx says the same), then a close.
pub static PLAIN_HTTP_ON_TLS_PORT: &[u8] = b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 46\r\nConnection: close\r\n\r\nThe plain HTTP request was sent to HTTPS port\n";

/// TLS version of an established connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// TLS 1.2.
    Tls12,
    /// TLS 1.3.
    Tls13,
}

impl Version {
    /// As logged: `TLSv1.2`, `TLSv1.3`.
    pub fn as_str(self) -> &'static str {
        match self {
            Version::Tls12 => "TLSv1.2",
            Version::Tls13 => "TLSv1.3",
        }
    }
}

/// What a handshake settled, for the access log and metrics.
#[derive(Clone, Debug)]
pub struct Facts {
    /// Protocol version.
    pub version: Version,
    /// Cipher suite (IANA name).
    pub cipher: &'static str,
    /// The SNI name the client sent, if any.
    pub sni: Option<Box<str>>,
    /// The client resumed a session (ticket).
    pub resumed: bool,
}

/// A record that went out in part and was given back: the next run starts with it again,
/// sealed with the same length and sequence number, and its first `skip` bytes (already
/// sent) are not sent twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resume {
    /// Plaintext bytes of the record.
    pub len: u32,
    /// Ciphertext bytes of it that already left.
    pub skip: u32,
}

/// How to seal the next run of plaintext (`plan_run`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunPlan {
    /// How the run is cut into records.
    pub cut: RecordCut,
    /// Sequence number of its first record.
    pub first_seq: u64,
    /// Ciphertext bytes at its front that already left (a resumed record).
    pub skip: u32,
}

/// The outcome of a handshake turn.
#[derive(Debug, PartialEq, Eq)]
pub enum HandshakeStep {
    /// More bytes from the client are needed (anything to send is in `outgoing`).
    NeedInput,
    /// The handshake is complete; records from now on. Application data the client sent
    /// with its Finished went to the caller's buffer.
    Complete,
    /// The client spoke cleartext HTTP: `outgoing` holds the plain 400, then close.
    PlainHttp,
    /// The handshake failed; `outgoing` holds the alert rustls chose (if any), then close.
    Failed(HandshakeFailure),
}

/// Why a handshake failed (a metrics label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeFailure {
    /// rustls refused what the client sent (version, suites, bad message...).
    Protocol,
    /// The client sent an alert or closed.
    Peer,
    /// More handshake bytes than `HANDSHAKE_INCOMING_MAX_BYTES`.
    TooLarge,
}

/// What the records a client sent after the handshake asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Received {
    /// Application data (if any) went to the caller's buffer; keep going.
    Data,
    /// The client sent close_notify: no more data will come.
    PeerClosed,
    /// The client sent a fatal alert: close without one of ours.
    PeerAlert,
    /// The client broke the protocol: `outgoing` holds our alert; close after sending it.
    Fatal,
}

enum State {
    Handshaking(Box<UnbufferedServerConnection>),
    Open(Box<Records>),
    /// Failed or finished: nothing more is processed.
    Done,
}

/// The record state of an established connection.
struct Records {
    kernel: KernelConnection<ServerConnectionData>,
    version: ProtocolVersion,
    tx: RecordKey,
    tx_seq: u64,
    rx: RecordKey,
    rx_seq: u64,
    /// The next run begins with a record that went out in part.
    resume: Option<Resume>,
    /// A KeyUpdate of ours is due before the next run (the client asked, or our key is
    /// near its limit).
    key_update_due: bool,
    /// Our records per key before the key must change (TLS 1.3) or the connection end (1.2).
    tx_records_max: u64,
    /// Consecutive empty records and warning alerts from the client.
    empties: u32,
    /// A post-handshake message received in part (RFC 8446 5.1 lets a handshake message
    /// span records): its first bytes, up to `POST_HANDSHAKE_MESSAGE_MAX_BYTES`.
    partial: [u8; POST_HANDSHAKE_MESSAGE_MAX_BYTES],
    partial_len: usize,
    /// TLS 1.2: bytes of a refused renegotiation ClientHello still to skip (it may span
    /// records).
    hello_skip: usize,
    /// TLS 1.2: a no_renegotiation warning is due (sent when the connection is idle, or
    /// before the next response head).
    no_renegotiation_due: bool,
}

/// One connection's TLS state.
pub struct TlsSession {
    state: State,
    /// TLS bytes received and not yet consumed (bounded).
    pub incoming: Vec<u8>,
    /// Bytes for the client, produced by the session (handshake flights, alerts,
    /// close_notify, KeyUpdate); the shard swaps them into the header buffer to send.
    pub outgoing: Vec<u8>,
    /// What the handshake settled (set when it completes).
    pub facts: Option<Facts>,
    sni: Option<Box<str>>,
    /// Handshake turns taken so far.
    turns: u32,
    /// The server has sent handshake records: from then on (TLS 1.3) an alert must be
    /// encrypted, which only rustls can do, so our own plaintext alerts stop.
    spoke: bool,
    /// Bytes at the front of `incoming` rustls has been given (whole records). Once the
    /// server has spoken it gets one record at a time, when it asks for more: rustls reads
    /// every record it is given, so records behind the client's Finished would be opened
    /// (and refused) by rustls rather than by our record layer.
    fed: usize,
    /// The precheck's state (until the server's first flight).
    precheck: Precheck,
}

impl std::fmt::Debug for TlsSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Handshaking(_) => "handshaking",
            State::Open(_) => "open",
            State::Done => "done",
        };
        f.debug_struct("TlsSession")
            .field("state", &state)
            .field("incoming", &self.incoming.len())
            .field("outgoing", &self.outgoing.len())
            .field("facts", &self.facts)
            .finish()
    }
}

/// Handshake message type of a ClientHello (RFC 8446 4).
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
/// Bytes at the front of the ClientHello the precheck judges: type, length (3),
/// legacy_version (2).
const CLIENT_HELLO_HEAD_BYTES: usize = 6;

/// What the precheck has seen of the client's records before the server's first flight.
/// It judges each record once, as it is handed to rustls: rustls joins a handshake message's
/// fragments in place in `incoming`, so records it was given cannot be parsed again.
#[derive(Clone, Copy, Debug, Default)]
struct Precheck {
    /// The ClientHello's first bytes, gathered over records (it may come a byte per record).
    head: [u8; CLIENT_HELLO_HEAD_BYTES],
    /// Handshake bytes seen so far (the ClientHello's, then whatever follows it).
    hs_seen: usize,
    /// Whole records judged so far.
    records: usize,
}

impl Precheck {
    /// Judges the records of `buf` from `from` on (`from` is where the last call stopped:
    /// the whole records before it were judged); returns the alert for what rustls lets
    /// through but the RFCs refuse. A record's header is judged as soon as it is in, its
    /// body when the record is whole.
    fn judge(&mut self, buf: &[u8], mut from: usize) -> Option<u8> {
        while let Some(header) = buf.get(from..from + RECORD_HEADER_BYTES) {
            let typ = header[0];
            let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
            if typ == CONTENT_HANDSHAKE && len > PLAINTEXT_RECORD_MAX_BYTES {
                return Some(alert::RECORD_OVERFLOW);
            }
            // No application data before the handshake is done, and never an empty fragment.
            if typ == CONTENT_APPLICATION_DATA && len == 0 {
                return Some(alert::UNEXPECTED_MESSAGE);
            }
            let hello_end = (self.hs_seen >= 4).then(|| {
                let [_, a, b, c, ..] = self.head;
                4 + u32::from_be_bytes([0, a, b, c]) as usize
            });
            let inside_hello = self.hs_seen > 0 && hello_end.is_none_or(|end| self.hs_seen < end);
            // Another record type inside a handshake message (RFC 8446 5.1); rustls would
            // wait for the rest of the message, or close without an alert.
            if typ != CONTENT_HANDSHAKE && inside_hello {
                return Some(alert::UNEXPECTED_MESSAGE);
            }
            let body = buf.get(from + RECORD_HEADER_BYTES..from + RECORD_HEADER_BYTES + len)?;
            if typ == CONTENT_HANDSHAKE && (self.records == 0 || inside_hello) {
                for (slot, &b) in self.head.iter_mut().skip(self.hs_seen).zip(body) {
                    *slot = b;
                }
                self.hs_seen += body.len();
                let seen = self.hs_seen.min(CLIENT_HELLO_HEAD_BYTES);
                if let Some(verdict) = judge_client_hello_head(&self.head[..seen]) {
                    return Some(verdict);
                }
                // RFC 8446 9.2's alert where rustls would answer handshake_failure.
                if self.records == 0 && sniff::tls13_hello_missing_extension(&buf[from..]) {
                    return Some(alert::MISSING_EXTENSION);
                }
            }
            self.records += 1;
            from += RECORD_HEADER_BYTES + len;
        }
        None
    }
}

/// The alert for a ClientHello from its first bytes (as many as are in), if they refuse it.
fn judge_client_hello_head(head: &[u8]) -> Option<u8> {
    // The first handshake message must be a ClientHello (RFC 8446 4.1.2); rustls answers
    // another type with decode_error, OpenSSL and tlsfuzzer expect unexpected_message.
    if head.first().is_some_and(|&t| t != HANDSHAKE_CLIENT_HELLO) {
        return Some(alert::UNEXPECTED_MESSAGE);
    }
    // Longer than rustls takes: it would be refused there without an alert.
    if let &[_, a, b, c, ..] = head {
        if u32::from_be_bytes([0, a, b, c]) > HANDSHAKE_MESSAGE_MAX_BYTES {
            return Some(alert::DECODE_ERROR);
        }
    }
    if let &[_, _, _, _, major, minor] = head {
        if u16::from_be_bytes([major, minor]) <= LEGACY_VERSION_REFUSED_MAX {
            return Some(alert::PROTOCOL_VERSION);
        }
    }
    None
}

/// The end of the whole record that starts at `from` in `buf`, if it is all in.
fn next_record_end(buf: &[u8], from: usize) -> Option<usize> {
    let header = buf.get(from..from + RECORD_HEADER_BYTES)?;
    let end = from + RECORD_HEADER_BYTES + usize::from(u16::from_be_bytes([header[3], header[4]]));
    (end <= buf.len()).then_some(end)
}

/// The end of the last whole record of those from `from` on in `buf` (`from` when none is).
fn whole_records_end(buf: &[u8], mut from: usize) -> usize {
    while let Some(end) = next_record_end(buf, from) {
        from = end;
    }
    from
}

fn records_max(suite: SupportedCipherSuite) -> u64 {
    let limit = match suite {
        SupportedCipherSuite::Tls12(s) => s.common.confidentiality_limit,
        SupportedCipherSuite::Tls13(s) => s.common.confidentiality_limit,
    };
    limit.min(RECORDS_PER_KEY_SOFT_MAX)
}

impl TlsSession {
    /// A session for a new connection under `config` (which must allow secret extraction).
    pub fn new(config: Arc<ServerConfig>) -> Result<TlsSession, rustls::Error> {
        debug_assert!(config.enable_secret_extraction);
        Ok(TlsSession {
            state: State::Handshaking(Box::new(UnbufferedServerConnection::new(config)?)),
            incoming: Vec::new(),
            outgoing: Vec::new(),
            facts: None,
            sni: None,
            turns: 0,
            spoke: false,
            fed: 0,
            precheck: Precheck::default(),
        })
    }

    /// Handshake turns taken so far (0: the ClientHello has not been processed).
    pub fn turns(&self) -> u32 {
        self.turns
    }

    /// Whether the handshake is still running.
    pub fn handshaking(&self) -> bool {
        matches!(self.state, State::Handshaking(_))
    }

    /// Whether records flow (the handshake completed and nothing failed).
    pub fn is_open(&self) -> bool {
        matches!(self.state, State::Open(_))
    }

    /// Adds received bytes; false when that would pass the buffering limit (the caller
    /// closes).
    pub fn receive(&mut self, data: &[u8]) -> bool {
        let max = if self.handshaking() {
            HANDSHAKE_INCOMING_MAX_BYTES
        } else {
            INCOMING_MAX_BYTES
        };
        if self.incoming.len() + data.len() > max {
            if self.handshaking() {
                self.refuse_plain(alert::HANDSHAKE_FAILURE);
            }
            return false;
        }
        self.incoming.extend_from_slice(data);
        true
    }

    /// Ends a handshake that may not buffer more (the shard's budget is spent): a
    /// handshake_failure alert if the server has not spoken yet, then the caller closes.
    pub fn refuse_handshake(&mut self) {
        self.refuse_plain(alert::HANDSHAKE_FAILURE);
    }

    /// Handshake bytes held now: received, not yet consumed by rustls (0 once open).
    pub fn handshake_bytes(&self) -> usize {
        if self.handshaking() {
            self.incoming.len()
        } else {
            0
        }
    }

    /// Ends a handshake the server has not answered yet with a plaintext fatal alert.
    fn refuse_plain(&mut self, desc: u8) {
        if !self.spoke {
            self.outgoing.clear();
            self.outgoing
                .extend_from_slice(&[CONTENT_ALERT, 3, 3, 0, 2, 2, desc]);
        }
        self.state = State::Done;
    }

    /// Frees the buffers of an idle connection (nothing pending in them).
    pub fn shrink_idle(&mut self) {
        if self.incoming.is_empty() && self.incoming.capacity() > 0 {
            self.incoming = Vec::new();
        }
        if self.outgoing.is_empty() && self.outgoing.capacity() > 0 {
            self.outgoing = Vec::new();
        }
    }

    /// Runs the handshake over what has been received: rustls's records for the client go
    /// to `outgoing`, application data that arrived with the client's Finished to `app`.
    ///
    /// rustls parses what any client sends; should it ever panic on some input, that ends
    /// this connection (logged loudly), not the shard and every download on it.
    pub fn handshake(&mut self, app: &mut Vec<u8>) -> HandshakeStep {
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.handshake_unguarded(app)
        }));
        run.unwrap_or_else(|_| {
            tracing::error!(
                "the TLS handshake code panicked on a client's input; closing that connection"
            );
            self.state = State::Done;
            self.outgoing.clear();
            HandshakeStep::Failed(HandshakeFailure::Protocol)
        })
    }

    fn handshake_unguarded(&mut self, app: &mut Vec<u8>) -> HandshakeStep {
        if !self.handshaking() {
            return HandshakeStep::Failed(HandshakeFailure::Protocol);
        }
        if self.sni.is_none() {
            match sniff::classify(&self.incoming) {
                FirstBytes::Unknown => return HandshakeStep::NeedInput,
                FirstBytes::PlainHttp => {
                    self.state = State::Done;
                    self.outgoing.clear();
                    self.outgoing.extend_from_slice(PLAIN_HTTP_ON_TLS_PORT);
                    return HandshakeStep::PlainHttp;
                }
                FirstBytes::TlsHandshake | FirstBytes::Other => {}
            }
            self.sni = sniff::client_hello_sni(&self.incoming).map(Box::from);
        }
        self.turns += 1;
        if !self.spoke {
            if let Some(desc) = self.precheck.judge(&self.incoming, self.fed) {
                self.refuse_plain(desc);
                return HandshakeStep::Failed(HandshakeFailure::Protocol);
            }
        }
        let State::Handshaking(conn) = &mut self.state else {
            return HandshakeStep::Failed(HandshakeFailure::Protocol);
        };
        if !self.spoke {
            // Before our first flight every whole record goes in (the precheck judged them);
            // bytes that are no TLS record (an SSL 2.0 hello) all go in, for rustls's alert.
            let tls_record = self.incoming.first().is_some_and(|t| (20..=24).contains(t));
            self.fed = if tls_record {
                whole_records_end(&self.incoming, self.fed)
            } else {
                self.incoming.len()
            };
        }
        let mut failed = None;
        let mut rounds = 0;
        while rounds < HANDSHAKE_ROUNDS_MAX {
            rounds += 1;
            let fed = self.fed.min(self.incoming.len());
            let UnbufferedStatus { discard, state } =
                conn.process_tls_records(&mut self.incoming[..fed]);
            let round = match state {
                Err(e) => {
                    if failed.is_none() {
                        tracing::debug!(error = %e, "TLS handshake failed");
                    }
                    // rustls queued its alert (if any): the next rounds encode it.
                    Round::Error(failure_of(&e))
                }
                Ok(ConnectionState::EncodeTlsData(mut enc)) => {
                    encode_into(&mut self.outgoing, |buf| enc.encode(buf));
                    self.spoke = true;
                    Round::Encoded
                }
                // The bytes are ours to send from `outgoing`; rustls needs no more than that.
                Ok(ConnectionState::TransmitTlsData(t)) => {
                    t.done();
                    Round::Encoded
                }
                Ok(ConnectionState::BlockedHandshake) => Round::NeedInput,
                Ok(ConnectionState::ReadTraffic(mut r)) => {
                    while let Some(Ok(rec)) = r.next_record() {
                        app.extend_from_slice(rec.payload);
                    }
                    Round::Continue
                }
                Ok(ConnectionState::ReadEarlyData(mut r)) => {
                    // 0-RTT is off (max_early_data_size = 0): rustls never accepts any.
                    while r.next_record().is_some() {}
                    Round::Continue
                }
                Ok(ConnectionState::WriteTraffic(_)) => Round::WriteTraffic,
                Ok(ConnectionState::PeerClosed | ConnectionState::Closed) => {
                    Round::Error(HandshakeFailure::Peer)
                }
                Ok(other) => {
                    tracing::debug!(state = ?other, "TLS handshake: unexpected state");
                    Round::Error(HandshakeFailure::Protocol)
                }
            };
            self.incoming.drain(..discard);
            self.fed = fed - discard;
            if let Some(f) = failed {
                // After an error, rustls hands over what it queued (its alert last) before it
                // parses anything; once that is out, another round would parse the bad input
                // again (and alert twice).
                if !matches!(round, Round::Encoded) || !conn.wants_write() {
                    self.state = State::Done;
                    return HandshakeStep::Failed(f);
                }
                continue;
            }
            match round {
                Round::Continue | Round::Encoded => {}
                Round::Error(f) if !conn.wants_write() => {
                    self.state = State::Done;
                    return HandshakeStep::Failed(f);
                }
                Round::Error(f) => failed = Some(f),
                Round::NeedInput | Round::WriteTraffic if conn.is_handshaking() => {
                    // rustls waits for the client: the next whole record, if one is in. Not
                    // a round: records are bounded by `HANDSHAKE_INCOMING_MAX_BYTES`.
                    match next_record_end(&self.incoming, self.fed) {
                        Some(end) => {
                            self.fed = end;
                            rounds -= 1;
                        }
                        None => return HandshakeStep::NeedInput,
                    }
                }
                Round::NeedInput => return HandshakeStep::NeedInput,
                // Records behind the client's Finished stay in `incoming` for `open_records`.
                Round::WriteTraffic => return self.establish(),
            }
        }
        tracing::debug!(rounds, "TLS handshake: out of rounds in one turn");
        self.state = State::Done;
        HandshakeStep::Failed(failed.unwrap_or(HandshakeFailure::Protocol))
    }

    /// The handshake is complete: take the traffic secrets from rustls and keep the rest
    /// of it only for key updates.
    fn establish(&mut self) -> HandshakeStep {
        let State::Handshaking(conn) = std::mem::replace(&mut self.state, State::Done) else {
            unreachable!("establish outside a handshake");
        };
        let version = conn.protocol_version();
        let suite = conn.negotiated_cipher_suite();
        let resumed = conn.handshake_kind() == Some(HandshakeKind::Resumed);
        let (Some(version), Some(suite)) = (version, suite) else {
            return HandshakeStep::Failed(HandshakeFailure::Protocol);
        };
        let (secrets, kernel) = match conn.dangerous_into_kernel_connection() {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "TLS secrets not extractable");
                return HandshakeStep::Failed(HandshakeFailure::Protocol);
            }
        };
        let (tx_seq, tx) = secrets.tx;
        let (rx_seq, rx) = secrets.rx;
        let (Some(tx), Some(rx)) = (RecordKey::new(version, &tx), RecordKey::new(version, &rx))
        else {
            tracing::warn!(
                ?suite,
                "negotiated a cipher suite the record layer does not speak"
            );
            return HandshakeStep::Failed(HandshakeFailure::Protocol);
        };
        self.facts = Some(Facts {
            version: if version == ProtocolVersion::TLSv1_3 {
                Version::Tls13
            } else {
                Version::Tls12
            },
            cipher: suite.suite().as_str().unwrap_or("unknown"),
            sni: self.sni.take(),
            resumed,
        });
        self.state = State::Open(Box::new(Records {
            kernel,
            version,
            tx,
            tx_seq,
            rx,
            rx_seq,
            resume: None,
            key_update_due: false,
            tx_records_max: records_max(suite),
            empties: 0,
            partial: [0; POST_HANDSHAKE_MESSAGE_MAX_BYTES],
            partial_len: 0,
            hello_skip: 0,
            no_renegotiation_due: false,
        }));
        HandshakeStep::Complete
    }

    fn records(&self) -> Option<&Records> {
        match &self.state {
            State::Open(r) => Some(r),
            _ => None,
        }
    }

    fn records_mut(&mut self) -> Option<&mut Records> {
        match &mut self.state {
            State::Open(r) => Some(r),
            _ => None,
        }
    }

    /// The key that seals our records (the shard seals chunks with it in place).
    pub fn tx_key(&self) -> &RecordKey {
        &self
            .records()
            .expect("sealing before the handshake completed")
            .tx
    }

    /// Bytes each record adds, once established.
    pub fn overhead(&self) -> Option<u32> {
        self.records().map(|r| r.tx.protection().overhead() as u32)
    }

    /// A KeyUpdate must go out before the next run is sealed (and nothing blocks it: a
    /// record that went out in part is finished first, with the key it began with).
    pub fn key_update_ready(&self) -> bool {
        self.records()
            .is_some_and(|r| r.key_update_due && r.resume.is_none())
    }

    /// TLS 1.2 without key updates has used most of what its key may seal: the connection
    /// is not kept alive after this response.
    pub fn wants_close(&self) -> bool {
        self.records()
            .is_some_and(|r| r.version != ProtocolVersion::TLSv1_3 && r.tx_seq >= r.tx_records_max)
    }

    /// Plans sealing the next run of `pt_len` plaintext bytes into records of
    /// `record_len`: its cut, first sequence number and resumed prefix. None when the run
    /// cannot be sealed (the key is exhausted, or a resumed record does not fit: the
    /// connection must abort rather than send a different record under the same number).
    pub fn plan_run(&mut self, pt_len: u32, record_len: u32) -> Option<RunPlan> {
        let r = self.records_mut()?;
        let overhead = r.tx.protection().overhead() as u32;
        let (first, skip) = match r.resume {
            Some(res) if res.len > pt_len || res.len > record_len => return None,
            Some(res) => (Some(res.len), res.skip),
            None => (None, 0),
        };
        let cut = RecordCut::new(pt_len, first, record_len, overhead);
        let first_seq = r.tx_seq;
        let end = first_seq.checked_add(u64::from(cut.records()))?;
        // A TLS 1.2 key never goes past twice the soft limit (still well inside 2^24).
        if r.version != ProtocolVersion::TLSv1_3 && end > 2 * r.tx_records_max {
            return None;
        }
        r.tx_seq = end;
        r.resume = None;
        if r.version == ProtocolVersion::TLSv1_3 && r.tx_seq >= r.tx_records_max {
            r.key_update_due = true;
        }
        Some(RunPlan {
            cut,
            first_seq,
            skip,
        })
    }

    /// Plaintext bytes of the record that must be sealed again first (it left in part before
    /// its chunk was given back), if one is pending: the next chunk must carry at least these.
    pub fn pending_resume_bytes(&self) -> Option<u32> {
        self.records().and_then(|r| r.resume).map(|res| res.len)
    }

    /// The unsent tail of sealed runs was given back: the next record to seal is number
    /// `seq`, resuming `resume` if it went out in part.
    pub fn rewind(&mut self, seq: u64, resume: Option<Resume>) {
        let r = self
            .records_mut()
            .expect("rewinding before the handshake completed");
        assert!(seq <= r.tx_seq, "rewind to record {seq} past {}", r.tx_seq);
        r.tx_seq = seq;
        r.resume = resume;
    }

    /// Seals `buf[from..]` (a response head) in place into records of `record_len` (a
    /// KeyUpdate first, when one is due).
    pub fn seal_tail(&mut self, buf: &mut Vec<u8>, from: usize, record_len: u32) {
        let r = self
            .records_mut()
            .expect("sealing before the handshake completed");
        assert!(
            r.resume.is_none(),
            "a head sealed while a record is half sent"
        );
        let plain = buf.split_off(from);
        if r.no_renegotiation_due {
            r.append_no_renegotiation(buf);
        }
        if r.key_update_due {
            r.append_key_update(buf);
        }
        let at = buf.len();
        let cut = RecordCut::new(
            plain.len() as u32,
            None,
            record_len,
            r.tx.protection().overhead() as u32,
        );
        buf.extend_from_slice(&plain);
        buf.resize(at + cut.ct_len() as usize, 0);
        super::record::seal_run(&r.tx, buf, at, &cut, CONTENT_APPLICATION_DATA, r.tx_seq);
        r.tx_seq += u64::from(cut.records());
    }

    /// Appends our KeyUpdate to `outgoing` and switches to the next key (the caller checked
    /// `key_update_ready`).
    pub fn queue_key_update(&mut self) {
        let TlsSession {
            state, outgoing, ..
        } = self;
        if let State::Open(r) = state {
            r.append_key_update(outgoing);
        }
    }

    /// A refused renegotiation's warning waits to be sent (`queue_no_renegotiation` when the
    /// connection is idle; otherwise it goes before the next response head).
    pub fn no_renegotiation_due(&self) -> bool {
        self.records().is_some_and(|r| r.no_renegotiation_due)
    }

    /// Appends the due no_renegotiation warning to `outgoing`.
    pub fn queue_no_renegotiation(&mut self) {
        let TlsSession {
            state, outgoing, ..
        } = self;
        if let State::Open(r) = state {
            r.append_no_renegotiation(outgoing);
        }
    }

    /// Appends close_notify to `outgoing` (a clean close).
    pub fn queue_close_notify(&mut self) {
        self.queue_alert(alert::CLOSE_NOTIFY);
    }

    /// Appends an alert (close_notify is a warning, anything else fatal) to `outgoing`,
    /// protected once the handshake is done. A session that is not open sends nothing.
    pub fn queue_alert(&mut self, desc: u8) {
        let level = if desc == alert::CLOSE_NOTIFY { 1 } else { 2 };
        let TlsSession {
            state, outgoing, ..
        } = self;
        if let State::Open(r) = state {
            r.tx.seal_append(outgoing, &[level, desc], CONTENT_ALERT, r.tx_seq);
            r.tx_seq += 1;
        }
        if desc != alert::CLOSE_NOTIFY {
            self.state = State::Done;
        }
    }

    /// Opens every whole record in `incoming`: application data is appended to `app`; a
    /// KeyUpdate changes the receive key (and schedules ours if the client asks); alerts
    /// and protocol errors end the session.
    pub fn open_records(&mut self, app: &mut Vec<u8>) -> Received {
        let TlsSession {
            state,
            incoming,
            outgoing,
            ..
        } = self;
        let State::Open(r) = state else {
            return Received::PeerAlert;
        };
        let mut used = 0;
        let outcome = loop {
            let rest = &mut incoming[used..];
            if rest.len() < RECORD_HEADER_BYTES {
                break Received::Data;
            }
            let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
            if len > r.rx.protection().max_fragment_bytes() {
                break r.fail(outgoing, alert::RECORD_OVERFLOW);
            }
            if rest.len() < RECORD_HEADER_BYTES + len {
                break Received::Data;
            }
            let rec = &mut rest[..RECORD_HEADER_BYTES + len];
            used += rec.len();
            let (typ, range) = match r.rx.open_one(rec, r.rx_seq) {
                Ok(v) => v,
                Err(RecordError { alert }) => break r.fail(outgoing, alert),
            };
            r.rx_seq += 1;
            let payload = &rec[range];
            // A handshake message split over records must not be interleaved with other
            // record types (RFC 8446 5.1).
            if (r.partial_len > 0 || r.hello_skip > 0) && typ != CONTENT_HANDSHAKE {
                break r.fail(outgoing, alert::UNEXPECTED_MESSAGE);
            }
            match typ {
                CONTENT_APPLICATION_DATA => {
                    if payload.is_empty() {
                        r.empties += 1;
                        if r.empties > EMPTY_RECORDS_MAX {
                            break r.fail(outgoing, alert::UNEXPECTED_MESSAGE);
                        }
                    } else {
                        r.empties = 0;
                        app.extend_from_slice(payload);
                    }
                }
                // Zero-length alert and handshake fragments are not allowed (RFC 8446 5.1).
                CONTENT_ALERT | CONTENT_HANDSHAKE if payload.is_empty() => {
                    break r.fail(outgoing, alert::UNEXPECTED_MESSAGE);
                }
                CONTENT_ALERT => {
                    let [level, desc] = payload else {
                        break r.fail(outgoing, alert::DECODE_ERROR);
                    };
                    if *desc == alert::CLOSE_NOTIFY {
                        break Received::PeerClosed;
                    }
                    // TLS 1.2 warnings other than close_notify carry nothing we act on.
                    if *level == 1 && r.version != ProtocolVersion::TLSv1_3 {
                        r.empties += 1;
                        if r.empties > EMPTY_RECORDS_MAX {
                            break r.fail(outgoing, alert::UNEXPECTED_MESSAGE);
                        }
                        continue;
                    }
                    break Received::PeerAlert;
                }
                CONTENT_HANDSHAKE if r.version == ProtocolVersion::TLSv1_3 => {
                    if let Err(desc) = r.on_post_handshake(payload) {
                        break r.fail(outgoing, desc);
                    }
                }
                // TLS 1.2: a ClientHello here asks for renegotiation, which we never do. It is
                // refused with a warning and the connection goes on (RFC 5746 4.2, what
                // OpenSSL does and tlsfuzzer's test-renegotiation-disabled expects); each
                // refusal counts as a record that carried nothing.
                CONTENT_HANDSHAKE => {
                    if let Err(desc) = r.on_tls12_handshake(payload) {
                        break r.fail(outgoing, desc);
                    }
                    r.empties += 1;
                    if r.empties > EMPTY_RECORDS_MAX {
                        break r.fail(outgoing, alert::UNEXPECTED_MESSAGE);
                    }
                }
                _ => break r.fail(outgoing, alert::UNEXPECTED_MESSAGE),
            }
        };
        incoming.drain(..used);
        if matches!(outcome, Received::Fatal | Received::PeerAlert) {
            *state = State::Done;
        }
        outcome
    }
}

impl Records {
    /// Seals our alert into `outgoing` and reports the session as failed.
    fn fail(&mut self, outgoing: &mut Vec<u8>, desc: u8) -> Received {
        if desc == alert::NO_RENEGOTIATION {
            // no_renegotiation is only a warning (RFC 5246 7.2.2); we close after it, and a
            // close is announced with close_notify (RFC 5246 7.2.1).
            for d in [alert::NO_RENEGOTIATION, alert::CLOSE_NOTIFY] {
                self.tx
                    .seal_append(outgoing, &[1, d], CONTENT_ALERT, self.tx_seq);
                self.tx_seq += 1;
            }
            return Received::Fatal;
        }
        self.tx
            .seal_append(outgoing, &[2, desc], CONTENT_ALERT, self.tx_seq);
        self.tx_seq += 1;
        Received::Fatal
    }

    /// The payload of a handshake record after a TLS 1.2 handshake: only a ClientHello
    /// (renegotiation, refused with a warning) may come, and it is skipped whole. Its header
    /// must be in one record (no client splits a message's header); otherwise the connection
    /// ends with no_renegotiation and close_notify.
    fn on_tls12_handshake(&mut self, payload: &[u8]) -> Result<(), u8> {
        let mut rest = payload;
        while !rest.is_empty() {
            if self.hello_skip > 0 {
                let n = self.hello_skip.min(rest.len());
                self.hello_skip -= n;
                rest = &rest[n..];
                continue;
            }
            let &[typ, a, b, c, ref body @ ..] = rest else {
                return Err(alert::NO_RENEGOTIATION);
            };
            if typ != HANDSHAKE_CLIENT_HELLO {
                return Err(alert::UNEXPECTED_MESSAGE);
            }
            self.hello_skip = u32::from_be_bytes([0, a, b, c]) as usize;
            self.no_renegotiation_due = true;
            rest = body;
        }
        Ok(())
    }

    /// Seals the no_renegotiation warning into `out`.
    fn append_no_renegotiation(&mut self, out: &mut Vec<u8>) {
        self.tx.seal_append(
            out,
            &[1, alert::NO_RENEGOTIATION],
            CONTENT_ALERT,
            self.tx_seq,
        );
        self.tx_seq += 1;
        self.no_renegotiation_due = false;
    }

    /// The payload of a handshake record after a TLS 1.3 handshake: only KeyUpdate is legal
    /// from a client (RFC 8446 4.6.3). It may span records (5.1), up to
    /// `POST_HANDSHAKE_MESSAGE_MAX_BYTES`; it must end its record, since the key changes
    /// after it (5.1: no message may span a key change).
    fn on_post_handshake(&mut self, payload: &[u8]) -> Result<(), u8> {
        let mut rest = payload;
        while let Some((&b, tail)) = rest.split_first() {
            rest = tail;
            self.partial[self.partial_len] = b;
            self.partial_len += 1;
            match &self.partial[..self.partial_len] {
                // The header decides as soon as it is in: a type other than KeyUpdate, or a
                // KeyUpdate of another length, is refused without waiting for its body.
                [typ, ..] if *typ != HANDSHAKE_KEY_UPDATE => return Err(alert::UNEXPECTED_MESSAGE),
                [_, l0, l1, l2] if [*l0, *l1, *l2] != [0, 0, 1] => return Err(alert::DECODE_ERROR),
                [_, _, _, _, request] => {
                    let request = *request;
                    self.partial_len = 0;
                    if request > 1 {
                        return Err(alert::ILLEGAL_PARAMETER);
                    }
                    if !rest.is_empty() {
                        return Err(alert::UNEXPECTED_MESSAGE);
                    }
                    let (seq, secrets) = self
                        .kernel
                        .update_rx_secret()
                        .map_err(|_| alert::INTERNAL_ERROR)?;
                    self.rx =
                        RecordKey::new(self.version, &secrets).ok_or(alert::INTERNAL_ERROR)?;
                    self.rx_seq = seq;
                    if request == 1 {
                        self.key_update_due = true;
                    }
                }
                _ => {}
            }
        }
        debug_assert!(self.partial_len < POST_HANDSHAKE_MESSAGE_MAX_BYTES);
        Ok(())
    }

    /// Appends our KeyUpdate (sealed with the current key) to `out`, then moves to the next
    /// key with sequence numbers from 0.
    fn append_key_update(&mut self, out: &mut Vec<u8>) {
        self.tx.seal_append(
            out,
            &KEY_UPDATE_NOT_REQUESTED,
            CONTENT_HANDSHAKE,
            self.tx_seq,
        );
        match self.kernel.update_tx_secret() {
            Ok((seq, secrets)) => match RecordKey::new(self.version, &secrets) {
                Some(key) => {
                    self.tx = key;
                    self.tx_seq = seq;
                }
                None => tracing::error!("next TLS key not usable; keeping the current one"),
            },
            Err(e) => tracing::error!(error = %e, "TLS key update failed"),
        }
        self.key_update_due = false;
    }
}

/// What one `process_tls_records` round asked for.
enum Round {
    Continue,
    /// A record was encoded into `outgoing` (or marked transmitted).
    Encoded,
    NeedInput,
    WriteTraffic,
    Error(HandshakeFailure),
}

/// Appends what `encode` writes to `out`, growing it to the size rustls asks for.
fn encode_into(out: &mut Vec<u8>, mut encode: impl FnMut(&mut [u8]) -> Result<usize, EncodeError>) {
    let start = out.len();
    let mut want = 512;
    loop {
        out.resize(start + want, 0);
        match encode(&mut out[start..]) {
            Ok(n) => {
                out.truncate(start + n);
                return;
            }
            Err(EncodeError::InsufficientSize(s)) => want = s.required_size,
            Err(EncodeError::AlreadyEncoded) => {
                out.truncate(start);
                return;
            }
        }
    }
}

fn failure_of(e: &rustls::Error) -> HandshakeFailure {
    match e {
        rustls::Error::AlertReceived(_) => HandshakeFailure::Peer,
        _ => HandshakeFailure::Protocol,
    }
}

/// The plaintext cap of one record: the configured size within what TLS allows.
pub fn clamp_record_bytes(bytes: usize) -> u32 {
    bytes.clamp(1, MAX_PLAINTEXT_BYTES) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::tls::record::seal_run;
    use crate::tls::testing::{self, KeyKind};
    use crate::tls::TlsBuilder;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    use rustls::ClientConnection;
    use std::io::{Read, Write};

    struct World {
        _dir: tempfile::TempDir,
        server: Arc<ServerConfig>,
        cert: CertificateDer<'static>,
    }

    fn world() -> World {
        let dir = tempfile::tempdir().unwrap();
        let spec = testing::write_cert(dir.path(), "edge", KeyKind::EcdsaP256, &["edge.test"]);
        let cert = CertificateDer::from_pem_file(&spec.cert).unwrap();
        let cfg = Config {
            tls_listen: Some("127.0.0.1:0".parse().unwrap()),
            tls_certificate: vec![spec],
            ..Config::default()
        };
        let ctx = TlsBuilder::new().unwrap().build(&cfg).unwrap().unwrap();
        World {
            _dir: dir,
            server: ctx.server.clone(),
            cert,
        }
    }

    fn client(
        w: &World,
        cfg: Option<Arc<rustls::ClientConfig>>,
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> (ClientConnection, Arc<rustls::ClientConfig>) {
        let cc = cfg.unwrap_or_else(|| {
            let base = testing::client_config(&w.cert, None);
            let mut cc = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
                .with_protocol_versions(versions)
                .unwrap()
                .with_root_certificates({
                    let mut r = rustls::RootCertStore::empty();
                    r.add(w.cert.clone()).unwrap();
                    r
                })
                .with_no_client_auth();
            cc.alpn_protocols = vec![b"http/1.1".to_vec()];
            cc.resumption = base.resumption.clone();
            Arc::new(cc)
        });
        let c =
            ClientConnection::new(cc.clone(), ServerName::try_from("edge.test").unwrap()).unwrap();
        (c, cc)
    }

    fn to_server(c: &mut ClientConnection, s: &mut TlsSession) {
        let mut buf = Vec::new();
        while c.wants_write() {
            c.write_tls(&mut buf).unwrap();
        }
        assert!(s.receive(&buf));
    }

    fn to_client(s: &mut TlsSession, c: &mut ClientConnection) -> Vec<u8> {
        let out = std::mem::take(&mut s.outgoing);
        let mut rd = &out[..];
        let mut got = Vec::new();
        while !rd.is_empty() {
            c.read_tls(&mut rd).unwrap();
            c.process_new_packets().unwrap();
            let _ = c.reader().read_to_end(&mut got);
        }
        got
    }

    /// Runs the handshake to completion; returns what the client sent with its Finished.
    fn shake(s: &mut TlsSession, c: &mut ClientConnection) -> Vec<u8> {
        let mut app = Vec::new();
        for _ in 0..10 {
            to_server(c, s);
            match s.handshake(&mut app) {
                HandshakeStep::NeedInput => {
                    to_client(s, c);
                }
                HandshakeStep::Complete => {
                    to_client(s, c);
                    assert!(!c.is_handshaking());
                    return app;
                }
                other => panic!("handshake: {other:?}"),
            }
        }
        panic!("handshake did not complete");
    }

    #[test]
    fn both_versions_handshake_then_carry_data_both_ways() {
        let w = world();
        for versions in [
            &[&rustls::version::TLS13][..],
            &[&rustls::version::TLS12][..],
        ] {
            let (mut c, _) = client(&w, None, versions);
            let mut s = TlsSession::new(w.server.clone()).unwrap();
            c.writer()
                .write_all(b"GET /early HTTP/1.1\r\n\r\n")
                .unwrap();
            let early = shake(&mut s, &mut c);
            let facts = s.facts.clone().unwrap();
            assert_eq!(facts.sni.as_deref(), Some("edge.test"));
            assert!(!facts.resumed);
            assert_eq!(c.alpn_protocol(), Some(&b"http/1.1"[..]));
            // The request written before the handshake ended arrives, in the handshake or after.
            let mut app = early;
            c.writer().write_all(b"GET /next HTTP/1.1\r\n\r\n").unwrap();
            to_server(&mut c, &mut s);
            assert_eq!(s.open_records(&mut app), Received::Data);
            assert_eq!(
                app, b"GET /early HTTP/1.1\r\n\r\nGET /next HTTP/1.1\r\n\r\n",
                "{versions:?}"
            );
            // A head sealed in a buffer, then a run sealed in place.
            let mut head = b"HTTP/1.1 200 OK\r\n\r\n".to_vec();
            s.seal_tail(&mut head, 0, 16384);
            s.outgoing = head;
            assert_eq!(to_client(&mut s, &mut c), b"HTTP/1.1 200 OK\r\n\r\n");
            let body: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8).collect();
            let plan = s.plan_run(body.len() as u32, 16384).unwrap();
            let mut slot = vec![0u8; plan.cut.ct_len() as usize];
            slot[..body.len()].copy_from_slice(&body);
            seal_run(
                s.tx_key(),
                &mut slot,
                0,
                &plan.cut,
                CONTENT_APPLICATION_DATA,
                plan.first_seq,
            );
            s.outgoing = slot;
            assert_eq!(to_client(&mut s, &mut c), body);
            // Our close_notify; the client's close_notify.
            s.queue_close_notify();
            to_client(&mut s, &mut c);
            c.send_close_notify();
            to_server(&mut c, &mut s);
            assert_eq!(s.open_records(&mut Vec::new()), Received::PeerClosed);
        }
    }

    #[test]
    fn a_rewound_partial_record_is_sent_again_byte_for_byte() {
        let w = world();
        let (mut c, _) = client(&w, None, &[&rustls::version::TLS13]);
        let mut s = TlsSession::new(w.server.clone()).unwrap();
        shake(&mut s, &mut c);
        let body: Vec<u8> = (0..50_000u32).map(|i| (i * 31) as u8).collect();
        let plan = s.plan_run(50_000, 16384).unwrap();
        let mut first = vec![0u8; plan.cut.ct_len() as usize];
        first[..50_000].copy_from_slice(&body);
        seal_run(
            s.tx_key(),
            &mut first,
            0,
            &plan.cut,
            CONTENT_APPLICATION_DATA,
            plan.first_seq,
        );
        // 20 000 ciphertext bytes left; the rest is given back and planned again from disk.
        let sent = 20_000;
        let (k, within) = plan.cut.locate(sent);
        assert_eq!(k, 1);
        s.rewind(
            plan.first_seq + u64::from(k),
            Some(Resume {
                len: plan.cut.pt_len_of(k),
                skip: within,
            }),
        );
        let rest = &body[plan.cut.pt_start(k) as usize..];
        let again = s.plan_run(rest.len() as u32, 16384).unwrap();
        assert_eq!(again.skip, within);
        let mut second = vec![0u8; again.cut.ct_len() as usize];
        second[..rest.len()].copy_from_slice(rest);
        seal_run(
            s.tx_key(),
            &mut second,
            0,
            &again.cut,
            CONTENT_APPLICATION_DATA,
            again.first_seq,
        );
        let mut wire = first[..sent as usize].to_vec();
        wire.extend_from_slice(&second[again.skip as usize..]);
        s.outgoing = wire;
        assert_eq!(to_client(&mut s, &mut c), body);
        // A resumed record longer than the run cannot be sealed: the caller aborts.
        s.rewind(
            again.first_seq,
            Some(Resume {
                len: 16384,
                skip: 5,
            }),
        );
        assert!(s.plan_run(100, 16384).is_none());
    }

    #[test]
    fn a_requested_key_update_is_answered_before_the_next_run() {
        let w = world();
        let (mut c, _) = client(&w, None, &[&rustls::version::TLS13]);
        let mut s = TlsSession::new(w.server.clone()).unwrap();
        shake(&mut s, &mut c);
        c.refresh_traffic_keys().unwrap();
        c.writer().write_all(b"after update").unwrap();
        to_server(&mut c, &mut s);
        let mut app = Vec::new();
        assert_eq!(s.open_records(&mut app), Received::Data);
        assert_eq!(app, b"after update", "the new receive key opened it");
        assert!(s.key_update_ready());
        s.queue_key_update();
        assert!(!s.key_update_ready());
        to_client(&mut s, &mut c);
        let mut head = b"new key".to_vec();
        s.seal_tail(&mut head, 0, 16384);
        s.outgoing = head;
        assert_eq!(to_client(&mut s, &mut c), b"new key");
    }

    /// A scripted client: after a real handshake, the client's keys taken from rustls, so a
    /// test can send exactly the records it wants and read the server's alerts.
    struct Peer {
        version: ProtocolVersion,
        tx: RecordKey,
        tx_seq: u64,
        rx: RecordKey,
        rx_seq: u64,
    }

    impl Peer {
        fn after_handshake(w: &World, tls12: bool) -> (Peer, TlsSession) {
            let versions: &[&'static rustls::SupportedProtocolVersion] = if tls12 {
                &[&rustls::version::TLS12]
            } else {
                &[&rustls::version::TLS13]
            };
            let (_, cc) = client(w, None, versions);
            let mut cc = (*cc).clone();
            cc.enable_secret_extraction = true;
            let mut c =
                ClientConnection::new(Arc::new(cc), ServerName::try_from("edge.test").unwrap())
                    .unwrap();
            let mut s = TlsSession::new(w.server.clone()).unwrap();
            shake(&mut s, &mut c);
            // TLS 1.3 tickets come after the handshake; let the client read them first.
            to_client(&mut s, &mut c);
            let version = c.protocol_version().unwrap();
            let secrets = c.dangerous_extract_secrets().unwrap();
            let peer = Peer {
                version,
                tx: RecordKey::new(version, &secrets.tx.1).unwrap(),
                tx_seq: secrets.tx.0,
                rx: RecordKey::new(version, &secrets.rx.1).unwrap(),
                rx_seq: secrets.rx.0,
            };
            (peer, s)
        }

        /// Seals one record of `typ` around `payload` and hands it to the server.
        fn send(&mut self, s: &mut TlsSession, typ: u8, payload: &[u8]) -> Received {
            let mut rec = Vec::new();
            self.tx.seal_append(&mut rec, payload, typ, self.tx_seq);
            self.tx_seq += 1;
            assert!(s.receive(&rec));
            s.open_records(&mut Vec::new())
        }

        /// The (level, description) of every alert the server queued.
        fn alerts(&mut self, s: &mut TlsSession) -> Vec<(u8, u8)> {
            let mut out = std::mem::take(&mut s.outgoing);
            let mut got = Vec::new();
            let mut at = 0;
            while at + RECORD_HEADER_BYTES <= out.len() {
                let len = usize::from(u16::from_be_bytes([out[at + 3], out[at + 4]]));
                let rec = &mut out[at..at + RECORD_HEADER_BYTES + len];
                let (typ, range) = self
                    .rx
                    .open_one(rec, self.rx_seq)
                    .expect("our record opens");
                self.rx_seq += 1;
                if typ == CONTENT_ALERT {
                    got.push((rec[range.start], rec[range.start + 1]));
                }
                at += RECORD_HEADER_BYTES + len;
            }
            assert_eq!(at, out.len(), "whole records");
            got
        }
    }

    #[test]
    fn a_key_update_split_over_records_is_reassembled() {
        let w = world();
        let (mut p, mut s) = Peer::after_handshake(&w, false);
        assert_eq!(p.version, ProtocolVersion::TLSv1_3);
        assert_eq!(p.send(&mut s, CONTENT_HANDSHAKE, &[24, 0]), Received::Data);
        assert_eq!(p.send(&mut s, CONTENT_HANDSHAKE, &[0, 1]), Received::Data);
        assert_eq!(p.send(&mut s, CONTENT_HANDSHAKE, &[1]), Received::Data);
        assert!(s.key_update_ready(), "update_requested was read");
        // The receive key changed: a record under the old key no longer opens.
        assert_eq!(
            p.send(&mut s, CONTENT_APPLICATION_DATA, b"x"),
            Received::Fatal
        );
        assert_eq!(p.alerts(&mut s), [(2, alert::BAD_RECORD_MAC)]);
    }

    #[test]
    fn post_handshake_records_get_the_alerts_rfc_8446_names() {
        let w = world();
        // (what, the records sent as (type, payload), the alert expected)
        type Case<'a> = (&'a str, &'a [(u8, &'a [u8])], u8);
        let cases: &[Case] = &[
            // 4.6.3: request_update other than 0 or 1.
            (
                "KeyUpdate request 2",
                &[(CONTENT_HANDSHAKE, &[24, 0, 0, 1, 2])],
                alert::ILLEGAL_PARAMETER,
            ),
            // 4.6.3 / 4: a KeyUpdate is one byte long.
            (
                "KeyUpdate of length 2",
                &[(CONTENT_HANDSHAKE, &[24, 0, 0, 2])],
                alert::DECODE_ERROR,
            ),
            // 5.1: zero-length alert and handshake fragments.
            (
                "empty alert",
                &[(CONTENT_ALERT, &[])],
                alert::UNEXPECTED_MESSAGE,
            ),
            (
                "empty handshake",
                &[(CONTENT_HANDSHAKE, &[])],
                alert::UNEXPECTED_MESSAGE,
            ),
            (
                "alert of 3 bytes",
                &[(CONTENT_ALERT, &[2, 0, 0])],
                alert::DECODE_ERROR,
            ),
            // 5.1: no message spans a key change; no interleaving inside a message.
            (
                "data after a KeyUpdate",
                &[(CONTENT_HANDSHAKE, &[24, 0, 0, 1, 0, 24])],
                alert::UNEXPECTED_MESSAGE,
            ),
            (
                "data inside a KeyUpdate",
                &[
                    (CONTENT_HANDSHAKE, &[24, 0]),
                    (CONTENT_APPLICATION_DATA, b"x"),
                ],
                alert::UNEXPECTED_MESSAGE,
            ),
            // 4.6: no other post-handshake message from a client we did not ask.
            (
                "a ClientHello",
                &[(CONTENT_HANDSHAKE, &[1, 0, 0, 0])],
                alert::UNEXPECTED_MESSAGE,
            ),
        ];
        for (what, records, want) in cases {
            let (mut p, mut s) = Peer::after_handshake(&w, false);
            let mut last = Received::Data;
            for (typ, payload) in *records {
                last = p.send(&mut s, *typ, payload);
            }
            assert_eq!(last, Received::Fatal, "{what}");
            assert_eq!(p.alerts(&mut s), [(2, *want)], "{what}");
        }
    }

    /// tlsfuzzer's test-renegotiation-disabled: a TLS 1.2 renegotiation gets the
    /// no_renegotiation warning and the connection goes on (also with the ClientHello split
    /// over records, and with a request before and after it); a header cut short still
    /// closes, and another handshake message is unexpected.
    #[test]
    fn a_refused_renegotiation_gets_a_warning_and_the_connection_goes_on() {
        let w = world();
        let hello = testing::client_hello(Some("edge.test"));
        let msg = &hello[5..];
        let (mut p, mut s) = Peer::after_handshake(&w, true);
        assert_eq!(p.version, ProtocolVersion::TLSv1_2);
        let mut app = Vec::new();
        let mut send = |p: &mut Peer, s: &mut TlsSession, typ: u8, payload: &[u8]| {
            let mut rec = Vec::new();
            p.tx.seal_append(&mut rec, payload, typ, p.tx_seq);
            p.tx_seq += 1;
            assert!(s.receive(&rec));
            s.open_records(&mut app)
        };
        assert_eq!(
            send(
                &mut p,
                &mut s,
                CONTENT_APPLICATION_DATA,
                b"GET / HTTP/1.0\r\n"
            ),
            Received::Data
        );
        assert_eq!(
            send(&mut p, &mut s, CONTENT_HANDSHAKE, &msg[..3]),
            Received::Fatal,
            "a header cut"
        );
        let (mut p, mut s) = Peer::after_handshake(&w, true);
        for piece in [&msg[..40], &msg[40..]] {
            assert_eq!(
                send(&mut p, &mut s, CONTENT_HANDSHAKE, piece),
                Received::Data
            );
        }
        assert!(s.no_renegotiation_due());
        s.queue_no_renegotiation();
        assert!(!s.no_renegotiation_due());
        assert_eq!(p.alerts(&mut s), [(1, alert::NO_RENEGOTIATION)]);
        assert_eq!(
            send(&mut p, &mut s, CONTENT_APPLICATION_DATA, b"\r\n"),
            Received::Data
        );
        // A warning not yet sent goes before the next head.
        assert_eq!(send(&mut p, &mut s, CONTENT_HANDSHAKE, msg), Received::Data);
        let mut head = b"HTTP/1.1 200 OK\r\n\r\n".to_vec();
        s.seal_tail(&mut head, 0, 16384);
        s.outgoing = head;
        assert_eq!(p.alerts(&mut s), [(1, alert::NO_RENEGOTIATION)]);
        // Anything but a ClientHello.
        assert_eq!(
            send(&mut p, &mut s, CONTENT_HANDSHAKE, &[20, 0, 0, 0]),
            Received::Fatal
        );
        assert_eq!(p.alerts(&mut s), [(2, alert::UNEXPECTED_MESSAGE)]);
    }

    /// tlsfuzzer's test-tls13-empty-alert and test-tls13-zero-length-data with application
    /// keys: records that come in the same flight as the client's Finished are opened by our
    /// record layer (rustls gets one record at a time once it has spoken), so an empty alert
    /// there gets unexpected_message (RFC 8446 5.1), not rustls's decode_error.
    #[test]
    fn records_behind_the_clients_finished_are_ours() {
        let w = world();
        // (what follows the Finished in its flight, what the server makes of it, its alerts)
        type Case = ((&'static [u8], u8), Received, &'static [(u8, u8)]);
        let cases: [Case; 2] = [
            (
                (b"GET / HTTP/1.1\r\n\r\n", CONTENT_APPLICATION_DATA),
                Received::Data,
                &[],
            ),
            (
                (b"", CONTENT_ALERT),
                Received::Fatal,
                &[(2, alert::UNEXPECTED_MESSAGE)],
            ),
        ];
        for ((payload, typ), want, want_alerts) in cases {
            let (_, cc) = client(&w, None, &[&rustls::version::TLS13]);
            let mut cc = (*cc).clone();
            cc.enable_secret_extraction = true;
            let name = ServerName::try_from("edge.test").unwrap();
            let mut c = ClientConnection::new(Arc::new(cc), name).unwrap();
            let mut s = TlsSession::new(w.server.clone()).unwrap();
            to_server(&mut c, &mut s);
            assert_eq!(s.handshake(&mut Vec::new()), HandshakeStep::NeedInput);
            to_client(&mut s, &mut c);
            assert!(!c.is_handshaking());
            let mut flight = Vec::new();
            while c.wants_write() {
                c.write_tls(&mut flight).unwrap();
            }
            let secrets = c.dangerous_extract_secrets().unwrap();
            let version = ProtocolVersion::TLSv1_3;
            let mut p = Peer {
                version,
                tx: RecordKey::new(version, &secrets.tx.1).unwrap(),
                tx_seq: secrets.tx.0,
                rx: RecordKey::new(version, &secrets.rx.1).unwrap(),
                rx_seq: secrets.rx.0,
            };
            p.tx.seal_append(&mut flight, payload, typ, p.tx_seq);
            assert!(s.receive(&flight));
            let mut app = Vec::new();
            assert_eq!(s.handshake(&mut app), HandshakeStep::Complete);
            assert!(app.is_empty(), "rustls opened nothing behind the Finished");
            assert!(
                !s.incoming.is_empty(),
                "the record behind it waits for the record layer"
            );
            assert_eq!(s.open_records(&mut app), want);
            assert_eq!(app, if want == Received::Data { payload } else { b"" });
            // Our tickets (handshake records), then the alert if any.
            assert_eq!(p.alerts(&mut s), want_alerts);
        }
    }

    /// What the server answers to `records` sent before or during the handshake: the step and
    /// the plaintext alerts it queued (those before its first flight).
    fn handshake_answer(w: &World, input: &[u8]) -> (HandshakeStep, Vec<(u8, u8)>) {
        let mut s = TlsSession::new(w.server.clone()).unwrap();
        let step = if s.receive(input) {
            s.handshake(&mut Vec::new())
        } else {
            HandshakeStep::Failed(HandshakeFailure::TooLarge)
        };
        let mut alerts = Vec::new();
        let mut at = 0;
        let out = &s.outgoing;
        while at + RECORD_HEADER_BYTES <= out.len() {
            let len = usize::from(u16::from_be_bytes([out[at + 3], out[at + 4]]));
            if out[at] == CONTENT_ALERT && len == 2 {
                alerts.push((out[at + 5], out[at + 6]));
            }
            at += RECORD_HEADER_BYTES + len;
        }
        (step, alerts)
    }

    /// A ClientHello record with its handshake body padded by `extra` bytes in an unknown
    /// extension, as post-quantum key shares make them grow; split into records of at most
    /// `record_max` bytes.
    fn big_client_hello(extra: usize, record_max: usize) -> Vec<u8> {
        big_client_hello_with_suites(extra, 0, record_max)
    }

    /// As `big_client_hello`, with `more_suites` unknown cipher suites (two bytes each) before
    /// the real ones: with both, a ClientHello can pass 64 KiB (each list's length is 16 bits).
    fn big_client_hello_with_suites(
        extra: usize,
        more_suites: usize,
        record_max: usize,
    ) -> Vec<u8> {
        let rec = testing::client_hello(Some("edge.test"));
        let mut msg = rec[5..].to_vec();
        // Extensions block: after version, random, session id, suites and compression.
        let mut at = 4 + 2 + 32;
        at += 1 + usize::from(msg[at]);
        let suites_len = usize::from(u16::from_be_bytes([msg[at], msg[at + 1]]));
        let junk = std::iter::repeat_n([0x0a, 0x0a], more_suites).flatten();
        msg.splice(at + 2..at + 2, junk);
        let new_suites_len = (suites_len + 2 * more_suites) as u16;
        msg[at..at + 2].copy_from_slice(&new_suites_len.to_be_bytes());
        at += 2 + usize::from(u16::from_be_bytes([msg[at], msg[at + 1]]));
        at += 1 + usize::from(msg[at]);
        let ext_len = usize::from(u16::from_be_bytes([msg[at], msg[at + 1]]));
        let mut ext = vec![0xfe, 0x77];
        ext.extend_from_slice(&(extra as u16).to_be_bytes());
        ext.extend(std::iter::repeat_n(0u8, extra));
        // The padding goes first: a PSK extension, if any, must stay last.
        msg.splice(at + 2..at + 2, ext.iter().copied());
        let new_ext_len = (ext_len + 4 + extra) as u16;
        msg[at..at + 2].copy_from_slice(&new_ext_len.to_be_bytes());
        let body_len = (msg.len() - 4) as u32;
        msg[1..4].copy_from_slice(&body_len.to_be_bytes()[1..]);
        let mut out = Vec::new();
        for piece in msg.chunks(record_max) {
            out.extend_from_slice(&[CONTENT_HANDSHAKE, 3, 1]);
            out.extend_from_slice(&(piece.len() as u16).to_be_bytes());
            out.extend_from_slice(piece);
        }
        out
    }

    #[test]
    fn client_hellos_at_the_edges_get_the_alerts_the_rfcs_name() {
        let w = world();
        let hello = testing::client_hello(Some("edge.test"));
        // A ClientHello of 40 KiB in records of 16 KiB: accepted (real ones grow with
        // post-quantum key shares).
        let (step, alerts) = handshake_answer(&w, &big_client_hello(40 * 1024, 16384));
        assert_eq!(
            (step, alerts),
            (HandshakeStep::NeedInput, vec![]),
            "a 40 KiB ClientHello"
        );
        // legacy_version SSL 3.0: protocol_version (RFC 8446 D.5).
        let mut ssl3 = hello.clone();
        ssl3[9..11].copy_from_slice(&[3, 0]);
        let (step, alerts) = handshake_answer(&w, &ssl3);
        assert!(matches!(step, HandshakeStep::Failed(_)), "{step:?}");
        assert_eq!(
            alerts,
            [(2, alert::PROTOCOL_VERSION)],
            "legacy_version 0x0300"
        );
        // A plaintext record over 2^14 bytes: record_overflow (RFC 8446 5.1).
        let (step, alerts) = handshake_answer(&w, &big_client_hello(16_400, 20_000));
        assert!(matches!(step, HandshakeStep::Failed(_)), "{step:?}");
        assert_eq!(
            alerts,
            [(2, alert::RECORD_OVERFLOW)],
            "a 16.4 KB plaintext record"
        );
        // A zero-length application-data record before the handshake is done.
        let mut empty_data = hello.clone();
        empty_data.extend_from_slice(&[CONTENT_APPLICATION_DATA, 3, 3, 0, 0]);
        let (step, alerts) = handshake_answer(&w, &empty_data);
        assert!(matches!(step, HandshakeStep::Failed(_)), "{step:?}");
        assert_eq!(
            alerts,
            [(2, alert::UNEXPECTED_MESSAGE)],
            "empty data in the handshake"
        );
        // More than the handshake buffer holds: an alert, not a silent close.
        let (step, alerts) =
            handshake_answer(&w, &big_client_hello(HANDSHAKE_INCOMING_MAX_BYTES, 16384));
        assert!(
            matches!(step, HandshakeStep::Failed(HandshakeFailure::TooLarge)),
            "{step:?}"
        );
        assert_eq!(
            alerts,
            [(2, alert::HANDSHAKE_FAILURE)],
            "over the handshake buffer"
        );
    }

    /// The precheck reads the ClientHello's head out of the records' bodies, never across a
    /// record header (tlsfuzzer's test-record-layer-fragmentation, test-tls13-zero-length-data,
    /// test-invalid-client-hello-w-record-overflow).
    #[test]
    fn the_precheck_reads_a_fragmented_client_hello_by_record() {
        let w = world();
        let hello = testing::client_hello(Some("edge.test"));
        let msg = &hello[5..];
        let records = |pieces: &[&[u8]]| {
            let mut out = Vec::new();
            for p in pieces {
                out.extend_from_slice(&[CONTENT_HANDSHAKE, 3, 1]);
                out.extend_from_slice(&(p.len() as u16).to_be_bytes());
                out.extend_from_slice(p);
            }
            out
        };
        // One byte per record: accepted, the server answers.
        let bytes: Vec<&[u8]> = msg.chunks(1).collect();
        let (step, alerts) = handshake_answer(&w, &records(&bytes));
        assert_eq!(
            (step, alerts),
            (HandshakeStep::NeedInput, vec![]),
            "1-byte records"
        );
        // The same, arriving a record at a time (rustls joins what it was given in place).
        let mut s = TlsSession::new(w.server.clone()).unwrap();
        for (i, b) in bytes.iter().enumerate() {
            assert!(s.receive(&records(&[b])));
            assert_eq!(
                s.handshake(&mut Vec::new()),
                HandshakeStep::NeedInput,
                "record {i}"
            );
        }
        assert_eq!(s.outgoing[0], CONTENT_HANDSHAKE, "the server's flight");
        // An empty application-data record inside the ClientHello (split after 2 bytes).
        let mut input = records(&[&msg[..2]]);
        input.extend_from_slice(&[CONTENT_APPLICATION_DATA, 3, 3, 0, 0]);
        input.extend_from_slice(&records(&[&msg[2..]]));
        let (step, alerts) = handshake_answer(&w, &input);
        assert!(matches!(step, HandshakeStep::Failed(_)), "{step:?}");
        assert_eq!(
            alerts,
            [(2, alert::UNEXPECTED_MESSAGE)],
            "empty data inside the hello"
        );
        // Another record type inside it.
        let mut input = records(&[&msg[..7]]);
        input.extend_from_slice(&[CONTENT_ALERT, 3, 3, 0, 2, 1, 0]);
        let (_, alerts) = handshake_answer(&w, &input);
        assert_eq!(
            alerts,
            [(2, alert::UNEXPECTED_MESSAGE)],
            "an alert inside the hello"
        );
        // A first message that is not a ClientHello.
        for typ in [0u8, 2, 4, 11, 20, 255] {
            let mut m = msg.to_vec();
            m[0] = typ;
            let (_, alerts) = handshake_answer(&w, &records(&[&m]));
            assert_eq!(alerts, [(2, alert::UNEXPECTED_MESSAGE)], "type {typ}");
        }
        // legacy_version SSL 3.0 with the header split over three records.
        let mut m = msg.to_vec();
        m[4..6].copy_from_slice(&[3, 0]);
        let (_, alerts) = handshake_answer(&w, &records(&[&m[..1], &m[1..5], &m[5..]]));
        assert_eq!(
            alerts,
            [(2, alert::PROTOCOL_VERSION)],
            "split SSL 3.0 hello"
        );
    }

    /// A TLS 1.3 ClientHello with `shares` (group, key length) in key_share and `groups` in
    /// supported_groups (each extension left out when empty); x25519 shares get a valid point
    /// (the base point).
    fn hello_with_shares(shares: &[(u16, usize)], groups: &[u16]) -> Vec<u8> {
        fn ext(out: &mut Vec<u8>, typ: u16, body: &[u8]) {
            out.extend_from_slice(&typ.to_be_bytes());
            out.extend_from_slice(&(body.len() as u16).to_be_bytes());
            out.extend_from_slice(body);
        }
        let mut exts = Vec::new();
        ext(&mut exts, 0x2b, &[2, 3, 4]); // supported_versions: TLS 1.3
        let mut sig = vec![0, 4];
        sig.extend_from_slice(&[0x04, 0x03, 0x08, 0x04]); // ecdsa_secp256r1_sha256, rsa_pss_rsae_sha256
        ext(&mut exts, 0x0d, &sig);
        if !groups.is_empty() {
            let mut g = ((groups.len() * 2) as u16).to_be_bytes().to_vec();
            groups
                .iter()
                .for_each(|x| g.extend_from_slice(&x.to_be_bytes()));
            ext(&mut exts, 0x0a, &g);
        }
        if !shares.is_empty() {
            let mut ks = Vec::new();
            for &(group, len) in shares {
                ks.extend_from_slice(&group.to_be_bytes());
                ks.extend_from_slice(&(len as u16).to_be_bytes());
                let mut key = vec![0x5a; len];
                if group == 0x1d {
                    key = vec![0; 32];
                    key[0] = 9;
                }
                ks.extend_from_slice(&key);
            }
            let mut body = (ks.len() as u16).to_be_bytes().to_vec();
            body.extend_from_slice(&ks);
            ext(&mut exts, 0x33, &body);
        }
        let mut m = vec![3, 3];
        m.extend_from_slice(&[7; 32]); // random
        m.push(0); // session id
        m.extend_from_slice(&[0, 2, 0x13, 0x01, 1, 0]); // TLS_AES_128_GCM_SHA256; null compression
        m.extend_from_slice(&(exts.len() as u16).to_be_bytes());
        m.extend_from_slice(&exts);
        let mut msg = vec![1];
        msg.extend_from_slice(&(m.len() as u32).to_be_bytes()[1..]);
        msg.extend_from_slice(&m);
        let mut rec = vec![CONTENT_HANDSHAKE, 3, 1];
        rec.extend_from_slice(&(msg.len() as u16).to_be_bytes());
        rec.extend_from_slice(&msg);
        rec
    }

    /// tlsfuzzer's test-tls13-unrecognised-groups and test-tls13-keyshare-omitted, and what real
    /// clients send: key shares for groups the server does not know (GREASE, a new
    /// post-quantum group of ML-KEM-1024's 1568 bytes) are skipped, a known group in
    /// supported_groups without a share gets a HelloRetryRequest, and both complete. What
    /// rustls refuses, pinned: a client whose only known group is ffdhe2048 (aws-lc-rs's
    /// provider has no FFDHE for TLS 1.3; OpenSSL has) gets handshake_failure. A ClientHello
    /// without key_share (or without supported_groups, or signature_algorithms) gets
    /// missing_extension from our precheck (RFC 8446 9.2), where rustls would answer
    /// handshake_failure (`PeerIncompatible::KeyShareExtensionRequired`).
    #[test]
    fn unknown_key_share_groups_are_skipped_and_what_rustls_refuses_is_pinned() {
        let w = world();
        const X25519: u16 = 0x1d;
        const GREASE: u16 = 0x0a0a;
        const UNKNOWN_PQ: u16 = 0x11fe;
        const FFDHE2048: u16 = 0x100;
        // The random of a HelloRetryRequest (RFC 8446 4.1.3).
        const HRR_RANDOM: [u8; 4] = [0xcf, 0x21, 0xad, 0x74];
        let answer = |input: Vec<u8>| {
            let mut s = TlsSession::new(w.server.clone()).unwrap();
            assert!(s.receive(&input));
            let step = s.handshake(&mut Vec::new());
            (step, s.outgoing)
        };
        let server_hello = |out: &[u8]| out[0] == CONTENT_HANDSHAKE && out[5] == 2;
        let (step, out) = answer(hello_with_shares(
            &[(GREASE, 1), (UNKNOWN_PQ, 1568), (X25519, 32)],
            &[GREASE, UNKNOWN_PQ, X25519],
        ));
        assert_eq!(step, HandshakeStep::NeedInput);
        assert!(
            server_hello(&out) && out[11..15] != HRR_RANDOM,
            "a ServerHello"
        );
        let (step, out) = answer(hello_with_shares(
            &[(GREASE, 1), (UNKNOWN_PQ, 1568)],
            &[GREASE, UNKNOWN_PQ, X25519],
        ));
        assert_eq!(step, HandshakeStep::NeedInput);
        assert!(
            server_hello(&out) && out[11..15] == HRR_RANDOM,
            "a HelloRetryRequest"
        );
        for (what, input, want) in [
            (
                "only ffdhe2048 known",
                hello_with_shares(&[(UNKNOWN_PQ, 64)], &[UNKNOWN_PQ, FFDHE2048]),
                alert::HANDSHAKE_FAILURE,
            ),
            (
                "no key_share",
                hello_with_shares(&[], &[X25519]),
                alert::MISSING_EXTENSION,
            ),
            (
                "key_share without supported_groups",
                hello_with_shares(&[(X25519, 32)], &[]),
                alert::MISSING_EXTENSION,
            ),
        ] {
            let (step, out) = answer(input);
            assert!(matches!(step, HandshakeStep::Failed(_)), "{what}: {step:?}");
            assert_eq!(out, [CONTENT_ALERT, 3, 3, 0, 2, 2, want], "{what}");
        }
    }

    /// rustls refuses a handshake message over its `MAX_HANDSHAKE_SIZE` (64 KiB), where OpenSSL
    /// takes a ClientHello up to 128 KiB (`CLIENT_HELLO_MAX_LENGTH`); the bound is in rustls's
    /// deframer, which our record layer cannot widen (the ClientHello is hashed into the
    /// transcript whole). Pinned: a 40 KiB one completes (`client_hellos_at_the_edges_...`), a
    /// ~70 KiB one (within `HANDSHAKE_INCOMING_MAX_BYTES`, so rustls itself judges it) gets an
    /// alert, never a silent close. Real ClientHellos, post-quantum shares included, are a few
    /// KiB.
    #[test]
    fn a_client_hello_over_rustls_handshake_limit_gets_an_alert() {
        let w = world();
        let hello = big_client_hello_with_suites(60 * 1024, 4096, 16384);
        let body =
            hello.len() - hello.len().div_ceil(16384 + RECORD_HEADER_BYTES) * RECORD_HEADER_BYTES;
        assert!(
            body > 64 * 1024 && hello.len() <= HANDSHAKE_INCOMING_MAX_BYTES,
            "{body}"
        );
        let (step, alerts) = handshake_answer(&w, &hello);
        assert!(matches!(step, HandshakeStep::Failed(_)), "{step:?}");
        assert_eq!(
            alerts,
            [(2, alert::DECODE_ERROR)],
            "an alert, then the close"
        );
    }

    #[test]
    fn a_second_connection_resumes_with_the_ticket() {
        let w = world();
        let (mut c, cc) = client(&w, None, &[&rustls::version::TLS13]);
        let mut s = TlsSession::new(w.server.clone()).unwrap();
        shake(&mut s, &mut c);
        let (mut c2, _) = client(&w, Some(cc), &[]);
        let mut s2 = TlsSession::new(w.server.clone()).unwrap();
        shake(&mut s2, &mut c2);
        assert!(s2.facts.unwrap().resumed);
    }

    #[test]
    fn wrong_protocols_and_bad_records_end_with_the_right_answer() {
        let w = world();
        let mut s = TlsSession::new(w.server.clone()).unwrap();
        assert!(s.receive(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
        assert_eq!(s.handshake(&mut Vec::new()), HandshakeStep::PlainHttp);
        assert_eq!(s.outgoing, PLAIN_HTTP_ON_TLS_PORT);
        let text = std::str::from_utf8(PLAIN_HTTP_ON_TLS_PORT).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("Content-Length: {}", body.len())));
        // A handshake record with garbage in it: rustls's alert, then failure.
        let mut s = TlsSession::new(w.server.clone()).unwrap();
        assert!(s.receive(&[0x16, 3, 1, 0, 6, 1, 0, 0, 2, 0xff, 0xff]));
        assert!(matches!(
            s.handshake(&mut Vec::new()),
            HandshakeStep::Failed(HandshakeFailure::Protocol)
        ));
        assert_eq!(&s.outgoing[..1], &[CONTENT_ALERT], "an alert record");
        // Too many handshake bytes.
        let mut s = TlsSession::new(w.server.clone()).unwrap();
        assert!(!s.receive(&vec![0x16; HANDSHAKE_INCOMING_MAX_BYTES + 1]));
        // After the handshake: a tampered record gets bad_record_mac.
        let (mut c, _) = client(&w, None, &[&rustls::version::TLS13]);
        let mut s = TlsSession::new(w.server.clone()).unwrap();
        shake(&mut s, &mut c);
        c.writer().write_all(b"x").unwrap();
        let mut buf = Vec::new();
        while c.wants_write() {
            c.write_tls(&mut buf).unwrap();
        }
        let last = buf.len() - 1;
        buf[last] ^= 0x40;
        assert!(s.receive(&buf));
        assert_eq!(s.open_records(&mut Vec::new()), Received::Fatal);
        let mut rd = &s.outgoing[..];
        c.read_tls(&mut rd).unwrap();
        let e = c.process_new_packets().unwrap_err();
        assert!(format!("{e}").contains("BadRecordMac"), "{e}");
        // A record header announcing more than TLS allows.
        let (mut c, _) = client(&w, None, &[&rustls::version::TLS13]);
        let mut s = TlsSession::new(w.server.clone()).unwrap();
        shake(&mut s, &mut c);
        assert!(s.receive(&[23, 3, 3, 0x48, 0x01]));
        assert_eq!(s.open_records(&mut Vec::new()), Received::Fatal);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(crate::tls::testing::fuzz_cases(300)))]

        /// Whatever a client sends before and during the handshake, in whatever pieces: no
        /// panic (rustls's debug assertions included: the unguarded path), and the buffer
        /// stays within its bound.
        #[test]
        fn arbitrary_handshake_bytes_never_panic(
            mutations in proptest::collection::vec((0usize..2000, proptest::prelude::any::<u8>()), 0..8),
            cut in 0usize..2100,
            junk in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
            pieces in proptest::collection::vec(1usize..700, 1..6),
        ) {
            let w = fuzz_world();
            let mut input = testing::client_hello(Some("edge.test"));
            for (at, b) in &mutations {
                if let Some(x) = input.get_mut(*at) {
                    *x ^= b | 1;
                }
            }
            input.truncate(cut.min(input.len()));
            input.extend_from_slice(&junk);
            let mut s = TlsSession::new(w.server.clone()).unwrap();
            let mut at = 0;
            for p in pieces {
                let end = (at + p).min(input.len());
                if !s.receive(&input[at..end]) {
                    break;
                }
                at = end;
                let step = s.handshake_unguarded(&mut Vec::new());
                proptest::prop_assert!(s.incoming.len() <= HANDSHAKE_INCOMING_MAX_BYTES);
                if step != HandshakeStep::NeedInput {
                    break;
                }
            }
        }

        /// After a real handshake, a client's records with bytes flipped, cut or added: opened,
        /// refused with an alert, or waited for; never a panic.
        #[test]
        fn arbitrary_records_after_the_handshake_never_panic(
            flips in proptest::collection::vec((0usize..400, 1u8..=255), 0..4),
            tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            tls12 in proptest::prelude::any::<bool>(),
        ) {
            let w = fuzz_world();
            let versions: &[&'static rustls::SupportedProtocolVersion] = if tls12 {
                &[&rustls::version::TLS12]
            } else {
                &[&rustls::version::TLS13]
            };
            let (mut c, _) = client(w, None, versions);
            let mut s = TlsSession::new(w.server.clone()).unwrap();
            shake(&mut s, &mut c);
            c.writer().write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
            if !tls12 {
                c.refresh_traffic_keys().unwrap();
                c.writer().write_all(b"more").unwrap();
            }
            let mut wire = Vec::new();
            while c.wants_write() {
                c.write_tls(&mut wire).unwrap();
            }
            for (at, b) in &flips {
                let n = wire.len();
                wire[at % n] ^= b;
            }
            wire.extend_from_slice(&tail);
            let mut app = Vec::new();
            if s.receive(&wire) {
                let _ = s.open_records(&mut app);
            }
            proptest::prop_assert!(app.len() <= wire.len());
        }
    }

    #[test]
    fn a_client_without_http11_in_alpn_gets_an_alert() {
        let w = world();
        let mut cc = testing::client_config(&w.cert, None);
        cc.alpn_protocols = vec![b"h2".to_vec()];
        let mut c = ClientConnection::new(Arc::new(cc), ServerName::try_from("edge.test").unwrap())
            .unwrap();
        let mut s = TlsSession::new(w.server.clone()).unwrap();
        to_server(&mut c, &mut s);
        assert_eq!(
            s.handshake(&mut Vec::new()),
            HandshakeStep::Failed(HandshakeFailure::Protocol)
        );
        let out = std::mem::take(&mut s.outgoing);
        let mut rd = &out[..];
        while !rd.is_empty() {
            c.read_tls(&mut rd).unwrap();
            if let Err(e) = c.process_new_packets() {
                assert!(format!("{e}").contains("NoApplicationProtocol"), "{e}");
                return;
            }
        }
        panic!("the client saw no alert");
    }

    /// One configuration for every fuzz case (building it generates a key).
    fn fuzz_world() -> &'static World {
        static W: std::sync::OnceLock<World> = std::sync::OnceLock::new();
        W.get_or_init(world)
    }

    #[test]
    fn every_truncation_of_a_client_hello_waits_and_never_panics() {
        let w = world();
        let hello = testing::client_hello(Some("edge.test"));
        for cut in 0..hello.len() {
            let mut s = TlsSession::new(w.server.clone()).unwrap();
            assert!(s.receive(&hello[..cut]));
            assert_eq!(
                s.handshake(&mut Vec::new()),
                HandshakeStep::NeedInput,
                "cut at {cut}"
            );
        }
    }
}
