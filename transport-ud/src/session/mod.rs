//! One peer's message stream over datagrams: exactly once, in order, flow-controlled. Sans
//! I/O: datagrams come in through [`Session::handle_datagram`] and go out through
//! [`Session::poll_transmit`], time comes in as arguments, and the caller runs
//! [`Session::handle_timeout`] at [`Session::poll_timeout`].
//!
//! **Sending.** Messages queue (up to `max_queued` bytes: then `WouldBlock`) and leave as
//! datagrams of at most `max_datagram` bytes: a message too long for one is cut into
//! segments (`FIRST` carries its length); several small queued messages share one datagram
//! (`Packed`). Each datagram has a sequence number; at most `send_window` are in flight, and
//! none beyond the credit the peer granted. The peer acknowledges cumulatively, with a bitmap
//! of the 32 packets after (selective); after a retransmission timeout (doubling, up to
//! `max_rto`) the unacknowledged, unselected packets go again, asking for an immediate
//! acknowledgement. A peer that acknowledges nothing for `peer_timeout` is unreachable.
//!
//! **Receiving.** The credit granted is `recv_window` packets beyond what the application
//! has not taken yet (whole messages waiting, and the segments of the one being
//! reassembled): memory is bounded whatever the peer does, and a receiver holding packets
//! out of order holds them inside that credit. Duplicates and packets beyond the credit are
//! dropped and counted; acknowledgements go with the next datagram, or alone after
//! `ack_delay`, at once for out-of-order packets and retransmissions.
//!
//! **Closing.** `close` queues a `Fin` after the last message; the peer delivers everything
//! before it, then answers with its own. A silent peer is probed after a quiet spell and
//! declared unreachable after `peer_timeout` without a datagram; a sender waiting for credit
//! probes so that a lost credit update cannot stall it.
//!
//! **Credit from a budget.** The window is the transport's to set ([`Session::set_window`]):
//! a sender without credit asks for some (`WANT`), and a receiver may take credit back from
//! an idle sender ([`Session::recall`]), which skips the sequence numbers it will not use.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::outbox::{Cut, Outbox};
use crate::seq::Seq;
use crate::wire::{self, HEADER_LEN, Header, Kind, MSG_LEN_PREFIX, flags};

mod credit;
mod types;

pub use types::{Cause, SendError, SessionConfig, SessionStats};

/// The most credit a peer can grant beyond what it acknowledged, in datagrams: each is a
/// receive buffer it holds, and no receive queue holds more (the bootstrap's largest
/// window is 65,536; this leaves room for a transport's budget to grow one).
pub const MAX_PEER_CREDIT: u32 = 1 << 17;

/// A datagram sent and not yet acknowledged.
#[derive(Debug)]
struct Sent {
    seq: Seq,
    kind: Kind,
    flags: u8,
    payload: Vec<u8>,
    sacked: bool,
}

/// A datagram received ahead of a missing one.
#[derive(Debug)]
struct Held {
    kind: Kind,
    flags: u8,
    payload: Vec<u8>,
}

/// The message being reassembled.
#[derive(Debug)]
struct Partial {
    buf: Vec<u8>,
    want: usize,
    packets: u32,
}

/// One peer's stream (see the module docs).
#[derive(Debug)]
pub struct Session {
    cfg: SessionConfig,
    /// What the peer's datagrams must carry.
    token: u32,
    /// The peer's session id and token, for our datagrams.
    peer_id: u32,
    peer_token: u32,

    /// Messages accepted and not yet wholly sent.
    outbox: Outbox,
    /// The application closed this side.
    local_close: bool,
    /// Our `Fin` is due (the application closed, or the peer did and we answer).
    closed_here: bool,
    fin_sent: bool,
    fin_acked: bool,
    next_seq: Seq,
    snd_una: Seq,
    peer_credit: Seq,
    inflight: VecDeque<Sent>,
    retransmit: VecDeque<Seq>,
    rto_at: Option<Instant>,
    backoff: u32,
    /// After a retransmission timeout: what was sent before it (only the oldest packet
    /// went again, the others go once the peer answers).
    recover_to: Option<Seq>,
    /// When the peer last acknowledged something new (or we started waiting for it).
    progress_at: Instant,

