//! The chunk pipeline: body segments planned into reads within the budgets, reads landed,
//! sends (copy or SEND_ZC), a full socket parked and its chunks given back, the response's end.

use super::chunk_plan::plan_chunk;
use super::*;

impl ConnMachine {
    // ---- the chunk pipeline ------------------------------------------------------------

    /// Turns body segments into chunk reads, within the connection's budget for this visit,
    /// the shard's budget for this tick and the pipeline depth. `take` asks the arena for a
    /// slot (None: none free for that demand).
    pub fn pump(
        &mut self,
        budget: &mut TickBudget,
        shard_budget: &mut TickBudget,
        take: &mut dyn FnMut(Demand) -> Option<ArenaSlot>,
        egress: Option<&EgressBucket>,
        cx: &Ctx,
        out: &mut Actions,
    ) -> Turn {
        let depth = cx.limits.pipeline_depth;
        let chunk_bytes = self.payload_cap(cx);
        // The cap applies while it is configured (a reload that lifts it lets what is
        // reserved go and reserves nothing more).
        let egress = egress.filter(|_| cx.limits.egress_limit_bytes_per_s > 0);
        loop {
            let socket_full = self.ops.poll;
            let limit = self.rate_limit;
            let Some(body) = self.body_mut() else {
                return Turn::Idle;
            };
            // The next bytes of a pulled object still filling are not on disk yet: wait for
            // the fill (its notice moves `readable_end` on and queues us).
            let blocked_at = match body.segments.front() {
                Some(&Segment::File { pos, .. }) if pos >= body.readable_end => Some(pos),
                _ => None,
            };
            if let Some(file_offset) = blocked_at {
                if !body.awaiting_block {
                    body.awaiting_block = true;
                    out.push(Action::AwaitBlock { file_offset });
                }
            }
            // A full socket takes nothing now: read when it drains (the poll re-queues us).
            // A pass-through reads one chunk at a time (its bytes come in order from one fetch).
            let depth = if body.relay { 1 } else { depth };
            if socket_full
                || blocked_at.is_some()
                || body.segments.is_empty()
                || body.chunks.len() >= body.read_ahead.min(depth)
            {
                // No more read-ahead wanted now: a slot handed over while waiting goes back.
                self.leave_arena_queue(cx, out);
                self.give_back_handed(out);
                return Turn::Idle;
            }
            // A small response's single chunk is never held back; bulk work stops at the
            // connection's budget or when the shard's budget for this tick is spent.
            if !body.inline_head && (!budget.has_room() || !shard_budget.has_room()) {
                return Turn::MoreWork;
            }
            let rest = body.unplanned_bytes();
            let mut cap_bytes = u64::MAX;
            if let Some(limit) = limit {
                let allowance = limit.allowance(cx.now_us);
                let step = limit.step_bytes();
                if allowance < step.min(rest) {
                    let at_ms = limit.ready_at_ms(step.min(rest), cx.now_us);
                    if let Some(l) = self.rate_limit.as_mut() {
                        l.waits += 1;
                    }
                    out.push(Action::Count(Counter::LimitWait, 1));
                    return self.wait_for_limiter(at_ms, cx, out);
                }
                cap_bytes = allowance;
            }
            let want = cap_bytes.min(chunk_bytes as u64).min(rest).max(1);
            if let Some(bucket) = egress {
                if let Some(at_ms) = self.egress_turn(bucket, want, cx, out) {
                    return self.wait_for_limiter(at_ms, cx, out);
                }
                if let Some(hold) = self.egress {
                    cap_bytes = cap_bytes.min(hold.reserved_bytes.max(1));
                }
            }
            // A record that left in part is sealed again whole, whatever the limiters say (at
            // most a record past them; they count what is planned).
            if let Some(len) = self.tls.as_ref().and_then(|t| t.pending_resume_bytes()) {
                cap_bytes = cap_bytes.max(u64::from(len));
            }
            let body = self.body_mut().expect("checked above");
            body.limit_cap_bytes = usize::try_from(cap_bytes).unwrap_or(usize::MAX);
            let demand = if body.inline_head {
                Demand::Small
            } else if body.chunks.is_empty() {
                Demand::Bulk
            } else {
                Demand::ReadAhead
            };
            let handed = match self.arena {
                ArenaWait::Handed { slot } => Some(slot),
                _ => None,
            };
            let Some(slot) = handed.or_else(|| take(demand)) else {
                if demand == Demand::ReadAhead {
                    // Planned again when one of its chunks finishes.
                    return Turn::Idle;
                }
                if self.arena == ArenaWait::None {
                    self.arena = ArenaWait::Waiting {
                        since_us: cx.now_us,
                    };
                    out.push(Action::WaitArena(demand));
                }
                // Chunks parked behind full sockets are not moving: they go to the waiters.
                out.push(Action::Reclaim);
                return Turn::Idle;
            };
            if handed.is_some() {
                self.arena = ArenaWait::None;
            } else {
                self.leave_arena_queue(cx, out);
            }
            let head_len = self.response().map_or(0, |r| r.head_len);
            let body = self.body_mut().expect("checked above");
            let chunk = plan_chunk(body, slot, head_len, chunk_bytes, out);
            let planned = u64::from(chunk.send_len);
            budget.charge(chunk.send_len as usize);
            shard_budget.charge(chunk.send_len as usize);
            let reading = chunk.state == ChunkState::Reading;
            body.chunks.push_back(chunk);
            if reading {
                self.submit_read(slot, out);
            }
            if let Some(l) = self.rate_limit.as_mut() {
                let before = l.planned_bytes;
                l.planned_bytes += planned;
                let limited = l.planned_bytes.saturating_sub(before.max(l.after_bytes));
                if limited > 0 {
                    out.push(Action::Count(Counter::LimitedBytes, limited));
                }
            }
            if let (Some(bucket), Some(hold)) = (egress, self.egress.as_mut()) {
                if hold.delayed {
                    let delayed = planned.min(hold.reserved_bytes);
                    out.push(Action::Count(Counter::EgressDelayedBytes, delayed));
                }
                let rate = cx.limits.egress_limit_bytes_per_s;
                hold.spend(bucket, planned, rate, cx.egress_now_us);
            }
        }
    }

