//! The events a worker keeps for the application (`poll_event`), bounded.

use std::collections::VecDeque;

use crate::Event;

/// The most events a worker keeps for `poll_event`: an application that never asks for
/// them (many do not need them) must not grow memory with every endpoint that ever went
/// down. Beyond this, the oldest are dropped and counted ([`EventQueue::dropped`]).
pub const MAX_EVENTS: usize = 4096;

/// The events waiting for `poll_event`, at most [`MAX_EVENTS`].
#[derive(Debug, Default)]
pub struct EventQueue {
    queue: VecDeque<Event>,
    dropped: u64,
}

impl EventQueue {
    /// Queues an event, dropping the oldest beyond [`MAX_EVENTS`].
    pub fn push(&mut self, ev: Event) {
        if self.queue.len() >= MAX_EVENTS {
            self.queue.pop_front();
            self.dropped += 1;
        }
        self.queue.push_back(ev);
    }

    /// The oldest event.
    pub fn pop_front(&mut self) -> Option<Event> {
        self.queue.pop_front()
    }

    /// Events dropped for lack of room so far (the oldest go first).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_queue_keeps_the_newest_and_counts_the_rest() {
        let mut q = EventQueue::default();
        let n = MAX_EVENTS as u64 + 10;
        for endpoint in 0..n {
            q.push(Event::PathMigrated { endpoint });
        }
        assert_eq!(q.dropped(), 10);
        assert_eq!(q.pop_front(), Some(Event::PathMigrated { endpoint: 10 }));
        let mut last = None;
        while let Some(e) = q.pop_front() {
            last = Some(e);
        }
        assert_eq!(last, Some(Event::PathMigrated { endpoint: n - 1 }));
    }
}
