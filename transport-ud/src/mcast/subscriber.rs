//! A member's view of another member's stream: datagrams put back in order and into
//! messages, gaps asked for again (a NAK to the group after a random delay, not sent when
//! another member asked first), its position told to the publisher, and the publisher's
//! liveness.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use super::McastConfig;
use super::wire::{Header, Kind, flags};
use crate::seq::Seq;
use crate::wire::MSG_LEN_PREFIX;

/// Gaps asked for in one NAK round at most.
const MAX_NAK_GAPS: usize = 16;

/// The most bytes reserved for a message before its segments come.
const MAX_RESERVE: usize = 1 << 16;

/// The message being put together.
#[derive(Debug)]
struct Partial {
    len: usize,
    bytes: Vec<u8>,
    /// Its first datagram.
    start: Seq,
}

/// One publisher's stream, as a member receives it.
pub(super) struct Stream {
    pub(super) epoch: u32,
    /// The next datagram expected in order.
    rcv_next: Seq,
    /// Datagrams after a gap (within a window of `rcv_next`).
    ahead: BTreeMap<u32, (u8, Vec<u8>)>,
    partial: Option<Partial>,
    /// Whole messages not taken yet, with their first datagram.
    pub(super) inbox: VecDeque<(Vec<u8>, Seq)>,
    /// Joined in the middle of a message: its segments are skipped until one opens a
    /// message.
    skipping: bool,
    /// A message was delivered: from then on, what is skipped is lost (before, the stream
    /// merely starts later: a late joiner's live position moved on while it asked).
    started: bool,
    /// A NAK for the first gap is due then (or was sent, and is asked again then).
    nak_at: Option<Instant>,
    /// NAKs in a row for the same gap (each waits twice as long as the one before).
    naks: u32,
    /// The gaps of the NAK round under way, still to send (each round asks for every gap
    /// held, not only the first).
    nak_round: Vec<(Seq, u32)>,
    /// Where the stream stood when the last round was sent: once it moves on, a gap still
    /// open is a new one and waits only the short random delay.
    nak_from: Option<Seq>,
    /// When our position goes to the publisher next, and the position last told.
    status_at: Instant,
    told: Seq,
    pub(super) last_heard: Instant,
    /// The oldest datagram the publisher said it can send again.
    floor: Seq,
    /// The publisher has sent everything before this (as far as we heard).
    upto: Seq,
    /// Counters.
    pub(super) naks_sent: u64,
    pub(super) naks_suppressed: u64,
    pub(super) duplicates: u64,
    pub(super) lost: u64,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // (Positions and sizes: the bytes would drown them.)
        f.debug_struct("Stream")
            .field("epoch", &self.epoch)
            .field("rcv_next", &self.rcv_next.0)
            .field("ahead", &self.ahead.keys().collect::<Vec<_>>())
            .field(
                "partial",
                &self
                    .partial
                    .as_ref()
                    .map(|p| (p.start.0, p.len, p.bytes.len())),
            )
            .field("inbox", &self.inbox.len())
            .field("pos", &self.pos().0)
            .field("skipping", &self.skipping)
            .field("nak_at", &self.nak_at)
            .field("naks", &self.naks)
            .field("floor", &self.floor.0)
            .field("last_heard", &self.last_heard)
            .finish_non_exhaustive()
    }
}

impl Stream {
    /// A stream first heard of at `at` (the live position: what comes from there on).
    pub(super) fn new(epoch: u32, at: Seq, now: Instant) -> Self {
        Self {
            epoch,
            rcv_next: at,
            ahead: BTreeMap::new(),
            partial: None,
            inbox: VecDeque::new(),
            skipping: true,
            started: false,
            nak_at: None,
            naks: 0,
            nak_round: Vec::new(),
            nak_from: None,
            status_at: now,
            told: at,
            last_heard: now,
            floor: at,
            upto: at,
            naks_sent: 0,
            naks_suppressed: 0,
            duplicates: 0,
            lost: 0,
        }
    }

