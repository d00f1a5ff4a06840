//! The part of librdmacm's C interface (`<rdma/rdma_cma.h>`) rdmx calls, declared by hand.
//!
//! ibverbs-sys binds only `verbs.h`; the structs below embed its types (`ibv_gid`,
//! `ibv_ah_attr`, `ibv_qp_attr`) so that they are the very types the libibverbs provider
//! uses. Only what rdmx reads or passes is spelled out; the rest keeps its size and place.
//! The sizes and offsets are asserted at compile time (LP64 Linux, the only ABI the values
//! were taken for), and the `layout_matches_the_installed_header` test compiles a C program
//! against the installed header and compares every value with the Rust declarations.

#![allow(
    non_camel_case_types,
    dead_code,
    reason = "C declarations: the C names, and fields rdmx does not read keep their places"
)]

use std::os::raw::{c_int, c_void};

use ibverbs_sys as ibv;

/// `enum rdma_cm_event_type` (values in declaration order, from 0).
pub(crate) mod event_type {
    pub(crate) const ADDR_RESOLVED: u32 = 0;
    pub(crate) const ADDR_ERROR: u32 = 1;
    pub(crate) const ROUTE_RESOLVED: u32 = 2;
    pub(crate) const ROUTE_ERROR: u32 = 3;
    pub(crate) const CONNECT_REQUEST: u32 = 4;
    pub(crate) const CONNECT_RESPONSE: u32 = 5;
    pub(crate) const CONNECT_ERROR: u32 = 6;
    pub(crate) const UNREACHABLE: u32 = 7;
    pub(crate) const REJECTED: u32 = 8;
    pub(crate) const ESTABLISHED: u32 = 9;
    pub(crate) const DISCONNECTED: u32 = 10;
    pub(crate) const DEVICE_REMOVAL: u32 = 11;
    pub(crate) const MULTICAST_JOIN: u32 = 12;
    pub(crate) const MULTICAST_ERROR: u32 = 13;
    pub(crate) const ADDR_CHANGE: u32 = 14;
    pub(crate) const TIMEWAIT_EXIT: u32 = 15;
}

/// `struct rdma_event_channel`.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct rdma_event_channel {
    pub(crate) fd: c_int,
}

/// `struct rdma_ib_addr`.
#[repr(C)]
pub(crate) struct rdma_ib_addr {
    pub(crate) sgid: ibv::ibv_gid,
    pub(crate) dgid: ibv::ibv_gid,
    pub(crate) pkey: u16,
}

/// `struct rdma_addr`: the source and destination socket addresses (each a union whose
/// largest member is a `sockaddr_storage`) and the IB addresses.
#[repr(C)]
pub(crate) struct rdma_addr {
    pub(crate) src: libc::sockaddr_storage,
    pub(crate) dst: libc::sockaddr_storage,
    pub(crate) ibaddr: rdma_ib_addr,
}

/// `struct rdma_route`.
#[repr(C)]
pub(crate) struct rdma_route {
    pub(crate) addr: rdma_addr,
    /// `struct ibv_sa_path_rec *` (not read).
    pub(crate) path_rec: *mut c_void,
    pub(crate) num_paths: c_int,
}

/// `struct rdma_cm_id`.
#[repr(C)]
pub(crate) struct rdma_cm_id {
    pub(crate) verbs: *mut ibv::ibv_context,
    pub(crate) channel: *mut rdma_event_channel,
    /// The application's pointer: rdmx keeps the ID's key in it.
    pub(crate) context: *mut c_void,
    pub(crate) qp: *mut ibv::ibv_qp,
    pub(crate) route: rdma_route,
    /// `enum rdma_port_space`.
    pub(crate) ps: u32,
    pub(crate) port_num: u8,
    /// `struct rdma_cm_event *` (synchronous IDs only).
    pub(crate) event: *mut c_void,
    pub(crate) send_cq_channel: *mut ibv::ibv_comp_channel,
    pub(crate) send_cq: *mut ibv::ibv_cq,
    pub(crate) recv_cq_channel: *mut ibv::ibv_comp_channel,
    pub(crate) recv_cq: *mut ibv::ibv_cq,
    pub(crate) srq: *mut ibv::ibv_srq,
    pub(crate) pd: *mut ibv::ibv_pd,
    /// `enum ibv_qp_type`.
    pub(crate) qp_type: u32,
}

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct rdma_conn_param {
    pub(crate) private_data: *const c_void,
    pub(crate) private_data_len: u8,
    pub(crate) responder_resources: u8,
    pub(crate) initiator_depth: u8,
    pub(crate) flow_control: u8,
    pub(crate) retry_count: u8,
    pub(crate) rnr_retry_count: u8,
    pub(crate) srq: u8,
    pub(crate) qp_num: u32,
}

