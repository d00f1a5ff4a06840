//! A hostile XRC peer behind a well-formed connection: it does the XRC exchange like an
//! rdmx context (its own initiator and target, hand-driven), then writes where it should not,
//! or does not answer when the protocol says it must.
//!
//! XRC cannot bind a window to a peer's queue pair (a target has no send queue), so an XRC
//! endpoint's mailbox slot is a registration of its own: the peer can write its slot and
//! nothing beside it. And an endpoint that went down on our side keeps its key, slot and
//! rendezvous buffers until the peer answers our `GONE` (or the peer timeout passes), never
//! for a fixed guess.
#![allow(missing_docs)]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::raw;
use rdmx_core::bootstrap::{self, EndpointInfo, Frame, Transport};
use rdmx_core::header::{Header, Kind, RTS_LEN, RtsInfo};
use rdmx_core::{DisconnectCause, Error};
use rdmx_rc::wire::{MAILBOX_LEN, Mailbox, RECALL_OFF, Recall};
use rdmx_rc::{Context, Endpoint, Listener};
use rdmx_verbs::{
    AhAttr, CompletionQueue, Gid, MemoryRegion, QueuePair, Rkey, SendFlags, SendWr,
    SharedReceiveQueue, WcStatus, WrOpcode,
};

/// A raw XRC peer: one initiator towards the server's node, one target for the server's
/// initiator, connected through the real bootstrap as a connector.
struct XrcRogue {
    cq: CompletionQueue,
    ini: QueuePair,
    _tgt: QueuePair,
    _srq: SharedReceiveQueue,
    /// Its mailbox (the server writes its grants and its `GONE` here).
    mr: MemoryRegion,
    /// The tag the server gave this endpoint.
    tag: u16,
    /// The server's SRQ number (every message names it).
    srqn: u32,
    /// The server's slot for this endpoint (address, key).
    slot: (u64, u32),
    _ctx: rdmx_verbs::Context,
}

impl XrcRogue {
    fn connect(addr: SocketAddr, node_id: u64) -> Self {
        let me = raw::RawXrcPeer::new();
        let ini_psn = 700;
        let hello = me.info(node_id, 0, ini_psn);
        let raw::RawXrcPeer {
            cq,
            ini,
            tgt,
            srq,
            mailbox: mr,
            ctx,
            ..
        } = me;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut s = bootstrap::connect(addr, deadline).unwrap();
        bootstrap::send_frame(&mut s, &Frame::Hello(hello.clone()), deadline).unwrap();
        let peer = bootstrap::expect_accept(&mut s, deadline).unwrap();
        let av = AhAttr::new(Gid(peer.primary.gid)).with_udp_port(peer.primary.udp_port);
        // Our target, for the server's initiator.
        raw::xrc_target_up(&tgt, av, peer.qpn, peer.psn);
        let second = EndpointInfo {
            qpn: ini.qp_num().0,
            xrc_target: Some(tgt.qp_num().0),
            ..hello
        };
        bootstrap::send_frame(&mut s, &Frame::Hello(second), deadline).unwrap();
        let their_target = bootstrap::expect_xrc_target(&mut s, deadline).unwrap();
        // Our initiator, to the server's target.
        raw::xrc_initiator_up(&ini, av, their_target, ini_psn);
        Self {
            cq,
            ini,
            _tgt: tgt,
            _srq: srq,
            mr,
            tag: peer.tag as u16,
            srqn: peer.srq_nums[0],
            slot: (peer.mailbox_addr, peer.mailbox_rkey),
            _ctx: ctx,
        }
    }

    /// Writes `bytes` at `(addr, key)` in the server, through its initiator; the status.
    fn write_at(&self, addr: u64, key: u32, bytes: &[u8]) -> WcStatus {
        let op = WrOpcode::RdmaWrite {
            remote_addr: addr,
            rkey: Rkey(key),
        };
        let mut wr = SendWr::new(3, op, &[]).signaled().to_srq(self.srqn);
        wr.inline_data = Some(bytes);
        wr.send_flags |= SendFlags::INLINE;
        self.ini.post_send(&wr).unwrap();
        self.wait_send()
    }

