//! The connection state machine on a virtual clock: no sockets, no sleeping.

use std::time::{Duration, Instant};

use super::*;
use crate::cm::msg::{REP_PRIVATE_LEN, REQ_PRIVATE_LEN, Req};
use crate::types::Gid;

fn req_mad(comm: u32) -> Mad {
    Mad {
        tid: 0x77,
        msg: CmMsg::Req(Box::new(Req {
            local_comm_id: comm,
            service_id: 0x0106_1d2f,
            local_ca_guid: 1,
            local_qkey: 0,
            local_qpn: 0x11,
            responder_resources: 4,
            initiator_depth: 4,
            remote_cm_response_timeout: RESPONSE_TIMEOUT_CODE,
            transport_type: 0,
            flow_control: true,
            starting_psn: 5,
            local_cm_response_timeout: RESPONSE_TIMEOUT_CODE,
            retry_count: 7,
            pkey: 0xFFFF,
            path_mtu: 3,
            rnr_retry_count: 7,
            max_cm_retries: MAX_CM_RETRIES,
            srq: false,
            primary_local_lid: 4000,
            primary_remote_lid: 0,
            primary_local_gid: Gid::default(),
            primary_remote_gid: Gid::default(),
            primary_flow_label: 0,
            primary_packet_rate: 0,
            primary_traffic_class: 0,
            primary_hop_limit: 64,
            primary_sl: 0,
            primary_subnet_local: false,
            primary_local_ack_timeout: 14,
            private_data: [0; REQ_PRIVATE_LEN],
        })),
    }
}

fn rep_mad(local: u32, remote: u32) -> Mad {
    Mad {
        tid: 0x77,
        msg: CmMsg::Rep(Box::new(Rep {
            local_comm_id: local,
            remote_comm_id: remote,
            local_qkey: 5000,
            local_qpn: 0x22,
            starting_psn: 9,
            responder_resources: 4,
            initiator_depth: 4,
            target_ack_delay: 0,
            failover_accepted: 0,
            flow_control: true,
            rnr_retry_count: 7,
            srq: false,
            local_ca_guid: 2,
            private_data: [0; REP_PRIVATE_LEN],
        })),
    }
}

fn ids(local: u32, remote: u32) -> Ids {
    Ids {
        local_comm_id: local,
        remote_comm_id: remote,
        remote_qpn: 0,
    }
}

fn sent(out: &[Output]) -> Vec<&'static str> {
    out.iter()
        .filter_map(|o| match o {
            Output::Send(m) => Some(m.msg.name()),
            _ => None,
        })
        .collect()
}

fn notices(out: &[Output]) -> Vec<Notice> {
    out.iter()
        .filter_map(|o| match o {
            Output::Notify(n) => Some(n.clone()),
            _ => None,
        })
        .collect()
}

/// An active connection brought to Established; returns it and the time.
fn established_active() -> (Conn, Instant) {
    let t0 = crate::os::clock::monotonic();
    let mut out = Vec::new();
    let mut c = Conn::active(t0, req_mad(1), Timing::default(), &mut out);
    out.clear();
    c.handle(t0, &rep_mad(2, 1), &mut out);
    assert!(matches!(out.as_slice(), [Output::ConnectQp(_)]));
    out.clear();
    c.qp_connected(t0, true, &mut out);
    assert_eq!(sent(&out), ["RTU"]);
    assert_eq!(c.state(), State::Established);
    assert_eq!(c.poll_timeout(), None);
    (c, t0)
}

#[test]
fn an_unanswered_req_is_sent_again_then_unreachable() {
    let t0 = crate::os::clock::monotonic();
    let timing = Timing::default();
    let mut out = Vec::new();
    let mut c = Conn::active(t0, req_mad(1), timing, &mut out);
    assert_eq!(sent(&out), ["REQ"]);
    let mut now = t0;
    let mut reqs = 1;
    // Bounded drive: retries + 1 deadlines at most.
    for _ in 0..=timing.max_retries {
        out.clear();
        // Early calls do nothing.
        c.handle_timeout(now, &mut out);
        assert!(out.is_empty());
        now = c.poll_timeout().unwrap();
        c.handle_timeout(now, &mut out);
        reqs += sent(&out).iter().filter(|m| **m == "REQ").count();
    }
    assert_eq!(reqs, 1 + usize::from(timing.max_retries));
    assert_eq!(sent(&out), ["REJ"], "a REJ (timeout) tells the peer");
    assert_eq!(notices(&out), [Notice::Unreachable]);
    assert_eq!(c.state(), State::Closed);
    assert_eq!(
        now - t0,
        timing.response * (u32::from(timing.max_retries) + 1)
    );
}

