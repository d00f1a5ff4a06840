//! A hostile peer behind a well-formed connection: it does the bootstrap exchange like an
//! rdmx context, connects a raw RC queue pair to the endpoint, and then breaks the message
//! protocol (garbage headers, sends beyond its credits, rendezvous requests with a bad key or
//! an oversized length, a header that lies about the length, RDMA WRITEs with an immediate
//! that is no recall signal or names another endpoint). Each must take that endpoint
//! down with a clear cause and a counted protocol error, never panic or hang, and leave the
//! context's other endpoints working.
#![allow(missing_docs)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rdmx_core::bootstrap::{self, EndpointInfo, Frame, PathInfo, Transport};
use rdmx_core::header::{HEADER_LEN, Header, Kind, RTS_LEN, RtsInfo};
use rdmx_core::{DisconnectCause, Error};
use rdmx_rc::wire::{Mailbox, RECALL_OFF, Signal};
use rdmx_rc::{Context, Endpoint};
use rdmx_verbs::{
    AccessFlags, AhAttr, CompletionQueue, Device, Gid, MemoryRegion, Mtu, QpAttr, QpAttrMask as M,
    QpCap, QpInitAttr, QpState, QpType, QueuePair, Rkey, SendFlags, SendWr, WcStatus,
    WorkCompletion, WrOpcode,
};

/// A raw RC queue pair connected to an rdmx endpoint through the real bootstrap.
struct Rogue {
    _ctx: rdmx_verbs::Context,
    cq: CompletionQueue,
    qp: QueuePair,
    _mr: MemoryRegion,
    /// The tag the server's endpoint expects in headers.
    tag: u16,
    /// The server's mailbox slot for this endpoint (address, rkey).
    mailbox: (u64, u32),
}

