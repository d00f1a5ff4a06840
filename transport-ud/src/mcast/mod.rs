//! Reliable multicast groups, sans I/O: one member of one group ([`Member`]) — its own
//! stream (what it publishes) and the streams of the other members it hears.
//!
//! Every member's messages reach every live member exactly once and in order (per
//! publisher). A publisher numbers its datagrams and keeps them in a bounded window until
//! every live member has them; members tell it their position (`Status`, to the publisher
//! alone), which paces it to the slowest live member. A member that misses datagrams asks
//! the group for the first gap (`Nak`) after a random delay, and does not ask when another
//! member asked first; the publisher repairs once per holdoff whatever the number of
//! requests. A member silent for `member_timeout`, or holding the publisher a whole window
//! back for `slow_timeout`, is removed, with an event on both sides (`Removed` goes to the
//! group). Quiet publishers send heartbeats; one not heard for `publisher_timeout` is
//! reported gone. A member's view of a publisher's stream starts at the oldest datagram the
//! publisher still keeps when the member first hears from it (skipping to the first whole
//! message): members there before the publisher began get everything even if they missed
//! its first datagrams, and a late joiner gets at most a window of the past, then the live
//! stream. In unreliable mode nobody asks for repairs and gaps are skipped and counted.
//!
//! Datagrams come in through [`Member::handle_datagram`] and go out through
//! [`Member::poll_transmit`] (to the group, or to one member); time is an argument.

mod publisher;
mod subscriber;
pub mod wire;

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use publisher::Publisher;
use subscriber::Stream;
use wire::{HEADER_LEN, Header, Kind};

use crate::seq::Seq;
use crate::session::SendError;

/// How a group behaves (every member of a group should use the same).
#[derive(Debug, Clone)]
pub struct McastConfig {
    /// The group's id ([`wire::group_id`] of its name).
    pub group: u32,
    /// Largest datagram (header included).
    pub max_datagram: usize,
    /// Largest message.
    pub max_message: usize,
    /// Datagrams a publisher keeps for repairs, and how far the slowest member may lag.
    pub window: u32,
    /// Bytes a publisher queues before `publish` answers `WouldBlock`.
    pub max_queued: usize,
    /// Messages up to this size that are queued together share datagrams (0: never).
    pub pack_max: usize,
    /// Reliable (repairs, pacing) or not (gaps skipped and counted).
    pub reliable: bool,
    /// Repairs by unicast: a member asks its publisher alone, and the repair goes to it
    /// alone (no suppression, a repair per member that missed the datagram). By default a
    /// request and its repair go to the group, and one repair serves every member.
    pub unicast_repairs: bool,
    /// A quiet publisher's heartbeat interval.
    pub heartbeat: Duration,
    /// How often members tell publishers their position.
    pub status_interval: Duration,
    /// The longest random delay before a member asks for a repair.
    pub nak_delay: Duration,
    /// A datagram repaired (or sent) is not repaired again within this time.
    pub repair_holdoff: Duration,
    /// A member silent this long is removed.
    pub member_timeout: Duration,
    /// A member holding its publisher a whole window back this long without taking
    /// anything is removed (one that moves, however slowly, paces the publisher).
    pub slow_timeout: Duration,
    /// A publisher not heard this long is reported gone.
    pub publisher_timeout: Duration,
}

impl Default for McastConfig {
    fn default() -> Self {
        Self {
            group: 0,
            max_datagram: 4096,
            max_message: 1 << 20,
            window: 512,
            max_queued: 1 << 20,
            pack_max: 256,
            reliable: true,
            unicast_repairs: false,
            heartbeat: Duration::from_millis(20),
            status_interval: Duration::from_millis(10),
            nak_delay: Duration::from_micros(500),
            repair_holdoff: Duration::from_micros(500),
            member_timeout: Duration::from_secs(1),
            slow_timeout: Duration::from_millis(500),
            publisher_timeout: Duration::from_secs(1),
        }
    }
}

/// Where a datagram goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dest {
    /// Every member (the group's multicast address).
    Group,
    /// One member, by id (its unicast address, as learned from its datagrams).
    Member(u32),
}

/// Why a publisher removed a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemovedWhy {
    /// No status for the member timeout.
    Silent,
    /// It held the publisher a whole window back, taking nothing, for the slow timeout.
    TooSlow,
}