    rcv_next: Seq,
    /// Datagrams `rcv_next + i` received ahead of `rcv_next`.
    ahead: VecDeque<Option<Held>>,
    partial: Option<Partial>,
    inbox: VecDeque<(Vec<u8>, u32)>,
    /// Packets of the whole messages the application has not taken yet.
    held: u32,
    /// The highest credit ever told: the peer may send up to it whatever we hold since
    /// (lowered only by the peer's `RETURN`).
    granted: Seq,
    /// Datagrams we grant beyond the whole messages the application holds (the transport
    /// sets it from its budget; `recv_window` to start with).
    window: u32,
    /// The peer asked for credit (`WANT`), and the transport has not looked yet.
    wanted: bool,
    /// We asked the peer to give its unused credit back, and it has not yet.
    recall_out: bool,
    /// When an unanswered recall is asked again.
    recall_at: Option<Instant>,
    /// Our credit-stall probes ask for credit.
    want_out: bool,
    peer_fin: bool,
    ack_now: bool,
    ack_at: Option<Instant>,
    /// The credit we last told the peer.
    credit_told: Seq,
    last_rx: Instant,
    /// A probe (an acknowledgement that asks for one) is due.
    probe_due: bool,
    /// When a sender stalled on credit probes next.
    probe_at: Option<Instant>,
    /// Stall probes since credit last grew (each waits twice as long as the one before).
    probes: u8,
    /// When a quiet peer is probed next (keepalive).
    keepalive_at: Instant,
    dead: Option<Cause>,
    stats: SessionStats,
}

impl Session {
    /// A session whose datagrams carry `token`, towards the peer's session `peer_id` with
    /// `peer_token`, both sides starting at `first` sent and `peer_first` received, this
    /// side granting `window` datagrams and the peer `peer_window` until it says more (the
    /// set-up exchanges them; either may be 0, and the sender then asks with `WANT`).
    pub fn new(
        cfg: SessionConfig,
        token: u32,
        (peer_id, peer_token): (u32, u32),
        (first, peer_first): (Seq, Seq),
        (window, peer_window): (u32, u32),
        now: Instant,
    ) -> Self {
        let credit = peer_first.plus(window);
        Self {
            token,
            peer_id,
            peer_token,
            outbox: Outbox::default(),
            local_close: false,
            closed_here: false,
            fin_sent: false,
            fin_acked: false,
            next_seq: first,
            snd_una: first,
            // Until the peer says otherwise: the window it announced.
            peer_credit: first.plus(peer_window),
            inflight: VecDeque::new(),
            retransmit: VecDeque::new(),
            rto_at: None,
            backoff: 0,
            recover_to: None,
            progress_at: now,
            rcv_next: peer_first,
            ahead: VecDeque::new(),
            partial: None,
            inbox: VecDeque::new(),
            held: 0,
            granted: credit,
            window,
            wanted: false,
            recall_out: false,
            recall_at: None,
            want_out: false,
            peer_fin: false,
            ack_now: false,
            ack_at: None,
            credit_told: credit,
            last_rx: now,
            probe_due: false,
            probe_at: None,
            probes: 0,
            // Sessions set up together would probe together for ever: the first probe
            // comes between half and all of the usual quiet time, by the token.
            keepalive_at: now
                + cfg.peer_timeout / 6
                + (cfg.peer_timeout / 6) * (token % 1024) / 1024,
            dead: None,
            stats: SessionStats::default(),
            cfg,
        }
    }

    // ------------------------------------------------------------------ application side

    /// Queues a message.
    ///
    /// # Errors
    /// [`SendError`]: full queue, too large, closed.
    pub fn send(&mut self, msg: &[u8]) -> Result<(), SendError> {
        if self.closed_here || self.dead.is_some() || self.peer_fin {
            return Err(SendError::Closed);
        }
        if msg.len() > self.cfg.max_message {
            return Err(SendError::TooLarge {
                len: msg.len(),
                max: self.cfg.max_message,
            });
        }
        if !self.outbox.is_empty() && self.outbox.bytes() + msg.len() > self.cfg.max_queued {
            return Err(SendError::WouldBlock);
        }
        self.outbox.push(msg);
        Ok(())
    }