    /// Sends `bytes` as a message to the server's receive queue; the status.
    fn send(&self, bytes: &[u8]) -> WcStatus {
        self.ini
            .post_send(&SendWr::send_inline(1, bytes).signaled().to_srq(self.srqn))
            .unwrap();
        self.wait_send()
    }

    fn wait_send(&self) -> WcStatus {
        raw::wait_one(&self.cq, "the rogue's work").status
    }

    /// A rendezvous request for more than any message may be: a protocol violation.
    /// (A header that cannot be parsed at all is only counted: on XRC, whose target is
    /// shared by all the peer node's endpoints, it names no endpoint.)
    fn bad_rts(&self) -> Vec<u8> {
        let mut rts = [0u8; RTS_LEN];
        Header {
            kind: Kind::Rts,
            tag: self.tag,
            grant: 8,
            rndv_done: 0,
            len: u32::MAX,
            flags: 0,
        }
        .write(&mut rts);
        RtsInfo {
            addr: 0x1000,
            rkey: 1,
        }
        .write(&mut rts);
        rts.to_vec()
    }

    /// Whether the server wrote `GONE` in the recall word of our mailbox.
    fn told_gone(&self) -> bool {
        let w = self.mr.to_vec(RECALL_OFF, 8).unwrap();
        Recall::from_word(u64::from_be_bytes(w.try_into().unwrap())).is_gone()
    }

    /// Waits up to `limit` for the server's `GONE`.
    fn wait_told_gone(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if self.told_gone() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        self.told_gone()
    }

    /// Answers the server's `GONE` with ours (what an rdmx peer does once it stopped).
    fn answer_gone(&self) -> WcStatus {
        self.write_at(
            self.slot.0 + RECALL_OFF as u64,
            self.slot.1,
            &Recall::GONE.to_be_bytes(),
        )
    }
}

fn server(peer_timeout: Duration) -> (Context, Listener) {
    let ctx = Context::builder()
        .transport(Transport::Xrc)
        .credits(8)
        .srq_depth(256)
        .peer_timeout(peer_timeout)
        .build()
        .unwrap();
    let l = ctx.listen("127.0.0.1:0").unwrap();
    (ctx, l)
}

fn accept_rogue(l: &Listener, node_id: u64) -> (XrcRogue, Endpoint) {
    let addr = l.local_addr();
    let t = std::thread::spawn(move || XrcRogue::connect(addr, node_id));
    let ep = l.accept_timeout(Duration::from_secs(5)).unwrap();
    (t.join().unwrap(), ep)
}

/// Receives until the endpoint fails; the cause.
fn wait_down(ep: &Endpoint) -> DisconnectCause {
    loop {
        match ep.recv_timeout(Duration::from_secs(5)) {
            Ok(_) => {}
            Err(Error::Disconnected(c)) => return c,
            Err(e) => panic!("expected the endpoint to go down, got {e}"),
        }
    }
}

/// A well-behaved XRC pair through the server's listener still works.
fn good_pair_works(l: &Listener) {
    let client = Context::builder()
        .transport(Transport::Xrc)
        .build()
        .unwrap();
    let addr = l.local_addr();
    let t = std::thread::spawn(move || {
        let ep = client.connect(addr).unwrap();
        (client, ep)
    });
    let sep = l.accept_timeout(Duration::from_secs(5)).unwrap();
    let (_client, cep) = t.join().unwrap();
    cep.send(b"still here").unwrap();
    assert_eq!(
        &sep.recv_timeout(Duration::from_secs(5)).unwrap()[..],
        b"still here"
    );
    sep.send(&[5u8; 50_000]).unwrap();
    assert_eq!(
        cep.recv_timeout(Duration::from_secs(5)).unwrap().len(),
        50_000
    );
}

