//! `bootstrap`: the frames of the bootstrap exchange (`rdmx_core::bootstrap`:
//! `decode_header`, `decode` with its bincode payload and cautious sequence visitors), then
//! what a receiver does with a decoded endpoint's information (`validate`,
//! `check_app_data`). The authentication frames and `Ready` go through the same codec. The
//! input is a byte stream: frames are decoded from it one after the other, as `recv_frame`
//! would read them.

use rdmx_core::bootstrap::{
    self, EndpointInfo, Frame, HEADER_LEN, MAX_APP_DATA, MAX_FRAME, PathInfo, Transport,
};

use super::{FnRunner, Runner, Target, numbered};

pub(crate) const TARGET: Target = Target {
    name: "bootstrap",
    about: "rdmx-core bootstrap frames (header, bincode payload), validate, check_app_data",
    // A frame is at most MAX_FRAME bytes, and its strings and vectors at most that.
    max_alloc: MAX_FRAME as usize + 1024,
    max_total: 4 * MAX_FRAME as usize,
    max_len: 16 * 1024,
    framed: false,
    seeds,
    runner,
};

fn runner() -> Box<dyn Runner> {
    Box::new(FnRunner(run))
}

fn run(input: &[u8]) {
    if let Ok(Some(h)) = bootstrap::decode_header(input) {
        assert!(h.frame_len() >= HEADER_LEN);
    }
    let mut rest = input;
    for _ in 0..16 {
        match bootstrap::decode(rest) {
            Ok(Some((frame, used))) => {
                assert!(
                    used >= HEADER_LEN && used <= rest.len(),
                    "consumed within the input"
                );
                check(&frame);
                rest = &rest[used..];
            }
            Ok(None) | Err(_) => break,
        }
    }
}

/// What a receiver does with a frame; and the frame, encoded again, decodes to itself.
fn check(frame: &Frame) {
    if let Frame::Hello(info) | Frame::Accept(info) = frame {
        let valid = bootstrap::validate(info).is_ok();
        let data_ok = bootstrap::check_app_data(&info.app_data).is_ok();
        assert!(
            !valid || data_ok,
            "validate passed more connection data than allowed"
        );
        assert_eq!(data_ok, info.app_data.len() <= MAX_APP_DATA);
    }
    if let Ok(bytes) = bootstrap::try_encode(frame) {
        let again = bootstrap::decode(&bytes)
            .expect("our encoding decodes")
            .expect("a whole frame");
        assert_eq!(&again.0, frame, "frame round trip");
    }
}

fn path(port_num: u8) -> PathInfo {
    PathInfo {
        gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, port_num],
        udp_port: 4791,
        port_num,
    }
}

fn info() -> EndpointInfo {
    EndpointInfo {
        transport: Transport::Rc,
        qpn: 0x12,
        psn: 0x00ab_cdef,
        mtu: 4096,
        primary: path(1),
        alternate: Some(path(2)),
        srq_nums: Vec::new(),
        credits: 64,
        mailbox_addr: 0x7f00_1234_5000,
        mailbox_rkey: 0x1234,
        max_message: 1 << 20,
        eager_limit: 8192,
        context_id: 0xdead_beef_cafe_f00d,
        node_id: 0x0123_4567_89ab_cdef,
        tag: 0xFFFF,
        xrc_target: None,
        xrc_target_path: None,
        xrc_target_alt: None,
        xrc_in_use: None,
        token: 0,
        app_data: b"role=leader".to_vec(),
    }
}

fn seeds() -> Vec<(String, Vec<u8>)> {
    let xrc = EndpointInfo {
        transport: Transport::Xrc,
        alternate: None,
        srq_nums: vec![1, 2, 0x00FF_FFFF],
        xrc_target: Some(0x00AB_CDEF),
        xrc_target_path: Some(path(3)),
        xrc_target_alt: Some(path(4)),
        xrc_in_use: Some(7),
        ..info()
    };
    let ud = EndpointInfo {
        transport: Transport::Ud,
        srq_nums: vec![0x44],
        token: 0x1234_5678,
        app_data: Vec::new(),
        ..info()
    };
    let frames = [
        Frame::Hello(info()),
        Frame::Accept(xrc),
        Frame::Hello(ud),
        Frame::Reject("busy".to_owned()),
        Frame::XrcTarget(0x42),
        Frame::Ready,
        Frame::AuthHello([7; 32]),
        Frame::AuthChallenge {
            nonce: [8; 32],
            mac: [9; 32],
        },
        Frame::AuthProof([10; 32]),
    ];
    let mut out: Vec<Vec<u8>> = frames.iter().map(bootstrap::encode).collect();
    // An exchange as one stream: hello, then the XRC target number.
    let mut stream = bootstrap::encode(&frames[0]);
    stream.extend_from_slice(&bootstrap::encode(&frames[4]));
    out.push(stream);
    numbered("frame", out)
}
