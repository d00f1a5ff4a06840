//! Receive-credit accounting.
//!
//! All endpoints of a context receive into one shared receive queue. A sender may only send
//! when it holds a credit, and every credit a receiver hands out is backed by a buffer that
//! is already posted, so the receiver's NIC never answers with an RNR NAK:
//!
//! ```text
//!   posted buffers  >=  sum over endpoints of (granted - received)
//! ```
//!
//! [`Budget`] keeps the two sides of that inequality for a context; [`RecvWindow`] is the
//! receiver's view of one endpoint and [`SendWindow`] the sender's. Grants travel as
//! cumulative 32-bit counters (piggybacked on messages or written into the sender's mailbox),
//! so a lost or reordered update can never grant twice.

use crate::header::seq_after;

/// The sender's view: how many messages it may still send.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendWindow {
    /// Cumulative credits granted by the peer (the latest value seen).
    pub limit: u32,
    /// Cumulative messages sent.
    pub sent: u32,
}

impl SendWindow {
    /// A window with `initial` credits.
    pub fn new(initial: u32) -> Self {
        Self {
            limit: initial,
            sent: 0,
        }
    }

    /// Credits available now.
    pub fn available(&self) -> u32 {
        if seq_after(self.limit, self.sent) {
            self.limit.wrapping_sub(self.sent)
        } else {
            0
        }
    }

    /// Takes one credit; false when there is none.
    pub fn take(&mut self) -> bool {
        if self.available() == 0 {
            return false;
        }
        self.sent = self.sent.wrapping_add(1);
        true
    }

    /// Applies a cumulative grant from the peer (older values are ignored). Returns whether
    /// it added credits.
    pub fn update(&mut self, grant: u32) -> bool {
        if seq_after(grant, self.limit) {
            self.limit = grant;
            true
        } else {
            false
        }
    }
}

/// The receiver's view of one endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecvWindow {
    /// Cumulative credits granted to the peer.
    pub granted: u32,
    /// Cumulative messages received from the peer.
    pub received: u32,
    /// The grant value the peer is known to have been sent.
    pub advertised: u32,
}

impl RecvWindow {
    /// Credits the peer may still use.
    pub fn outstanding(&self) -> u32 {
        self.granted.wrapping_sub(self.received)
    }

    /// Grants not yet told to the peer.
    pub fn unadvertised(&self) -> u32 {
        self.granted.wrapping_sub(self.advertised)
    }

    /// Records a message from the peer; false when the peer had no credit (a protocol
    /// violation: the message landed in a buffer backing someone else's credit).
    pub fn on_receive(&mut self) -> bool {
        if self.outstanding() == 0 {
            return false;
        }
        self.received = self.received.wrapping_add(1);
        true
    }

    /// Marks the current grant as told to the peer and returns it.
    pub fn advertise(&mut self) -> u32 {
        self.advertised = self.granted;
        self.granted
    }
}

/// The context-wide balance between posted receive buffers and outstanding credits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Budget {
    /// Receive buffers currently posted on the shared receive queue.
    pub posted: u64,
    /// Sum of all endpoints' outstanding credits.
    pub outstanding: u64,
    /// Endpoints sharing the queue.
    pub endpoints: u64,
    /// The configured credits per endpoint (the most any endpoint is given).
    pub credits: u32,
    /// The configured queue depth.
    pub srq_depth: u32,
}

impl Budget {
    /// A budget for `srq_depth` buffers and `credits` per endpoint.
    pub fn new(srq_depth: u32, credits: u32) -> Self {
        Self {
            srq_depth,
            credits,
            ..Self::default()
        }
    }

    /// Posted buffers not backing any credit.
    pub fn spare(&self) -> u64 {
        self.posted.saturating_sub(self.outstanding)
    }

    /// The window each endpoint is aimed at: the configured credits, less when many
    /// endpoints share the queue, but at least one.
    pub fn target(&self) -> u32 {
        let fair = u64::from(self.srq_depth) / self.endpoints.max(1);
        fair.clamp(1, u64::from(self.credits)) as u32
    }

    /// Registers a new endpoint and returns its initial grant (possibly 0 when every posted
    /// buffer already backs a credit; it then waits for [`grant`](Self::grant)).
    pub fn add_endpoint(&mut self, w: &mut RecvWindow) -> u32 {
        self.endpoints += 1;
        let n = u64::from(self.target()).min(self.spare()) as u32;
        w.granted = w.granted.wrapping_add(n);
        self.outstanding += u64::from(n);
        n
    }

    /// Removes an endpoint whose queue pair can no longer receive: its credits are freed.
    pub fn remove_endpoint(&mut self, w: &RecvWindow) {
        self.endpoints = self.endpoints.saturating_sub(1);
        self.outstanding = self.outstanding.saturating_sub(u64::from(w.outstanding()));
    }

    /// A buffer was posted.
    pub fn on_post(&mut self, n: u64) {
        self.posted += n;
    }

    /// A message from the endpoint consumed a posted buffer. False when the endpoint had no
    /// credit (the caller treats that as a protocol violation).
    pub fn on_receive(&mut self, w: &mut RecvWindow) -> bool {
        self.posted = self.posted.saturating_sub(1);
        if !w.on_receive() {
            return false;
        }
        self.outstanding = self.outstanding.saturating_sub(1);
        true
    }

    /// Gives the endpoint one credit if there is a spare buffer and it is below the target.
    pub fn grant(&mut self, w: &mut RecvWindow) -> bool {
        if self.spare() == 0 || w.outstanding() >= self.target() {
            return false;
        }
        w.granted = w.granted.wrapping_add(1);
        self.outstanding += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_window_wraps() {
        let mut s = SendWindow {
            limit: u32::MAX - 1,
            sent: u32::MAX - 2,
        };
        assert_eq!(s.available(), 1);
        assert!(s.take());
        assert!(!s.take());
        assert!(s.update(2));
        assert!(!s.update(1), "an older grant never takes credits back");
        assert_eq!(s.available(), 4);
    }

    /// The invariant under a random mix of arrivals, reposts and new endpoints.
    #[test]
    fn posted_always_backs_outstanding() {
        let mut b = Budget::new(64, 8);
        b.on_post(64);
        let mut eps: Vec<RecvWindow> = Vec::new();
        let mut rng = 0x1234_5678_u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for _ in 0..20_000 {
            match next() % 4 {
                0 if eps.len() < 100 => {
                    let mut w = RecvWindow::default();
                    b.add_endpoint(&mut w);
                    eps.push(w);
                }
                1 | 2 if !eps.is_empty() => {
                    let i = (next() % eps.len() as u64) as usize;
                    if eps[i].outstanding() > 0 {
                        assert!(b.on_receive(&mut eps[i]));
                        // The buffer comes back at once (the message was consumed).
                        b.on_post(1);
                        let j = (next() % eps.len() as u64) as usize;
                        b.grant(&mut eps[j]);
                    }
                }
                _ => {}
            }
            let sum: u64 = eps.iter().map(|w| u64::from(w.outstanding())).sum();
            assert_eq!(sum, b.outstanding);
            assert!(b.posted >= b.outstanding);
            assert!(b.posted <= 64);
        }
        assert!(b.target() >= 1);
    }

    #[test]
    fn receive_without_credit_is_refused() {
        let mut b = Budget::new(4, 2);
        b.on_post(4);
        let mut w = RecvWindow::default();
        assert_eq!(b.add_endpoint(&mut w), 2);
        assert!(b.on_receive(&mut w));
        assert!(b.on_receive(&mut w));
        assert!(!b.on_receive(&mut w));
    }
}
