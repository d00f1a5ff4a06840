//! Keepalives: probing peers that have been silent too long, and giving up on closes that
//! take longer than the peer timeout.

use std::time::{Duration, Instant};

use rdmx_core::DisconnectCause;
use rdmx_core::worker::Cx;
use rdmx_verbs::{Rkey, WrOpcode};

use super::send::{PostData, post_on};
use crate::ep::{Hold, Status};
use crate::state::{Shared, State};
use crate::wire::Mailbox;

/// The local ACK timeout exponent (4.096 us * 2^t per try) so that 8 tries take about half
/// the peer timeout.
pub(crate) fn timeout_exponent(peer_timeout: Duration) -> u8 {
    let per_try_ns = (peer_timeout.as_nanos() / 16).max(4096);
    let mut t = 1u8;
    while t < 31 && 4096u128 << t < per_try_ns {
        t += 1;
    }
    t
}

/// How long an endpoint may be silent before it is probed with a keepalive: the peer
/// timeout less what the probe's tries take (8 of the ACK timeout, rounded up to a power of
/// two) and one background tick, so that a dead peer is reported within the peer timeout.
/// (Probing after half the timeout overshot it: 3.5-3.7 s with a 3 s timeout.)
pub(crate) fn probe_after(peer_timeout: Duration, tick: Duration) -> Duration {
    let tries = Duration::from_nanos((4096u64 << timeout_exponent(peer_timeout)) * 8);
    peer_timeout.saturating_sub(tries + tick)
}

/// Background duties, every tick: probe peers that have been silent for half the peer
/// timeout (a signaled mailbox write: a dead peer makes it exhaust its retries), and give up
/// on closes that take longer than the peer timeout.
pub(crate) fn keepalive(sh: &Shared, st: &mut State, cx: &mut Cx<'_>, now: Instant) {
    let probe = probe_after(sh.cfg.peer_timeout, sh.keepalive_tick());
    let mut expired = Vec::new();
    for (k, ep) in st.eps.iter_mut() {
        if ep.linger_until.is_some_and(|t| now >= t) {
            ep.linger_until = None;
            st.reap_pending = true;
        }
        if let Some(d) = ep.close_deadline
            && now >= d
            && !matches!(ep.status, Status::Down(_))
        {
            expired.push(k);
            continue;
        }
        if !matches!(ep.status, Status::Open | Status::Closing) {
            continue;
        }
        if now.duration_since(ep.last_rx) < probe || ep.signaled_out > 0 {
            continue;
        }
        // Probes are spaced the same way: a peer that dies right after answering one is
        // found by the next within the peer timeout (spacing them half the timeout apart
        // overshot it: 0.45 s with a 0.4 s timeout).
        if ep
            .keepalive_at
            .is_some_and(|t| now.duration_since(t) < probe)
        {
            continue;
        }
        let m = Mailbox {
            grant: ep.recv.advertised,
            rndv_done: ep.rndv_in_adv,
        };
        let bytes = m.to_word().to_be_bytes();
        let op = WrOpcode::RdmaWrite {
            remote_addr: ep.peer_mailbox.0,
            rkey: Rkey(ep.peer_mailbox.1),
        };
        if post_on(ep, op, PostData::Inline(&bytes), Hold::None, true).is_ok() {
            ep.keepalive_at = Some(now);
        }
    }
    super::recall::tick(sh, st, cx, now);
    for k in expired {
        sh.fail(
            st,
            cx,
            k,
            DisconnectCause::PeerUnreachable("the peer did not finish closing in time".into()),
        );
    }
    sh.after(st, cx);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_leave_room_for_their_retries() {
        for ms in [10u64, 200, 1000, 2000, 3000, 10_000] {
            let t = Duration::from_millis(ms);
            let tick = (t / 4).min(Duration::from_millis(100));
            let tries = Duration::from_nanos((4096u64 << timeout_exponent(t)) * 8);
            let probe = probe_after(t, tick);
            assert!(probe + tries + tick <= t.max(tries + tick), "{ms} ms");
        }
        // 3 s: 8 tries of 268 ms, so probe after 0.75 s of silence (not 1.5 s).
        let t = Duration::from_secs(3);
        assert_eq!(timeout_exponent(t), 16);
        assert!(probe_after(t, Duration::from_millis(100)) < Duration::from_millis(800));
    }

    #[test]
    fn timeout_exponent_scales() {
        // 2 s peer timeout: 8 tries of ~134 ms.
        assert_eq!(timeout_exponent(Duration::from_secs(2)), 15);
        assert_eq!(timeout_exponent(Duration::from_millis(10)), 8);
        assert_eq!(timeout_exponent(Duration::from_secs(100_000)), 31);
    }
}