    /// A limiter lets the response go on at `at_ms` (shard clock): wait on the wheel, holding
    /// nothing planned ahead (no handed slot, no place in the arena's queue).
    pub(super) fn wait_for_limiter(&mut self, at_ms: u64, cx: &Ctx, out: &mut Actions) -> Turn {
        out.push(Action::LimitWait { at_ms });
        self.leave_arena_queue(cx, out);
        self.give_back_handed(out);
        Turn::Idle
    }

    /// The egress cap's say on the next `want` bytes: reserves them when nothing is reserved,
    /// and returns when to wake (shard clock, ms) if they may not go yet.
    pub(super) fn egress_turn(
        &mut self,
        bucket: &EgressBucket,
        want: u64,
        cx: &Ctx,
        out: &mut Actions,
    ) -> Option<u64> {
        let rate = cx.limits.egress_limit_bytes_per_s;
        let hold = self.egress.as_mut()?;
        if hold.reserved_bytes == 0 {
            let bypass_before = hold.bypass_left_bytes;
            if hold.reserve(bucket, want, rate, cx.now_us, cx.egress_now_us) {
                out.push(Action::Count(Counter::EgressWait, 1));
            } else if bypass_before > hold.bypass_left_bytes {
                let bypassed = bypass_before - hold.bypass_left_bytes;
                out.push(Action::Count(Counter::EgressBypassBytes, bypassed));
            }
        }
        (cx.now_us < hold.ready_at_us).then(|| hold.ready_at_us.div_ceil(1000))
    }

    /// Plaintext bytes one chunk carries: the whole slot, or on a TLS connection what still
    /// fits once every record's framing is added in place.
    pub(super) fn payload_cap(&self, cx: &Ctx) -> usize {
        if self.tls.is_some() {
            cx.limits.tls_chunk_bytes
        } else {
            cx.limits.chunk_bytes
        }
    }

    /// Leaves the arena queue, if queued, and reports how long it waited.
    pub(super) fn leave_arena_queue(&mut self, cx: &Ctx, out: &mut Actions) {
        if let ArenaWait::Waiting { since_us } = self.arena {
            self.arena = ArenaWait::None;
            out.push(Action::BufferWaited(cx.now_us.saturating_sub(since_us)));
            out.push(Action::LeaveArenaQueue);
        }
    }

    /// The arena handed this waiting connection a slot: a small response is queued urgently,
    /// bulk work at the back.
    pub fn slot_handed(&mut self, slot: ArenaSlot, cx: &Ctx, out: &mut Actions) {
        let ArenaWait::Waiting { since_us } = self.arena else {
            panic!(
                "a slot handed to a connection that was not waiting: {:?}",
                self.arena
            );
        };
        out.push(Action::BufferWaited(cx.now_us.saturating_sub(since_us)));
        self.arena = ArenaWait::Handed { slot };
        let small = self.body().is_some_and(|b| b.inline_head);
        out.push(if small {
            Action::QueueUrgent
        } else {
            Action::QueueBulk
        });
    }