/// What happened in the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McastEvent {
    /// (Publisher side.) This member's stream no longer waits for `member`.
    MemberRemoved {
        /// The member removed.
        member: u32,
        /// Why.
        why: RemovedWhy,
    },
    /// (Member side.) `publisher` removed this member: its stream is no longer received.
    RemovedBy {
        /// The publisher.
        publisher: u32,
    },
    /// A publisher was heard for the first time (its stream starts here).
    PublisherJoined {
        /// Its member id.
        publisher: u32,
    },
    /// A publisher left, went silent for the publisher timeout, or broke the format.
    PublisherGone {
        /// Its member id.
        publisher: u32,
        /// Why, in words.
        why: String,
    },
    /// Datagrams of `publisher` that will never come (unreliable mode, or a publisher that
    /// did not wait for this member yet).
    Lost {
        /// Its member id.
        publisher: u32,
        /// How many datagrams.
        datagrams: u64,
    },
}

/// Counters of a member.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct McastStats {
    /// Datagrams of other groups, of ourselves, or naming a stream their sender does not own.
    pub refused: u64,
    /// Repairs this member's stream sent.
    pub repairs_sent: u64,
    /// Repair requests ignored (within the holdoff, or for what is no longer kept).
    pub naks_ignored: u64,
    /// Repair requests this member sent.
    pub naks_sent: u64,
    /// Repair requests this member did not send because another member asked first.
    pub naks_suppressed: u64,
    /// Duplicate datagrams dropped.
    pub duplicates: u64,
    /// Datagrams given up on.
    pub lost: u64,
    /// (Counted by the group over a queue pair.) Datagrams that are not of the multicast
    /// format (too short, another version, lengths that do not add up).
    pub malformed: u64,
    /// (Counted by the group.) Datagrams naming as their source a member already heard from
    /// another address: forgeries, dropped before the protocol sees them.
    pub forged: u64,
    /// (Counted by the group.) Datagrams that could not be sent (no buffer, no send slot,
    /// no address for the member yet); the protocol repairs what matters.
    pub send_dropped: u64,
    /// (Counted by the group, with a key.) Datagrams without a valid tag of the group's
    /// key (a stranger's, a member's without the key, or altered): dropped before anything
    /// else looks at them.
    pub unauthenticated: u64,
}

/// One member of one group.
#[derive(Debug)]
pub struct Member {
    cfg: McastConfig,
    id: u32,
    publisher: Publisher,
    /// Whether this member published anything (a member that never does sends no
    /// heartbeats).
    publishing: bool,
    /// (Ordered by publisher id: `recv` takes turns without sorting.)
    streams: BTreeMap<u32, Stream>,
    /// Publishers (and their epoch) that removed us: their datagrams are ignored.
    removed_by: HashSet<(u32, u32)>,
    /// Members our stream removed: their statuses are answered with `Removed` again.
    removed: HashSet<u32>,
    /// Control datagrams to send (to the group).
    control: VecDeque<Header>,
    events: VecDeque<McastEvent>,
    /// Streams take turns in `recv`: the publisher id to look at first.
    turn: u32,
    rng: u64,
    stats: McastStats,
    left: bool,
    /// When this member next says it is there (`Join`).
    join_at: Instant,
}

impl Member {
    /// Member `id` of the group `cfg.group`, joining at `now` (it says so at once), its own
    /// stream starting at `first` in `epoch`.
    pub fn new(cfg: McastConfig, id: u32, epoch: u32, first: Seq, now: Instant) -> Self {
        Self {
            cfg,
            id,
            publisher: Publisher::new(epoch, first),
            publishing: false,
            streams: BTreeMap::new(),
            removed_by: HashSet::new(),
            removed: HashSet::new(),
            control: VecDeque::new(),
            events: VecDeque::new(),
            turn: 0,
            rng: u64::from(id) | 1 << 40,
            stats: McastStats::default(),
            left: false,
            join_at: now,
        }
    }

    /// This member's id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Queues a message for every member.
    ///
    /// # Errors
    /// `TooLarge`; `WouldBlock` while the queue is full (the slowest member paces it);
    /// `Closed` after [`leave`](Self::leave).
    pub fn publish(&mut self, msg: &[u8]) -> Result<(), SendError> {
        if self.left {
            return Err(SendError::Closed);
        }
        self.publisher.publish(&self.cfg, msg)?;
        self.publishing = true;
        Ok(())
    }

    /// The next message of any publisher (publishers take turns), with its publisher's id.
    pub fn recv(&mut self) -> Option<(u32, Vec<u8>)> {
        let t = self.turn;
        let id = self
            .streams
            .range(t..)
            .chain(self.streams.range(..t))
            .find(|(_, s)| !s.inbox.is_empty())
            .map(|(&id, _)| id)?;
        let m = self.streams.get_mut(&id).and_then(Stream::recv)?;
        self.turn = id.wrapping_add(1);
        Some((id, m))
    }

    /// Whether everything this member published was sent and taken by every live member
    /// (those removed or gone meanwhile excepted).
    pub fn flushed(&self) -> bool {
        self.publisher.settled()
    }