    /// The next message, in order.
    pub fn recv(&mut self) -> Option<Vec<u8>> {
        let (m, packets) = self.inbox.pop_front()?;
        self.held = self.held.saturating_sub(packets);
        self.stats.delivered += 1;
        // A peer stalled on credit hears of the room as soon as half a window opened.
        if self.credit().since(self.credit_told) >= i64::from(self.window / 2).max(1) {
            self.ack_now = true;
        }
        Some(m)
    }

    /// Whether this side is closing (the application closed, or the peer did).
    pub fn is_closing(&self) -> bool {
        self.closed_here
    }

    /// Whether our `Fin` was acknowledged: the peer has everything we sent.
    pub fn fin_acked(&self) -> bool {
        self.fin_acked
    }

    /// Why the session died, if it did (unreachable peer, protocol violation).
    pub fn dead_cause(&self) -> Option<Cause> {
        self.dead.clone()
    }

    /// Whether a whole message waits to be taken.
    pub fn has_message(&self) -> bool {
        !self.inbox.is_empty()
    }

    /// Drops the messages waiting (their credit goes back to the peer): for a session whose
    /// application went away.
    pub fn drop_messages(&mut self) {
        self.inbox.clear();
        self.held = 0;
        self.ack_now = true;
    }

    /// Closes this side in order: what is queued goes first, then the `Fin`.
    pub fn close(&mut self) {
        self.local_close = true;
        self.closed_here = true;
    }

    /// Why the session is over, once it is: the peer's close once its messages are all
    /// taken, ours once the peer confirmed it, or what went wrong.
    pub fn cause(&self) -> Option<Cause> {
        if let Some(c) = &self.dead {
            return Some(c.clone());
        }
        if self.peer_fin && self.inbox.is_empty() {
            // (Our answering Fin may still be on its way: the stream itself is over.)
            return Some(if self.local_close {
                Cause::LocalClose
            } else {
                Cause::PeerClosed
            });
        }
        None
    }

    /// Whether the peer will send no more data: its `Fin` came (in order, after everything
    /// it sent), or the session is dead. Credit told to it is void then.
    pub fn peer_done(&self) -> bool {
        self.peer_fin || self.dead.is_some()
    }

    /// Whether the session has nothing left to do: dead, or both sides closed and
    /// confirmed, and every message taken.
    pub fn is_finished(&self) -> bool {
        self.dead.is_some() || (self.peer_fin && self.fin_acked && self.inbox.is_empty())
    }

    /// Counters.
    pub fn stats(&self) -> SessionStats {
        self.stats
    }

    /// Bytes queued and not yet sent.
    pub fn queued_bytes(&self) -> usize {
        self.outbox.bytes()
    }

    /// Datagrams sent and not yet acknowledged.
    pub fn in_flight(&self) -> usize {
        self.inflight.len()
    }

    /// Packets of the whole messages waiting for the application.
    pub fn held_packets(&self) -> u32 {
        self.held
    }

    /// Datagrams held out of order (each one a receive buffer).
    pub fn held_ahead(&self) -> usize {
        self.ahead.iter().filter(|h| h.is_some()).count()
    }

    // ------------------------------------------------------------------ network side

    /// The selective acknowledgement of the 32 packets after `rcv_next`.
    fn sack(&self) -> u32 {
        let mut bits = 0u32;
        for (i, h) in self.ahead.iter().enumerate().skip(1).take(32) {
            if h.is_some() {
                bits |= 1 << (i - 1);
            }
        }
        bits
    }