#[test]
fn an_mra_makes_the_requester_wait_longer() {
    let t0 = crate::os::clock::monotonic();
    let timing = Timing::default();
    let mut out = Vec::new();
    let mut c = Conn::active(t0, req_mad(1), timing, &mut out);
    let mra = Mad {
        tid: 0x77,
        msg: CmMsg::Mra(Mra {
            local_comm_id: 2,
            remote_comm_id: 1,
            message_mraed: msg_kind::REQ,
            service_timeout: MRA_TIMEOUT_CODE,
        }),
    };
    c.handle(t0, &mra, &mut out);
    assert_eq!(c.state(), State::MraRcvd);
    assert_eq!(
        c.poll_timeout(),
        Some(t0 + timing.mra_wait + timing.response)
    );
    // The REP after the MRA completes as usual.
    out.clear();
    c.handle(t0 + Duration::from_secs(3), &rep_mad(2, 1), &mut out);
    assert!(matches!(out.as_slice(), [Output::ConnectQp(_)]));
}

#[test]
fn a_rejected_req_reports_the_reason_and_private_data() {
    let t0 = crate::os::clock::monotonic();
    let mut out = Vec::new();
    let mut c = Conn::active(t0, req_mad(1), Timing::default(), &mut out);
    let mut passive = Conn::passive(2, 0x77, (1, 0x11));
    let rej = passive.rej(msg_kind::REQ, reason::CONSUMER_DEFINED, b"no");
    out.clear();
    c.handle(t0, &rej, &mut out);
    let n = notices(&out);
    let [Notice::Rejected(28, p)] = n.as_slice() else {
        panic!("{n:?}");
    };
    assert_eq!(&p[..2], b"no");
    assert_eq!(c.state(), State::Closed);
    // The passive side's reject answers duplicates with the same REJ.
    out.clear();
    passive.reject(t0, b"no", &mut out).unwrap();
    assert_eq!(sent(&out), ["REJ"]);
    out.clear();
    passive.handle(t0, &req_mad(1), &mut out);
    assert_eq!(sent(&out), ["REJ"]);
}

#[test]
fn a_failed_qp_transition_rejects_the_rep() {
    let t0 = crate::os::clock::monotonic();
    let mut out = Vec::new();
    let mut c = Conn::active(t0, req_mad(1), Timing::default(), &mut out);
    c.handle(t0, &rep_mad(2, 1), &mut out);
    out.clear();
    c.qp_connected(t0, false, &mut out);
    assert_eq!(sent(&out), ["REJ"]);
    assert_eq!(notices(&out), [Notice::ConnectError]);
}

#[test]
fn a_lost_rtu_is_recovered_by_the_reps_retransmission() {
    let (mut c, t0) = established_active();
    let mut out = Vec::new();
    c.handle(t0, &rep_mad(2, 1), &mut out);
    assert_eq!(sent(&out), ["RTU"], "the RTU again for a duplicate REP");
    assert!(notices(&out).is_empty());
}

#[test]
fn the_passive_side_mras_duplicates_then_repeats_its_rep_until_the_rtu() {
    let t0 = crate::os::clock::monotonic();
    let mut c = Conn::passive(2, 0x77, (1, 0x11));
    let mut out = Vec::new();
    assert_eq!(
        c.poll_timeout(),
        None,
        "no timer while the application decides"
    );
    c.handle(t0, &req_mad(1), &mut out);
    assert_eq!(sent(&out), ["MRA"]);
    out.clear();
    c.accept(t0, rep_mad(2, 1), &mut out).unwrap();
    assert_eq!(sent(&out), ["REP"]);
    assert!(c.accept(t0, rep_mad(2, 1), &mut out).is_err());
    out.clear();
    c.handle(t0, &req_mad(1), &mut out);
    assert_eq!(sent(&out), ["REP"], "the REP again for a duplicate REQ");
    out.clear();
    let t1 = c.poll_timeout().unwrap();
    c.handle_timeout(t1, &mut out);
    assert_eq!(sent(&out), ["REP"], "the REP again after a time-out");
    out.clear();
    let rtu = Mad {
        tid: 0x77,
        msg: CmMsg::Rtu(ids(1, 2)),
    };
    c.handle(t1, &rtu, &mut out);
    assert_eq!(notices(&out), [Notice::Established(Vec::new())]);
    assert_eq!(c.poll_timeout(), None);
}

