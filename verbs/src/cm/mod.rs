//! The connection manager (librdmacm's `rdma_*` API): event channels, communication IDs,
//! address and route resolution, listening, connecting, accepting, rejecting,
//! disconnecting, UD multicast, and the `rdma_verbs.h` helpers.
//!
//! ```text
//! EventChannel::new()                       rdma_create_event_channel
//!   .create_id(PortSpace::Tcp)              rdma_create_id
//! server: id.bind_addr(addr); id.listen(n)  rdma_bind_addr, rdma_listen
//!         CONNECT_REQUEST -> ev.id: create_qp, post_recv, accept(param) | reject(data)
//! client: id.resolve_addr(None, dst, t)     ADDR_RESOLVED
//!         id.resolve_route(t)               ROUTE_RESOLVED
//!         id.create_qp(pd, attr); id.connect(param)
//! both:   ESTABLISHED; disconnect() -> DISCONNECTED on both sides
//! UD:     bind/resolve; create_qp; join_multicast(group) -> MULTICAST_JOIN (ev.ud)
//! ```
//!
//! # Transport of the CM messages
//!
//! Every listening or connecting ID has a CM agent: a UDP socket of its own (a listener
//! bound at `127.0.0.1:7471` owns that UDP address; a connecting ID gets an ephemeral port
//! on the address that routes to the peer, and sends its REQ to the listener's address).
//! IDs created for incoming requests share their listener's socket. The soft NIC's engine
//! is not involved: the CM's datagrams never reach a device, and the data path address
//! (the device's own UDP port) travels inside the messages. Each [`EventChannel`] runs one
//! thread that sleeps in `poll(2)` on its IDs' sockets (at most one second, or until the
//! next retransmission is due) and exits when the channel is dropped.
//!
//! # Wire format
//!
//! Each datagram is a RoCEv2 packet as the GSI sends it ([`mad`]): BTH with opcode 0x64 (UD
//! SEND_ONLY), destination QP 1, P_Key 0xFFFF; DETH with Q_Key 0x80010000 and source QP 1;
//! a 256-byte MAD (base version 1, management class 0x07, class version 2, method Send
//! 0x03, the transaction ID, attribute ID REQ 0x0010, MRA 0x0011, REJ 0x0012, REP 0x0013,
//! RTU 0x0014, DREQ 0x0015 or DREP 0x0016); the ICRC over the CM sockets' addresses. The
//! CM messages ([`msg`]) have their IBA layouts (vol. 1 §12.6): communication IDs, service
//! ID, QPN, starting PSN, responder resources / initiator depth, retry counts, path MTU,
//! the primary path's GIDs, private data. So a capture decodes as CM (Wireshark: "Decode
//! As" RoCEv2 on the CM's UDP ports).
//!
//! * Service ID: rdma_cm's, port space << 16 | port (`0x0000_0000_0106_xxxx` for TCP).
//! * REQ private data: rdma_cm's 36-byte header first (version 0, IP version in the high
//!   nibble, source port, source and destination addresses; IPv4 as 12 zero bytes and the
//!   address), then at most 56 bytes of the application's.
//! * **The soft device's UDP port**, which a RoCE NIC does not need (it listens on 4791):
//!   in the REQ it is the primary path's *local LID* (REQ bytes 52-53 of the message, 76-77
//!   of the MAD), which is 0 on RoCE; in the REP, which has no path fields, it is the *local
//!   Q_Key* (REP bytes 8-11 of the message, 32-35 of the MAD; the IBA uses it for RD only),
//!   as `0x0000_pppp`. The data-path IP is the primary path's local GID (REQ) and the
//!   address the active side resolved (REP). A REQ whose local LID is 0 (no port) is
//!   rejected with reason 13 (invalid LID); a REP whose Q_Key is not a port ends the
//!   connection attempt with CONNECT_ERROR (and a REJ).
//! * SIDR (UD service resolution), LAP/APR (path migration) and ClassPortInfo are not
//!   implemented: such MADs are counted as malformed and dropped.
//!
//! # Reliability and bad input
//!
//! REQ, REP and DREQ are sent again after the response time-out (about 537 ms, the REQ's
//! CM response timeout code 17) at most 4 times; then the active side reports UNREACHABLE
//! (the passive side too, for a REP never answered), and a disconnecting side reports
//! DISCONNECTED anyway. A duplicate REQ is answered with an MRA while the application has
//! not decided (the requester then waits about 8.6 s longer), with the REP again once it
//! accepted, and with the REJ again after a reject; a duplicate REP with the RTU again; a
//! duplicate DREQ with a DREP. A REQ that finds no listener, or the wrong service ID, gets a
//! REJ (reason 8, invalid service ID); a REP or DREQ for an unknown communication ID gets a
//! REJ (reason 6) or a DREP, as the IB CM answers; other MADs for unknown IDs are dropped.
//! Anything that does not decode as a CM MAD is dropped and counted ([`CmStats`]); decoding
//! never panics and reads into a fixed buffer.
//!
//! # Events and private data
//!
//! As in rdma_cm an event's private data is the whole field of the message: the peer's
//! bytes followed by zeros (56 bytes for CONNECT_REQUEST, 196 for ESTABLISHED at the active
//! side, 148 for REJECTED); the IB CM carries no length.
//!
//! # Devices
//!
//! An ID is bound to the soft device of its local address, opened when first needed and
//! shared by the process's IDs while any of them uses it, or to the device given to
//! [`EventChannel::create_id_on`].
//!
//! With the `ibverbs` feature, `create_id_on` a libibverbs device makes an ID of the
//! kernel's CM through librdmacm instead (`rdma_create_id` and the other `rdma_*` calls;
//! see `rdmacm/`): the same API and events, with rdmx's QP (librdmacm's `rdma_create_qp`
//! is not used) moved through its states with the attributes `rdma_init_qp_attr` gives,
//! and the caller's `Context` (librdmacm's own `ibv_context` is not adopted). The
//! sections above describe the soft CM only; librdmacm speaks to the kernel's. Without
//! the feature, `create_id_on` a device that is not soft returns `Unsupported`.

mod agent;
mod conn;
mod dispatch;
pub mod error;
pub mod event;
mod helpers;
pub mod id;
pub mod mad;
mod mcast;
pub mod msg;
mod proto;
#[cfg(feature = "ibverbs")]
mod rdmacm;

pub use agent::CmStats;
pub use conn::{ACCEPT_PRIVATE_MAX, CMA_HDR_LEN, CONNECT_PRIVATE_MAX, REJECT_PRIVATE_MAX};
pub use error::CmError;
pub use event::{CmEvent, CmEventKind, EventChannel, PeerConnParam, UdParam, status};
pub use id::{CmId, ConnParam, PortSpace, RDMA_UDP_QKEY};
pub use mad::{Mad, MadError};