/// An XRC peer writes its own slot, and nothing beside it: the bytes after its slot (the
/// next endpoint's slot, when all slots shared one region) are out of its key's range.
#[test]
fn an_xrc_peer_writes_only_its_own_slot() {
    let (ctx, l) = server(Duration::from_secs(2));
    let (rogue, ep) = accept_rogue(&l, 0x5157_0001);
    let word = Mailbox {
        grant: 8,
        rndv_done: 0,
    }
    .to_word()
    .to_be_bytes();
    assert_eq!(
        rogue.write_at(rogue.slot.0, rogue.slot.1, &word),
        WcStatus::Success
    );
    assert_eq!(
        rogue.write_at(rogue.slot.0 + MAILBOX_LEN as u64, rogue.slot.1, &word),
        WcStatus::RemAccessErr,
        "a write past the slot"
    );
    // (The error broke the rogue's initiator: another one tries before its slot.)
    let (rogue, ep2) = accept_rogue(&l, 0x5157_0005);
    assert_eq!(
        rogue.write_at(rogue.slot.0 - MAILBOX_LEN as u64, rogue.slot.1, &word),
        WcStatus::RemAccessErr,
        "a write before the slot"
    );
    drop((ep, ep2));
    good_pair_works(&l);
    assert_eq!(ctx.stats().protocol_errors, 0);
}

/// The peer's `GONE` on an open endpoint: ours goes down (the peer aborted) and answers
/// with a `GONE` of its own in the peer's mailbox.
#[test]
fn an_xrc_endpoint_answers_its_peers_gone() {
    let (_ctx, l) = server(Duration::from_secs(5));
    let (rogue, ep) = accept_rogue(&l, 0x5157_0002);
    assert!(!rogue.told_gone());
    assert_eq!(rogue.answer_gone(), WcStatus::Success);
    assert_eq!(wait_down(&ep), DisconnectCause::PeerAborted);
    assert!(
        rogue.wait_told_gone(Duration::from_secs(2)),
        "no answer to the peer's GONE"
    );
    good_pair_works(&l);
}

/// An endpoint that went down here (a peer breaking the protocol) tells the peer and keeps
/// its key until the peer answers: no new endpoint gets that key meanwhile. The answer ends
/// the wait at once, long before the peer timeout; without one, the wait ends after it.
#[test]
fn an_xrc_endpoint_that_went_down_waits_for_the_answer() {
    let timeout = Duration::from_millis(1500);
    let (ctx, l) = server(timeout);
    // One that answers.
    let (rogue, ep) = accept_rogue(&l, 0x5157_0003);
    assert_eq!(rogue.send(&rogue.bad_rts()), WcStatus::Success);
    assert!(matches!(wait_down(&ep), DisconnectCause::Protocol(_)));
    drop(ep);
    assert!(
        rogue.wait_told_gone(Duration::from_secs(2)),
        "the peer was not told"
    );
    // While it waits, its key stays taken.
    let (other, other_ep) = accept_rogue(&l, 0x5157_0004);
    assert_ne!(
        other.tag, rogue.tag,
        "a key reused before the peer answered"
    );
    let s = ctx.stats();
    assert_eq!((s.gone_answered, s.gone_unanswered), (0, 0));
    let answered = Instant::now();
    assert_eq!(rogue.answer_gone(), WcStatus::Success);
    let until = Instant::now() + Duration::from_secs(1);
    while ctx.stats().gone_answered == 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        ctx.stats().gone_answered,
        1,
        "the answer did not end the wait"
    );
    assert!(answered.elapsed() < timeout);
    // One that never answers: released after the peer timeout, not before.
    // (Taken before the send: the endpoint may go down before the send's completion.)
    let went = Instant::now();
    assert_eq!(other.send(&other.bad_rts()), WcStatus::Success);
    assert!(matches!(wait_down(&other_ep), DisconnectCause::Protocol(_)));
    drop(other_ep);
    assert!(other.wait_told_gone(Duration::from_secs(2)));
    std::thread::sleep(timeout / 2);
    let n = ctx.stats().gone_unanswered;
    if went.elapsed() < timeout {
        // (Read before the clock: it was early then too.)
        assert_eq!(n, 0, "the wait ended early");
    }
    let until = went + timeout * 4;
    while ctx.stats().gone_unanswered == 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(ctx.stats().gone_unanswered, 1);
    assert!(went.elapsed() >= timeout);
    assert_eq!(ctx.stats().gone_answered, 1);
    good_pair_works(&l);
}
