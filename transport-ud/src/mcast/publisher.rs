//! A member's own stream: what it publishes, cut into datagrams numbered in order, kept in a
//! bounded retransmit window until every live member has it, paced by the slowest live
//! member, repaired on request, and the members' liveness (removed when silent, or when
//! they hold the publisher back for too long).

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use super::wire::{HEADER_LEN, Header, Kind, flags};
use super::{Dest, McastConfig, McastEvent, RemovedWhy};
use crate::outbox::{Cut, Outbox};
use crate::seq::Seq;
use crate::session::SendError;

/// A datagram of the stream, kept until every live member has it.
struct Kept {
    flags: u8,
    payload: Vec<u8>,
    /// When it was last repaired: requests within the holdoff are ignored (one repair
    /// serves every member that asked). The first send does not count: a request for it
    /// says it was lost, and waiting out a holdoff from it would only delay the repair.
    sent_at: Option<Instant>,
}

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Kept({:#x}, {} B, {:?})",
            self.flags,
            self.payload.len(),
            self.sent_at
        )
    }
}

/// What the publisher knows of a member (from its status messages).
#[derive(Debug)]
struct Receiver {
    /// The next datagram it expects (it has taken everything before).
    pos: Seq,
    /// Whole messages waiting for its application (none: it is not the reader that holds
    /// it back, but a repair on its way).
    waiting: u32,
    heard: Instant,
    /// Since when it has held the publisher back (a whole window behind) without moving,
    /// and where it was then.
    behind_since: Option<(Instant, Seq)>,
}

/// The publishing side of a member.
pub(super) struct Publisher {
    pub(super) epoch: u32,
    /// Messages not yet cut into datagrams.
    outbox: Outbox,
    /// The oldest datagram kept (`ring[0]`).
    base: Seq,
    next_seq: Seq,
    ring: VecDeque<Kept>,
    /// Datagrams to send again (repairs), oldest first, and where (the group, or the member
    /// that asked).
    repairs: VecDeque<(Seq, Dest)>,
    receivers: HashMap<u32, Receiver>,
    /// When the members are looked at next (silent, or holding the stream back): every
    /// status interval while there are any.
    check_at: Option<Instant>,
    last_sent: Option<Instant>,
    /// A member moved on, or went, since [`take_moved`](Self::take_moved) last looked.
    moved: bool,
    /// Counters.
    pub(super) repairs_sent: u64,
    pub(super) naks_ignored: u64,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("epoch", &self.epoch)
            .field("queued", &self.outbox.bytes())
            .field("base", &self.base.0)
            .field("next_seq", &self.next_seq.0)
            .field("ring", &self.ring)
            .field("repairs", &self.repairs)
            .field("receivers", &self.receivers)
            .field("last_sent", &self.last_sent)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    pub(super) fn new(epoch: u32, first: Seq) -> Self {
        Self {
            epoch,
            outbox: Outbox::default(),
            base: first,
            next_seq: first,
            ring: VecDeque::new(),
            repairs: VecDeque::new(),
            receivers: HashMap::new(),
            check_at: None,
            last_sent: None,
            moved: false,
            repairs_sent: 0,
            naks_ignored: 0,
        }
    }

    /// Queues a message.
    pub(super) fn publish(&mut self, cfg: &McastConfig, msg: &[u8]) -> Result<(), SendError> {
        if msg.len() > cfg.max_message {
            return Err(SendError::TooLarge {
                len: msg.len(),
                max: cfg.max_message,
            });
        }
        if self.outbox.bytes() > 0 && self.outbox.bytes() + msg.len() > cfg.max_queued {
            return Err(SendError::WouldBlock);
        }
        self.outbox.push(msg);
        Ok(())
    }

    /// Bytes queued and not yet in datagrams.
    pub(super) fn queued_bytes(&self) -> usize {
        self.outbox.bytes()
    }

    /// Live members the stream is paced by.
    pub(super) fn receivers(&self) -> usize {
        self.receivers.len()
    }

    /// Whether everything published was sent and taken by every live member's application.
    pub(super) fn settled(&self) -> bool {
        self.outbox.bytes() == 0 && self.receivers.values().all(|r| r.pos == self.next_seq)
    }

    /// Whether the stream waits for `member`.
    pub(super) fn paces(&self, member: u32) -> bool {
        self.receivers.contains_key(&member)
    }