    pub(super) fn submit_read(&mut self, slot: ArenaSlot, out: &mut Actions) {
        let body = self.body().expect("reading without a body");
        let ch = &body.chunks[body.chunk_index(slot)];
        let got = ch.read_got;
        out.push(Action::Read {
            slot,
            buf_off: (ch.read_buf_off + got) as usize,
            len: (ch.read_len - got) as usize,
            file_fixed: body.file_fixed,
            file_off: ch.read_file_off + u64::from(got),
            rw_flags: body.rw_flags,
        });
    }

    /// The read into `slot` holds a cached block that failed its checksum (or that another
    /// read dropped as corrupt): the chunk keeps its place in the pipeline and its slot, and
    /// is read again whole (`reread`) once the block is fetched again. Nothing is in flight
    /// meanwhile; later chunks wait behind it, so bytes still leave in order.
    pub fn hold_for_refetch(&mut self, slot: ArenaSlot) {
        let body = self.body_mut().expect("a read completion without a body");
        let i = body.chunk_index(slot);
        let ch = &mut body.chunks[i];
        assert_eq!(ch.state, ChunkState::Reading, "held a chunk not reading");
        ch.state = ChunkState::Refetching;
        ch.read_got = 0;
    }

    /// The block a held chunk (`hold_for_refetch`) waited for is on disk again: its read is
    /// submitted again. False when no chunk of this response waits in `slot` (it ended).
    pub fn reread(&mut self, slot: ArenaSlot, out: &mut Actions) -> bool {
        if !self.is_open() {
            return false;
        }
        let Some(body) = self.body_mut() else {
            return false;
        };
        let Some(ch) = body
            .chunks
            .iter_mut()
            .find(|c| c.slot == slot && c.state == ChunkState::Refetching)
        else {
            return false;
        };
        ch.state = ChunkState::Reading;
        self.submit_read(slot, out);
        true
    }

    /// A file read into `slot` completed with `res`. `unchanged(file)` says whether the
    /// open file is still the version the response started with.
    pub fn on_read(
        &mut self,
        slot: ArenaSlot,
        res: i32,
        unchanged: &mut dyn FnMut(FileSlot) -> bool,
        cx: &Ctx,
        out: &mut Actions,
    ) {
        let open = self.is_open();
        let body = self.body_mut().expect("read completion without a body");
        let i = body.chunk_index(slot);
        assert_eq!(
            body.chunks[i].state,
            ChunkState::Reading,
            "read completion for a chunk not reading"
        );
        if !open {
            body.chunks[i].state = ChunkState::Ready;
            self.maybe_finish_close(out);
            return;
        }
        if res < 0 {
            // Judged by the chunk, not the body: with several chunks in flight, every read
            // submitted with RWF_DONTCACHE comes back refused, not only the first.
            if -res == libc::EOPNOTSUPP && body.chunks[i].source == Source::DontCache {
                // RWF_DONTCACHE refused by this file system: read buffered from now on.
                body.rw_flags = 0;
                body.source = Source::Buffered;
                body.chunks[i].source = Source::Buffered;
                if let Some(file) = body.file {
                    out.push(Action::DemoteFile(file));
                }
                self.submit_read(slot, out);
                return;
            }
            tracing::warn!(errno = -res, "file read failed; aborting response");
            body.chunks[i].state = ChunkState::Ready;
            self.close(CloseReason::Abort, cx, out);
            return;
        }
        let align = body.align;
        let file = body.file;
        let ch = &mut body.chunks[i];
        ch.read_got += res as u32;
        if ch.read_got < ch.read_need {
            let aligned = (ch.read_file_off + u64::from(ch.read_got)).is_multiple_of(align);
            if res == 0 || !aligned {
                // The file is shorter than promised: it was truncated under us. Never pad.
                tracing::info!("file shrank during a response; aborting");
                ch.state = ChunkState::Ready;
                self.close(CloseReason::Abort, cx, out);
                return;
            }
            self.submit_read(slot, out);
            return;
        }
        ch.state = ChunkState::Ready;
        let framed = match ch.bytes_from {
            BytesFrom::FramedFile { at, len } => Some((at, len, ch.send_off)),
            _ => None,
        };
        // The bytes are only good if the file did not change while they were read.
        if let Some(file) = file {
            if !unchanged(file) {
                tracing::info!("file changed during a response; aborting");
                self.close(CloseReason::Abort, cx, out);
                return;
            }
        }
        if let Some((at, len, to)) = framed {
            // The part header goes right in front of the data, over bytes of the aligned read
            // that precede the range (the read would have overwritten it before).
            out.push(Action::CopyFraming {
                slot,
                from: at as usize,
                len: len as usize,
                to: to as usize,
            });
        }
        if self.ops.poll {
            // Read ahead landed behind a full socket: the chunk is ours now, so a reclaim that
            // found it still being read (and freed nothing) can take it this time; past the
            // hold already (the read waited for a block fetched again) it goes back now.
            self.reclaim_past_hold(cx, out);
            out.push(Action::ListParked);
            out.push(Action::Reclaim);
            return;
        }
        self.send_soon(cx, out);
    }