    fn header(&self, kind: Kind, flags: u8, seq: Seq, len: usize) -> Header {
        let mut flags = flags;
        if self.is_recalling() {
            flags |= flags::RECALL;
        }
        // With nothing in flight, every number below `next_seq` was received: say so, so
        // that numbers skipped by a recall are counted as received even if the first
        // answer was lost.
        if kind == Kind::Ack && self.inflight.is_empty() {
            flags |= flags::RETURN;
        }
        Header {
            kind,
            flags,
            dst_session: self.peer_id,
            dst_token: self.peer_token,
            seq,
            ack: self.rcv_next,
            sack: self.sack(),
            credit: self.credit(),
            len: len as u16,
        }
    }

    /// Writes the next datagram to send into `out` (at least `max_datagram` bytes) and
    /// returns its length; `None` when nothing is to be sent now.
    pub fn poll_transmit(&mut self, now: Instant, out: &mut [u8]) -> Option<usize> {
        if self.dead.is_some() || out.len() < HEADER_LEN {
            return None;
        }
        // (The header's length field is 16 bits.)
        let room = self
            .cfg
            .max_datagram
            .min(out.len())
            .min(HEADER_LEN + usize::from(u16::MAX))
            .saturating_sub(HEADER_LEN);
        // Retransmissions first.
        while let Some(seq) = self.retransmit.pop_front() {
            let Some(s) = self.inflight.iter().find(|s| s.seq == seq && !s.sacked) else {
                continue;
            };
            let h = self.header(s.kind, s.flags | flags::ACK_NOW, s.seq, s.payload.len());
            let n = HEADER_LEN + s.payload.len();
            let Some(dst) = out.get_mut(HEADER_LEN..n) else {
                continue;
            };
            dst.copy_from_slice(&s.payload);
            h.write(out);
            self.after_send(now, true);
            self.stats.retransmits += 1;
            return Some(n);
        }
        // New data, within the window and the peer's credit.
        let may = self.inflight.len() < self.cfg.send_window as usize
            && self.next_seq.before(self.peer_credit);
        if may
            && room > MSG_LEN_PREFIX
            && let Some((kind, fl, payload)) = self.next_payload(room)
        {
            let seq = self.next_seq;
            self.next_seq = seq.next();
            let h = self.header(kind, fl, seq, payload.len());
            let n = HEADER_LEN + payload.len();
            h.write(out);
            out[HEADER_LEN..n].copy_from_slice(&payload);
            if self.inflight.is_empty() {
                self.progress_at = now;
                self.rto_at = Some(now + self.rto());
            }
            self.inflight.push_back(Sent {
                seq,
                kind,
                flags: fl,
                payload,
                sacked: false,
            });
            self.after_send(now, false);
            return Some(n);
        }
        // Data waits for credit with nothing in flight: probe, or a lost credit update
        // would stall us for ever.
        let stalled = !may && self.inflight.is_empty() && self.has_unsent();
        self.want_out = stalled;
        if stalled && self.probe_at.is_none() {
            // Ask for credit at once (the peer may hold none for us), then every `rto`.
            self.probe_at = Some(now + self.cfg.rto);
            self.probes = 0;
            self.probe_due = true;
        }
        let ack_due = self.ack_now || self.ack_at.is_some_and(|t| t <= now);
        if ack_due || self.probe_due {
            let mut fl = if self.probe_due { flags::ACK_NOW } else { 0 };
            if self.probe_due && self.want_out {
                fl |= flags::WANT;
            }
            let h = self.header(Kind::Ack, fl, self.next_seq, 0);
            h.write(out);
            self.probe_due = false;
            self.after_send(now, false);
            self.stats.acks += 1;
            return Some(HEADER_LEN);
        }
        None
    }

    /// Every datagram carries our acknowledgement and credit: nothing is owed after one.
    fn after_send(&mut self, _now: Instant, _retransmission: bool) {
        self.stats.sent += 1;
        self.ack_now = false;
        self.ack_at = None;
        self.credit_told = self.credit();
        self.granted = self.credit_told;
    }

    fn has_unsent(&self) -> bool {
        !self.outbox.is_empty() || (self.closed_here && !self.fin_sent)
    }