    fn header(
        &self,
        cfg: &McastConfig,
        me: u32,
        kind: Kind,
        fl: u8,
        seq: Seq,
        len: usize,
    ) -> Header {
        Header {
            kind,
            flags: fl,
            group: cfg.group,
            source: me,
            stream: me,
            seq,
            aux: self.base.0,
            epoch: self.epoch,
            len: len as u16,
        }
    }

    /// The next datagram of the stream to send (a repair, new data, or a heartbeat).
    pub(super) fn poll_transmit(
        &mut self,
        cfg: &McastConfig,
        me: u32,
        now: Instant,
        out: &mut [u8],
    ) -> Option<(Dest, usize)> {
        // Repairs first.
        while let Some((seq, to)) = self.repairs.pop_front() {
            let Ok(i) = usize::try_from(seq.since(self.base)) else {
                continue;
            };
            let Some((fl, len)) = self.ring.get(i).map(|k| (k.flags, k.payload.len())) else {
                continue;
            };
            let h = self.header(cfg, me, Kind::Data, fl | flags::REPAIR, seq, len);
            let Some(k) = self.ring.get_mut(i) else {
                continue;
            };
            let n = HEADER_LEN + len;
            h.write(out);
            out[HEADER_LEN..n].copy_from_slice(&k.payload);
            k.sent_at = Some(now);
            self.repairs_sent += 1;
            self.last_sent = Some(now);
            return Some((to, n));
        }
        self.release(cfg);
        // New data while the slowest live member is less than a window behind.
        let in_window = !self.blocked_by_members(cfg);
        if in_window && let Some((fl, payload)) = self.next_payload(cfg) {
            let seq = self.next_seq;
            self.next_seq = seq.next();
            let n = HEADER_LEN + payload.len();
            let h = self.header(cfg, me, Kind::Data, fl, seq, payload.len());
            h.write(out);
            out[HEADER_LEN..n].copy_from_slice(&payload);
            self.ring.push_back(Kept {
                flags: fl,
                payload,
                sent_at: None,
            });
            self.last_sent = Some(now);
            return Some((Dest::Group, n));
        }
        // Quiet: a heartbeat now and then says where the stream is.
        if self
            .last_sent
            .is_none_or(|t| now.saturating_duration_since(t) >= cfg.heartbeat)
        {
            let h = self.header(cfg, me, Kind::Heartbeat, 0, self.next_seq, 0);
            h.write(out);
            self.last_sent = Some(now);
            return Some((Dest::Group, HEADER_LEN));
        }
        None
    }

    /// Whether the slowest live member is a whole window behind (reliable mode).
    fn blocked_by_members(&self, cfg: &McastConfig) -> bool {
        cfg.reliable
            && self
                .receivers
                .values()
                .any(|r| self.next_seq.since(r.pos) >= i64::from(cfg.window))
    }

    /// Cuts the next datagram's payload from the queue: a segment of the first message, or
    /// several small whole messages packed.
    fn next_payload(&mut self, cfg: &McastConfig) -> Option<(u8, Vec<u8>)> {
        Some(
            match self
                .outbox
                .cut(cfg.max_datagram - HEADER_LEN, cfg.pack_max)?
            {
                Cut::Packed { payload, .. } => (flags::PACKED, payload),
                Cut::Segment {
                    first,
                    last,
                    payload,
                } => {
                    let fl =
                        if first { flags::FIRST } else { 0 } | if last { flags::LAST } else { 0 };
                    (fl, payload)
                }
            },
        )
    }

    /// Drops what is more than a window old. (The last window is always kept: every live
    /// member is less than a window behind, and a member not heard of yet can still get
    /// what it missed.)
    fn release(&mut self, cfg: &McastConfig) {
        let floor = Seq(self.next_seq.0.wrapping_sub(cfg.window));
        while self.base.before(floor) && !self.ring.is_empty() {
            self.ring.pop_front();
            self.base = self.base.next();
        }
        if self.ring.is_empty() {
            self.base = self.next_seq;
        }
    }

    /// A member's status: its position paces the stream.
    pub(super) fn on_status(&mut self, member: u32, pos: Seq, waiting: u32, now: Instant) {
        // (A position beyond what was sent, or before what is kept, is forged or stale.)
        if self.next_seq.since(pos) < 0 || pos.before(self.base) {
            return;
        }
        let r = self.receivers.entry(member).or_insert(Receiver {
            pos,
            waiting,
            heard: now,
            behind_since: None,
        });
        if r.pos.before(pos) {
            r.pos = pos;
            self.moved = true;
        }
        r.waiting = waiting;
        r.heard = now;
        self.check_at.get_or_insert(now);
    }

