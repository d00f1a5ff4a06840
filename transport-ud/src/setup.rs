//! Setting sessions up, whatever the exchange: taking a receive window from the budget,
//! describing our side, checking and opening the session towards what the peer described.

use std::net::SocketAddr;
use std::sync::Arc;

use rdmx_core::bootstrap::{DatagramKey, EndpointInfo, PathInfo, Transport};
use rdmx_core::worker::WaitSlot;
use rdmx_core::{Error, Result};
use rdmx_verbs::{AhAttr, Gid, Qpn};

use crate::endpoint::Endpoint;
use crate::seq::Seq;
use crate::session::Session;
use crate::state::{Peer, UdRef};

/// Session ids travel in the endpoint information's 16-bit `tag`.
pub(crate) const MAX_SESSIONS: usize = 1 << 16;

/// Our side of a session being set up: its key (the session id), token and first sequence
/// number, its receive window taken from the budget.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Half {
    pub(crate) key: usize,
    pub(crate) token: u32,
    pub(crate) first: Seq,
    /// The window the session starts with (reserved in the budget; may be 0).
    pub(crate) window: u32,
}

/// What the peer told of its session.
#[derive(Debug, Clone)]
pub(crate) struct PeerHalf {
    pub(crate) addr: SocketAddr,
    pub(crate) gid: Gid,
    pub(crate) qpn: Qpn,
    /// Where our acknowledgements go (its control queue pair; `qpn` if it has none).
    pub(crate) ctrl_qpn: Qpn,
    pub(crate) session: u32,
    pub(crate) token: u32,
    pub(crate) first: Seq,
    pub(crate) window: u32,
    pub(crate) mtu: usize,
    pub(crate) max_message: usize,
    /// Its connection data.
    pub(crate) data: Arc<[u8]>,
}

impl UdRef {
    /// Takes a session key and a receive window from the budget (the whole window while
    /// the budget has room, else none: the peer then asks), and picks our token and first
    /// sequence number. Undo with [`unreserve`](Self::unreserve) if the session is never
    /// opened.
    pub(crate) fn reserve(&self) -> Result<Half> {
        self.with(|sh, st, _| {
            if st.peers.vacant_key() >= MAX_SESSIONS {
                return Err(Error::Config(format!(
                    "a UD transport holds at most {MAX_SESSIONS} sessions"
                )));
            }
            // The key is ours from now on (`None` until the session opens).
            let key = st.peers.insert(None);
            let window = st.budget.take_initial(sh.session.recv_window);
            Ok(Half {
                key,
                token: rdmx_verbs::random_u64() as u32,
                first: Seq((rdmx_verbs::random_u64() as u32) & 0x00ff_ffff),
                window,
            })
        })
    }

    /// Gives back the key and window [`reserve`](Self::reserve) took for a session never
    /// opened.
    pub(crate) fn unreserve(&self, h: &Half) {
        self.with(|sh, st, _| {
            if st.peers.get(h.key).is_some_and(Option::is_none) {
                sh.remove(st, h.key);
                st.budget.release(h.window);
            }
        });
    }

    /// Our side, for the peer.
    pub(crate) fn describe(&self, h: &Half, app_data: Vec<u8>) -> Result<EndpointInfo> {
        let sh = &self.sh;
        let gid = sh.vctx.query_gid(1, sh.gid_index)?;
        Ok(EndpointInfo {
            transport: Transport::Ud,
            qpn: sh.qp.qp_num().0,
            psn: h.first.0,
            mtu: sh.session.max_datagram as u32,
            primary: PathInfo {
                gid: gid.0,
                udp_port: sh.addr.port(),
                port_num: 1,
            },
            alternate: None,
            srq_nums: vec![sh.ctrl_qp.qp_num().0],
            credits: h.window,
            mailbox_addr: 0,
            mailbox_rkey: 0,
            max_message: sh.session.max_message as u64,
            eager_limit: 0,
            context_id: 0,
            node_id: 0,
            tag: h.key as u32,
            xrc_target: None,
            xrc_target_path: None,
            xrc_target_alt: None,
            xrc_in_use: None,
            token: h.token,
            app_data,
        })
    }