    /// A chunk became sendable: a small response sends at once; bulk sends wait for the
    /// connection's turn in the ready queue, under the shard's per-tick budget.
    pub(super) fn send_soon(&mut self, cx: &Ctx, out: &mut Actions) {
        if self.body().is_some_and(|b| b.small) {
            self.try_send(cx, out);
        } else {
            out.push(Action::QueueBulk);
        }
    }

    /// Sends what is next (the head, or the first chunk not yet sent) unless a send is in
    /// flight or the socket is full; finishes the response when nothing is left. On a TLS
    /// connection a chunk is sealed into records right before its first send (so only what
    /// is about to leave is encrypted), after our KeyUpdate if one is due.
    pub fn try_send(&mut self, cx: &Ctx, out: &mut Actions) {
        if !self.is_open() || self.send_in_flight() {
            return;
        }
        let poll = self.ops.poll;
        // A response a limiter holds back is paced by it, not by its socket: a whole send
        // only means the socket had room, and its bytes wait there for a client slower than
        // the link. Copy sends free the slot at once.
        let limiter_paced = self.rate_limit.is_some_and(|l| l.waits > 0)
            || self.egress.is_some_and(|e| e.waits > 0);
        let fast_drain = self.fast_drain && !limiter_paced;
        let warm = self.resp_bytes >= cx.limits.zerocopy_warmup_bytes;
        let ConnMachine { write, tls, .. } = self;
        let WriteState::Responding(resp) = write else {
            return;
        };
        if let HeadState::Pending { from } = resp.head {
            let more = resp.body.as_ref().is_some_and(|b| !b.is_done());
            resp.head = HeadState::Sending { from };
            out.push(Action::SendHead { from, more });
            return;
        }
        let Some(body) = resp.body.as_mut() else {
            self.finish_response(cx, out);
            return;
        };
        let Some(ch) = body
            .chunks
            .iter_mut()
            // A chunk fully handed to SEND_ZC only waits for its buffer; one the socket took
            // only part of still goes first (bytes leave in order).
            .find(|ch| ch.state != ChunkState::AwaitNotif || ch.sent < ch.send_len)
        else {
            if body.is_done() {
                self.finish_response(cx, out);
            }
            return;
        };
        if ch.state != ChunkState::Ready || poll {
            return;
        }
        if let (Some(session), None) = (tls.as_mut(), ch.tls) {
            if session.key_update_ready() {
                session.queue_key_update();
                self.send_tls_output(out);
                return;
            }
            let Some(plan) = session.plan_run(ch.send_len, cx.limits.tls_record_bytes) else {
                tracing::warn!("TLS record sequence cannot continue; aborting the response");
                self.close(CloseReason::Abort, cx, out);
                return;
            };
            assert_eq!(ch.sent, 0, "a chunk sealed after it began to leave");
            out.push(Action::Seal {
                slot: ch.slot,
                at: ch.send_off,
                cut: plan.cut,
                first_seq: plan.first_seq,
            });
            ch.tls = Some(SealedRun {
                cut: plan.cut,
                first_seq: plan.first_seq,
                pt_at: ch.send_off,
            });
            ch.send_off += plan.skip;
            ch.send_len = plan.cut.ct_len() - plan.skip;
        }
        ch.state = ChunkState::Sending;
        if ch.sent == 0 {
            ch.send_started_ms = cx.now_ms;
        }
        let (slot, off, len) = (ch.slot, ch.send_off + ch.sent, ch.send_len - ch.sent);
        let zc_busy = body.chunks.iter().any(|c| c.zerocopy);
        // More bytes follow this send (MSG_MORE): body not yet planned, or another chunk with
        // bytes still to leave. A chunk fully handed to SEND_ZC, waiting only for its
        // notification, has none: counting it corked the response's last segment.
        let more = !body.segments.is_empty()
            || body
                .chunks
                .iter()
                .any(|c| c.slot != slot && c.sent < c.send_len);
        // SEND_ZC keeps the buffer until the peer acknowledges it: only for a connection
        // that drains fast; a slow or stalled one gets copy sends and holds nothing.
        let zc = cx.limits.zerocopy
            && fast_drain
            && warm
            && len as usize >= cx.limits.zerocopy_min_bytes
            && cx.zc_room
            && !zc_busy;
        let i = body.chunk_index(slot);
        let ch = &mut body.chunks[i];
        ch.zerocopy = zc;
        if zc {
            out.push(Action::ZcTaken);
        }
        out.push(Action::Send {
            slot,
            off: off as usize,
            len: len as usize,
            more,
            zerocopy: zc,
        });
    }