/// `struct rdma_ud_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct rdma_ud_param {
    pub(crate) private_data: *const c_void,
    pub(crate) private_data_len: u8,
    pub(crate) ah_attr: ibv::ibv_ah_attr,
    pub(crate) qp_num: u32,
    pub(crate) qkey: u32,
}

/// The `param` union of `struct rdma_cm_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) union rdma_cm_event_param {
    pub(crate) conn: rdma_conn_param,
    pub(crate) ud: rdma_ud_param,
}

/// `struct rdma_cm_event`.
#[repr(C)]
pub(crate) struct rdma_cm_event {
    pub(crate) id: *mut rdma_cm_id,
    pub(crate) listen_id: *mut rdma_cm_id,
    /// `enum rdma_cm_event_type`.
    pub(crate) event: u32,
    pub(crate) status: c_int,
    pub(crate) param: rdma_cm_event_param,
}

#[link(name = "rdmacm")]
unsafe extern "C" {
    pub(crate) fn rdma_create_event_channel() -> *mut rdma_event_channel;
    pub(crate) fn rdma_destroy_event_channel(channel: *mut rdma_event_channel);
    pub(crate) fn rdma_create_id(
        channel: *mut rdma_event_channel,
        id: *mut *mut rdma_cm_id,
        context: *mut c_void,
        ps: u32,
    ) -> c_int;
    pub(crate) fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int;
    pub(crate) fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int;
    pub(crate) fn rdma_resolve_addr(
        id: *mut rdma_cm_id,
        src_addr: *mut libc::sockaddr,
        dst_addr: *mut libc::sockaddr,
        timeout_ms: c_int,
    ) -> c_int;
    pub(crate) fn rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int;
    pub(crate) fn rdma_connect(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int;
    pub(crate) fn rdma_establish(id: *mut rdma_cm_id) -> c_int;
    pub(crate) fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int;
    pub(crate) fn rdma_accept(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int;
    pub(crate) fn rdma_reject(
        id: *mut rdma_cm_id,
        private_data: *const c_void,
        private_data_len: u8,
    ) -> c_int;
    pub(crate) fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int;
    pub(crate) fn rdma_join_multicast(
        id: *mut rdma_cm_id,
        addr: *mut libc::sockaddr,
        context: *mut c_void,
    ) -> c_int;
    pub(crate) fn rdma_leave_multicast(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int;
    pub(crate) fn rdma_get_cm_event(
        channel: *mut rdma_event_channel,
        event: *mut *mut rdma_cm_event,
    ) -> c_int;
    pub(crate) fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int;
    pub(crate) fn rdma_init_qp_attr(
        id: *mut rdma_cm_id,
        qp_attr: *mut ibv::ibv_qp_attr,
        qp_attr_mask: *mut c_int,
    ) -> c_int;
}

/// The layout of `<rdma/rdma_cma.h>` on LP64 Linux (x86_64, aarch64, ...), as a C
/// compiler lays it out: (what, value). The test below recomputes each from the header.
pub(crate) const LAYOUT: &[(&str, usize)] = &[
    ("sizeof(struct rdma_cm_id)", 416),
    ("offsetof(struct rdma_cm_id, context)", 16),
    ("offsetof(struct rdma_cm_id, route)", 32),
    ("offsetof(struct rdma_cm_id, ps)", 344),
    ("offsetof(struct rdma_cm_id, port_num)", 348),
    ("offsetof(struct rdma_cm_id, event)", 352),
    ("offsetof(struct rdma_cm_id, pd)", 400),
    ("offsetof(struct rdma_cm_id, qp_type)", 408),
    ("sizeof(struct rdma_route)", 312),
    ("offsetof(struct rdma_route, path_rec)", 296),
    ("offsetof(struct rdma_route, num_paths)", 304),
    ("sizeof(struct rdma_addr)", 296),
    ("offsetof(struct rdma_addr, dst_addr)", 128),
    ("offsetof(struct rdma_addr, addr)", 256),
    ("sizeof(struct rdma_ib_addr)", 40),
    ("offsetof(struct rdma_ib_addr, pkey)", 32),
    ("sizeof(struct rdma_conn_param)", 24),
    ("offsetof(struct rdma_conn_param, private_data_len)", 8),
    ("offsetof(struct rdma_conn_param, rnr_retry_count)", 13),
    ("offsetof(struct rdma_conn_param, srq)", 14),
    ("offsetof(struct rdma_conn_param, qp_num)", 16),
    ("sizeof(struct rdma_ud_param)", 56),
    ("offsetof(struct rdma_ud_param, ah_attr)", 16),
    ("offsetof(struct rdma_ud_param, qp_num)", 48),
    ("offsetof(struct rdma_ud_param, qkey)", 52),
    ("sizeof(struct rdma_cm_event)", 80),
    ("offsetof(struct rdma_cm_event, event)", 16),
    ("offsetof(struct rdma_cm_event, status)", 20),
    ("offsetof(struct rdma_cm_event, param)", 24),
    ("sizeof(struct rdma_event_channel)", 4),
];

/// The same values measured on the Rust declarations, in the same order.
pub(crate) const RUST_LAYOUT: [usize; 30] = {
    use std::mem::{offset_of, size_of};
    [
        size_of::<rdma_cm_id>(),
        offset_of!(rdma_cm_id, context),
        offset_of!(rdma_cm_id, route),
        offset_of!(rdma_cm_id, ps),
        offset_of!(rdma_cm_id, port_num),
        offset_of!(rdma_cm_id, event),
        offset_of!(rdma_cm_id, pd),
        offset_of!(rdma_cm_id, qp_type),
        size_of::<rdma_route>(),
        offset_of!(rdma_route, path_rec),
        offset_of!(rdma_route, num_paths),
        size_of::<rdma_addr>(),
        offset_of!(rdma_addr, dst),
        offset_of!(rdma_addr, ibaddr),
        size_of::<rdma_ib_addr>(),
        offset_of!(rdma_ib_addr, pkey),
        size_of::<rdma_conn_param>(),
        offset_of!(rdma_conn_param, private_data_len),
        offset_of!(rdma_conn_param, rnr_retry_count),
        offset_of!(rdma_conn_param, srq),
        offset_of!(rdma_conn_param, qp_num),
        size_of::<rdma_ud_param>(),
        offset_of!(rdma_ud_param, ah_attr),
        offset_of!(rdma_ud_param, qp_num),
        offset_of!(rdma_ud_param, qkey),
        size_of::<rdma_cm_event>(),
        offset_of!(rdma_cm_event, event),
        offset_of!(rdma_cm_event, status),
        offset_of!(rdma_cm_event, param),
        size_of::<rdma_event_channel>(),
    ]
};

// The declarations are only known to match LP64 Linux; elsewhere the build stops here.
#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
compile_error!("the librdmacm declarations are checked for 64-bit Linux only");

const _: () = {
    assert!(LAYOUT.len() == RUST_LAYOUT.len());
    let mut i = 0;
    while i < LAYOUT.len() {
        assert!(
            LAYOUT[i].1 == RUST_LAYOUT[i],
            "a librdmacm declaration does not match <rdma/rdma_cma.h>"
        );
        i += 1;
    }
};

#[cfg(test)]
mod tests {
    use super::*;

    /// Compiles a C program that prints every value of [`LAYOUT`] from the installed
    /// `<rdma/rdma_cma.h>` and compares them with the Rust declarations. Needs `cc` and
    /// librdmacm-dev, which building with the `ibverbs` feature already needs.
    #[test]
    fn layout_matches_the_installed_header() {
        let dir = std::env::temp_dir().join(format!("rdmx-rdmacm-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut c = String::from(
            "#include <stddef.h>\n#include <stdio.h>\n#include <rdma/rdma_cma.h>\nint main(void) {\n",
        );
        for (what, _) in LAYOUT {
            c.push_str(&format!("  printf(\"%zu\\n\", (size_t){what});\n"));
        }
        c.push_str("  return 0;\n}\n");
        let src = dir.join("layout.c");
        let exe = dir.join("layout");
        std::fs::write(&src, c).unwrap();
        let out = std::process::Command::new("cc")
            .arg(&src)
            .arg("-o")
            .arg(&exe)
            .output()
            .expect("run cc (a C compiler is needed to build with the `ibverbs` feature)");
        assert!(
            out.status.success(),
            "compiling the layout probe failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = std::process::Command::new(&exe).output().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let text = String::from_utf8(out.stdout).unwrap();
        let measured: Vec<usize> = text.lines().map(|l| l.parse().unwrap()).collect();
        assert_eq!(measured.len(), LAYOUT.len());
        for (i, ((what, declared), c)) in LAYOUT.iter().zip(&measured).enumerate() {
            assert_eq!(declared, c, "{what}: the header says {c}");
            assert_eq!(RUST_LAYOUT[i], *c, "{what}: the Rust declaration differs");
        }
    }

    #[test]
    fn event_codes_match_rdma_event_str() {
        // librdmacm names each code; the names must be the ones our constants stand for.
        unsafe extern "C" {
            fn rdma_event_str(event: u32) -> *const std::os::raw::c_char;
        }
        let name = |code| {
            // SAFETY: rdma_event_str returns a static NUL-terminated string for any value.
            unsafe { std::ffi::CStr::from_ptr(rdma_event_str(code)) }
                .to_str()
                .unwrap()
                .to_string()
        };
        use event_type as e;
        for (code, want) in [
            (e::ADDR_RESOLVED, "RDMA_CM_EVENT_ADDR_RESOLVED"),
            (e::ADDR_ERROR, "RDMA_CM_EVENT_ADDR_ERROR"),
            (e::ROUTE_RESOLVED, "RDMA_CM_EVENT_ROUTE_RESOLVED"),
            (e::ROUTE_ERROR, "RDMA_CM_EVENT_ROUTE_ERROR"),
            (e::CONNECT_REQUEST, "RDMA_CM_EVENT_CONNECT_REQUEST"),
            (e::CONNECT_RESPONSE, "RDMA_CM_EVENT_CONNECT_RESPONSE"),
            (e::CONNECT_ERROR, "RDMA_CM_EVENT_CONNECT_ERROR"),
            (e::UNREACHABLE, "RDMA_CM_EVENT_UNREACHABLE"),
            (e::REJECTED, "RDMA_CM_EVENT_REJECTED"),
            (e::ESTABLISHED, "RDMA_CM_EVENT_ESTABLISHED"),
            (e::DISCONNECTED, "RDMA_CM_EVENT_DISCONNECTED"),
            (e::DEVICE_REMOVAL, "RDMA_CM_EVENT_DEVICE_REMOVAL"),
            (e::MULTICAST_JOIN, "RDMA_CM_EVENT_MULTICAST_JOIN"),
            (e::MULTICAST_ERROR, "RDMA_CM_EVENT_MULTICAST_ERROR"),
            (e::ADDR_CHANGE, "RDMA_CM_EVENT_ADDR_CHANGE"),
            (e::TIMEWAIT_EXIT, "RDMA_CM_EVENT_TIMEWAIT_EXIT"),
        ] {
            assert_eq!(name(code), want);
        }
    }
}
