//! The sans-I/O connection state machine of one communication (one side of one connection):
//! IB CM states, retransmission of REQ, REP and DREQ with a bounded number of retries,
//! answers to duplicates. It owns no socket, no QP and no clock: messages and time come in
//! as arguments ([`Conn::handle`], [`Conn::handle_timeout`]), and what must happen comes out
//! as [`Output`]s, which the caller carries out in order (send a MAD, move the QP, queue an
//! event). [`Conn::poll_timeout`] tells when `handle_timeout` is due next; calling it early
//! is harmless. `now` must never go backwards.
//!
//! ```text
//! active:  ReqSent --REP--> RepRcvd --qp_connected(ok)--> Established
//!          ReqSent --MRA--> MraRcvd (longer wait) --timeout--> ReqSent (retries go on)
//!          ReqSent --REJ / retries exhausted--> Closed (REJECTED / UNREACHABLE)
//! passive: ReqRcvd --accept--> RepSent --RTU--> Established;  ReqRcvd --reject--> TimeWait
//!          duplicate REQ in ReqRcvd: MRA; in RepSent: the REP again; after a reject: the REJ
//! both:    Established --disconnect--> DreqSent --DREP / retries exhausted--> TimeWait
//!          Established --DREQ--> TimeWait (DREP sent; sent again for a duplicate DREQ)
//!          TimeWait --timeout--> Closed
//! ```
#![warn(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::time::{Duration, Instant};

use super::mad::{CmMsg, Mad};
use super::msg::{Ids, Mra, REJ_ARI_LEN, REJ_PRIVATE_LEN, Rej, Rep, msg_kind, reason};

/// Time-outs and retries of one communication.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timing {
    /// How long to wait for the answer to a REQ, REP or DREQ before sending it again.
    pub(crate) response: Duration,
    /// How many times a REQ, REP or DREQ is sent again before giving up.
    pub(crate) max_retries: u8,
    /// How much longer to wait after an MRA.
    pub(crate) mra_wait: Duration,
    /// How long a closed communication still answers duplicates.
    pub(crate) timewait: Duration,
}

/// The CM response timeout code we send (4.096 us × 2^17 ≈ 537 ms).
pub(crate) const RESPONSE_TIMEOUT_CODE: u8 = 17;
/// The MRA service timeout code we send (4.096 us × 2^21 ≈ 8.6 s).
pub(crate) const MRA_TIMEOUT_CODE: u8 = 21;
/// Retries of a REQ, REP or DREQ (sent in the REQ's "max CM retries").
pub(crate) const MAX_CM_RETRIES: u8 = 4;

/// The duration of an IBA time-out code: 4.096 us × 2^code (code clamped to 31).
pub(crate) fn timeout_of(code: u8) -> Duration {
    Duration::from_nanos(4096u64 << code.min(31))
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            response: timeout_of(RESPONSE_TIMEOUT_CODE),
            max_retries: MAX_CM_RETRIES,
            mra_wait: timeout_of(MRA_TIMEOUT_CODE),
            timewait: 2 * timeout_of(RESPONSE_TIMEOUT_CODE),
        }
    }
}

/// Where a communication is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Active: the REQ is out.
    ReqSent,
    /// Active: the peer sent an MRA; waiting longer for its REP.
    MraRcvd,
    /// Active: the REP arrived; the QP is being connected.
    RepRcvd,
    /// Passive: the REQ was delivered to the application, which has not decided yet.
    ReqRcvd,
    /// Passive: accepted, the REP is out.
    RepSent,
    /// Connected.
    Established,
    /// Disconnecting: the DREQ is out.
    DreqSent,
    /// Over; still answering duplicates until the time-wait ends.
    TimeWait,
    /// Over.
    Closed,
}

impl State {
    /// The state's name, for errors and logs.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::ReqSent => "REQ sent",
            Self::MraRcvd => "MRA received",
            Self::RepRcvd => "REP received",
            Self::ReqRcvd => "REQ received",
            Self::RepSent => "REP sent",
            Self::Established => "established",
            Self::DreqSent => "DREQ sent",
            Self::TimeWait => "time-wait",
            Self::Closed => "closed",
        }
    }
}

/// What the application is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Notice {
    /// The connection is up (with the REP's private data on the active side).
    Established(Vec<u8>),
    /// The peer refused (reason and the REJ's private data).
    Rejected(u16, Vec<u8>),
    /// Nobody answered.
    Unreachable,
    /// The local QP could not be connected.
    ConnectError,
    /// The connection is down.
    Disconnected,
}