    /// The head send completed with `res`.
    pub fn on_head_sent(&mut self, res: i32, cx: &Ctx, out: &mut Actions) {
        let resp = self.response_mut().expect("head send without a response");
        let HeadState::Sending { from } = resp.head else {
            panic!("head send completion without a head send");
        };
        let head_len = resp.head_len;
        resp.head = HeadState::Pending { from };
        if !self.is_open() {
            self.maybe_finish_close(out);
            return;
        }
        if res <= 0 {
            self.close(CloseReason::Abort, cx, out);
            return;
        }
        let from = from + res as usize;
        out.push(Action::Count(Counter::Bytes(Source::Memory), res as u64));
        if self.tls.is_some() {
            out.push(Action::Count(Counter::TlsBytesOut, res as u64));
        }
        self.sent_bytes(res as u64, cx, out);
        let resp = self.response_mut().expect("checked above");
        resp.head = if from < head_len {
            HeadState::Pending { from }
        } else {
            HeadState::Done
        };
        self.deadline_ms = cx.now_ms + cx.limits.send_timeout_ms;
        self.try_send(cx, out);
    }

    /// A chunk send completed: its result (`more`: SEND_ZC's notification is still to come),
    /// or the notification itself.
    pub fn on_send(
        &mut self,
        slot: ArenaSlot,
        res: i32,
        more: bool,
        notification: bool,
        cx: &Ctx,
        out: &mut Actions,
    ) {
        let kernel_done = notification || !more;
        let open = self.is_open();
        let ch = self.chunk_mut(slot);
        if kernel_done && ch.zerocopy {
            ch.zerocopy = false;
            out.push(Action::ZcReleased);
        }
        if !open {
            ch.state = if kernel_done {
                ChunkState::Ready
            } else {
                ChunkState::AwaitNotif
            };
            if kernel_done {
                self.maybe_finish_close(out);
            }
            return;
        }
        if notification {
            assert_eq!(ch.state, ChunkState::AwaitNotif);
            if ch.sent < ch.send_len {
                // The socket was full when SEND_ZC returned short: wait until it drains.
                ch.state = ChunkState::Parked;
                self.park(cx, out);
            } else {
                self.remove_chunk(slot, out);
                self.send_soon(cx, out);
            }
            return;
        }
        assert_eq!(ch.state, ChunkState::Sending);
        let took = match res {
            n if n > 0 => n as u32,
            n if -n == libc::EAGAIN => 0,
            _ => {
                if more {
                    ch.state = ChunkState::AwaitNotif;
                    ch.sent = ch.send_len; // nothing more will be sent; wait for the buffer
                } else {
                    ch.state = ChunkState::Ready;
                }
                self.close(CloseReason::Abort, cx, out);
                return;
            }
        };
        ch.sent += took;
        let whole = ch.sent == ch.send_len;
        let source = ch.source;
        let state = if more {
            ChunkState::AwaitNotif
        } else if whole {
            ChunkState::Ready // removed below
        } else {
            ChunkState::Parked
        };
        ch.state = state;
        let tls = ch.tls.is_some();
        if took > 0 {
            out.push(Action::Count(Counter::Bytes(source), u64::from(took)));
            if tls {
                out.push(Action::Count(Counter::TlsBytesOut, u64::from(took)));
            }
            self.sent_bytes(u64::from(took), cx, out);
            self.deadline_ms = cx.now_ms + cx.limits.send_timeout_ms;
        }
        self.note_socket_round(took, whole, cx, out);
        if state == ChunkState::Parked {
            self.park(cx, out);
            return;
        }
        if state == ChunkState::Ready {
            self.remove_chunk(slot, out);
        }
        self.send_soon(cx, out);
    }

    /// A chunk is done: its slot goes back, and the connection may plan more.
    pub(super) fn remove_chunk(&mut self, slot: ArenaSlot, out: &mut Actions) {
        let body = self.body_mut().expect("a chunk without a body");
        let i = body.chunk_index(slot);
        body.chunks.remove(i);
        let more = !body.segments.is_empty();
        out.push(Action::ReleaseSlot(slot));
        if more {
            out.push(Action::QueueBulk);
        }
    }

