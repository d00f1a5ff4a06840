//! Messages waiting to be sent, cut into datagram payloads: a segment of the first message
//! (the first one starts with the message's length, the last one ends it), or several small
//! whole messages packed together (each as a u16 length and its bytes). UD sessions and
//! multicast publishers cut the same way.

use std::collections::VecDeque;

use crate::wire::{MSG_LEN_PREFIX, PACKED_ENTRY_LEN};

/// The next payload.
#[derive(Debug)]
pub(crate) enum Cut {
    /// Several whole small messages.
    Packed { payload: Vec<u8>, messages: u64 },
    /// A segment of the first message.
    Segment {
        first: bool,
        last: bool,
        payload: Vec<u8>,
    },
}

/// The queue of messages not yet wholly cut.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    queue: VecDeque<Vec<u8>>,
    bytes: usize,
    /// Bytes of the first message already cut.
    head_off: usize,
}

impl Outbox {
    /// Queues a message.
    pub(crate) fn push(&mut self, msg: &[u8]) {
        self.bytes += msg.len();
        self.queue.push_back(msg.to_vec());
    }

    /// Bytes of the messages queued.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether no message waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether a message is partly cut.
    pub(crate) fn mid_message(&self) -> bool {
        self.head_off != 0
    }

    /// Drops everything queued.
    pub(crate) fn clear(&mut self) {
        self.queue.clear();
        self.bytes = 0;
        self.head_off = 0;
    }

    /// Gives back the memory of an empty queue.
    pub(crate) fn shrink(&mut self) {
        if self.queue.is_empty() && self.queue.capacity() > 0 {
            self.queue = VecDeque::new();
        }
    }

    /// Cuts the next payload of at most `room` bytes: small messages (up to `pack_max`) that
    /// are queued together are packed when at least two fit.
    pub(crate) fn cut(&mut self, room: usize, pack_max: usize) -> Option<Cut> {
        let len = self.queue.front()?.len();
        let packable = |n: usize| n <= pack_max && n <= usize::from(u16::MAX);
        let second_fits = self
            .queue
            .get(1)
            .is_some_and(|m| packable(m.len()) && 2 * PACKED_ENTRY_LEN + len + m.len() <= room);
        if self.head_off == 0 && packable(len) && second_fits {
            let mut payload = Vec::with_capacity(room);
            let mut messages = 0;
            while let Some(m) = self.queue.front() {
                if !packable(m.len()) || payload.len() + PACKED_ENTRY_LEN + m.len() > room {
                    break;
                }
                payload.extend_from_slice(&(m.len() as u16).to_be_bytes());
                payload.extend_from_slice(m);
                self.bytes -= m.len();
                self.queue.pop_front();
                messages += 1;
            }
            return Some(Cut::Packed { payload, messages });
        }
        let msg = self.queue.front()?;
        let first = self.head_off == 0;
        let mut payload = Vec::with_capacity(room.min(len + MSG_LEN_PREFIX));
        if first {
            payload.extend_from_slice(&(len as u32).to_be_bytes());
        }
        let take = room.saturating_sub(payload.len()).min(len - self.head_off);
        payload.extend_from_slice(&msg[self.head_off..self.head_off + take]);
        self.head_off += take;
        let last = self.head_off == len;
        if last {
            self.bytes -= len;
            self.head_off = 0;
            self.queue.pop_front();
        }
        Some(Cut::Segment {
            first,
            last,
            payload,
        })
    }
}