/// One thing the caller must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Output {
    /// Send this MAD to the peer.
    Send(Mad),
    /// Active side: bring the QP to RTR and RTS with the REP's values, then call
    /// [`Conn::qp_connected`] with the result.
    ConnectQp(Box<Rep>),
    /// Move the QP to the error state (its outstanding work flushes).
    QpError,
    /// Queue an event.
    Notify(Notice),
}

/// Why an application call does not fit the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WrongState(pub(crate) State);

/// One side of one connection.
#[derive(Debug)]
pub(crate) struct Conn {
    /// Our communication ID.
    pub(crate) local_comm_id: u32,
    /// The peer's (0 until known).
    pub(crate) remote_comm_id: u32,
    /// The peer's QPN (for a DREQ).
    pub(crate) remote_qpn: u32,
    state: State,
    timing: Timing,
    /// The transaction ID of the connection's REQ (reused by REP, RTU, REJ, MRA).
    tid: u64,
    /// What is sent again when the timer fires (REQ, REP, DREQ).
    pending: Option<Mad>,
    /// The last answer sent, sent again for a duplicate (MRA, RTU, REJ, DREP).
    last_reply: Option<Mad>,
    retries_left: u8,
    deadline: Option<Instant>,
    /// Disconnected was already notified.
    down_notified: bool,
}

impl Conn {
    /// The active side: `req` (a REQ MAD) is sent now and again until answered.
    pub(crate) fn active(now: Instant, req: Mad, timing: Timing, out: &mut Vec<Output>) -> Self {
        let mut c = Self::new(req.msg.local_comm_id(), 0, req.tid, State::ReqSent, timing);
        c.arm(now, req, out);
        c
    }

    /// The passive side of a REQ that was just received (nothing is sent yet).
    pub(crate) fn passive(local_comm_id: u32, req_tid: u64, remote: (u32, u32)) -> Self {
        let mut c = Self::new(
            local_comm_id,
            remote.0,
            req_tid,
            State::ReqRcvd,
            Timing::default(),
        );
        c.remote_qpn = remote.1;
        c
    }

    fn new(local: u32, remote: u32, tid: u64, state: State, timing: Timing) -> Self {
        Self {
            local_comm_id: local,
            remote_comm_id: remote,
            remote_qpn: 0,
            state,
            timing,
            tid,
            pending: None,
            last_reply: None,
            retries_left: 0,
            deadline: None,
            down_notified: false,
        }
    }

    /// The current state.
    pub(crate) fn state(&self) -> State {
        self.state
    }

    /// The transaction ID of the connection's REQ.
    pub(crate) fn tid(&self) -> u64 {
        self.tid
    }

