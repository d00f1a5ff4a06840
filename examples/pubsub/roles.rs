//! A publisher and a subscriber of the bench.

use super::*;

/// What a participant and whoever runs it share.
#[derive(Debug, Default)]
pub(crate) struct Control {
    /// The member id + 1, once joined (0 before).
    pub(crate) ready: AtomicU64,
    /// Messages published (publisher) or got (subscriber) so far.
    pub(crate) count: AtomicU64,
    /// Publishers start.
    pub(crate) go: AtomicBool,
    /// The participant did its part (a publisher: every member took everything; a
    /// subscriber: it has every publisher's end mark). It stays in the group until `stop`:
    /// leaving at once could keep its last status from its publishers, or its taking from
    /// the other publishers' streams.
    pub(crate) ended: AtomicBool,
    /// Leave (publishers waiting for `go` give up).
    pub(crate) stop: AtomicBool,
}

/// Opens a context, joins the topic, calls `on_ready` with the member id, then plays `role`.
pub(crate) fn run_role(
    role: Role,
    ro: &RoleOptions,
    ctl: &Control,
    on_ready: impl FnOnce(u32),
) -> Result<Outcome, String> {
    let mut b = Context::builder();
    if let Some(d) = &ro.device {
        b = b.device(d.clone());
    }
    let ctx = b.build().map_err(|e| format!("opening the context: {e}"))?;
    let g = ctx
        .join_with(&ro.topic, group_config(ro.reliable))
        .map_err(|e| format!("joining {}: {e}", ro.topic))?;
    on_ready(g.member_id());
    ctl.ready
        .store(u64::from(g.member_id()) + 1, Ordering::Release);
    match role {
        Role::Pub => publisher(&g, ro, ctl).map(Outcome::Pub),
        Role::Sub => subscriber(&g, ro, ctl).map(Outcome::Sub),
    }
}

/// Takes messages until stopped (after every publisher's end mark): counts them, per
/// publisher checks their order, and times each.
pub(crate) fn subscriber(g: &Group, ro: &RoleOptions, ctl: &Control) -> Result<SubResult, String> {
    let mut r = SubResult::default();
    let mut ended = 0;
    loop {
        match g.recv_timeout(Duration::from_millis(50)) {
            Ok((from, m)) => {
                let now = unix_ns();
                let i = match r.streams.iter().position(|s| s.publisher == from) {
                    Some(i) => i,
                    None => {
                        r.streams.push(StreamSeen {
                            publisher: from,
                            ..StreamSeen::default()
                        });
                        r.streams.len() - 1
                    }
                };
                let s = &mut r.streams[i];
                let (Some(seq), Some(sent)) = (word(&m, 0), word(&m, 8)) else {
                    s.out_of_order += 1;
                    continue;
                };
                if seq == END {
                    if !s.ended {
                        s.ended = true;
                        ended += 1;
                    }
                    if ended >= ro.pubs {
                        ctl.ended.store(true, Ordering::Release);
                    }
                    continue;
                }
                if seq < s.next {
                    s.out_of_order += 1;
                } else {
                    s.gaps += seq - s.next;
                    s.next = seq + 1;
                }
                s.got += 1;
                if r.got == 0 {
                    r.first_ns = now;
                }
                r.last_ns = now;
                r.got += 1;
                r.lat.record(now.saturating_sub(sent));
                ctl.count.store(r.got, Ordering::Relaxed);
                // (Events, losses in unreliable mode among them, would pile up.)
                if r.got.is_multiple_of(4096) {
                    while g.poll_event().is_some() {}
                    if ctl.stop.load(Ordering::Acquire) {
                        break;
                    }
                }
            }
            Err(rdmx::Error::Timeout(_)) => {
                while g.poll_event().is_some() {}
                if ctl.stop.load(Ordering::Acquire) {
                    break;
                }
            }
            Err(e) => return Err(format!("receiving: {e}")),
        }
    }
    r.naks_sent = g.stats().naks_sent;
    Ok(r)
}

