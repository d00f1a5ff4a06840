//! Endpoint timers (see `timers.rs`): keepalives probing peers that have been silent too
//! long, closes that take longer than the peer timeout, lingers, re-arming a path left
//! behind by a migration, starving flags, packed frames.

use std::time::{Duration, Instant};

use rdmx_core::Result;
use rdmx_core::bootstrap::PathInfo;
use rdmx_core::worker::Cx;
use rdmx_core::{DisconnectCause, Event};
use rdmx_verbs::{MigState, QpAttr, QpAttrMask as M, QpState, QueuePair, Rkey, WrOpcode};

use super::send::{PostData, post_on};
use crate::ep::{Hold, Status};
use crate::state::{Shared, State};
use crate::timers::Timer;
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

/// Runs the timers of every endpoint whose wake is due at `now` (see `timers.rs`): probes
/// of silent peers, close deadlines, lingers, path re-arms, packed frames.
pub(crate) fn run_timers(sh: &Shared, st: &mut State, cx: &mut Cx<'_>, now: Instant) {
    let mut due = Vec::new();
    while let Some((k, id)) = st.timer_queue.pop_due(now) {
        if st.eps.get(k).is_some_and(|ep| ep.id == id) && !due.contains(&k) {
            due.push(k);
        }
    }
    for k in due {
        endpoint_timers(sh, st, cx, k, now);
        let Some(ep) = st.eps.get_mut(k) else {
            continue;
        };
        // A timer its handler left due would wake us at once for ever: put it off a little
        // (dropping it lost keepalives for good when a probe re-armed at `now`).
        for t in Timer::ALL.into_iter().filter(|t| t.wakes()) {
            if ep.timers.is_due(t, now) {
                tracing::debug!(endpoint = ep.id, timer = ?t, "timer left due; put off 1 ms");
                let _ = ep.timers.set(t, now + Duration::from_millis(1));
            }
        }
        if let Some(at) = ep.timers.requeue() {
            st.timer_queue.push(at, k, ep.id);
        }
    }
    sh.after(st, cx);
}

/// The due timers of endpoint `k`.
fn endpoint_timers(sh: &Shared, st: &mut State, cx: &mut Cx<'_>, k: usize, now: Instant) {
    let Some(ep) = st.eps.get_mut(k) else { return };
    if ep.timers.take_due(Timer::Linger, now) {
        if std::mem::take(&mut ep.awaiting_gone) {
            // No answer in time: the peer is gone or does not follow the protocol. The
            // endpoint goes; an rdmx peer that is merely late finds its slot deregistered.
            tracing::debug!(endpoint = ep.id, "the peer did not answer our GONE in time");
            st.stats.gone_unanswered += 1;
        }
        st.reap_pending = true;
    }
    let Some(ep) = st.eps.get_mut(k) else { return };
    if ep.timers.take_due(Timer::CloseDeadline, now) && !matches!(ep.status, Status::Down(_)) {
        sh.fail(
            st,
            cx,
            k,
            DisconnectCause::PeerUnreachable("the peer did not finish closing in time".into()),
        );
    }
    let Some(ep) = st.eps.get_mut(k) else { return };
    if ep.timers.take_due(Timer::Keepalive, now) {
        probe(sh, st, cx, k, now);
    }
    let Some(ep) = st.eps.get_mut(k) else { return };
    if ep.timers.take_due(Timer::Rearm, now) {
        rearm(sh, st, cx, None, Some(k));
    }
    let Some(ep) = st.eps.get_mut(k) else { return };
    if ep.timers.take_due(Timer::PackFlush, now) {
        match sh.flush_pack(st, k) {
            // No send slot now: the progress that frees one sends it.
            Ok(_) => {}
            Err(e) => tracing::debug!("posting a packed frame failed: {e}"),
        }
    }
}

/// Starts the keepalive look of a newly opened endpoint.
pub(crate) fn start_keepalive(sh: &Shared, st: &mut State, cx: &mut Cx<'_>, k: usize) {
    let at = cx.now() + probe_after(sh.cfg.peer_timeout, sh.keepalive_tick());
    st.arm(cx, k, Timer::Keepalive, at);
}