impl Rogue {
    fn connect(addr: SocketAddr) -> Self {
        let ctx = Device::open("soft:127.0.0.1").unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(256, None).unwrap();
        let qp = pd
            .create_qp(&QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: 128,
                    max_recv_wr: 16,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 256,
                },
                sq_sig_all: true,
                send_ops: rdmx_verbs::SendOps::EMPTY,
            })
            .unwrap();
        let mr = pd
            .reg_mr(
                1 << 16,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            )
            .unwrap();
        let psn = 4242;
        let info = EndpointInfo {
            transport: Transport::Rc,
            qpn: qp.qp_num().0,
            psn,
            mtu: 4096,
            primary: PathInfo {
                gid: ctx.query_gid(1, 0).unwrap().0,
                udp_port: ctx.port_addr(1).map_or(4791, |a| a.port()),
                port_num: 1,
            },
            alternate: None,
            srq_nums: Vec::new(),
            credits: 64,
            mailbox_addr: mr.addr(),
            mailbox_rkey: mr.rkey().0,
            max_message: 1 << 20,
            eager_limit: 32 << 10,
            context_id: 7,
            node_id: 7,
            tag: 0,
            xrc_target: None,
            xrc_target_path: None,
            xrc_target_alt: None,
            xrc_in_use: None,
            token: 0,
            app_data: Vec::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut s = bootstrap::connect(addr, deadline).unwrap();
        bootstrap::send_frame(&mut s, &Frame::Hello(info), deadline).unwrap();
        let peer = bootstrap::expect_accept(&mut s, deadline).unwrap();
        qp.modify(
            &QpAttr {
                qp_state: QpState::Init,
                port_num: 1,
                qp_access_flags: AccessFlags::LOCAL_WRITE
                    | AccessFlags::REMOTE_WRITE
                    | AccessFlags::REMOTE_READ,
                ..QpAttr::default()
            },
            M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
        )
        .unwrap();
        qp.modify(
            &QpAttr {
                qp_state: QpState::Rtr,
                ah_attr: AhAttr::new(Gid(peer.primary.gid)).with_udp_port(peer.primary.udp_port),
                path_mtu: Mtu::Mtu4096,
                dest_qp_num: peer.qpn,
                rq_psn: peer.psn,
                max_dest_rd_atomic: 16,
                min_rnr_timer: 12,
                ..QpAttr::default()
            },
            M::STATE
                | M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER,
        )
        .unwrap();
        qp.modify(
            &QpAttr {
                qp_state: QpState::Rts,
                timeout: 10,
                retry_cnt: 3,
                rnr_retry: 0,
                sq_psn: psn,
                max_rd_atomic: 16,
                ..QpAttr::default()
            },
            M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
        )
        .unwrap();
        // The rogue plays by the set-up rules: its side is up (it has no slot window).
        bootstrap::send_frame(&mut s, &Frame::Ready, deadline).unwrap();
        Self {
            _ctx: ctx,
            cq,
            qp,
            _mr: mr,
            tag: peer.tag as u16,
            mailbox: (peer.mailbox_addr, peer.mailbox_rkey),
        }
    }

    /// Writes an all-zero recall word into the server's slot with immediate `imm` (what a
    /// recall signal looks like on the wire) and waits for its completion.
    fn write_imm(&self, imm: u32) -> WcStatus {
        let op = WrOpcode::RdmaWriteWithImm {
            remote_addr: self.mailbox.0 + RECALL_OFF as u64,
            rkey: Rkey(self.mailbox.1),
            imm,
        };
        let mut wr = SendWr::new(2, op, &[]).signaled();
        wr.inline_data = Some(&[0u8; 8]);
        wr.send_flags |= SendFlags::INLINE;
        self.qp.post_send(&wr).unwrap();
        self.wait_send()
    }

    /// Writes `m` into the server's mailbox slot for this endpoint (what a peer does to tell
    /// counters without a message) and waits for the write's completion.
    fn write_mailbox(&self, m: Mailbox) -> WcStatus {
        self.write_mailbox_at(self.mailbox, m)
    }

    /// Writes `m` at `(address, key)` (someone else's slot, for an attack).
    fn write_mailbox_at(&self, (addr, key): (u64, u32), m: Mailbox) -> WcStatus {
        let op = WrOpcode::RdmaWrite {
            remote_addr: addr,
            rkey: Rkey(key),
        };
        let word = m.to_word().to_be_bytes();
        let mut wr = SendWr::new(3, op, &[]).signaled();
        wr.inline_data = Some(&word);
        wr.send_flags |= SendFlags::INLINE;
        self.qp.post_send(&wr).unwrap();
        self.wait_send()
    }

    /// Waits for the server's next message and returns its rendezvous request (address,
    /// key, length): posts one receive for it first.
    fn recv_rts(&self) -> (u64, u32, u32) {
        let r = [self._mr.sge(32 << 10, 4096)];
        self.qp.post_recv(&rdmx_verbs::RecvWr::new(9, &r)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut wc = [WorkCompletion::EMPTY; 1];
        loop {
            if self.cq.poll(&mut wc) > 0 && wc[0].opcode == rdmx_verbs::WcOpcode::Recv {
                break;
            }
            assert!(Instant::now() < deadline, "no message for the rogue");
            std::thread::sleep(Duration::from_millis(1));
        }
        let b = self._mr.to_vec(32 << 10, RTS_LEN).unwrap();
        let h = Header::parse(&b).unwrap();
        assert_eq!(h.kind, Kind::Rts);
        let rts = RtsInfo::parse(&b).unwrap();
        (rts.addr, rts.rkey, h.len)
    }

    /// RDMA-reads `len` bytes at `addr` under `rkey` into its own memory; the status.
    fn read(&self, addr: u64, rkey: u32, len: usize) -> WcStatus {
        let d = [self._mr.sge(0, len)];
        let op = WrOpcode::RdmaRead {
            remote_addr: addr,
            rkey: Rkey(rkey),
        };
        self.qp
            .post_send(&SendWr::new(4, op, &d).signaled())
            .unwrap();
        self.wait_send()
    }

    /// Sends `bytes` inline and waits for its completion; returns its status.
    fn send(&self, bytes: &[u8]) -> WcStatus {
        self.qp
            .post_send(&SendWr::send_inline(1, bytes).signaled())
            .unwrap();
        self.wait_send()
    }

    fn wait_send(&self) -> WcStatus {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut wc = [WorkCompletion::EMPTY; 4];
        loop {
            let n = self.cq.poll(&mut wc);
            if n > 0 {
                return wc[0].status;
            }
            assert!(
                Instant::now() < deadline,
                "the rogue's send never completed"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn header(&self, kind: Kind, len: u32) -> Header {
        Header {
            kind,
            tag: self.tag,
            grant: 64,
            rndv_done: 0,
            len,
            flags: 0,
        }
    }

    fn data(&self, payload: &[u8]) -> Vec<u8> {
        let mut v = self
            .header(Kind::Data, payload.len() as u32)
            .to_bytes()
            .to_vec();
        v.extend_from_slice(payload);
        v
    }
}

fn server() -> (Context, rdmx_rc::Listener) {
    // The rogue peers speak RC, so the server does too whatever `RDMX_TRANSPORT` says.
    let ctx = Context::builder()
        .transport(Transport::Rc)
        .credits(8)
        .srq_depth(512)
        .max_message(1 << 20)
        .peer_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let l = ctx.listen("127.0.0.1:0").unwrap();
    (ctx, l)
}

fn accept_rogue(l: &rdmx_rc::Listener) -> (Rogue, Endpoint) {
    let addr = l.local_addr();
    let t = std::thread::spawn(move || Rogue::connect(addr));
    let ep = l.accept_timeout(Duration::from_secs(5)).unwrap();
    (t.join().unwrap(), ep)
}

/// Receives until the endpoint fails; returns the messages that arrived before and the cause.
fn drain_until_down(ep: &Endpoint) -> (usize, DisconnectCause) {
    let mut got = 0;
    loop {
        match ep.recv_timeout(Duration::from_secs(5)) {
            Ok(_) => got += 1,
            Err(Error::Disconnected(c)) => return (got, c),
            Err(e) => panic!("expected the endpoint to go down, got {e}"),
        }
    }
}

/// A well-behaved pair through the server's listener: (client context, client endpoint,
/// server endpoint), checked to work.
fn good_pair(l: &rdmx_rc::Listener) -> (Context, Endpoint, Endpoint) {
    let client = Context::builder().transport(Transport::Rc).build().unwrap();
    let addr = l.local_addr();
    let t = std::thread::spawn(move || {
        let ep = client.connect(addr).unwrap();
        (client, ep)
    });
    let sep = l.accept_timeout(Duration::from_secs(5)).unwrap();
    let (client, cep) = t.join().unwrap();
    check_pair(&cep, &sep);
    (client, cep, sep)
}

fn check_pair(cep: &Endpoint, sep: &Endpoint) {
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

/// A well-behaved endpoint on the same context must keep working.
fn good_pair_still_works(_ctx: &Context, l: &rdmx_rc::Listener) {
    drop(good_pair(l));
}

fn protocol_cause(c: &DisconnectCause) -> bool {
    matches!(c, DisconnectCause::Protocol(_))
}

#[test]
fn garbage_header_takes_the_endpoint_down() {
    let (ctx, l) = server();
    let (rogue, ep) = accept_rogue(&l);
    assert_eq!(rogue.send(&rogue.data(b"fine")), WcStatus::Success);
    let mut bad = rogue.data(b"not fine");
    bad[0] = 0xEE; // no such kind
    assert_eq!(rogue.send(&bad), WcStatus::Success);
    let (got, cause) = drain_until_down(&ep);
    assert_eq!(got, 1, "the good message before the garbage arrives");
    assert!(protocol_cause(&cause), "{cause:?}");
    assert!(ctx.stats().protocol_errors >= 1);
    good_pair_still_works(&ctx, &l);
}

#[test]
fn signals_are_checked() {
    let (ctx, l) = server();
    // Well-formed signals (an empty recall word: nothing asked, nothing returned; a read
    // done with no rendezvous outstanding) are harmless: the endpoint keeps working.
    let (rogue, ep) = accept_rogue(&l);
    for sig in [Signal::RecallRequest, Signal::ReadDone] {
        assert_eq!(rogue.write_imm(sig.to_imm(rogue.tag)), WcStatus::Success);
        assert_eq!(rogue.send(&rogue.data(b"after")), WcStatus::Success);
        let m = ep.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(&m[..], b"after", "{sig:?}");
    }
    // An immediate that is no signal, and a signal for another endpoint's tag: each takes
    // the endpoint down as a protocol violation.
    for other_tag in [false, true] {
        let (rogue, ep) = accept_rogue(&l);
        let imm = if other_tag {
            Signal::RecallReturned.to_imm(rogue.tag.wrapping_add(1))
        } else {
            0xDEAD_BEEF
        };
        assert_eq!(rogue.write_imm(imm), WcStatus::Success);
        let (got, cause) = drain_until_down(&ep);
        assert_eq!(got, 0);
        assert!(protocol_cause(&cause), "imm {imm:#x}: {cause:?}");
    }
    assert!(ctx.stats().protocol_errors >= 2);
    good_pair_still_works(&ctx, &l);
}

#[test]
fn short_and_lying_headers_take_the_endpoint_down() {
    let (ctx, l) = server();
    // Shorter than a header.
    let (rogue, ep) = accept_rogue(&l);
    assert_eq!(rogue.send(&[1, 2, 3]), WcStatus::Success);
    let (_, cause) = drain_until_down(&ep);
    assert!(protocol_cause(&cause), "{cause:?}");
    // A header whose length is not what arrived.
    let (rogue, ep) = accept_rogue(&l);
    let mut lie = rogue.data(&[9u8; 40]);
    lie[..HEADER_LEN].copy_from_slice(&rogue.header(Kind::Data, 4000).to_bytes());
    assert_eq!(rogue.send(&lie), WcStatus::Success);
    let (got, cause) = drain_until_down(&ep);
    assert_eq!(got, 0);
    assert!(protocol_cause(&cause), "{cause:?}");
    assert!(ctx.stats().protocol_errors >= 2);
    good_pair_still_works(&ctx, &l);
}

#[test]
fn malformed_packed_frames_take_the_endpoint_down() {
    let (ctx, l) = server();
    let packed = |rogue: &Rogue, payload: &[u8]| {
        let mut f = rogue
            .header(Kind::Packed, payload.len() as u32)
            .to_bytes()
            .to_vec();
        f.extend_from_slice(payload);
        f
    };
    // A well-formed frame: three messages, one of them empty, in order.
    let (rogue, ep) = accept_rogue(&l);
    let ok = packed(&rogue, &[0, 2, b'h', b'i', 0, 0, 0, 3, b'y', b'o', b'u']);
    assert_eq!(rogue.send(&ok), WcStatus::Success);
    for want in [&b"hi"[..], b"", b"you"] {
        let m = ep.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(&m[..], want);
    }
    // An entry longer than the frame, bytes after the last entry, and no entry at all.
    for bad in [&[0u8, 9, 1, 2][..], &[0, 1, 7, 0], &[]] {
        let (rogue, ep) = accept_rogue(&l);
        assert_eq!(rogue.send(&packed(&rogue, bad)), WcStatus::Success);
        let (got, cause) = drain_until_down(&ep);
        assert_eq!(got, 0, "{bad:?}");
        assert!(protocol_cause(&cause), "{bad:?}: {cause:?}");
    }
    assert!(ctx.stats().protocol_errors >= 3);
    good_pair_still_works(&ctx, &l);
}

#[test]
fn sends_beyond_the_credits_take_the_endpoint_down() {
    // A small receive queue shared with a well-behaved endpoint: once the application stops
    // reading, grants stop, and a message beyond them lands in a buffer that backs the other
    // endpoint's credit, which is how the violation shows.
    let ctx = Context::builder()
        .transport(Transport::Rc)
        .credits(8)
        .srq_depth(16)
        .pool_max(8 << 20)
        .peer_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let l = ctx.listen("127.0.0.1:0").unwrap();
    // Kept open during the flood: its credits are what the rogue's extra messages land on.
    let (_client, cep, sep) = good_pair(&l);
    let (rogue, ep) = accept_rogue(&l);
    let mut sent = 0u32;
    while sent < 200 {
        if rogue.send(&rogue.data(&sent.to_le_bytes())) != WcStatus::Success {
            break;
        }
        sent += 1;
        // Give the receiving context's progress time to see each message, so that it finds
        // the violation before the flood empties the shared queue.
        std::thread::sleep(Duration::from_millis(2));
    }
    let (got, cause) = drain_until_down(&ep);
    assert!(got <= sent as usize, "{got} of {sent}");
    assert!(protocol_cause(&cause), "after {sent} sends: {cause:?}");
    assert!(ctx.stats().protocol_errors >= 1);
    // No RNR assertion here: the NIC keeps taking the flood's messages from the shared
    // queue until the progress engine sees the violation and errors the queue pair, so a
    // flooding peer can empty the queue for a moment (the good endpoint's sender would then
    // retry on RNR NAKs, which rdmx sets to unlimited). The good pairs must still work.
    check_pair(&cep, &sep);
    good_pair_still_works(&ctx, &l);
}

#[test]
fn bad_rendezvous_requests_take_the_endpoint_down() {
    let (ctx, l) = server();
    // A key that names nothing: the read fails at the rogue's NIC.
    let (rogue, ep) = accept_rogue(&l);
    let mut rts = [0u8; RTS_LEN];
    rogue.header(Kind::Rts, 100_000).write(&mut rts);
    RtsInfo {
        addr: 0x1000,
        rkey: 0xDEAD_BEEF,
    }
    .write(&mut rts);
    // The read's bad key is a remote access error at the rogue's NIC, which moves the
    // rogue's queue pair to the error state: its SEND may be flushed before its ACK arrived.
    let st = rogue.send(&rts);
    assert!(
        matches!(st, WcStatus::Success | WcStatus::WrFlushErr),
        "{st:?}"
    );
    let (got, cause) = drain_until_down(&ep);
    assert_eq!(got, 0);
    assert!(
        matches!(cause, DisconnectCause::TransportError(_)),
        "{cause:?}"
    );
    // A length above the maximum message.
    let (rogue, ep) = accept_rogue(&l);
    let mut rts = [0u8; RTS_LEN];
    rogue.header(Kind::Rts, u32::MAX).write(&mut rts);
    RtsInfo {
        addr: 0x1000,
        rkey: 1,
    }
    .write(&mut rts);
    assert_eq!(rogue.send(&rts), WcStatus::Success);
    let (_, cause) = drain_until_down(&ep);
    assert!(protocol_cause(&cause), "{cause:?}");
    // A truncated request.
    let (rogue, ep) = accept_rogue(&l);
    let rts = rogue.header(Kind::Rts, 100).to_bytes();
    assert_eq!(rogue.send(&rts), WcStatus::Success);
    let (_, cause) = drain_until_down(&ep);
    assert!(protocol_cause(&cause), "{cause:?}");
    good_pair_still_works(&ctx, &l);
}

/// Counters that lie: a read-done count beyond the rendezvous buffers offered, or a grant
/// no receive queue could back, piggybacked on a message or written into the mailbox. Each
/// disconnects the liar alone (a protocol error), releasing nothing it claims.
#[test]
fn forged_counters_take_the_liar_down() {
    let (ctx, l) = server();
    // Piggybacked: reads done that were never offered.
    let (rogue, ep) = accept_rogue(&l);
    let mut h = rogue.header(Kind::Data, 2);
    h.rndv_done = 3;
    let mut msg = h.to_bytes().to_vec();
    msg.extend_from_slice(b"hi");
    assert_eq!(rogue.send(&msg), WcStatus::Success);
    let (got, cause) = drain_until_down(&ep);
    assert_eq!(got, 0);
    assert!(protocol_cause(&cause), "{cause:?}");
    // Piggybacked: a grant of a billion credits.
    let (rogue, ep) = accept_rogue(&l);
    let mut h = rogue.header(Kind::Data, 2);
    h.grant = 1 << 30;
    let mut msg = h.to_bytes().to_vec();
    msg.extend_from_slice(b"hi");
    assert_eq!(rogue.send(&msg), WcStatus::Success);
    let (got, cause) = drain_until_down(&ep);
    assert_eq!(got, 0);
    assert!(protocol_cause(&cause), "{cause:?}");
    // Through the mailbox, while a rendezvous buffer is out to the rogue: it claims two
    // reads done for the one it was offered (and never read).
    let (rogue, ep) = accept_rogue(&l);
    ep.send(&vec![7u8; 200_000]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let lie = Mailbox {
        grant: 64,
        rndv_done: 2,
    };
    assert_eq!(rogue.write_mailbox(lie), WcStatus::Success);
    let (got, cause) = drain_until_down(&ep);
    assert_eq!(got, 0);
    assert!(protocol_cause(&cause), "{cause:?}");
    assert!(ctx.stats().protocol_errors >= 3);
    good_pair_still_works(&ctx, &l);
}

/// Mailbox slots are confined: a peer writes its own slot, through its own queue pair,
/// and nothing else of the mailbox region: another endpoint's slot with that endpoint's
/// key (learned somehow), or with its own key, is a remote access error that disconnects
/// the attacker; the victim's counters and messages are untouched.
#[test]
fn a_peer_writes_only_its_own_mailbox_slot() {
    let (ctx, l) = server();
    let (a, ep_a) = accept_rogue(&l);
    let (b, ep_b) = accept_rogue(&l);
    let lie = Mailbox {
        grant: 64,
        rndv_done: 5,
    };
    assert_eq!(a.write_mailbox_at(b.mailbox, lie), WcStatus::RemAccessErr);
    let _ = drain_until_down(&ep_a);
    let (c, ep_c) = accept_rogue(&l);
    assert_ne!(c.mailbox.0, b.mailbox.0);
    assert_eq!(
        c.write_mailbox_at((b.mailbox.0, c.mailbox.1), lie),
        WcStatus::RemAccessErr
    );
    let _ = drain_until_down(&ep_c);
    // The victim: its slot, its counters and its messages are intact.
    assert_eq!(
        b.write_mailbox(Mailbox {
            grant: 64,
            rndv_done: 0
        }),
        WcStatus::Success
    );
    assert_eq!(b.send(&b.data(b"intact")), WcStatus::Success);
    assert_eq!(
        &ep_b.recv_timeout(Duration::from_secs(5)).unwrap()[..],
        b"intact"
    );
    good_pair_still_works(&ctx, &l);
}

/// Rendezvous sources are confined: the key a peer gets opens exactly the buffer offered,
/// from its own queue pair, until it reports the read done. Reading past the buffer, with
/// another peer's key, or with a key whose transfer ended fails with a remote access error;
/// the liar is disconnected and the victims' traffic completes.
#[test]
fn rendezvous_keys_open_one_buffer_to_one_peer_for_one_transfer() {
    let (ctx, l) = server();
    // Past the end of the offered buffer.
    let (rogue, ep) = accept_rogue(&l);
    ep.send(&vec![7u8; 100_000]).unwrap();
    let (addr, key, len) = rogue.recv_rts();
    assert_eq!(len, 100_000);
    assert_eq!(rogue.read(addr, key, 32 << 10), WcStatus::Success);
    assert_eq!(rogue._mr.to_vec(0, 16).unwrap(), [7u8; 16]);
    let past = addr + u64::from(len) - 8;
    assert_eq!(rogue.read(past, key, 16), WcStatus::RemAccessErr);
    let _ = drain_until_down(&ep);
    // Another peer's key: B cannot use A's, A still can.
    let (a, ep_a) = accept_rogue(&l);
    let (b, ep_b) = accept_rogue(&l);
    ep_a.send(&vec![9u8; 100_000]).unwrap();
    let (addr, key, _) = a.recv_rts();
    assert_eq!(b.read(addr, key, 4096), WcStatus::RemAccessErr);
    let _ = drain_until_down(&ep_b);
    assert_eq!(a.read(addr, key, 4096), WcStatus::Success);
    assert_eq!(a._mr.to_vec(0, 8).unwrap(), [9u8; 8]);
    // Reporting the read done ends the transfer: the key no longer opens anything, and the
    // endpoint of the peer that reported it keeps working.
    let mut h = a.header(Kind::Data, 4);
    h.rndv_done = 1;
    let mut msg = h.to_bytes().to_vec();
    msg.extend_from_slice(b"done");
    assert_eq!(a.send(&msg), WcStatus::Success);
    assert_eq!(
        &ep_a.recv_timeout(Duration::from_secs(5)).unwrap()[..],
        b"done"
    );
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        a.read(addr, key, 4096),
        WcStatus::RemAccessErr,
        "an expired key"
    );
    let _ = drain_until_down(&ep_a);
    good_pair_still_works(&ctx, &l);
}

/// Random frames, some of them nearly valid (a real kind and tag, a random length and
/// payload): whatever arrives, the endpoint either delivers messages or goes down with a
/// cause, the context never panics, and other endpoints keep working.
#[test]
fn random_frames_never_break_the_context() {
    let (ctx, l) = server();
    let (_client, cep, sep) = good_pair(&l);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut downs = 0;
    for _round in 0..24 {
        let (rogue, ep) = accept_rogue(&l);
        for _ in 0..(1 + next() % 4) {
            let len = (next() % 120) as usize;
            let mut f: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if next() % 2 == 0 && len >= HEADER_LEN {
                let kind = [Kind::Data, Kind::Rts, Kind::Close][(next() % 3) as usize];
                let mut h = rogue.header(kind, (next() % 200) as u32);
                if next() % 2 == 0 {
                    h.len = (len - HEADER_LEN) as u32;
                }
                h.write(&mut f);
            }
            if rogue.send(&f) != WcStatus::Success {
                break;
            }
        }
        // Drain what is deliverable; stop at the first error or after a quiet moment.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match ep.recv_timeout(Duration::from_millis(50)) {
                Ok(_) => {}
                Err(Error::Disconnected(_)) => {
                    downs += 1;
                    break;
                }
                Err(Error::Timeout(_)) => break,
                Err(e) => panic!("unexpected error {e}"),
            }
            assert!(Instant::now() < deadline, "the endpoint kept delivering");
        }
    }
    assert!(downs > 0, "no random frame was ever rejected");
    check_pair(&cep, &sep);
    eprintln!(
        "24 rogue endpoints, {downs} taken down; protocol errors counted: {}",
        ctx.stats().protocol_errors
    );
}
