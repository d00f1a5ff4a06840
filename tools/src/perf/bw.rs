//! The bandwidth tests: the client keeps up to `tx_depth` work requests in flight and
//! signals one in every few; for send_bw the server keeps receives posted and counts.
//!
//! UD send_bw has no transport-level flow control, so the server sends credits: a UD send
//! with no payload whose immediate is its receive count, every [`credit_every`] messages
//! and at the end of the warm-up and of the round. The client keeps at most `tx_depth`
//! messages (and no more than the server's `rx_depth`) beyond the newest credit. When nothing arrives for [`STALL`], what is not
//! credited is presumed lost and the window opens again; the server's final count tells
//! how many datagrams were really dropped.

use std::time::{Duration, Instant};

use super::endpoint::{Endpoint, Op, Waited};
use super::exchange::TestParams;
use super::lat::Measured;
use super::report::Progress;
use super::{TestKind, Transport};
use crate::error::{Error, Result};

/// UD send_bw: how long the client waits for a credit before presuming datagrams lost.
const STALL: Duration = Duration::from_millis(50);
/// UD send_bw: how long the server keeps taking datagrams after the client finished early.
const GRACE: Duration = Duration::from_millis(20);

/// Runs the client side: warm-up, then the measured stream.
pub(crate) fn client(
    ep: &mut Endpoint,
    p: &TestParams,
    progress: &mut Progress,
) -> Result<Measured> {
    if p.transport == Transport::Ud {
        return client_ud(ep, p, progress);
    }
    let op = match p.test {
        TestKind::SendBw => Op::Send,
        TestKind::WriteBw => Op::Write,
        _ => Op::Read,
    };
    let depth = u64::from(p.tx_depth);
    // Unsignaled work requests hold their send-queue slot until a later signaled one
    // completes, so at least one in every `depth` must be signaled.
    let sig_every = (depth / 4).clamp(1, 64);
    stream(ep, op, p.warmup, depth, sig_every, None)?;
    let t0 = Instant::now();
    stream(ep, op, p.iters, depth, sig_every, Some(progress))?;
    Ok(Measured {
        rtt_ns: Vec::new(),
        elapsed: t0.elapsed(),
        ud_base: 0,
    })
}

fn stream(
    ep: &mut Endpoint,
    op: Op,
    count: u64,
    depth: u64,
    sig_every: u64,
    mut progress: Option<&mut Progress>,
) -> Result<()> {
    let base = ep.sends_posted;
    let end = base + count;
    while ep.sends_done < end {
        let outstanding = ep.sends_posted - ep.sends_done;
        let room = depth.saturating_sub(outstanding).min(end - ep.sends_posted);
        if room > 0 {
            ep.post(op, room, |id| {
                id + 1 == end || (id + 1 - base).is_multiple_of(sig_every)
            })?;
        }
        let before = ep.sends_done;
        ep.wait_until("send completions", |e| Ok(e.sends_done > before))?;
        if let Some(p) = progress.as_deref_mut() {
            p.update(ep.sends_done - base);
        }
    }
    Ok(())
}

/// The server side of send_bw: waits for every message (receives are reposted as they
/// complete); returns how many arrived.
pub(crate) fn server_send(ep: &mut Endpoint, p: &TestParams) -> Result<u64> {
    if p.transport == Transport::Ud {
        return server_send_ud(ep, p);
    }
    let total = p.total();
    ep.wait_until("the client's messages", |e| Ok(e.recvs_done >= total))?;
    Ok(ep.recvs_done)
}

/// UD send_bw: messages the client may send beyond the newest credit: `tx_depth`, but never
/// more than the receives the server keeps posted.
fn window(p: &TestParams) -> u64 {
    u64::from(p.tx_depth.min(p.rx_depth))
}

/// UD send_bw: the server credits every this many messages.
fn credit_every(window: u64) -> u64 {
    (window / 4).clamp(1, 64)
}

/// The receive count at which the server sends its next credit, after one at `credited`.
fn next_credit(credited: u64, every: u64, warmup: u64, total: u64) -> u64 {
    let mut next = (credited / every + 1) * every;
    if warmup > credited {
        next = next.min(warmup);
    }
    next.min(total)
}