    /// The payload of the next new datagram: a segment of the first queued message, several
    /// small messages packed, or the `Fin`.
    fn next_payload(&mut self, room: usize) -> Option<(Kind, u8, Vec<u8>)> {
        match self.outbox.cut(room, self.cfg.pack_max) {
            Some(Cut::Packed { payload, messages }) => {
                self.stats.packed += messages;
                Some((Kind::Packed, 0, payload))
            }
            Some(Cut::Segment {
                first,
                last,
                payload,
            }) => {
                let fl = if first { flags::FIRST } else { 0 } | if last { flags::LAST } else { 0 };
                Some((Kind::Data, fl, payload))
            }
            None if self.closed_here && !self.fin_sent => {
                self.fin_sent = true;
                Some((Kind::Fin, 0, Vec::new()))
            }
            None => None,
        }
    }

    /// The retransmission timeout now: doubling from `rto` with every timeout in a row, up
    /// to `max_rto` and to an eighth of the peer timeout (so that eight tries fit before a
    /// peer that acknowledges nothing is given up on).
    fn rto(&self) -> Duration {
        let cap = self
            .cfg
            .max_rto
            .min(self.cfg.peer_timeout / 8)
            .max(self.cfg.rto);
        (self.cfg.rto * (1u32 << self.backoff.min(16))).min(cap)
    }

    /// Takes a datagram of this session (its header checked by [`Header::parse`] and
    /// addressed to us). Datagrams that do not belong are dropped and counted; a peer that
    /// breaks the protocol ends the session (`Cause::Protocol`).
    pub fn handle_datagram(&mut self, now: Instant, h: &Header, payload: &[u8]) {
        if self.dead.is_some() {
            return;
        }
        if h.dst_token != self.token {
            self.stats.refused += 1;
            return;
        }
        // An acknowledgement of what we never sent is forged (or from another life of the
        // session): drop the whole datagram. (One behind ours is only old: reordered.)
        if h.ack.since(self.next_seq) > 0 {
            self.stats.refused += 1;
            return;
        }
        // Credit is what the peer holds receive buffers for beyond what it acknowledged: more
        // than any receiver can hold is a lie (one far behind is only old, and ignored).
        let credit = h.credit.since(h.ack);
        if credit > i64::from(MAX_PEER_CREDIT) {
            self.die(Cause::Protocol(format!(
                "a credit of {credit} datagrams; no receiver holds more than {MAX_PEER_CREDIT}"
            )));
            return;
        }
        if h.kind.is_sequenced() {
            let off = h.seq.since(self.rcv_next);
            let limit = self.credit().since(self.rcv_next);
            if off >= limit {
                self.stats.refused += 1;
                return;
            }
            if off < 0 {
                // Our acknowledgement was lost: say it again.
                self.stats.duplicates += 1;
                self.ack_now = true;
                self.take_ack(now, h);
                self.last_rx = now;
                self.keepalive_at = now + self.probe_after();
                return;
            }
        }
        self.last_rx = now;
        self.keepalive_at = now + self.probe_after();
        self.stats.received += 1;
        self.take_ack(now, h);
        if h.has(flags::ACK_NOW) {
            self.ack_now = true;
        }
        self.take_credit_flags(h);
        if !h.kind.is_sequenced() {
            return;
        }
        let off = h.seq.since(self.rcv_next) as usize;
        while self.ahead.len() <= off {
            self.ahead.push_back(None);
        }
        if self.ahead[off].is_some() {
            self.stats.duplicates += 1;
            self.ack_now = true;
            return;
        }
        self.ahead[off] = Some(Held {
            kind: h.kind,
            flags: h.flags,
            payload: payload.to_vec(),
        });
        if off > 0 {
            self.stats.out_of_order += 1;
            self.ack_now = true;
            return;
        }
        let mut delivered = 0u32;
        while let Some(Some(_)) = self.ahead.front() {
            let Some(Some(p)) = self.ahead.pop_front() else {
                break;
            };
            self.rcv_next = self.rcv_next.next();
            delivered += 1;
            if let Err(why) = self.in_order(p) {
                self.die(Cause::Protocol(why));
                return;
            }
        }
        // Acknowledge every other datagram at once, the rest after `ack_delay` unless a
        // datagram of ours carries it first.
        if delivered >= 2 || self.ack_at.is_some() {
            self.ack_now = true;
        } else {
            self.ack_at = Some(now + self.cfg.ack_delay);
        }
    }

