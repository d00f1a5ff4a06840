//! The wire types of the bootstrap exchange: the endpoint information, the [`Frame`]s that
//! carry it, the errors, the frame [`Header`], and the [`validate`] checks a peer's
//! information must pass.

use std::fmt;
use std::io;

use serde::de::{SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use super::{
    HEADER_LEN, MAX_24BIT, MAX_APP_DATA, MAX_CREDITS, MAX_FRAME, MAX_SRQ_NUMS, VALID_MTUS,
};

/// How a path is reached: what a peer needs to build an address vector towards us.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathInfo {
    /// The GID of the local port (an IPv4-mapped address on RoCEv2).
    pub gid: [u8; 16],
    /// Soft provider: the UDP port of that device port (4791 on hardware).
    pub udp_port: u16,
    /// The local port number (1-based) this path leaves from.
    pub port_num: u8,
}

/// The transport an endpoint uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Transport {
    /// Reliable connected queue pairs, one per endpoint.
    Rc,
    /// XRC: one initiator QP per remote node, reaching every SRQ of the remote processes.
    Xrc,
    /// UD: datagrams over a few queue pairs per context for any number of peers, made
    /// reliable by per-peer sessions (`rdmx-ud`). In its endpoint information `qpn` is the
    /// context's UD queue pair, `psn` the session's first sequence number, `tag` its session
    /// id, `credits` its receive window in datagrams, `token` what its datagrams carry, and
    /// `srq_nums` the context's control queue pair (where acknowledgements go; none: `qpn`).
    Ud,
}

/// Everything one side tells the other to connect an endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointInfo {
    /// Transport of the endpoint.
    pub transport: Transport,
    /// The queue pair number the peer must send to (RC QP or XRC target QP).
    pub qpn: u32,
    /// The first PSN this side will send with.
    pub psn: u32,
    /// The path MTU this side can use, in bytes.
    pub mtu: u32,
    /// The primary path.
    pub primary: PathInfo,
    /// An alternate path for automatic path migration, when this side has two ports.
    pub alternate: Option<PathInfo>,
    /// XRC: the SRQ numbers of this side's receive queues (empty for RC).
    #[serde(deserialize_with = "deserialize_u32s_cautiously")]
    pub srq_nums: Vec<u32>,
    /// Receive credits granted to the peer up front.
    pub credits: u32,
    /// Address of the peer's mailbox slot in this side's mailbox region.
    pub mailbox_addr: u64,
    /// Remote key of the mailbox region.
    pub mailbox_rkey: u32,
    /// Largest message this side accepts, in bytes.
    pub max_message: u64,
    /// The largest message this side sends eagerly (bigger ones use rendezvous).
    pub eager_limit: u32,
    /// A random identifier of the sending context (for logs and duplicate detection).
    pub context_id: u64,
    /// A random identifier of the sending node (the device the context's XRC domain lives
    /// on; XRC target queue pairs are shared per remote node).
    pub node_id: u64,
    /// The endpoint's number on the sending side: the peer puts it in the header of every
    /// message so the sender's context can route it (at most 65535).
    pub tag: u32,
    /// XRC: the target queue pair the sender created (or already had) for the peer's
    /// initiator; `None` in a `Hello` and for RC.
    pub xrc_target: Option<u32>,
    /// XRC: where this side's node's target queue pairs receive, when that is not
    /// `primary` (soft provider: an XRC domain hosted by another process of the node).
    pub xrc_target_path: Option<PathInfo>,
    /// XRC: with `xrc_target_path`, the alternate path to the node's targets (the hosting
    /// process's second port), when it has two.
    pub xrc_target_alt: Option<PathInfo>,
    /// XRC: the target queue pair of the peer's node that this side's initiator already
    /// sends to (connected for another endpoint, possibly to another process of that
    /// node); the peer uses it instead of making a new one.
    pub xrc_in_use: Option<u32>,
    /// UD: the token the peer's datagrams to this side's session must carry (0 for RC and
    /// XRC).
    pub token: u32,
    /// The application's connection data (a role, a node id: what `rdma_cm` calls private
    /// data), at most [`MAX_APP_DATA`] bytes; the peer's endpoint shows it.
    ///
    /// [`MAX_APP_DATA`]: super::MAX_APP_DATA
    #[serde(deserialize_with = "deserialize_bytes_cautiously")]
    pub app_data: Vec<u8>,
}