    /// A member says it is there: the stream waits for it from the oldest datagram kept
    /// (which is where its view of the stream starts), until its statuses say more.
    pub(super) fn on_join(&mut self, member: u32, now: Instant) {
        let base = self.base;
        self.receivers
            .entry(member)
            .or_insert(Receiver {
                pos: base,
                waiting: 0,
                heard: now,
                behind_since: None,
            })
            .heard = now;
        self.check_at.get_or_insert(now);
    }

    /// Member `from` asks for `count` datagrams from `first` again.
    pub(super) fn on_nak(
        &mut self,
        cfg: &McastConfig,
        from: u32,
        first: Seq,
        count: u32,
        now: Instant,
    ) {
        // By multicast one repair serves everybody (and a request within the holdoff of the
        // last send is ignored); by unicast each member that asks gets its own.
        let to = if cfg.unicast_repairs {
            Dest::Member(from)
        } else {
            Dest::Group
        };
        for i in 0..count.min(cfg.window) {
            let s = first.plus(i);
            let Ok(off) = usize::try_from(s.since(self.base)) else {
                self.naks_ignored += 1;
                continue;
            };
            let Some(k) = self.ring.get(off) else {
                self.naks_ignored += 1;
                continue;
            };
            let recent = k
                .sent_at
                .is_some_and(|t| now.saturating_duration_since(t) < cfg.repair_holdoff);
            let queued = self.repairs.contains(&(s, to));
            if queued || (recent && !cfg.unicast_repairs) {
                self.naks_ignored += 1;
                continue;
            }
            self.repairs.push_back((s, to));
        }
    }

    /// A member left: the stream no longer waits for it.
    pub(super) fn forget(&mut self, member: u32) -> bool {
        let known = self.receivers.remove(&member).is_some();
        self.moved |= known;
        known
    }

    /// Whether a member moved on (or went) since the last call: a publisher waiting for
    /// room, or for its members to take everything, looks again.
    pub(super) fn take_moved(&mut self) -> bool {
        std::mem::take(&mut self.moved)
    }

    /// Members silent too long, or holding the stream back too long, are removed.
    pub(super) fn handle_timeout(
        &mut self,
        cfg: &McastConfig,
        now: Instant,
        events: &mut VecDeque<McastEvent>,
        removed: &mut Vec<u32>,
    ) {
        if self.check_at.is_some_and(|t| t > now) {
            return;
        }
        let full = self.next_seq;
        let window = i64::from(cfg.window);
        let mut self_moved = false;
        self.receivers.retain(|&m, r| {
            let why = if now.saturating_duration_since(r.heard) >= cfg.member_timeout {
                Some(RemovedWhy::Silent)
            } else {
                // A member a window behind paces the publisher (the slowest one always is);
                // one that stays there, messages waiting and none taken, for the slow
                // timeout has stopped reading, and is removed. (One with nothing to read
                // waits for a repair: a lossy link, not a slow reader.)
                let holding = full.since(r.pos) >= window && r.waiting > 0;
                match (holding, r.behind_since) {
                    (false, _) => {
                        r.behind_since = None;
                        None
                    }
                    (true, Some((t, at))) if at == r.pos => (now.saturating_duration_since(t)
                        >= cfg.slow_timeout)
                        .then_some(RemovedWhy::TooSlow),
                    (true, _) => {
                        r.behind_since = Some((now, r.pos));
                        None
                    }
                }
            };
            match why {
                Some(why) => {
                    self_moved = true;
                    events.push_back(McastEvent::MemberRemoved { member: m, why });
                    removed.push(m);
                    false
                }
                None => true,
            }
        });
        self.moved |= self_moved;
        self.check_at = (!self.receivers.is_empty()).then(|| now + cfg.status_interval);
    }

    /// When [`handle_timeout`](Self::handle_timeout) or a heartbeat is next due.
    pub(super) fn poll_timeout(&self, cfg: &McastConfig) -> Option<Instant> {
        let hb = self.last_sent.map(|t| t + cfg.heartbeat);
        [hb, self.check_at].into_iter().flatten().min()
    }
}