    /// The acknowledgement and credit of a datagram from the peer.
    fn take_ack(&mut self, now: Instant, h: &Header) {
        if h.ack.before(self.snd_una) {
            // An old datagram, overtaken: its acknowledgement says nothing new.
            return;
        }
        if h.credit.since(self.peer_credit) > 0 {
            self.peer_credit = h.credit;
            self.probe_at = None;
            self.probes = 0;
        }
        let mut advanced = false;
        while let Some(s) = self.inflight.front() {
            if !s.seq.before(h.ack) {
                break;
            }
            if s.kind == Kind::Fin {
                self.fin_acked = true;
            }
            self.inflight.pop_front();
            advanced = true;
        }
        if advanced {
            self.snd_una = h.ack;
            self.backoff = 0;
            self.progress_at = now;
            self.rto_at = (!self.inflight.is_empty()).then(|| now + self.rto());
        }
        for s in self.inflight.iter_mut() {
            let i = s.seq.since(h.ack) - 1;
            if (0..32).contains(&i) && h.sack & (1 << i) != 0 {
                s.sacked = true;
            }
        }
        if advanced && let Some(to) = self.recover_to.take() {
            // The peer answers again: what it still misses of what was sent before the
            // timeout was lost.
            self.retransmit = self
                .inflight
                .iter()
                .filter(|s| !s.sacked && s.seq.before(to))
                .map(|s| s.seq)
                .collect();
        }
    }

    /// A datagram whose turn has come.
    fn in_order(&mut self, p: Held) -> Result<(), String> {
        if self.peer_fin {
            return Err("a datagram after the peer's Fin".into());
        }
        match p.kind {
            Kind::Data => {
                let first = p.flags & flags::FIRST != 0;
                let mut data = &p.payload[..];
                match (&mut self.partial, first) {
                    (Some(_), true) => return Err("a message began inside another".into()),
                    (None, false) => return Err("a segment outside any message".into()),
                    (None, true) => {
                        let (len, rest) = data
                            .split_at_checked(MSG_LEN_PREFIX)
                            .ok_or("a first segment without its length")?;
                        let want = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
                        if want > self.cfg.max_message {
                            return Err(format!(
                                "a message of {want} bytes; the limit is {}",
                                self.cfg.max_message
                            ));
                        }
                        data = rest;
                        // Grown as segments come: a peer announcing a large message
                        // reserves nothing until it sends it.
                        self.partial = Some(Partial {
                            buf: Vec::with_capacity(want.min(1 << 16)),
                            want,
                            packets: 0,
                        });
                    }
                    (Some(_), false) => {}
                }
                let part = self.partial.as_mut().ok_or("no partial message")?;
                if part.buf.len() + data.len() > part.want {
                    return Err("a message longer than its length".into());
                }
                part.buf.extend_from_slice(data);
                part.packets += 1;
                if p.flags & flags::LAST != 0 {
                    let part = self.partial.take().ok_or("no partial message")?;
                    if part.buf.len() != part.want {
                        return Err("a message shorter than its length".into());
                    }
                    self.held += part.packets;
                    self.inbox.push_back((part.buf, part.packets));
                }
            }
            Kind::Packed => {
                if self.partial.is_some() {
                    return Err("packed messages inside a message".into());
                }
                let entries =
                    wire::packed_entries(&p.payload).ok_or("a malformed packed datagram")?;
                let last = entries.len() - 1;
                for (i, m) in entries.into_iter().enumerate() {
                    if m.len() > self.cfg.max_message {
                        return Err("a packed message over the limit".into());
                    }
                    // The datagram is freed with its last message.
                    self.inbox.push_back((m.to_vec(), u32::from(i == last)));
                }
                self.held += 1;
            }
            Kind::Fin => {
                if self.partial.is_some() {
                    return Err("a Fin inside a message".into());
                }
                self.peer_fin = true;
                // Answer with ours (after what we still have to send), and acknowledge at
                // once: the peer's close waits for it.
                self.closed_here = true;
                self.ack_now = true;
            }
            Kind::Ack => return Err("an acknowledgement in sequence".into()),
        }
        Ok(())
    }