/// One message of the bootstrap exchange.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Frame {
    /// Connector -> listener: "here is my side, please accept".
    Hello(EndpointInfo),
    /// Listener -> connector: accepted; here is the listener's side.
    Accept(EndpointInfo),
    /// Either side: refused, with a human-readable reason.
    Reject(String),
    /// XRC, connector -> listener after the `Accept`: the target queue pair the connector's
    /// node has for the listener's initiator.
    XrcTarget(u32),
    /// RC, connector -> listener after the `Accept`: the connector's queue pair is up and
    /// the window over its mailbox slot is bound (posted before this was sent): the
    /// listener may write the slot from now on.
    Ready,
    /// Connector -> listener, first (with a key): its nonce (see `auth.rs`).
    AuthHello([u8; 32]),
    /// Listener -> connector: its nonce and its proof of the key.
    AuthChallenge {
        /// The listener's nonce.
        nonce: [u8; 32],
        /// HMAC-SHA-256 over the label and both nonces.
        mac: [u8; 32],
    },
    /// Connector -> listener: its proof of the key.
    AuthProof([u8; 32]),
}

/// Deserializes a `Vec<u32>` without trusting the announced length: serde would reserve up to
/// 1 MiB for a sequence that claims 2^60 elements, which is more than a whole frame; here at
/// most [`MAX_SRQ_NUMS`] elements are reserved up front, and the vector grows only with the
/// elements actually decoded.
fn deserialize_u32s_cautiously<'de, D>(deserializer: D) -> Result<Vec<u32>, D::Error>
where
    D: Deserializer<'de>,
{
    deserializer.deserialize_seq(Cautious::<u32>::up_to(MAX_SRQ_NUMS))
}

/// Deserializes a `Vec<u8>` the same way, reserving at most [`MAX_APP_DATA`] bytes.
fn deserialize_bytes_cautiously<'de, D>(deserializer: D) -> Result<Vec<u8>, D::Error>
where
    D: Deserializer<'de>,
{
    deserializer.deserialize_seq(Cautious::<u8>::up_to(MAX_APP_DATA))
}

/// Visits a sequence of `T`, reserving at most `cap` elements before they are decoded.
struct Cautious<T> {
    cap: usize,
    _t: std::marker::PhantomData<fn() -> T>,
}

impl<T> Cautious<T> {
    fn up_to(cap: usize) -> Self {
        Self {
            cap,
            _t: std::marker::PhantomData,
        }
    }
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for Cautious<T> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a sequence of {}", std::any::type_name::<T>())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        let reserve = seq.size_hint().unwrap_or(0).min(self.cap);
        let mut out = Vec::with_capacity(reserve);
        while let Some(value) = seq.next_element()? {
            out.push(value);
        }
        Ok(out)
    }
}

/// Errors of the bootstrap exchange.
///
/// `BadMagic`, `Decode`, `Invalid`, `TooLarge`, `Truncated`, `Unexpected` and
/// `VersionMismatch` mean the peer broke (or does not speak) the protocol; `Rejected` means it
/// refused us; `Closed`, `Io` and `Timeout` come from the connection itself.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BootstrapError {
    /// The frame does not start with [`MAGIC`]: the peer does not speak this protocol.
    ///
    /// [`MAGIC`]: super::MAGIC
    #[error(
        "bootstrap frame starts with {0:02x?} instead of \"RDMX\": the peer does not speak the \
         rdmx bootstrap protocol"
    )]
    BadMagic([u8; 4]),
    /// The peer closed the connection before sending any byte of a frame.
    #[error("the peer closed the bootstrap connection before sending a frame")]
    Closed,
    /// The payload is not a valid encoding of a [`Frame`].
    #[error("bootstrap frame payload does not decode: {0}")]
    Decode(String),
    /// The peer's [`EndpointInfo`] failed [`validate`].
    #[error("invalid endpoint information: {0}")]
    Invalid(String),
    /// A socket operation failed. The OS error is part of the message (and so is not also
    /// returned as the `source`, which would print it twice in a chain).
    #[error("bootstrap {op} failed: {error}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The OS error.
        error: io::Error,
    },
    /// The peer refused the exchange, with this reason.
    #[error("the peer rejected the bootstrap: {0:?}")]
    Rejected(String),
    /// The deadline passed.
    #[error("bootstrap timed out {what}")]
    Timeout {
        /// What was being waited for.
        what: &'static str,
    },
    /// The frame header announces a payload longer than [`MAX_FRAME`].
    #[error("bootstrap frame announces a {0}-byte payload; the limit is {MAX_FRAME} bytes")]
    TooLarge(u32),
    /// The peer closed the connection in the middle of a frame.
    #[error("the peer closed the bootstrap connection mid-frame, after {got} of {expected} bytes")]
    Truncated {
        /// Bytes of the frame received.
        got: usize,
        /// Bytes of the frame expected (only the header, until the header is complete).
        expected: usize,
    },
    /// Authentication failed: a wrong or missing key on one side (the message says which).
    #[error("bootstrap authentication failed: {0}")]
    AuthFailed(String),
    /// A well-formed frame of a kind that is not allowed at this point of the exchange.
    #[error("unexpected bootstrap frame: {0}")]
    Unexpected(&'static str),
    /// The frame header carries another protocol version.
    #[error("bootstrap protocol version mismatch: we speak v{ours}, the peer speaks v{theirs}")]
    VersionMismatch {
        /// Our version ([`PROTOCOL_VERSION`]).
        ///
        /// [`PROTOCOL_VERSION`]: super::PROTOCOL_VERSION
        ours: u16,
        /// The version in the peer's frame header.
        theirs: u16,
    },
}

