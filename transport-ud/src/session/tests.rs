//! Unit tests of the session: credit, recall, loss, close.

use super::*;

fn pair(cfg: &SessionConfig, now: Instant) -> (Session, Session) {
    (
        Session::new(
            cfg.clone(),
            11,
            (2, 22),
            (Seq(100), Seq(5)),
            (cfg.recv_window, cfg.recv_window),
            now,
        ),
        Session::new(
            cfg.clone(),
            22,
            (1, 11),
            (Seq(5), Seq(100)),
            (cfg.recv_window, cfg.recv_window),
            now,
        ),
    )
}

/// Moves datagrams both ways over a perfect link until neither side has any; returns
/// how many moved.
fn pump(a: &mut Session, b: &mut Session, now: Instant) -> usize {
    let mut buf = vec![0u8; 8192];
    let mut moved = 0;
    let mut hop = |from: &mut Session, to: &mut Session| {
        let mut n_moved = 0;
        while let Some(n) = from.poll_transmit(now, &mut buf) {
            let (h, p) = Header::parse(&buf[..n]).expect("our own datagram parses");
            to.handle_datagram(now, &h, p);
            n_moved += 1;
        }
        n_moved
    };
    loop {
        let n = hop(a, b) + hop(b, a);
        if n == 0 {
            return moved;
        }
        moved += n;
    }
}

#[test]
fn a_message_longer_than_the_receive_window_completes() {
    // Its segments must not hold credit while it is reassembled, or it never could.
    let cfg = SessionConfig {
        max_datagram: 128,
        recv_window: 2,
        send_window: 2,
        ..SessionConfig::default()
    };
    let now = Instant::now();
    let (mut a, mut b) = pair(&cfg, now);
    let msg: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
    a.send(&msg).unwrap();
    a.send(b"after").unwrap();
    pump(&mut a, &mut b, now);
    assert_eq!(b.recv().as_deref(), Some(&msg[..]));
    // The big message holds the credit until it is taken: the next one waits...
    pump(&mut a, &mut b, now);
    assert_eq!(b.recv().as_deref(), Some(&b"after"[..]));
    assert_eq!(a.in_flight(), 0);
}

#[test]
fn a_receiver_that_does_not_read_stops_the_sender_and_holds_its_window() {
    let cfg = SessionConfig {
        recv_window: 4,
        max_queued: 1 << 20,
        pack_max: 0,
        ..SessionConfig::default()
    };
    let now = Instant::now();
    let (mut a, mut b) = pair(&cfg, now);
    for i in 0..20u32 {
        a.send(&i.to_be_bytes()).unwrap();
    }
    pump(&mut a, &mut b, now);
    assert_eq!(b.held_packets(), 4, "the window and no more");
    assert_eq!(a.queued_bytes(), 16 * 4);
    let mut got = Vec::new();
    for _ in 0..10 {
        while let Some(m) = b.recv() {
            got.push(u32::from_be_bytes(m[..4].try_into().unwrap()));
        }
        pump(&mut a, &mut b, now);
    }
    assert_eq!(got, (0..20).collect::<Vec<_>>());
}

#[test]
fn forged_and_stale_datagrams_are_counted_and_change_nothing() {
    let cfg = SessionConfig::default();
    let now = Instant::now();
    let (mut a, mut b) = pair(&cfg, now);
    a.send(b"one").unwrap();
    let mut buf = vec![0u8; 8192];
    let n = a.poll_transmit(now, &mut buf).unwrap();
    let (h, p) = Header::parse(&buf[..n]).unwrap();
    // The wrong token, an acknowledgement of what b never sent, a sequence number far
    // beyond the credit.
    for forged in [
        Header { dst_token: 99, ..h },
        Header {
            ack: Seq(5).plus(1000),
            ..h
        },
        Header {
            seq: h.seq.plus(10_000),
            ..h
        },
    ] {
        b.handle_datagram(now, &forged, p);
    }
    assert_eq!(b.stats().refused, 3);
    assert!(b.recv().is_none());
    b.handle_datagram(now, &h, p);
    b.handle_datagram(now, &h, p);
    assert_eq!(b.stats().duplicates, 1);
    assert_eq!(b.recv().as_deref(), Some(&b"one"[..]));
    assert!(b.recv().is_none());
    assert_eq!(b.cause(), None);
}

#[test]
fn a_peer_announcing_a_message_over_the_limit_breaks_the_protocol() {
    let cfg = SessionConfig {
        max_message: 1000,
        ..SessionConfig::default()
    };
    let big = SessionConfig {
        max_message: 100_000,
        ..SessionConfig::default()
    };
    let now = Instant::now();
    let mut a = Session::new(big, 11, (2, 22), (Seq(100), Seq(5)), (64, 64), now);
    let mut b = Session::new(cfg, 22, (1, 11), (Seq(5), Seq(100)), (64, 64), now);
    a.send(&[0u8; 5000]).unwrap();
    pump(&mut a, &mut b, now);
    assert!(matches!(b.cause(), Some(Cause::Protocol(m)) if m.contains("limit")));
}