    /// Counts `n` (> 0) bytes that left for the current response; the first ones mark its
    /// first byte.
    pub(super) fn sent_bytes(&mut self, n: u64, cx: &Ctx, out: &mut Actions) {
        debug_assert!(n > 0, "only bytes that left are counted");
        if self.resp_bytes == 0 {
            out.push(Action::Ttfb(
                cx.now_us.saturating_sub(self.request_start_us),
            ));
        }
        self.resp_bytes += n;
    }

    /// Learns from one send how much the socket takes: a whole send lets the connection read
    /// ahead its full pipeline with full-size reads; a short one (the socket filled up) records
    /// what this writable round took (the read size after a reclaim) and gives back read-ahead
    /// beyond `READ_AHEAD_START_CHUNKS`, so a slow client is never handed more than it can
    /// take.
    pub(super) fn note_socket_round(
        &mut self,
        took: u32,
        whole: bool,
        cx: &Ctx,
        out: &mut Actions,
    ) {
        let chunk_bytes = self.payload_cap(cx);
        self.round_bytes += u64::from(took);
        self.fast_drain = whole;
        if whole {
            // Until its socket has once filled up, a connection doubles its reads (a fresh
            // download reaches full-size reads within a few sends). After that it knows what a
            // round takes and grows by one step per whole send: doubling past the estimate
            // made every other read overshoot the socket by the estimate, and under arena
            // pressure that overshoot was given back and read again.
            let learnt = self.round_estimate_bytes > 0;
            if let Some(body) = self.body_mut() {
                body.read_ahead = cx.limits.pipeline_depth;
                let grown = if learnt {
                    body.read_size_bytes.saturating_add(MIN_READ_BYTES)
                } else {
                    body.read_size_bytes.saturating_mul(2)
                };
                body.read_size_bytes = grown.min(chunk_bytes);
            }
            return;
        }
        // What one writable round took: the size of reads once parked chunks are reclaimed
        // (a re-read of what a slow socket could not take wastes disk time).
        self.round_estimate_bytes =
            (self.round_bytes as usize).clamp(MIN_READ_BYTES.min(chunk_bytes), chunk_bytes);
        self.cut_read_ahead(out);
    }

    /// Back to `READ_AHEAD_START_CHUNKS` of read-ahead: the chunks beyond it that the kernel
    /// does not hold go back to the arena.
    pub(super) fn cut_read_ahead(&mut self, out: &mut Actions) {
        let Some(body) = self.body_mut() else {
            return;
        };
        if body.read_ahead > READ_AHEAD_START_CHUNKS {
            body.read_ahead = READ_AHEAD_START_CHUNKS;
            self.give_back_chunks(READ_AHEAD_START_CHUNKS, GiveBack::ReadAhead, out);
        }
    }

    /// The socket is full: wait for it to drain (one poll per connection; no buffer is lent
    /// to the kernel meanwhile) and list it so its chunks can be reclaimed.
    pub(super) fn park(&mut self, cx: &Ctx, out: &mut Actions) {
        self.fast_drain = false;
        if !self.ops.poll {
            self.ops.poll = true;
            // The hold runs from the last park after which the socket took bytes: a wake-up
            // that sent nothing (a spurious poll completion, a socket full again at once)
            // must not restart it, or a stalled client keeps its chunks for ever.
            if self.round_bytes > 0 || self.parked_ms == 0 {
                self.parked_ms = cx.now_ms;
            }
            out.push(Action::PollWritable);
        }
        out.push(Action::Count(Counter::ParkedSend, 1));
        // Parked again with nothing taken since the hold began: the chunks go back now (the
        // sweep may never find it parked when every wake-up sends nothing and parks again).
        self.reclaim_past_hold(cx, out);
        out.push(Action::ListParked);
        out.push(Action::Reclaim);
    }

    /// Gives back every chunk it can when the connection has been parked longer than
    /// `PARK_HOLD_MS` (see `reclaim`).
    pub(super) fn reclaim_past_hold(&mut self, cx: &Ctx, out: &mut Actions) {
        if cx.now_ms >= self.parked_ms + crate::shard::PARK_HOLD_MS {
            self.reclaim(out);
        }
    }

    /// The socket drained below its low-water mark: parked chunks may send again, and a
    /// connection whose chunks were reclaimed plans fresh reads.
    pub fn on_writable(&mut self, res: i32, cx: &Ctx, out: &mut Actions) {
        assert!(self.ops.poll, "poll completion without a poll");
        self.ops.poll = false;
        if !self.is_open() {
            self.maybe_finish_close(out);
            return;
        }
        if res < 0 && -res != libc::ECANCELED {
            self.close(CloseReason::Abort, cx, out);
            return;
        }
        self.round_bytes = 0;
        if let Some(body) = self.body_mut() {
            for ch in body.chunks.iter_mut() {
                if ch.state == ChunkState::Parked {
                    ch.state = ChunkState::Ready;
                }
            }
        }
        out.push(Action::QueueBulk);
    }