/// Waits for `go` and for every other member, publishes its stream for `ro.secs`, then the
/// end mark, waits for the members to take everything, then for `stop`.
pub(crate) fn publisher(g: &Group, ro: &RoleOptions, ctl: &Control) -> Result<PubResult, String> {
    // Every member receives (and paces) every stream: the other publishers' messages are
    // taken and dropped.
    let others = ro.pubs > 1;
    let drain = || {
        if others {
            while g.try_recv().is_ok() {}
        }
    };
    while !ctl.go.load(Ordering::Acquire) {
        if ctl.stop.load(Ordering::Acquire) {
            return Err("stopped before the start".into());
        }
        drain();
        thread::sleep(Duration::from_millis(1));
    }
    let heard = Instant::now() + SETTLE;
    while g.receivers() < ro.members {
        if Instant::now() > heard {
            return Err(format!(
                "heard of {} of the {} other members in {SETTLE:?}",
                g.receivers(),
                ro.members
            ));
        }
        drain();
        thread::sleep(Duration::from_millis(2));
    }
    let mut msg = vec![0xA5u8; ro.size];
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(ro.secs);
    let mut published = 0u64;
    while Instant::now() < end {
        if let Some(rate) = ro.rate {
            // Paced: the next message is due at published / rate. Sleep until close, then
            // yield (a spin would take a core from the subscribers on a small machine).
            let due = t0 + Duration::from_secs_f64(published as f64 / rate);
            loop {
                let now = Instant::now();
                if now >= due {
                    break;
                }
                if due - now > Duration::from_micros(200) {
                    drain();
                    thread::sleep(Duration::from_micros(100));
                } else {
                    thread::yield_now();
                }
            }
        }
        msg[..8].copy_from_slice(&published.to_le_bytes());
        msg[8..16].copy_from_slice(&unix_ns().to_le_bytes());
        match g.try_publish(&msg) {
            Ok(()) => {
                published += 1;
                ctl.count.store(published, Ordering::Relaxed);
                if published.is_multiple_of(256) {
                    drain();
                }
            }
            Err(rdmx::Error::WouldBlock) => {
                drain();
                thread::yield_now();
            }
            Err(e) => return Err(format!("publishing: {e}")),
        }
    }
    msg[..8].copy_from_slice(&END.to_le_bytes());
    msg[8..16].copy_from_slice(&unix_ns().to_le_bytes());
    let deadline = Instant::now() + SETTLE;
    loop {
        match g.try_publish(&msg) {
            Ok(()) => break,
            Err(rdmx::Error::WouldBlock) if Instant::now() < deadline => {
                drain();
                thread::yield_now();
            }
            Err(e) => return Err(format!("publishing the end mark: {e}")),
        }
    }
    // Until every member took everything. (Unreliable members send no statuses: there is
    // nothing to wait for, and what is queued leaves while the publisher stays.)
    let deadline = Instant::now() + SETTLE;
    let step = Duration::from_millis(if others { 5 } else { 100 });
    if ro.reliable {
        loop {
            drain();
            match g.flush_timeout(step) {
                Ok(()) => break,
                Err(rdmx::Error::Timeout(_)) if Instant::now() < deadline => {}
                Err(e) => return Err(format!("waiting for the members to take everything: {e}")),
            }
        }
    }
    let removed = std::iter::from_fn(|| g.poll_event())
        .filter(|e| matches!(e, McastEvent::MemberRemoved { .. }))
        .count() as u64;
    let st = g.stats();
    let r = PubResult {
        member: g.member_id(),
        published,
        repairs_sent: st.repairs_sent,
        naks_sent: st.naks_sent,
        removed,
    };
    // Still a member (taking the other publishers' messages) until every one is done.
    ctl.ended.store(true, Ordering::Release);
    while !ctl.stop.load(Ordering::Acquire) {
        match g.recv_timeout(Duration::from_millis(10)) {
            Ok(_) | Err(rdmx::Error::Timeout(_)) => {}
            Err(e) => return Err(format!("receiving: {e}")),
        }
    }
    Ok(r)
}