    /// The position the publisher paces to: the first datagram of the oldest message the
    /// application has not taken (or of the one being put together, or the next expected).
    /// It never goes back.
    pub(super) fn pos(&self) -> Seq {
        match (self.inbox.front(), &self.partial) {
            (Some((_, start)), _) => *start,
            (None, Some(p)) => p.start,
            (None, None) => self.rcv_next,
        }
    }

    /// Takes a message.
    pub(super) fn recv(&mut self) -> Option<Vec<u8>> {
        self.inbox.pop_front().map(|(m, _)| m)
    }

    /// A data datagram or heartbeat of this stream. Returns an error for a stream that
    /// breaks the format (the member then drops the stream).
    pub(super) fn on_datagram(
        &mut self,
        cfg: &McastConfig,
        h: &Header,
        payload: &[u8],
        now: Instant,
        rng: &mut u64,
    ) -> Result<(), String> {
        self.last_heard = now;
        if self.floor.before(Seq(h.aux)) {
            self.floor = Seq(h.aux);
        }
        let upto = match h.kind {
            Kind::Heartbeat => h.seq,
            Kind::Data => h.seq.next(),
            _ => return Ok(()),
        };
        if self.upto.before(upto) {
            self.upto = upto;
        }
        // Unrecoverable: what the publisher no longer keeps (an unreliable stream that lost
        // it, or a member the publisher did not wait for yet: just joined). Skipped and
        // counted (the member reports it: never a silent gap).
        if self.rcv_next.before(self.floor) {
            // (A reliable stream not started yet merely starts later: its publisher did not
            // wait for a member it had not heard of. Anywhere else a skip is a loss.)
            let lost = self.started || !cfg.reliable;
            self.skip_to(self.floor, lost);
            self.deliver(cfg)?;
        }
        if h.kind == Kind::Data {
            let off = h.seq.since(self.rcv_next);
            if off < 0 || self.ahead.contains_key(&h.seq.0) {
                self.duplicates += 1;
            } else if off >= i64::from(cfg.window) && cfg.reliable {
                // Too far ahead to hold: dropped (asked again once the gap before it closes).
            } else if off >= i64::from(cfg.window) {
                // Unreliable: the oldest gaps are given up on to make room.
                self.skip_to(Seq(h.seq.0.wrapping_sub(cfg.window - 1)), true);
                self.deliver(cfg)?;
                self.ahead.insert(h.seq.0, (h.flags, payload.to_vec()));
            } else if off == 0 {
                // The next in order: into messages straight from the datagram (no copy
                // into the held ones first).
                self.consume(cfg, h.flags, payload)?;
            } else {
                self.ahead.insert(h.seq.0, (h.flags, payload.to_vec()));
            }
            self.deliver(cfg)?;
        }
        // A gap before what the publisher sent: ask, after a random delay (unreliable
        // streams: give up on it then, unless it filled meanwhile, reordered).
        let missing = self.rcv_next.before(self.upto);
        if missing {
            // A gap after the one last asked for was repaired is new: it is asked for after
            // the short random delay, not after the retry wait of the old one.
            let moved_on = self.nak_from.is_some_and(|f| f != self.rcv_next);
            if moved_on {
                self.nak_from = None;
                self.naks = 0;
                self.nak_at = None;
            }
            if self.nak_at.is_none() {
                self.nak_at = Some(now + random_below(rng, cfg.nak_delay));
            }
        } else {
            self.nak_at = None;
            self.naks = 0;
            self.nak_from = None;
            self.nak_round.clear();
        }
        Ok(())
    }

    /// What the publisher no longer keeps is given up on and counted.
    fn skip_to(&mut self, to: Seq, lost: bool) {
        let gap = to.since(self.rcv_next);
        if gap > 0 {
            if lost {
                self.lost += gap as u64;
            }
            self.rcv_next = to;
            self.partial = None;
            self.skipping = true;
            let keep = to.0;
            self.ahead.retain(|&s, _| !Seq(s).before(Seq(keep)));
        }
    }

    /// Another member asked for the datagrams from `first` of this stream: ours would be
    /// the same request, so it waits as if it had been sent.
    pub(super) fn on_other_nak(&mut self, cfg: &McastConfig, first: Seq, count: u32, now: Instant) {
        let covers = !self.rcv_next.before(first) && self.rcv_next.before(first.plus(count));
        if covers && self.nak_at.is_some_and(|t| t > now) {
            self.nak_at = Some(now + self.retry_after(cfg));
            self.naks_suppressed += 1;
        }
    }