    /// Whether a member this member's stream waits for moved on (or went) since the last
    /// call: a publisher waiting for room, or for [`flushed`](Self::flushed), looks again.
    pub fn take_moved(&mut self) -> bool {
        self.publisher.take_moved()
    }

    /// Whether a message waits.
    pub fn has_message(&self) -> bool {
        self.streams.values().any(|s| !s.inbox.is_empty())
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<McastEvent> {
        self.events.pop_front()
    }

    /// Leaves the group: the others are told, and this member's stream ends.
    pub fn leave(&mut self) {
        if !self.left {
            self.left = true;
            let h = self.control_header(Kind::Leave, self.id, Seq(0), 0);
            self.control.push_back(h);
        }
    }

    /// Counters.
    pub fn stats(&self) -> McastStats {
        let mut s = self.stats;
        s.repairs_sent = self.publisher.repairs_sent;
        s.naks_ignored = self.publisher.naks_ignored;
        for st in self.streams.values() {
            s.naks_sent += st.naks_sent;
            s.naks_suppressed += st.naks_suppressed;
            s.duplicates += st.duplicates;
            s.lost += st.lost;
        }
        s
    }

    /// Members this member's stream is paced by.
    pub fn receivers(&self) -> usize {
        self.publisher.receivers()
    }

    /// Whether this member's stream waits for `member` (it heard from it, and has not
    /// removed it).
    pub fn paces(&self, member: u32) -> bool {
        self.publisher.paces(member)
    }

    /// Bytes published and not yet sent.
    pub fn queued_bytes(&self) -> usize {
        self.publisher.queued_bytes()
    }

    fn control_header(&self, kind: Kind, stream: u32, seq: Seq, aux: u32) -> Header {
        Header {
            kind,
            flags: 0,
            group: self.cfg.group,
            source: self.id,
            stream,
            seq,
            aux,
            epoch: self.publisher.epoch,
            len: 0,
        }
    }

    /// Takes a datagram heard on the group or sent to this member (its header parsed by
    /// [`Header::parse`]).
    pub fn handle_datagram(&mut self, now: Instant, h: &Header, payload: &[u8]) {
        if h.group != self.cfg.group || h.source == self.id || self.left {
            self.stats.refused += 1;
            return;
        }
        match h.kind {
            Kind::Data | Kind::Heartbeat => self.on_stream(now, h, payload),
            Kind::Status => {
                if h.stream != self.id || h.epoch != self.publisher.epoch {
                    self.stats.refused += 1;
                } else if self.removed.contains(&h.source) {
                    // It missed the news.
                    let r = self.control_header(Kind::Removed, self.id, Seq(h.source), 0);
                    self.control.push_back(r);
                } else {
                    self.publisher.on_status(h.source, h.seq, h.aux, now);
                }
            }
            Kind::Nak => {
                if h.stream == self.id {
                    if h.epoch == self.publisher.epoch {
                        self.publisher
                            .on_nak(&self.cfg, h.source, h.seq, h.aux, now);
                    } else {
                        self.stats.refused += 1;
                    }
                } else if let Some(s) = self.streams.get_mut(&h.stream)
                    && !self.cfg.unicast_repairs
                {
                    s.on_other_nak(&self.cfg, h.seq, h.aux, now);
                }
            }
            Kind::Removed => {
                if h.seq.0 == self.id && self.streams.remove(&h.source).is_some() {
                    self.removed_by.insert((h.source, h.epoch));
                    self.events.push_back(McastEvent::RemovedBy {
                        publisher: h.source,
                    });
                }
            }
            Kind::Join => {
                if self.removed.contains(&h.source) {
                    let r = self.control_header(Kind::Removed, self.id, Seq(h.source), 0);
                    self.control.push_back(r);
                } else {
                    // (Kept before this member publishes too: its stream then waits for
                    // the members it knows from the start.)
                    self.publisher.on_join(h.source, now);
                }
            }
            Kind::Leave => {
                self.publisher.forget(h.source);
                if self.streams.remove(&h.source).is_some() {
                    self.events.push_back(McastEvent::PublisherGone {
                        publisher: h.source,
                        why: "left the group".into(),
                    });
                }
            }
        }
    }

    /// A datagram of another member's stream.
    fn on_stream(&mut self, now: Instant, h: &Header, payload: &[u8]) {
        if h.stream != h.source || self.removed_by.contains(&(h.source, h.epoch)) {
            self.stats.refused += 1;
            return;
        }
        let known = self.streams.get(&h.source).map(|s| s.epoch);
        match known {
            Some(e) if e == h.epoch => {}
            other => {
                // A repair is no place to start from: the live position is what comes next.
                if h.has(wire::flags::REPAIR) {
                    return;
                }
                if other.is_some() {
                    self.events.push_back(McastEvent::PublisherGone {
                        publisher: h.source,
                        why: "restarted".into(),
                    });
                }
                // It starts at the oldest datagram its publisher still keeps: a member that
                // was there before the publisher began, but missed its first datagrams,
                // still gets everything; a late joiner gets at most a window of the past.
                self.streams
                    .insert(h.source, Stream::new(h.epoch, Seq(h.aux), now));
                self.events.push_back(McastEvent::PublisherJoined {
                    publisher: h.source,
                });
            }
        }
        let Some(s) = self.streams.get_mut(&h.source) else {
            return;
        };
        let lost = s.lost;
        if let Err(why) = s.on_datagram(&self.cfg, h, payload, now, &mut self.rng) {
            self.streams.remove(&h.source);
            self.events.push_back(McastEvent::PublisherGone {
                publisher: h.source,
                why,
            });
            return;
        }
        if s.lost > lost {
            self.events.push_back(McastEvent::Lost {
                publisher: h.source,
                datagrams: s.lost - lost,
            });
        }
    }

    /// The next datagram to send into `out` (at least `max_datagram` bytes): its
    /// destination and length.
    pub fn poll_transmit(&mut self, now: Instant, out: &mut [u8]) -> Option<(Dest, usize)> {
        if out.len() < self.cfg.max_datagram.max(HEADER_LEN) {
            return None;
        }
        if let Some(h) = self.control.pop_front() {
            h.write(out);
            return Some((Dest::Group, HEADER_LEN));
        }
        if self.left {
            return None;
        }
        if self.join_at <= now {
            self.join_at = now + self.cfg.heartbeat;
            let h = self.control_header(Kind::Join, self.id, Seq(0), 0);
            h.write(out);
            return Some((Dest::Group, HEADER_LEN));
        }
        let cfg = &self.cfg;
        let id = self.id;
        for (&p, s) in &mut self.streams {
            if let Some((first, count)) = s.poll_nak(cfg, now) {
                let h = Header {
                    kind: Kind::Nak,
                    flags: 0,
                    group: cfg.group,
                    source: id,
                    stream: p,
                    seq: first,
                    aux: count,
                    epoch: s.epoch,
                    len: 0,
                };
                h.write(out);
                let to = if cfg.unicast_repairs {
                    Dest::Member(p)
                } else {
                    Dest::Group
                };
                return Some((to, HEADER_LEN));
            }
            if cfg.reliable
                && let Some((pos, waiting)) = s.poll_status(cfg, now)
            {
                let h = Header {
                    kind: Kind::Status,
                    flags: 0,
                    group: cfg.group,
                    source: id,
                    stream: p,
                    seq: pos,
                    aux: waiting,
                    epoch: s.epoch,
                    len: 0,
                };
                h.write(out);
                return Some((Dest::Member(p), HEADER_LEN));
            }
        }
        if self.publishing {
            return self.publisher.poll_transmit(cfg, id, now, out);
        }
        None
    }

    /// When [`handle_timeout`](Self::handle_timeout) next has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.left {
            return None;
        }
        let own = self
            .publishing
            .then(|| self.publisher.poll_timeout(&self.cfg))
            .flatten();
        let streams = self
            .streams
            .values()
            .map(|s| s.poll_timeout(&self.cfg))
            .min();
        [own, streams, Some(self.join_at)]
            .into_iter()
            .flatten()
            .min()
    }

    /// Runs what is due: members removed, publishers given up on. (Statuses, repair
    /// requests and heartbeats come out of [`poll_transmit`](Self::poll_transmit) when due.)
    pub fn handle_timeout(&mut self, now: Instant) {
        let mut removed = Vec::new();
        if self.publishing {
            self.publisher
                .handle_timeout(&self.cfg, now, &mut self.events, &mut removed);
        }
        for m in removed {
            self.removed.insert(m);
            let h = self.control_header(Kind::Removed, self.id, Seq(m), 0);
            self.control.push_back(h);
        }
        let cfg = &self.cfg;
        let events = &mut self.events;
        self.streams.retain(|&p, s| {
            if now.saturating_duration_since(s.last_heard) >= cfg.publisher_timeout {
                events.push_back(McastEvent::PublisherGone {
                    publisher: p,
                    why: "not heard for the publisher timeout".into(),
                });
                return false;
            }
            let lost = s.lost;
            if let Err(why) = s.handle_timeout(cfg, now) {
                events.push_back(McastEvent::PublisherGone { publisher: p, why });
                return false;
            }
            if s.lost > lost {
                events.push_back(McastEvent::Lost {
                    publisher: p,
                    datagrams: s.lost - lost,
                });
            }
            true
        });
    }
}

#[cfg(test)]
mod tests;