/// The fixed header of a frame, as read from the wire.
///
/// Its layout is the same in every protocol version (see the [module docs](super)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The protocol version of the sender.
    pub version: u16,
    /// Length of the payload that follows the header, in bytes.
    pub payload_len: u32,
}

impl Header {
    /// Length of the whole frame (header and payload), in bytes.
    pub fn frame_len(&self) -> usize {
        let payload = usize::try_from(self.payload_len).unwrap_or(usize::MAX);
        HEADER_LEN.saturating_add(payload)
    }
}

/// Checks that the endpoint information a peer sent makes sense.
///
/// The rules: `qpn`, `psn` and every SRQ number fit in 24 bits; `mtu` is 256, 512, 1024,
/// 2048 or 4096; `credits` is at most 65536 (0 is allowed: a context whose receive queue is
/// fully committed grants credits later, through the mailbox); there are at most 4096 SRQ numbers; and
/// every path (primary and alternate) has a nonzero UDP port and a port number of at least 1.
///
/// # Errors
///
/// [`BootstrapError::Invalid`] naming the first rule that fails.
pub fn validate(info: &EndpointInfo) -> Result<(), BootstrapError> {
    let invalid = |msg: String| Err(BootstrapError::Invalid(msg));
    if info.qpn > MAX_24BIT {
        return invalid(format!("qpn {:#x} does not fit in 24 bits", info.qpn));
    }
    if info.psn > MAX_24BIT {
        return invalid(format!("psn {:#x} does not fit in 24 bits", info.psn));
    }
    if !VALID_MTUS.contains(&info.mtu) {
        return invalid(format!(
            "mtu {} is not one of 256, 512, 1024, 2048, 4096",
            info.mtu
        ));
    }
    if info.tag > 0xFFFF {
        return invalid(format!("tag {} does not fit in 16 bits", info.tag));
    }
    if info.xrc_target.is_some_and(|q| q > MAX_24BIT) {
        return invalid("the XRC target qpn does not fit in 24 bits".into());
    }
    if info.xrc_in_use.is_some_and(|q| q > MAX_24BIT) {
        return invalid("the XRC target in use does not fit in 24 bits".into());
    }
    if info.credits > MAX_CREDITS {
        return invalid(format!(
            "credits {} outside 0..={MAX_CREDITS}",
            info.credits
        ));
    }
    if info.srq_nums.len() > MAX_SRQ_NUMS {
        return invalid(format!(
            "{} SRQ numbers, more than {MAX_SRQ_NUMS}",
            info.srq_nums.len()
        ));
    }
    if info.app_data.len() > MAX_APP_DATA {
        return invalid(format!(
            "{} bytes of connection data, more than {MAX_APP_DATA}",
            info.app_data.len()
        ));
    }
    if let Some(srq) = info.srq_nums.iter().find(|&&srq| srq > MAX_24BIT) {
        return invalid(format!("SRQ number {srq:#x} does not fit in 24 bits"));
    }
    validate_path("primary", &info.primary)?;
    if let Some(alternate) = &info.alternate {
        validate_path("alternate", alternate)?;
    }
    if let Some(targets) = &info.xrc_target_path {
        validate_path("XRC target", targets)?;
    }
    if let Some(targets) = &info.xrc_target_alt {
        validate_path("XRC target alternate", targets)?;
    }
    Ok(())
}