    /// Takes every chunk a parked connection holds (someone waits for the arena, or it has
    /// been parked longer than `PARK_HOLD_MS`); its later reads are sized to what its socket
    /// takes per writable round, so the next reclaim wastes little.
    pub fn reclaim(&mut self, out: &mut Actions) {
        let freed = self.give_back_chunks(0, GiveBack::Reclaim, out);
        out.push(Action::Count(Counter::ReclaimedChunks, freed as u64));
        let estimate = self.round_estimate_bytes;
        if let Some(body) = self.body_mut() {
            body.read_size_bytes = estimate;
        }
    }

    /// Its rate limit allows more bytes now: plan them.
    pub fn on_limit_wake(&mut self, out: &mut Actions) {
        if self.is_open() && self.body().is_some() {
            out.push(Action::QueueBulk);
        }
    }

    /// The timer sweep for a connection holding a SEND_ZC chunk: a buffer the peer is slow
    /// to acknowledge gives no completion to learn from, so the read-ahead behind it is given
    /// back here.
    pub fn check_zerocopy_stuck(&mut self, cx: &Ctx, out: &mut Actions) {
        if !self.is_open() {
            return;
        }
        let now = cx.now_ms;
        let stuck = self.body().is_some_and(|b| {
            b.read_ahead > READ_AHEAD_START_CHUNKS
                && b.chunks.iter().any(|ch| {
                    ch.state == ChunkState::AwaitNotif
                        && now.saturating_sub(ch.send_started_ms) > READ_AHEAD_FAST_SEND_MS
                })
        });
        if stuck {
            self.cut_read_ahead(out);
        }
    }

    /// Gives back chunks beyond `keep` that the kernel does not hold (read-ahead not yet sent,
    /// or the unsent rest of a parked chunk), newest first, and rewinds the body so those bytes
    /// are planned again when the client catches up: the disk, not the arena, buffers a slow
    /// client. A chunk whose response header has not fully left is kept.
    pub(super) fn give_back_chunks(
        &mut self,
        keep: usize,
        why: GiveBack,
        out: &mut Actions,
    ) -> usize {
        let ConnMachine {
            write,
            tls,
            rate_limit,
            egress,
            ..
        } = self;
        let WriteState::Responding(Response {
            body: Some(body), ..
        }) = write
        else {
            return 0;
        };
        if body.relay {
            // Relayed bytes cannot be read again: they leave, or the connection ends.
            return 0;
        }
        let mut freed = 0;
        while body.chunks.len() > keep {
            let Some(last) = body.chunks.back() else {
                break;
            };
            // A chunk waiting for its block to be fetched again keeps its slot: it is read
            // again in place when the block is back.
            let ours = !last.state.kernel_holds() && last.state != ChunkState::Refetching;
            // Plaintext offsets in the slot: where the chunk's bytes began, the first one not
            // yet delivered, the end. A sealed chunk goes back to the start of its first
            // record that did not leave whole; one that left in part is sealed again
            // identically later (same length and sequence number, its sent bytes skipped).
            let (pt_off, unsent_at, send_end, record) = last.plaintext_progress();
            let rewind = last.tls.zip(record).map(|(run, (k, within))| {
                let resume = (within > 0).then(|| Resume {
                    len: run.cut.pt_len_of(k),
                    skip: within,
                });
                (run.first_seq + u64::from(k), resume)
            });
            let head_unsent = last.bytes_from == BytesFrom::File && unsent_at < last.read_buf_off;
            if !ours || head_unsent {
                break;
            }
            if let Some((seq, resume)) = rewind {
                tls.as_mut()
                    .expect("a sealed chunk on a connection without TLS")
                    .rewind(seq, resume);
            }
            let rest = send_end - unsent_at;
            if egress.is_some() && rest > 0 {
                out.push(Action::EgressRefund(u64::from(rest)));
            }
            // Each chunk comes from one segment, and segments follow in stream order, so the
            // unsent bytes go in front of whatever is still to plan.
            match last.bytes_from {
                BytesFrom::Framing { at } => {
                    let start = at + (unsent_at - pt_off);
                    body.segments.push_front(Segment::Mem {
                        start,
                        end: start + rest,
                    });
                }
                BytesFrom::Zero => match body.segments.front_mut() {
                    Some(Segment::Zero { remaining }) => *remaining += u64::from(rest),
                    _ => body.segments.push_front(Segment::Zero {
                        remaining: u64::from(rest),
                    }),
                },
                BytesFrom::File | BytesFrom::FramedFile { .. } => {
                    let (framing_at, framing_len) = match last.bytes_from {
                        BytesFrom::FramedFile { at, len } => (at, len),
                        _ => (0, 0),
                    };
                    let data_at = unsent_at.max(pt_off + framing_len);
                    let start = last.read_file_off + u64::from(data_at - last.read_buf_off);
                    let end = last.read_file_off + u64::from(send_end - last.read_buf_off);
                    if end > start {
                        let why = match why {
                            GiveBack::Reclaim if last.sent == 0 => GiveBack::ReclaimUnsent,
                            why => why,
                        };
                        out.push(Action::Count(Counter::GivenBack(why), end - start));
                    }
                    // Given back unsent: the limit lets those bytes be planned again.
                    if let Some(l) = rate_limit.as_mut() {
                        l.planned_bytes = l.planned_bytes.saturating_sub(end - start);
                    }
                    match body.segments.front_mut() {
                        // The rest of the same file range: extend it back.
                        Some(Segment::File { pos, .. }) if *pos == end => *pos = start,
                        // That range was planned to its end (a part header or nothing follows).
                        _ => body.segments.push_front(Segment::File { pos: start, end }),
                    }
                    let header_sent = unsent_at - pt_off;
                    if header_sent < framing_len {
                        // The part header did not fully leave: its rest goes first.
                        body.segments.push_front(Segment::Mem {
                            start: framing_at + header_sent,
                            end: framing_at + framing_len,
                        });
                    }
                }
            }
            out.push(Action::ReleaseSlot(last.slot));
            body.chunks.pop_back();
            freed += 1;
        }
        freed
    }