    /// How long a request waits for its repair before it is made again: twice as long
    /// after each, up to four times the first wait (a member that keeps asking must get
    /// through a lossy link well within the slow timeout).
    fn retry_after(&self, cfg: &McastConfig) -> Duration {
        (cfg.repair_holdoff * 2 + cfg.nak_delay) * (1u32 << self.naks.saturating_sub(1).min(2))
    }

    /// Puts in-order datagrams into messages.
    fn deliver(&mut self, cfg: &McastConfig) -> Result<(), String> {
        while let Some((fl, payload)) = self.ahead.remove(&self.rcv_next.0) {
            self.consume(cfg, fl, &payload)?;
        }
        Ok(())
    }

    /// The datagram `rcv_next` (flags and payload), into messages.
    fn consume(&mut self, cfg: &McastConfig, fl: u8, payload: &[u8]) -> Result<(), String> {
        {
            let seq = self.rcv_next;
            self.rcv_next = seq.next();
            self.naks = 0;
            if fl & flags::PACKED != 0 {
                if self.partial.is_some() && !self.skipping {
                    return Err("packed messages inside another message".into());
                }
                let Some(entries) = crate::wire::packed_entries(payload) else {
                    return Err("a packed datagram that does not parse".into());
                };
                self.skipping = false;
                self.partial = None;
                if entries.iter().any(|m| m.len() > cfg.max_message) {
                    return Err(format!(
                        "a packed message over the limit ({})",
                        cfg.max_message
                    ));
                }
                for m in entries {
                    self.inbox.push_back((m.to_vec(), seq));
                    self.started = true;
                }
                return Ok(());
            }
            let first = fl & flags::FIRST != 0;
            if self.skipping {
                if !first {
                    return Ok(());
                }
                self.skipping = false;
            }
            let mut data = payload;
            if first {
                if self.partial.is_some() {
                    return Err("a message opened inside another".into());
                }
                let Some((len, rest)) = data.split_first_chunk::<MSG_LEN_PREFIX>() else {
                    return Err("a first segment without its length".into());
                };
                let len = u32::from_be_bytes(*len) as usize;
                if len > cfg.max_message {
                    return Err(format!(
                        "a message of {len} bytes (limit {})",
                        cfg.max_message
                    ));
                }
                // Grown as segments come (as a session does): a peer announcing a large
                // message reserves little until it sends it. Reserving the announced length
                // let one 36-byte datagram per forged publisher reserve `max_message` bytes.
                self.partial = Some(Partial {
                    len,
                    bytes: Vec::with_capacity(len.min(MAX_RESERVE)),
                    start: seq,
                });
                data = rest;
            }
            let Some(p) = self.partial.as_mut() else {
                return Err("a segment outside any message".into());
            };
            if p.bytes.len() + data.len() > p.len {
                return Err("a message longer than it said".into());
            }
            p.bytes.extend_from_slice(data);
            if fl & flags::LAST != 0 {
                let Some(p) = self.partial.take() else {
                    return Ok(());
                };
                if p.bytes.len() != p.len {
                    return Err("a message shorter than it said".into());
                }
                self.inbox.push_back((p.bytes, p.start));
                self.started = true;
            }
        }
        Ok(())
    }

    /// Unreliable streams: a gap still open when its wait ends is given up on (up to the
    /// next datagram held, or to what the publisher sent).
    pub(super) fn handle_timeout(&mut self, cfg: &McastConfig, now: Instant) -> Result<(), String> {
        if cfg.reliable || self.nak_at.is_none_or(|t| t > now) {
            return Ok(());
        }
        self.nak_at = None;
        let first = self.rcv_next;
        let to = self
            .ahead
            .keys()
            .map(|&s| Seq(s))
            .filter(|s| first.before(*s))
            .min_by_key(|s| s.since(first))
            .unwrap_or(self.upto);
        self.skip_to(to, true);
        self.deliver(cfg)
    }