#[test]
fn an_unanswered_rep_ends_unreachable_with_the_qp_in_error() {
    let t0 = crate::os::clock::monotonic();
    let mut c = Conn::passive(2, 0x77, (1, 0x11));
    let mut out = Vec::new();
    c.accept(t0, rep_mad(2, 1), &mut out).unwrap();
    for _ in 0..=MAX_CM_RETRIES {
        out.clear();
        let t = c.poll_timeout().unwrap();
        c.handle_timeout(t, &mut out);
    }
    assert!(out.contains(&Output::QpError));
    assert_eq!(notices(&out), [Notice::Unreachable]);
}

#[test]
fn disconnect_sends_a_dreq_and_reports_once_on_the_drep() {
    let (mut c, t0) = established_active();
    let mut out = Vec::new();
    c.disconnect(t0, 9, &mut out).unwrap();
    assert_eq!(out.first(), Some(&Output::QpError));
    assert_eq!(sent(&out), ["DREQ"]);
    assert!(c.disconnect(t0, 9, &mut out).is_err());
    // Both sides disconnect at once: we answer theirs, and ours is answered.
    out.clear();
    let dreq = Mad {
        tid: 10,
        msg: CmMsg::Dreq(ids(2, 1)),
    };
    c.handle(t0, &dreq, &mut out);
    assert_eq!(sent(&out), ["DREP"]);
    assert!(notices(&out).is_empty());
    out.clear();
    let drep = Mad {
        tid: 9,
        msg: CmMsg::Drep(ids(2, 1)),
    };
    c.handle(t0, &drep, &mut out);
    assert_eq!(notices(&out), [Notice::Disconnected]);
    assert_eq!(c.state(), State::TimeWait);
    out.clear();
    c.handle(t0, &drep, &mut out);
    assert!(out.is_empty(), "a duplicate DREP changes nothing");
    let t = c.poll_timeout().unwrap();
    c.handle_timeout(t, &mut out);
    assert_eq!(c.state(), State::Closed);
}

#[test]
fn an_unanswered_dreq_still_ends_disconnected() {
    let (mut c, t0) = established_active();
    let mut out = Vec::new();
    c.disconnect(t0, 9, &mut out).unwrap();
    let mut dreqs = 0;
    for _ in 0..=MAX_CM_RETRIES {
        out.clear();
        let t = c.poll_timeout().unwrap();
        c.handle_timeout(t, &mut out);
        dreqs += sent(&out).len();
    }
    assert_eq!(dreqs, usize::from(MAX_CM_RETRIES));
    assert_eq!(notices(&out), [Notice::Disconnected]);
}

#[test]
fn a_dreq_is_answered_and_its_duplicates_too() {
    let (mut c, t0) = established_active();
    let mut out = Vec::new();
    let dreq = Mad {
        tid: 10,
        msg: CmMsg::Dreq(ids(2, 1)),
    };
    c.handle(t0, &dreq, &mut out);
    assert!(out.contains(&Output::QpError));
    assert_eq!(sent(&out), ["DREP"]);
    assert_eq!(notices(&out), [Notice::Disconnected]);
    out.clear();
    c.handle(t0, &dreq, &mut out);
    assert_eq!(sent(&out), ["DREP"]);
    assert!(notices(&out).is_empty(), "DISCONNECTED once");
}

#[test]
fn destroying_an_id_tells_the_peer_once() {
    let (mut c, _) = established_active();
    let mut out = Vec::new();
    c.destroy(3, &mut out);
    assert_eq!(sent(&out), ["DREQ"]);
    assert_eq!(c.poll_timeout(), None);
    let mut p = Conn::passive(2, 0x77, (1, 0x11));
    out.clear();
    p.destroy(3, &mut out);
    assert_eq!(sent(&out), ["REJ"]);
}

#[test]
fn timeout_codes_are_iba_durations() {
    assert_eq!(timeout_of(0), Duration::from_nanos(4096));
    assert_eq!(timeout_of(17), Duration::from_nanos(4096 << 17));
    assert_eq!(timeout_of(200), Duration::from_nanos(4096 << 31));
}