    /// When [`handle_timeout`](Self::handle_timeout) is due next.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.deadline
    }

    /// Sends `mad` and keeps sending it until answered or out of retries.
    fn arm(&mut self, now: Instant, mad: Mad, out: &mut Vec<Output>) {
        out.push(Output::Send(mad.clone()));
        self.pending = Some(mad);
        self.retries_left = self.timing.max_retries;
        self.deadline = Some(now + self.timing.response);
    }

    fn disarm(&mut self) {
        self.pending = None;
        self.deadline = None;
    }

    fn reply(&mut self, mad: Mad, out: &mut Vec<Output>) {
        out.push(Output::Send(mad.clone()));
        self.last_reply = Some(mad);
    }

    fn time_wait(&mut self, now: Instant) {
        self.disarm();
        self.state = State::TimeWait;
        self.deadline = Some(now + self.timing.timewait);
    }

    fn close(&mut self) {
        self.disarm();
        self.state = State::Closed;
    }

    fn notify_down(&mut self, out: &mut Vec<Output>) {
        if !self.down_notified {
            self.down_notified = true;
            out.push(Output::Notify(Notice::Disconnected));
        }
    }

    /// A REJ from us, answering message `kind` with `reason`.
    pub(crate) fn rej(&self, kind: u8, reason: u16, private: &[u8]) -> Mad {
        let mut private_data = [0u8; REJ_PRIVATE_LEN];
        let n = private.len().min(REJ_PRIVATE_LEN);
        if let (Some(dst), Some(src)) = (private_data.get_mut(..n), private.get(..n)) {
            dst.copy_from_slice(src);
        }
        Mad {
            tid: self.tid,
            msg: CmMsg::Rej(Box::new(Rej {
                local_comm_id: self.local_comm_id,
                remote_comm_id: self.remote_comm_id,
                message_rejected: kind,
                reject_info_len: 0,
                reason,
                ari: [0; REJ_ARI_LEN],
                private_data,
            })),
        }
    }

    fn ids(&self) -> Ids {
        Ids {
            local_comm_id: self.local_comm_id,
            remote_comm_id: self.remote_comm_id,
            remote_qpn: self.remote_qpn,
        }
    }

    /// Passive side: the application accepts; `rep` (a REP MAD) is sent until the RTU.
    pub(crate) fn accept(
        &mut self,
        now: Instant,
        rep: Mad,
        out: &mut Vec<Output>,
    ) -> Result<(), WrongState> {
        if self.state != State::ReqRcvd {
            return Err(WrongState(self.state));
        }
        self.state = State::RepSent;
        self.arm(now, rep, out);
        Ok(())
    }

    /// Passive side: the application refuses, with `private` data (at most 148 bytes).
    pub(crate) fn reject(
        &mut self,
        now: Instant,
        private: &[u8],
        out: &mut Vec<Output>,
    ) -> Result<(), WrongState> {
        if self.state != State::ReqRcvd {
            return Err(WrongState(self.state));
        }
        let rej = self.rej(msg_kind::REQ, reason::CONSUMER_DEFINED, private);
        self.reply(rej, out);
        self.time_wait(now);
        Ok(())
    }

    /// Either side: the application disconnects (`rdma_disconnect`). The QP goes to ERR at
    /// once; DISCONNECTED follows the DREP (or the last retry).
    pub(crate) fn disconnect(
        &mut self,
        now: Instant,
        tid: u64,
        out: &mut Vec<Output>,
    ) -> Result<(), WrongState> {
        match self.state {
            State::Established | State::RepSent => {
                out.push(Output::QpError);
                self.state = State::DreqSent;
                let dreq = Mad {
                    tid,
                    msg: CmMsg::Dreq(self.ids()),
                };
                self.arm(now, dreq, out);
                Ok(())
            }
            s => Err(WrongState(s)),
        }
    }

    /// Active side: the result of [`Output::ConnectQp`].
    pub(crate) fn qp_connected(&mut self, now: Instant, ok: bool, out: &mut Vec<Output>) {
        if self.state != State::RepRcvd {
            return;
        }
        if ok {
            let rtu = Mad {
                tid: self.tid,
                msg: CmMsg::Rtu(self.ids()),
            };
            self.reply(rtu, out);
            self.state = State::Established;
        } else {
            let rej = self.rej(msg_kind::REP, reason::NO_QP, &[]);
            self.reply(rej, out);
            out.push(Output::QpError);
            out.push(Output::Notify(Notice::ConnectError));
            self.time_wait(now);
        }
    }

    /// The communication's ID is going away (`rdma_destroy_id`): what to tell the peer, once
    /// (a DREQ gets transaction ID `tid`).
    pub(crate) fn destroy(&mut self, tid: u64, out: &mut Vec<Output>) {
        match self.state {
            State::ReqRcvd | State::ReqSent | State::MraRcvd => {
                let kind = if self.state == State::ReqRcvd {
                    msg_kind::REQ
                } else {
                    msg_kind::OTHER
                };
                let rej = self.rej(kind, reason::CONSUMER_DEFINED, &[]);
                out.push(Output::Send(rej));
            }
            State::Established | State::RepSent | State::RepRcvd => {
                out.push(Output::Send(Mad {
                    tid,
                    msg: CmMsg::Dreq(self.ids()),
                }));
            }
            State::DreqSent | State::TimeWait | State::Closed => {}
        }
        self.close();
    }

    /// A MAD addressed to this communication (or a duplicate REQ that created it).
    pub(crate) fn handle(&mut self, now: Instant, mad: &Mad, out: &mut Vec<Output>) {
        match (&mad.msg, self.state) {
            // Active side.
            (CmMsg::Rep(rep), State::ReqSent | State::MraRcvd) => {
                self.disarm();
                self.remote_comm_id = rep.local_comm_id;
                self.remote_qpn = rep.local_qpn;
                self.state = State::RepRcvd;
                out.push(Output::ConnectQp(rep.clone()));
            }
            (CmMsg::Rep(_), State::Established | State::TimeWait) => {
                // Our RTU (or REJ) was lost: the peer sends its REP again.
                if let Some(r) = &self.last_reply {
                    out.push(Output::Send(r.clone()));
                }
            }
            (CmMsg::Mra(m), State::ReqSent) if m.message_mraed == msg_kind::REQ => {
                self.state = State::MraRcvd;
                self.deadline = Some(now + self.timing.mra_wait + self.timing.response);
            }
            (CmMsg::Rej(rej), State::ReqSent | State::MraRcvd | State::RepSent) => {
                if self.state == State::RepSent {
                    out.push(Output::QpError);
                }
                self.close();
                let private = rej.private_data.to_vec();
                out.push(Output::Notify(Notice::Rejected(rej.reason, private)));
            }
            (CmMsg::Rej(rej), State::ReqRcvd) => {
                // The active side gave up before the application decided.
                self.close();
                let private = rej.private_data.to_vec();
                out.push(Output::Notify(Notice::Rejected(rej.reason, private)));
            }
            (CmMsg::Rej(_), State::Established) => {
                // A REJ of our RTU: the peer gave up on the connection.
                out.push(Output::QpError);
                self.time_wait(now);
                self.notify_down(out);
            }
            // Passive side.
            (CmMsg::Req(_), State::ReqRcvd) => {
                let mra = Mad {
                    tid: self.tid,
                    msg: CmMsg::Mra(Mra {
                        local_comm_id: self.local_comm_id,
                        remote_comm_id: self.remote_comm_id,
                        message_mraed: msg_kind::REQ,
                        service_timeout: MRA_TIMEOUT_CODE,
                    }),
                };
                self.reply(mra, out);
            }
            (CmMsg::Req(_), State::RepSent) => {
                if let Some(rep) = &self.pending {
                    out.push(Output::Send(rep.clone()));
                }
            }
            (CmMsg::Req(_), State::TimeWait) => {
                if let Some(r) = &self.last_reply {
                    out.push(Output::Send(r.clone()));
                }
            }
            (CmMsg::Rtu(_), State::RepSent) => {
                self.disarm();
                self.state = State::Established;
                out.push(Output::Notify(Notice::Established(Vec::new())));
            }
            // Disconnection.
            (CmMsg::Dreq(_), State::Established | State::RepSent | State::RepRcvd) => {
                out.push(Output::QpError);
                let drep = Mad {
                    tid: mad.tid,
                    msg: CmMsg::Drep(self.ids()),
                };
                self.reply(drep, out);
                self.time_wait(now);
                self.notify_down(out);
            }
            (CmMsg::Dreq(_), State::DreqSent) => {
                // Both sides disconnect at once: answer, and wait for our own DREP.
                let drep = Mad {
                    tid: mad.tid,
                    msg: CmMsg::Drep(self.ids()),
                };
                self.reply(drep, out);
            }
            (CmMsg::Dreq(_), State::TimeWait | State::Closed) => {
                out.push(Output::Send(Mad {
                    tid: mad.tid,
                    msg: CmMsg::Drep(self.ids()),
                }));
            }
            (CmMsg::Drep(_), State::DreqSent) => {
                self.time_wait(now);
                self.notify_down(out);
            }
            // Anything else is a stale duplicate or out of place: ignored.
            _ => {}
        }
    }

    /// The timer fired (or may have: a call before the deadline does nothing).
    pub(crate) fn handle_timeout(&mut self, now: Instant, out: &mut Vec<Output>) {
        let Some(deadline) = self.deadline else {
            return;
        };
        if now < deadline {
            return;
        }
        match self.state {
            State::MraRcvd => {
                // The MRA's wait is over: back to sending the REQ, retries as they were.
                self.state = State::ReqSent;
                self.resend(now, out);
            }
            State::ReqSent | State::RepSent | State::DreqSent if self.retries_left > 0 => {
                self.retries_left -= 1;
                self.resend(now, out);
            }
            State::ReqSent => {
                let rej = self.rej(msg_kind::REQ, reason::TIMEOUT, &[]);
                out.push(Output::Send(rej));
                self.close();
                out.push(Output::Notify(Notice::Unreachable));
            }
            State::RepSent => {
                let rej = self.rej(msg_kind::REP, reason::TIMEOUT, &[]);
                out.push(Output::Send(rej));
                out.push(Output::QpError);
                self.close();
                out.push(Output::Notify(Notice::Unreachable));
            }
            State::DreqSent => {
                self.time_wait(now);
                self.notify_down(out);
            }
            State::TimeWait => self.close(),
            State::RepRcvd | State::ReqRcvd | State::Established | State::Closed => {
                self.deadline = None;
            }
        }
    }

    fn resend(&mut self, now: Instant, out: &mut Vec<Output>) {
        if let Some(m) = &self.pending {
            out.push(Output::Send(m.clone()));
        }
        self.deadline = Some(now + self.timing.response);
    }
}

#[cfg(test)]
#[path = "proto_tests.rs"]
mod tests;
