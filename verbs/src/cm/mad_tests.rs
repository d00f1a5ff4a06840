//! CM MADs: IBA offsets of the fields, RoCEv2 framing with a valid ICRC, round trips, and
//! garbage that must not panic.

use proptest::prelude::*;

use super::*;
use crate::cm::msg::{
    REJ_ARI_LEN, REJ_PRIVATE_LEN, REP_PRIVATE_LEN, REQ_PRIVATE_LEN, msg_kind, reason,
};
use crate::types::Gid;

fn req() -> Req {
    let mut private_data = [0u8; REQ_PRIVATE_LEN];
    private_data[0] = 0x00;
    private_data[1] = 0x40;
    private_data[91] = 0xAB;
    Req {
        local_comm_id: 0x1122_3344,
        service_id: 0x0000_0000_0106_1D2F,
        local_ca_guid: 0x0102_0304_0506_0708,
        local_qkey: 0,
        local_qpn: 0x00AB_CDEF,
        responder_resources: 4,
        initiator_depth: 3,
        remote_cm_response_timeout: 17,
        transport_type: 0,
        flow_control: true,
        starting_psn: 0x0012_3456,
        local_cm_response_timeout: 17,
        retry_count: 7,
        pkey: 0xFFFF,
        path_mtu: 5,
        rnr_retry_count: 6,
        max_cm_retries: 4,
        srq: true,
        primary_local_lid: 0xC350,
        primary_remote_lid: 0,
        primary_local_gid: Gid::from(std::net::Ipv4Addr::new(127, 0, 0, 1)),
        primary_remote_gid: Gid::from(std::net::Ipv4Addr::new(127, 0, 0, 2)),
        primary_flow_label: 0x000F_FFFF,
        primary_packet_rate: 0x3F,
        primary_traffic_class: 0x20,
        primary_hop_limit: 64,
        primary_sl: 3,
        primary_subnet_local: true,
        primary_local_ack_timeout: 14,
        private_data,
    }
}

fn req_mad() -> Mad {
    Mad {
        tid: 0xDEAD_BEEF_0000_0001,
        msg: CmMsg::Req(Box::new(req())),
    }
}

#[test]
fn the_mad_header_and_req_fields_sit_at_their_iba_offsets() {
    let mut b = [0u8; MAD_LEN];
    req_mad().emit(&mut b);
    assert_eq!(
        b[..4],
        [0x01, 0x07, 0x02, 0x03],
        "base version, class, version, Send"
    );
    assert_eq!(
        b[8..16],
        0xDEAD_BEEF_0000_0001u64.to_be_bytes(),
        "transaction ID"
    );
    assert_eq!(b[16..18], [0x00, 0x10], "attribute ID REQ");
    // The REQ, at MAD offset 24.
    assert_eq!(b[24..28], [0x11, 0x22, 0x33, 0x44], "local comm ID");
    assert_eq!(
        b[32..40],
        [0, 0, 0, 0, 0x01, 0x06, 0x1D, 0x2F],
        "service ID"
    );
    assert_eq!(b[40..48], [1, 2, 3, 4, 5, 6, 7, 8], "local CA GUID");
    assert_eq!(
        b[56..60],
        [0xAB, 0xCD, 0xEF, 4],
        "local QPN, responder resources"
    );
    assert_eq!(b[60..64], [0, 0, 0, 3], "local EECN, initiator depth");
    assert_eq!(
        b[67],
        (17 << 3) | 1,
        "remote CM response timeout, RC, flow control"
    );
    assert_eq!(
        b[68..72],
        [0x12, 0x34, 0x56, (17 << 3) | 7],
        "PSN, timeout, retry"
    );
    assert_eq!(b[72..74], [0xFF, 0xFF], "P_Key");
    assert_eq!(b[74], (5 << 4) | 6, "path MTU, RNR retry");
    assert_eq!(b[75], (4 << 4) | 0x08, "max CM retries, SRQ");
    assert_eq!(
        b[76..78],
        [0xC3, 0x50],
        "primary local LID (the soft UDP port)"
    );
    assert_eq!(
        b[80..96],
        Gid::from(std::net::Ipv4Addr::new(127, 0, 0, 1)).0
    );
    assert_eq!(
        b[112..116],
        [0xFF, 0xFF, 0xF0, 0x3F],
        "flow label, packet rate"
    );
    assert_eq!(b[116..120], [0x20, 64, (3 << 4) | 0x08, 14 << 3]);
    assert_eq!(b[120..164], [0; 44], "no alternate path");
    assert_eq!(b[164..166], [0x00, 0x40], "private data at 164");
    assert_eq!(b[255], 0xAB);
    assert_eq!(Mad::parse(&b), Ok(req_mad()));
}