    /// A NAK due now: (first missing, how many), to send to the group. A round asks for
    /// every gap held (up to [`MAX_NAK_GAPS`]), one NAK each.
    pub(super) fn poll_nak(&mut self, cfg: &McastConfig, now: Instant) -> Option<(Seq, u32)> {
        if !cfg.reliable {
            return None;
        }
        if let Some(g) = self.nak_round.pop() {
            self.naks_sent += 1;
            return Some(g);
        }
        if self.nak_at.is_none_or(|t| t > now) {
            return None;
        }
        let mut held: Vec<Seq> = self.ahead.keys().map(|&s| Seq(s)).collect();
        held.sort_by_key(|s| s.since(self.rcv_next));
        let mut at = self.rcv_next;
        let mut gaps = Vec::new();
        for s in held.into_iter().chain(std::iter::once(self.upto)) {
            if gaps.len() == MAX_NAK_GAPS {
                break;
            }
            if at.before(s) {
                let n = u32::try_from(s.since(at)).unwrap_or(1).clamp(1, cfg.window);
                gaps.push((at, n));
            }
            if !s.before(at) {
                at = s.next();
            }
        }
        if gaps.is_empty() {
            // (The first datagram missing, as far as we know.)
            gaps.push((self.rcv_next, 1));
        }
        gaps.reverse();
        self.nak_round = gaps;
        self.naks += 1;
        self.nak_from = Some(self.rcv_next);
        self.nak_at = Some(now + self.retry_after(cfg));
        let g = self.nak_round.pop()?;
        self.naks_sent += 1;
        Some(g)
    }

    /// Our position for the publisher and the messages waiting for the application, when
    /// due (every status interval, or at once when the application freed an eighth of a
    /// window).
    pub(super) fn poll_status(&mut self, cfg: &McastConfig, now: Instant) -> Option<(Seq, u32)> {
        let pos = self.pos();
        let moved = pos.since(self.told) >= i64::from(cfg.window / 8).max(1);
        if now >= self.status_at || moved {
            self.status_at = now + cfg.status_interval;
            self.told = pos;
            let waiting = u32::try_from(self.inbox.len()).unwrap_or(u32::MAX);
            return Some((pos, waiting));
        }
        None
    }

    /// The next time this stream has something to do.
    pub(super) fn poll_timeout(&self, cfg: &McastConfig) -> Instant {
        let gone = self.last_heard + cfg.publisher_timeout;
        let mut t = if cfg.reliable {
            self.status_at.min(gone)
        } else {
            gone
        };
        if let Some(n) = self.nak_at {
            t = t.min(n);
        }
        t
    }
}

/// A pseudo-random duration in `[0, max)` (xorshift on the member's state: the protocol
/// draws no randomness of its own, so a simulation replays).
fn random_below(state: &mut u64, max: Duration) -> Duration {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    let ns = max.as_nanos() as u64;
    if ns == 0 {
        Duration::ZERO
    } else {
        Duration::from_nanos(x % ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_announced_length_reserves_little_before_the_bytes_come() {
        // Found by fuzzing (rdmx-fuzz mcast_member): a first segment announcing a message
        // of `max_message` bytes reserved all of it at once.
        let cfg = McastConfig {
            max_message: 1 << 20,
            ..McastConfig::default()
        };
        let now = Instant::now();
        let mut s = Stream::new(1, Seq(0), now);
        let mut payload = (1u32 << 20).to_be_bytes().to_vec();
        payload.extend_from_slice(b"first bytes");
        let h = Header {
            kind: Kind::Data,
            flags: flags::FIRST,
            group: 0,
            source: 2,
            stream: 2,
            seq: Seq(0),
            aux: 0,
            epoch: 1,
            len: payload.len() as u16,
        };
        let mut rng = 1;
        s.on_datagram(&cfg, &h, &payload, now, &mut rng).unwrap();
        let p = s.partial.as_ref().expect("a message under way");
        assert_eq!(p.len, 1 << 20);
        assert_eq!(p.bytes, b"first bytes");
        assert!(p.bytes.capacity() <= MAX_RESERVE, "{}", p.bytes.capacity());
    }
}