/// The server side of UD send_bw: counts datagrams (receives are reposted as they
/// complete), sends credits, and stops at the last message or, when some were lost, once
/// the client says it finished and nothing more arrives; returns how many arrived.
fn server_send_ud(ep: &mut Endpoint, p: &TestParams) -> Result<u64> {
    let total = p.total();
    let every = credit_every(window(p));
    let mut credited = 0;
    loop {
        let next = next_credit(credited, every, p.warmup, total);
        let w = ep.wait("the client's messages", None, true, |e| {
            Ok(e.recvs_done >= next)
        })?;
        if w == Waited::PeerSpoke {
            ep.wait("the last messages", Some(GRACE), true, |e| {
                Ok(e.recvs_done >= total)
            })?;
            break;
        }
        credited = ep.recvs_done;
        ep.post_one(Op::Credit(credited as u32))?;
        if credited >= total {
            break;
        }
    }
    ep.drain_sends()?;
    Ok(ep.recvs_done)
}

/// What the UD client knows of the server's progress.
#[derive(Debug, Default)]
struct Credits {
    /// `recvs_done` when last looked at.
    seen: u64,
    /// The server's receive count in its newest credit.
    got: u64,
    /// Messages presumed lost (not credited when the window stalled).
    lost: u64,
    /// When the newest credit arrived.
    last_at: Option<Instant>,
}

impl Credits {
    /// Takes in the newest credit, if one came.
    fn update(&mut self, ep: &Endpoint) -> Result<()> {
        if ep.recvs_done == self.seen {
            return Ok(());
        }
        self.seen = ep.recvs_done;
        self.last_at = Some(Instant::now());
        let imm = ep
            .last_recv
            .imm()
            .ok_or_else(|| Error::msg("a credit message without immediate data"))?;
        // The immediate is the low 32 bits of a count that is at most what was sent.
        let sent = ep.sends_posted;
        let got = sent
            .checked_sub(u64::from((sent as u32).wrapping_sub(imm)))
            .ok_or_else(|| Error::msg(format!("credit {imm} is above the {sent} messages sent")))?;
        self.got = self.got.max(got);
        Ok(())
    }

    /// Messages the server took, or that are presumed lost.
    fn acked(&self, sent: u64) -> u64 {
        (self.got + self.lost).min(sent)
    }
}

/// The client side of UD send_bw: warm-up, then the measured stream, which ends when the
/// server credited the last message (or nothing more came).
fn client_ud(ep: &mut Endpoint, p: &TestParams, progress: &mut Progress) -> Result<Measured> {
    let window = window(p);
    let mut c = Credits::default();
    stream_ud(ep, &mut c, p.warmup, window, None)?;
    let base = c.got;
    let t0 = Instant::now();
    let end = stream_ud(ep, &mut c, p.iters, window, Some(progress))?;
    Ok(Measured {
        rtt_ns: Vec::new(),
        elapsed: end.saturating_duration_since(t0),
        ud_base: base,
    })
}

/// Sends `count` messages, at most `window` beyond the credits; returns when the server
/// credited them all (or nothing came for [`STALL`]) with the time of the last progress.
fn stream_ud(
    ep: &mut Endpoint,
    c: &mut Credits,
    count: u64,
    window: u64,
    mut progress: Option<&mut Progress>,
) -> Result<Instant> {
    let base = ep.sends_posted;
    let end = base + count;
    let sig_every = (window / 4).clamp(1, 64);
    while ep.sends_posted < end {
        c.update(ep)?;
        let sent = ep.sends_posted;
        let in_flight = (sent - c.acked(sent)).max(sent - ep.sends_done);
        let room = window.saturating_sub(in_flight).min(end - sent);
        if room > 0 {
            ep.post(Op::Send, room, |id| {
                id + 1 == end || (id + 1 - base).is_multiple_of(sig_every)
            })?;
            continue;
        }
        let (r0, s0) = (ep.recvs_done, ep.sends_done);
        let w = ep.wait("credits from the server", Some(STALL), false, |e| {
            Ok(e.recvs_done != r0 || e.sends_done != s0)
        })?;
        c.update(ep)?;
        if w == Waited::Quiet {
            c.lost = ep.sends_posted - c.got;
            tracing::debug!(
                sent = ep.sends_posted,
                credited = c.got,
                "UD window stalled"
            );
        }
        if let Some(p) = progress.as_deref_mut() {
            p.update(c.acked(ep.sends_posted).saturating_sub(base));
        }
    }
    ep.drain_sends()?;
    let drained = Instant::now();
    ep.wait("the last credit", Some(STALL), false, |e| {
        c.update(e)?;
        Ok(c.acked(e.sends_posted) >= end)
    })?;
    Ok(c.last_at.map_or(drained, |t| t.max(drained)))
}