#[test]
fn rep_and_rej_fields_sit_at_their_iba_offsets() {
    let mut private_data = [0u8; REP_PRIVATE_LEN];
    private_data[0] = 0x5A;
    let rep = Mad {
        tid: 7,
        msg: CmMsg::Rep(Box::new(Rep {
            local_comm_id: 1,
            remote_comm_id: 2,
            local_qkey: 0xC351,
            local_qpn: 0x12,
            starting_psn: 0x0A_BCDE,
            responder_resources: 5,
            initiator_depth: 6,
            target_ack_delay: 0,
            failover_accepted: 0,
            flow_control: true,
            rnr_retry_count: 7,
            srq: false,
            local_ca_guid: 9,
            private_data,
        })),
    };
    let mut b = [0u8; MAD_LEN];
    rep.emit(&mut b);
    assert_eq!(b[16..18], [0x00, 0x13]);
    assert_eq!(
        b[32..36],
        [0, 0, 0xC3, 0x51],
        "local Q_Key carries the soft UDP port"
    );
    assert_eq!(b[36..40], [0, 0, 0x12, 0]);
    assert_eq!(b[44..48], [0x0A, 0xBC, 0xDE, 0]);
    assert_eq!(b[48..52], [5, 6, 1, 7 << 5]);
    assert_eq!(b[60], 0x5A, "private data at 60");
    assert_eq!(Mad::parse(&b), Ok(rep));

    let mut private_data = [0u8; REJ_PRIVATE_LEN];
    private_data[147] = 1;
    let rej = Mad {
        tid: 7,
        msg: CmMsg::Rej(Box::new(Rej {
            local_comm_id: 1,
            remote_comm_id: 2,
            message_rejected: msg_kind::REQ,
            reject_info_len: 0,
            reason: reason::CONSUMER_DEFINED,
            ari: [0; REJ_ARI_LEN],
            private_data,
        })),
    };
    rej.emit(&mut b);
    assert_eq!(b[16..18], [0x00, 0x12]);
    assert_eq!(b[34..36], [0, 28], "reason");
    assert_eq!(b[255], 1, "private data ends the MAD");
    assert_eq!(Mad::parse(&b), Ok(rej));
}

#[test]
fn a_frame_is_a_gsi_ud_send_with_a_valid_icrc() {
    let path = IcrcPath::new(
        "127.0.0.1:40000".parse().unwrap(),
        "127.0.0.1:7471".parse().unwrap(),
    );
    let f = req_mad().to_frame(0x10, &path);
    assert_eq!(f.len(), FRAME_LEN);
    assert_eq!(f[0], 0x64, "UD SEND_ONLY");
    assert_eq!(f[2..4], [0xFF, 0xFF], "P_Key");
    assert_eq!(f[5..8], [0, 0, 1], "destination QP 1");
    assert_eq!(f[12..16], [0x80, 0x01, 0x00, 0x00], "GSI Q_Key");
    assert_eq!(f[17..20], [0, 0, 1], "source QP 1");
    assert_eq!(f[20], 0x01, "the MAD follows the DETH");
    assert!(icrc::verify(&path, &f));
    assert_eq!(Mad::from_frame(&f, Some(&path)), Ok(req_mad()));
    let other = IcrcPath::new(path.src, "127.0.0.1:7472".parse().unwrap());
    assert_eq!(Mad::from_frame(&f, Some(&other)), Err(MadError::BadIcrc));
    assert_eq!(Mad::from_frame(&f, None), Ok(req_mad()));
}

#[test]
fn other_classes_and_attributes_are_errors() {
    let mut b = [0u8; MAD_LEN];
    req_mad().emit(&mut b);
    let mut c = b;
    c[1] = 0x04;
    assert!(matches!(
        Mad::parse(&c),
        Err(MadError::NotCm { class: 0x04, .. })
    ));
    let mut c = b;
    c[3] = 0x01;
    assert!(matches!(
        Mad::parse(&c),
        Err(MadError::NotCm { method: 0x01, .. })
    ));
    let mut c = b;
    c[17] = 0x17;
    assert_eq!(
        Mad::parse(&c),
        Err(MadError::UnknownAttribute(attr::SIDR_REQ))
    );
    assert_eq!(Mad::parse(&b[..255]), Err(MadError::BadLength(255)));
}

proptest! {
    #[test]
    fn garbage_frames_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let path = IcrcPath::new(
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.1:2".parse().unwrap(),
        );
        let _ = Mad::from_frame(&bytes, Some(&path));
        let _ = Mad::from_frame(&bytes, None);
        let _ = Mad::parse(&bytes);
    }

    #[test]
    fn any_cm_mad_parses_and_reemits_to_a_fixed_point(
        attr in 0x10u16..=0x16,
        tid in any::<u64>(),
        data in proptest::collection::vec(any::<u8>(), 232),
    ) {
        let mut b = [0u8; MAD_LEN];
        b[..4].copy_from_slice(&[1, 7, 2, 3]);
        b[8..16].copy_from_slice(&tid.to_be_bytes());
        b[16..18].copy_from_slice(&attr.to_be_bytes());
        b[24..].copy_from_slice(&data);
        let m = Mad::parse(&b).unwrap();
        prop_assert_eq!(m.msg.attr_id(), attr);
        // Reserved bits are dropped on the way; what is left survives a round trip.
        let mut again = [0u8; MAD_LEN];
        m.emit(&mut again);
        prop_assert_eq!(Mad::parse(&again).unwrap(), m);
    }

    #[test]
    fn req_round_trips(comm in any::<u32>(), qpn in 0u32..1 << 24, psn in 0u32..1 << 24,
                       port in any::<u16>(), rr in any::<u8>(), id in any::<u8>()) {
        let mut r = req();
        r.local_comm_id = comm;
        r.local_qpn = qpn;
        r.starting_psn = psn;
        r.primary_local_lid = port;
        r.responder_resources = rr;
        r.initiator_depth = id;
        let m = Mad { tid: 1, msg: CmMsg::Req(Box::new(r)) };
        let mut b = [0u8; MAD_LEN];
        m.emit(&mut b);
        prop_assert_eq!(Mad::parse(&b).unwrap(), m);
    }
}