#[test]
fn a_silent_peer_is_unreachable_within_the_peer_timeout() {
    let cfg = SessionConfig {
        peer_timeout: Duration::from_millis(300),
        ..SessionConfig::default()
    };
    let t0 = Instant::now();
    let (mut a, _b) = pair(&cfg, t0);
    a.send(b"lost").unwrap();
    let mut buf = vec![0u8; 8192];
    let mut now = t0;
    let mut steps = 0;
    while a.cause().is_none() {
        while a.poll_transmit(now, &mut buf).is_some() {}
        now = a.poll_timeout().expect("a timer while the peer is awaited");
        a.handle_timeout(now);
        steps += 1;
        assert!(steps < 1000);
    }
    assert_eq!(a.cause(), Some(Cause::PeerUnreachable));
    assert!(
        now - t0 <= cfg.peer_timeout + cfg.peer_timeout / 8,
        "{:?}",
        now - t0
    );
    assert!(a.stats().retransmits >= 4, "{:?}", a.stats());
}

#[test]
fn an_orderly_close_delivers_everything_then_ends_both_sides() {
    let cfg = SessionConfig::default();
    let now = Instant::now();
    let (mut a, mut b) = pair(&cfg, now);
    a.send(b"last words").unwrap();
    a.close();
    assert_eq!(a.send(b"too late"), Err(SendError::Closed));
    pump(&mut a, &mut b, now);
    assert_eq!(b.cause(), None, "a message is still to be taken");
    assert_eq!(b.recv().as_deref(), Some(&b"last words"[..]));
    assert_eq!(b.cause(), Some(Cause::PeerClosed));
    pump(&mut a, &mut b, now);
    assert_eq!(a.cause(), Some(Cause::LocalClose));
    assert!(a.is_finished() && b.is_finished());
}

/// Moves what `from` has to send to `to`, or drops it.
fn hop(from: &mut Session, to: Option<&mut Session>, now: Instant) -> usize {
    let mut buf = vec![0u8; 8192];
    let mut n_moved = 0;
    let mut to = to;
    while let Some(n) = from.poll_transmit(now, &mut buf) {
        if let Some(to) = to.as_deref_mut() {
            let (h, p) = Header::parse(&buf[..n]).expect("our own datagram parses");
            to.handle_datagram(now, &h, p);
        }
        n_moved += 1;
    }
    n_moved
}

#[test]
fn a_sender_granted_nothing_asks_and_sends_once_granted() {
    let cfg = SessionConfig::default();
    let now = Instant::now();
    let mut a = Session::new(cfg.clone(), 11, (2, 22), (Seq(100), Seq(5)), (8, 0), now);
    let mut b = Session::new(cfg, 22, (1, 11), (Seq(5), Seq(100)), (0, 8), now);
    a.send(b"hello").unwrap();
    pump(&mut a, &mut b, now);
    assert_eq!(b.recv(), None);
    assert_eq!(b.stats().refused, 0, "nothing was sent without credit");
    assert!(b.take_want(), "the sender asked for credit");
    assert!(!b.take_want(), "a request is taken once");
    b.set_window(2);
    pump(&mut a, &mut b, now);
    assert_eq!(b.recv().as_deref(), Some(&b"hello"[..]));
}

#[test]
fn an_idle_sender_gives_recalled_credit_back_and_asks_again_later() {
    let cfg = SessionConfig {
        recv_window: 8,
        ..SessionConfig::default()
    };
    let now = Instant::now();
    let (mut a, mut b) = pair(&cfg, now);
    a.send(b"one").unwrap();
    pump(&mut a, &mut b, now);
    assert_eq!(b.recv().as_deref(), Some(&b"one"[..]));
    // (The credit told to `a` has not grown since: the acknowledgement waits.)
    assert_eq!(b.promised(), 7);
    b.set_window(0);
    b.recall(now);
    assert!(b.is_recalling());
    pump(&mut a, &mut b, now);
    assert_eq!(
        b.promised(),
        0,
        "every buffer promised to `a` is free again"
    );
    assert!(!b.is_recalling());
    assert_eq!(b.stats().skipped, 7);
    // A recall asked again (or late) changes nothing.
    b.recall(now);
    assert!(!b.is_recalling());
    // The next message waits for credit, asked for.
    a.send(b"two").unwrap();
    pump(&mut a, &mut b, now);
    assert_eq!(b.recv(), None);
    assert!(b.take_want());
    b.set_window(1);
    pump(&mut a, &mut b, now);
    assert_eq!(b.recv().as_deref(), Some(&b"two"[..]));
    assert_eq!(b.stats().refused, 0);
}