    /// Opens our session `h` towards `peer`.
    ///
    /// # Errors
    /// `Verbs` when the address handle cannot be made (the reservation stays: undo it);
    /// `Protocol` when the reservation is gone.
    pub(crate) fn open(
        &self,
        h: Half,
        peer: &PeerHalf,
        mac: Option<DatagramKey>,
    ) -> Result<Endpoint> {
        let to = (peer.gid, peer.addr.port());
        let ah = match self.with(|_, st, _| st.ahs.get(&to).cloned()) {
            Some(ah) => ah,
            None => Arc::new(self.sh.pd.create_ah(&AhAttr {
                sgid_index: u8::try_from(self.sh.gid_index).unwrap_or(0),
                ..AhAttr::new(peer.gid).with_udp_port(peer.addr.port())
            })?),
        };
        let id = self.with(|sh, st, cx| {
            // (Another session to the same remote may have cached one meanwhile.)
            let ah = st.ahs.entry(to).or_insert(ah).clone();
            if !st.peers.get(h.key).is_some_and(Option::is_none) {
                return Err(Error::Protocol(
                    "the UD session's reservation is gone".into(),
                ));
            }
            let id = st.next_id;
            st.next_id += 1;
            let mut cfg = sh.session.clone();
            // (With a key, each datagram ends with its tag: the session has that much less.)
            let tag_len = mac.as_ref().map_or(0, |_| DatagramKey::TAG_LEN);
            cfg.max_datagram = cfg.max_datagram.min(peer.mtu) - tag_len;
            cfg.max_message = cfg.max_message.min(peer.max_message);
            let session = Session::new(
                cfg,
                h.token,
                (peer.session, peer.token),
                (h.first, peer.first),
                (h.window, peer.window),
                cx.now(),
            );
            let k = h.key;
            let share = st.budget.open(k, id, h.window, cx.now());
            st.peers[k] = Some(Peer {
                id,
                session,
                ah,
                remote_qpn: peer.qpn,
                remote_ctrl_qpn: peer.ctrl_qpn,
                mac,
                wait: WaitSlot::new(h.key),
                detached: false,
                timer_at: None,
                told_down: false,
                share,
            });
            st.mark_dirty(k);
            let now = cx.now();
            sh.after(st, cx, now);
            Ok(id)
        })?;
        Ok(Endpoint {
            u: self.clone(),
            key: h.key,
            id,
            peer: peer.addr,
            peer_data: Arc::clone(&peer.data),
        })
    }
}

/// What a peer's endpoint information says of its UD session, checked.
///
/// # Errors
/// `Protocol` for another transport or a datagram size below what a session needs. (A
/// window of 0 is fine: the peer's budget had no room, and our session asks.)
pub(crate) fn peer_half(info: &EndpointInfo) -> Result<PeerHalf> {
    if info.transport != Transport::Ud {
        return Err(Error::Protocol(format!(
            "the peer uses transport {:?}, this context ud",
            info.transport
        )));
    }
    let ctrl_qpn = match info.srq_nums[..] {
        [] => info.qpn,
        [q] => q,
        _ => {
            return Err(Error::Protocol(format!(
                "a UD peer names {} control queue pairs (at most 1)",
                info.srq_nums.len()
            )));
        }
    };
    let mtu = info.mtu as usize;
    if mtu < crate::wire::HEADER_LEN + 64 {
        return Err(Error::Protocol(format!(
            "the peer's datagrams of {mtu} bytes are too small"
        )));
    }
    let gid = Gid(info.primary.gid);
    Ok(PeerHalf {
        addr: SocketAddr::new(gid.to_ip(), info.primary.udp_port),
        gid,
        qpn: Qpn(info.qpn),
        ctrl_qpn: Qpn(ctrl_qpn),
        session: info.tag,
        token: info.token,
        first: Seq(info.psn),
        window: info.credits,
        mtu,
        max_message: usize::try_from(info.max_message).unwrap_or(usize::MAX),
        data: info.app_data.as_slice().into(),
    })
}