/// The keepalive look at endpoint `k`: probes the peer if it has been silent for
/// [`probe_after`] since its last message and our last probe (a signaled mailbox write: a
/// dead peer makes it exhaust its retries), and sets the next look.
fn probe(sh: &Shared, st: &mut State, cx: &mut Cx<'_>, k: usize, now: Instant) {
    let after = probe_after(sh.cfg.peer_timeout, sh.keepalive_tick());
    let Some(ep) = st.eps.get_mut(k) else { return };
    if !matches!(ep.status, Status::Open | Status::Closing) {
        return;
    }
    if !ep.peer_ready {
        // Its slot cannot be written yet (see `setup::complete`): a connector that never
        // says it is ready, nor sends anything, within the connect (or peer) timeout is
        // gone.
        let limit = sh.cfg.connect_timeout.max(sh.cfg.peer_timeout);
        if now.duration_since(ep.last_rx) > limit {
            sh.fail(
                st,
                cx,
                k,
                DisconnectCause::PeerUnreachable(
                    "the peer never opened its mailbox slot (no Ready signal)".into(),
                ),
            );
        } else {
            let at = now + sh.keepalive_tick();
            st.arm(cx, k, Timer::Keepalive, at);
        }
        return;
    }
    // Probes are spaced the same way: a peer that dies right after answering one is found by
    // the next within the peer timeout (spacing them half the timeout apart overshot it:
    // 0.45 s with a 0.4 s timeout).
    let quiet_since = ep.keepalive_at.map_or(ep.last_rx, |t| t.max(ep.last_rx));
    let next = if ep.signaled_out > 0 {
        // Signaled work in flight answers the question (its completion or its failure).
        now + sh.keepalive_tick()
    } else if now.duration_since(quiet_since) < after {
        quiet_since + after
    } else {
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
            // No sooner than a tick (with a short peer timeout, `after` is zero: the tries
            // take it all).
            now + after.max(sh.keepalive_tick())
        } else {
            now + sh.keepalive_tick()
        }
    };
    st.arm(cx, k, Timer::Keepalive, next);
}

/// Loads the path an endpoint migrated away from as its new alternate, once that path's
/// local port is active and its re-arm timer has expired (`port`: a port that just became
/// active; `only`: that endpoint only; `None`s: every endpoint). An endpoint whose port is
/// not active yet looks again a tick later.
pub(crate) fn rearm(
    sh: &Shared,
    st: &mut State,
    cx: &mut Cx<'_>,
    port: Option<u8>,
    only: Option<usize>,
) {
    let now = cx.now();
    let mut rearmed = Vec::new();
    let mut later = Vec::new();
    for (k, ep) in st.eps.iter_mut() {
        if only.is_some_and(|o| o != k) {
            continue;
        }
        let (Some(p), Some(paths)) = (ep.rearm_port, &ep.paths) else {
            continue;
        };
        if port.is_some_and(|q| q != p) || !matches!(ep.status, Status::Open) {
            continue;
        }
        if ep.timers.get(Timer::Rearm).is_some_and(|t| now < t) {
            continue;
        }
        let up = sh
            .vctx
            .query_port(p)
            .is_ok_and(|a| a.state == rdmx_verbs::PortState::Active);
        if !up {
            later.push(k);
            continue;
        }
        // Port 1 reaches the peer's primary address, port 2 its alternate.
        let target = &paths[usize::from(p) - 1];
        match load_alternate(sh, &ep.qp, target, p) {
            Ok(()) => {
                ep.rearm_port = None;
                ep.timers.clear(Timer::Rearm);
                rearmed.push(ep.id);
            }
            Err(e) => {
                tracing::debug!(endpoint = ep.id, "re-arming failed: {e}");
                later.push(k);
            }
        }
    }
    for k in later {
        st.arm(cx, k, Timer::Rearm, now + sh.keepalive_tick());
    }
    for endpoint in rearmed {
        cx.push_event(Event::PathRearmed { endpoint });
    }
}

/// Loads `path` (the peer's side, reached from local port `local_port`) as the queue pair's
/// alternate path and asks for it to be armed (automatic path migration).
pub(crate) fn load_alternate(
    sh: &Shared,
    qp: &QueuePair,
    path: &PathInfo,
    local_port: u8,
) -> Result<()> {
    let mut alt = crate::util::av(path);
    alt.port_num = local_port;
    alt.sgid_index = u8::try_from(sh.gid_index(local_port)).unwrap_or(0);
    qp.modify(
        &QpAttr {
            qp_state: QpState::Rts,
            path_mig_state: MigState::Rearm,
            alt_ah_attr: alt,
            alt_port_num: local_port,
            alt_timeout: timeout_exponent(sh.cfg.peer_timeout),
            ..QpAttr::default()
        },
        M::STATE | M::ALT_PATH | M::PATH_MIG_STATE,
    )?;
    Ok(())
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