    /// The response is complete: release what it held, then keep the connection (and parse
    /// a pipelined request or wait for one), linger, or close.
    pub(super) fn finish_response(&mut self, cx: &Ctx, out: &mut Actions) {
        self.give_back_handed(out);
        let rate_waited = self.rate_limit.is_some_and(|l| l.waits > 0);
        let egress_waited = self.egress.is_some_and(|e| e.waits > 0);
        self.limiter = match (rate_waited, egress_waited) {
            (true, true) => Some("rate+egress"),
            (true, false) => Some("rate"),
            (false, true) => Some("egress"),
            (false, false) => None,
        };
        let WriteState::Responding(resp) = std::mem::replace(&mut self.write, WriteState::Idle)
        else {
            panic!("finishing a response that was not started");
        };
        assert!(resp.body.as_ref().is_none_or(|b| b.chunks.is_empty()));
        let tls_done = self.tls.as_ref().is_some_and(|t| t.wants_close());
        let (status, keep_alive) = (resp.status, resp.keep_alive && !tls_done);
        self.end_response(resp, out);
        let eof = self.read == ReadState::Eof;
        if !keep_alive && !eof && status >= 400 {
            self.begin_linger(cx, out);
            return;
        }
        // After a FIN, requests already received (pipelined) are still answered.
        if !keep_alive || (eof && self.rx.is_empty()) || cx.draining {
            self.close(CloseReason::Normal, cx, out);
            return;
        }
        if self.rx.is_empty() {
            self.set_deadline(Deadline::Idle, cx.now_ms + cx.limits.keepalive_timeout_ms);
            self.idle_tls_memory(out);
            self.arm_recv(out);
        } else {
            // A pipelined request is already here.
            self.set_deadline(Deadline::Header, cx.now_ms + cx.limits.header_timeout_ms);
            out.push(Action::QueueUrgent);
        }
    }

    /// After an error response on a connection the client may still be writing to (a 414 or
    /// 431 with the rest of the head unread): shut our write side so the client sees the
    /// response and a FIN, then read and drop what it sends (bounded in bytes and time) until
    /// it closes (nginx's lingering close).
    pub(super) fn begin_linger(&mut self, cx: &Ctx, out: &mut Actions) {
        self.life = ConnLife::Lingering { dropped_bytes: 0 };
        self.rx.clear();
        self.head_scan.reset();
        self.set_deadline(Deadline::Linger, cx.now_ms + LINGER_TIMEOUT_MS);
        match self.tls.as_mut().filter(|t| t.is_open()) {
            // close_notify first; the write side is shut once it has left.
            Some(tls) => {
                tls.queue_close_notify();
                self.linger_shutdown_due = true;
                self.send_tls_output(out);
            }
            None => {
                self.ops.shutdown = true;
                out.push(Action::ShutdownWrite);
            }
        }
        self.arm_recv(out);
    }
}