/// Checks one path of an [`EndpointInfo`].
fn validate_path(which: &str, path: &PathInfo) -> Result<(), BootstrapError> {
    if path.udp_port == 0 {
        return Err(BootstrapError::Invalid(format!(
            "{which} path has UDP port 0"
        )));
    }
    if path.port_num == 0 {
        return Err(BootstrapError::Invalid(format!(
            "{which} path has port number 0 (ports are numbered from 1)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::fixtures::{path, rc_info, xrc_info};

    #[test]
    fn connection_data_is_bounded_and_decoded_without_trusting_its_length() {
        let most = EndpointInfo {
            app_data: vec![7; MAX_APP_DATA],
            ..rc_info()
        };
        validate(&most).unwrap();
        let over = EndpointInfo {
            app_data: vec![7; MAX_APP_DATA + 1],
            ..rc_info()
        };
        assert!(matches!(validate(&over), Err(BootstrapError::Invalid(_))));
        // A frame whose data length claims 2^60 bytes is refused, not allocated.
        let mut bytes = crate::bootstrap::encode(&Frame::Hello(rc_info()));
        let n = rc_info().app_data.len();
        let at = bytes.len() - n - 8;
        bytes[at..at + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
        assert!(crate::bootstrap::decode(&bytes).is_err());
    }

    #[test]
    fn valid_information_passes() {
        validate(&rc_info()).unwrap();
        validate(&xrc_info()).unwrap();
        let edges = EndpointInfo {
            qpn: MAX_24BIT,
            psn: 0,
            mtu: 256,
            credits: MAX_CREDITS,
            srq_nums: vec![MAX_24BIT; MAX_SRQ_NUMS],
            ..xrc_info()
        };
        validate(&edges).unwrap();
        validate(&EndpointInfo {
            credits: 1,
            ..rc_info()
        })
        .unwrap();
    }

    #[test]
    fn each_rule_is_enforced() {
        let broken: [(&str, EndpointInfo); 10] = [
            (
                "qpn",
                EndpointInfo {
                    qpn: 1 << 24,
                    ..rc_info()
                },
            ),
            (
                "psn",
                EndpointInfo {
                    psn: u32::MAX,
                    ..rc_info()
                },
            ),
            (
                "mtu",
                EndpointInfo {
                    mtu: 1500,
                    ..rc_info()
                },
            ),
            (
                "mtu",
                EndpointInfo {
                    mtu: 0,
                    ..rc_info()
                },
            ),
            (
                "credits",
                EndpointInfo {
                    credits: MAX_CREDITS + 1,
                    ..rc_info()
                },
            ),
            (
                "SRQ numbers",
                EndpointInfo {
                    srq_nums: vec![1; MAX_SRQ_NUMS + 1],
                    ..xrc_info()
                },
            ),
            (
                "SRQ number",
                EndpointInfo {
                    srq_nums: vec![1, 1 << 24],
                    ..xrc_info()
                },
            ),
            (
                "primary path has UDP port 0",
                EndpointInfo {
                    primary: PathInfo {
                        udp_port: 0,
                        ..path(1)
                    },
                    ..rc_info()
                },
            ),
            (
                "primary path has port number 0",
                EndpointInfo {
                    primary: PathInfo {
                        port_num: 0,
                        ..path(1)
                    },
                    ..rc_info()
                },
            ),
            (
                "alternate path has UDP port 0",
                EndpointInfo {
                    alternate: Some(PathInfo {
                        udp_port: 0,
                        ..path(2)
                    }),
                    ..rc_info()
                },
            ),
        ];
        for (needle, info) in broken {
            match validate(&info) {
                Err(BootstrapError::Invalid(msg)) => {
                    assert!(msg.contains(needle), "{msg:?} should mention {needle:?}");
                }
                other => panic!("{info:?} should be invalid ({needle}), got {other:?}"),
            }
        }
    }

    #[test]
    fn error_messages_say_what_happened() {
        let msg = BootstrapError::VersionMismatch { ours: 1, theirs: 2 }.to_string();
        assert!(msg.contains("v1") && msg.contains("v2"), "{msg}");
        let msg = BootstrapError::BadMagic(*b"GET ").to_string();
        assert!(msg.contains("RDMX"), "{msg}");
        let msg = BootstrapError::TooLarge(u32::MAX).to_string();
        assert!(
            msg.contains(&u32::MAX.to_string()) && msg.contains("65536"),
            "{msg}"
        );
        // Reasons from the peer are quoted, so control characters cannot mess up a log line.
        let msg = BootstrapError::Rejected("a\nb\x1b[31m".to_owned()).to_string();
        assert!(!msg.contains('\n') && !msg.contains('\x1b'), "{msg}");
    }
}