    fn die(&mut self, cause: Cause) {
        tracing::debug!(?cause, "UD session down");
        self.dead = Some(cause);
        self.inflight.clear();
        self.retransmit.clear();
        self.outbox.clear();
        self.rto_at = None;
    }

    /// Gives back the memory of queues a busy spell grew and that are empty now (a quiet
    /// session then costs its own size, whatever it did before).
    fn trim(&mut self) {
        fn shrink<T>(q: &mut VecDeque<T>) {
            if q.is_empty() && q.capacity() > 0 {
                *q = VecDeque::new();
            }
        }
        self.outbox.shrink();
        shrink(&mut self.inflight);
        shrink(&mut self.retransmit);
        shrink(&mut self.ahead);
        shrink(&mut self.inbox);
    }

    /// When [`handle_timeout`](Self::handle_timeout) next has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.dead.is_some() || self.is_finished() {
            return None;
        }
        let death = self.last_rx + self.cfg.peer_timeout;
        [
            self.rto_at,
            self.ack_at,
            self.probe_at,
            self.recall_at.filter(|_| self.is_recalling()),
            Some(self.keepalive_at),
            Some(death),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Quiet time before a keepalive probe.
    fn probe_after(&self) -> Duration {
        self.cfg.peer_timeout / 3
    }

    /// Runs what is due at `now`: retransmissions, delayed acknowledgements, probes, and the
    /// verdict on a silent peer.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.dead.is_some() || self.is_finished() {
            return;
        }
        let silent = now.saturating_duration_since(self.last_rx);
        let stuck = !self.inflight.is_empty()
            && now.saturating_duration_since(self.progress_at) >= self.cfg.peer_timeout;
        if silent >= self.cfg.peer_timeout || stuck {
            self.die(Cause::PeerUnreachable);
            return;
        }
        if self.rto_at.is_some_and(|t| t <= now) && !self.inflight.is_empty() {
            // Only the oldest packet goes again: a receiver that stalled (rather than a
            // link that lost) would otherwise get the whole window twice, and a UD receive
            // queue has no room for copies. The rest follows once the peer answers.
            self.retransmit = self
                .inflight
                .iter()
                .find(|s| !s.sacked)
                .map(|s| s.seq)
                .into_iter()
                .collect();
            self.recover_to = Some(self.next_seq);
            if self.retransmit.is_empty() {
                // Everything left was selected: the cumulative acknowledgement was lost.
                self.probe_due = true;
            }
            self.backoff += 1;
            self.rto_at = Some(now + self.rto());
        }
        if self.ack_at.is_some_and(|t| t <= now) {
            self.ack_now = true;
        }
        if self.probe_at.is_some_and(|t| t <= now) {
            // Every probe is answered, and a peer short of budget keeps us in line: ask
            // again less and less often (up to the keepalive's third of the peer timeout),
            // at a cost of that long when the datagram granting credit is lost.
            self.probe_due = true;
            self.probes = self.probes.saturating_add(1);
            let wait = (self.cfg.rto * (1u32 << self.probes.min(16))).min(self.probe_after());
            self.probe_at = Some(now + wait.max(self.cfg.rto));
        }
        if self.recall_at.is_some_and(|t| t <= now) {
            // The recall or its answer was lost, or the peer was busy: ask again.
            self.recall_at = self.is_recalling().then(|| now + self.rto());
            self.ack_now |= self.recall_at.is_some();
        }
        if self.keepalive_at <= now {
            self.trim();
            // Quiet for a while: make sure the peer is there (again a third of the peer
            // timeout later if it stays quiet, so that two probes fit before the verdict).
            if self.inflight.is_empty() {
                self.probe_due = true;
            }
            self.keepalive_at = now + self.probe_after();
        }
    }
}

#[cfg(test)]
mod tests;
