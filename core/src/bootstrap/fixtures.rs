//! Endpoint information shared by the unit tests of the bootstrap submodules.

use super::{EndpointInfo, MAX_24BIT, PathInfo, Transport};

/// A loopback path through local port `port_num`.
pub(super) fn path(port_num: u8) -> PathInfo {
    PathInfo {
        gid: [
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, port_num,
        ],
        udp_port: 4791,
        port_num,
    }
}

/// Valid RC endpoint information, with an alternate path.
pub(super) fn rc_info() -> EndpointInfo {
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
        xrc_target: Some(0x00AB_CDEF),
        xrc_target_path: None,
        xrc_target_alt: None,
        xrc_in_use: Some(7),
        token: 0,
        app_data: b"role=leader".to_vec(),
    }
}

/// Valid XRC endpoint information, with SRQ numbers and no alternate path.
pub(super) fn xrc_info() -> EndpointInfo {
    EndpointInfo {
        transport: Transport::Xrc,
        alternate: None,
        srq_nums: vec![1, 2, MAX_24BIT],
        ..rc_info()
    }
}