#[test]
fn a_lost_return_is_repaired_by_the_next_datagram() {
    let cfg = SessionConfig {
        recv_window: 4,
        ..SessionConfig::default()
    };
    let now = Instant::now();
    let (mut a, mut b) = pair(&cfg, now);
    b.set_window(0);
    b.recall(now);
    hop(&mut b, Some(&mut a), now);
    // `a` skipped its unused numbers, but its answer is lost.
    assert!(hop(&mut a, None, now) > 0);
    assert!(b.is_recalling());
    // `b` grants again before hearing back: `a` takes no credit from a datagram that
    // has not seen the skip, and (its answer to the recall lost again) asks for
    // credit with a datagram that carries the skip.
    b.set_window(8);
    hop(&mut b, Some(&mut a), now);
    hop(&mut a, None, now);
    a.send(b"after the skip").unwrap();
    let mut buf = vec![0u8; 8192];
    let n = a.poll_transmit(now, &mut buf).unwrap();
    let (h, p) = Header::parse(&buf[..n]).unwrap();
    assert_eq!(h.kind, Kind::Ack);
    assert!(h.has(flags::RETURN) && h.has(flags::WANT));
    b.handle_datagram(now, &h, p);
    pump(&mut a, &mut b, now);
    assert_eq!(b.recv().as_deref(), Some(&b"after the skip"[..]));
    assert_eq!(b.stats().skipped, 4);
}

#[test]
fn a_busy_sender_answers_a_recall_once_idle_and_the_recall_is_repeated() {
    let cfg = SessionConfig {
        recv_window: 8,
        pack_max: 0,
        ..SessionConfig::default()
    };
    let t0 = Instant::now();
    let (mut a, mut b) = pair(&cfg, t0);
    a.send(b"in flight").unwrap();
    // `a` sends, then `b` recalls while the datagram is on its way; the recall reaches
    // `a` with its data unacknowledged: `a` is not idle and keeps its credit.
    let mut buf = vec![0u8; 8192];
    let n = a.poll_transmit(t0, &mut buf).unwrap();
    let data = buf[..n].to_vec();
    b.set_window(0);
    b.recall(t0);
    let n = b.poll_transmit(t0, &mut buf).unwrap();
    let (h, p) = Header::parse(&buf[..n]).unwrap();
    assert!(h.has(flags::RECALL));
    a.handle_datagram(t0, &h, p);
    hop(&mut a, None, t0);
    let (h, p) = Header::parse(&data).unwrap();
    b.handle_datagram(t0, &h, p);
    assert!(b.is_recalling());
    // The acknowledgement of the data is lost too.
    hop(&mut b, None, t0);
    assert!(b.is_recalling());
    // The recall is asked again after a retransmission timeout, and answered.
    let t1 = b.poll_timeout().unwrap();
    assert!(t1 <= t0 + cfg.rto * 2, "{:?}", t1 - t0);
    b.handle_timeout(t1);
    a.handle_timeout(t1);
    pump(&mut a, &mut b, t1);
    assert!(!b.is_recalling());
    assert_eq!(b.promised(), 0);
    assert_eq!(b.recv().as_deref(), Some(&b"in flight"[..]));
    assert_eq!(a.in_flight(), 0);
}

#[test]
fn a_peer_granting_more_credit_than_any_receiver_holds_breaks_the_protocol() {
    let now = Instant::now();
    let cfg = SessionConfig::default();
    let (mut a, mut b) = pair(&cfg, now);
    b.send(b"x").unwrap();
    let mut buf = vec![0u8; 8192];
    let n = b.poll_transmit(now, &mut buf).unwrap();
    let (mut h, payload) = Header::parse(&buf[..n]).unwrap();
    let payload = payload.to_vec();
    // At the limit: taken.
    let mut ok = h;
    ok.credit = ok.ack.plus(MAX_PEER_CREDIT);
    a.handle_datagram(now, &ok, &payload);
    assert!(a.cause().is_none());
    assert_eq!(a.recv().as_deref(), Some(&b"x"[..]));
    // One beyond: the session ends, nothing more is taken from it.
    h.credit = h.ack.plus(MAX_PEER_CREDIT + 1);
    h.seq = h.seq.next();
    a.handle_datagram(now, &h, &payload);
    assert!(
        matches!(a.cause(), Some(Cause::Protocol(m)) if m.contains("credit")),
        "{:?}",
        a.cause()
    );
    assert!(a.recv().is_none());
}
