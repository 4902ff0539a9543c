//! Per-connection response-header buffers, and which of them a send is reading: one owner of
//! the rule "never touch a buffer while the kernel reads it" for the real ring and the
//! simulator's alike.

/// One heap buffer per connection slot (a response head, ~300 bytes while in use).
pub struct HeaderBuffers {
    bufs: Vec<Vec<u8>>,
    lent: Vec<bool>,
}

impl HeaderBuffers {
    /// Empty buffers for `conns` connection slots (no heap until a head is written).
    pub fn new(conns: usize) -> HeaderBuffers {
        HeaderBuffers {
            bufs: (0..conns).map(|_| Vec::new()).collect(),
            lent: vec![false; conns],
        }
    }

    /// The buffer of `conn` for writing a head; panics while a send reads it.
    pub fn get_mut(&mut self, conn: usize) -> &mut Vec<u8> {
        assert!(
            !self.lent[conn],
            "tx buffer {conn} mutated while the kernel reads it"
        );
        &mut self.bufs[conn]
    }

    /// Lends `bufs[conn][from..]` to a send until `done(conn)`; returns the bytes lent. The
    /// caller passes their address to the kernel: the Vec is not touched (`get_mut` and
    /// `release` assert) until `done`, so the heap block stays where it is.
    pub fn lend(&mut self, conn: usize, from: usize) -> &[u8] {
        assert!(!self.lent[conn], "second send from tx buffer {conn}");
        assert!(from < self.bufs[conn].len());
        self.lent[conn] = true;
        &self.bufs[conn][from..]
    }

    /// The send reading `conn`'s buffer completed.
    pub fn done(&mut self, conn: usize) {
        assert!(self.lent[conn], "tx_done without a send in flight");
        self.lent[conn] = false;
    }

    /// Bytes in `conn`'s buffer.
    pub fn len(&self, conn: usize) -> usize {
        self.bufs[conn].len()
    }

    /// What a send in flight reads (the simulator's kernel side): `bufs[conn][from..]`.
    pub fn in_flight(&self, conn: usize, from: usize) -> &[u8] {
        assert!(
            self.lent[conn],
            "reading tx buffer {conn} with no send in flight"
        );
        &self.bufs[conn][from..]
    }

    /// The bytes of `conn`'s buffer (not lent).
    pub fn bytes(&self, conn: usize) -> &[u8] {
        assert!(!self.lent[conn]);
        &self.bufs[conn]
    }

    /// Frees the heap memory of an idle connection's buffer.
    pub fn release(&mut self, conn: usize) {
        assert!(!self.lent[conn]);
        self.bufs[conn] = Vec::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lent_buffers_cannot_be_touched_until_done() {
        let mut h = HeaderBuffers::new(2);
        h.get_mut(1).extend_from_slice(b"HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!(h.lend(1, 9), b"200 OK\r\n\r\n");
        let touched = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            h.get_mut(1).clear();
        }));
        assert!(touched.is_err());
        h.done(1);
        assert_eq!(h.len(1), 19);
        h.release(1);
        assert_eq!(h.len(1), 0);
    }
}
