//! The RC exchange over the bootstrap side channel: the connecting and the listening side
//! (an XRC context's go to `xrc.rs`).

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdmx_core::bootstrap::{self, BootstrapError, Frame, Transport};
use rdmx_core::{Error, Result};

use crate::setup::{
    Established, bring_up_endpoint, check_peer, complete, create_qp, random_psn, register, settle,
};
use crate::state::RcRef;

/// The connecting side.
pub(crate) fn connect(rc: &RcRef, addr: SocketAddr, data: &[u8]) -> Result<Established> {
    let sh = &*rc.sh;
    bootstrap::check_app_data(data)?;
    let deadline = crate::util::host_now() + sh.cfg.connect_timeout;
    if sh.node.is_some() {
        return connect_xrc(rc, addr, deadline, data);
    }
    let mut stream = bootstrap::connect(addr, deadline)?;
    // Before anything exists here: prove the key, check the listener's.
    bootstrap::auth::connector(&mut stream, sh.cfg.auth_key.as_ref(), deadline)?;
    let psn = random_psn();
    let qp = Arc::new(create_qp(sh)?);
    let (key, id, info) = register(rc, qp, psn, data.to_vec())?;
    let result = (|| -> Result<()> {
        bootstrap::send_frame(&mut stream, &Frame::Hello(info), deadline)?;
        let peer = bootstrap::expect_accept(&mut stream, deadline)?;
        check_peer(sh, &peer)?;
        bring_up_endpoint(rc, key, psn, &peer)?;
        // The listener's slot window was bound before its Accept: we may write at once.
        complete(rc, key, &peer, true);
        if sh.confine {
            // Our own slot's window was bound (posted on the queue pair) above.
            bootstrap::send_frame(&mut stream, &Frame::Ready, deadline)?;
        }
        Ok(())
    })();
    settle(rc, key, id, result, "connected", addr)
}

/// The connecting side of an XRC endpoint: the exchange, tried again after a short random
/// pause while the listener declines because its context is busy with another exchange
/// ([`bootstrap::REJECT_BUSY`]).
fn connect_xrc(
    rc: &RcRef,
    addr: SocketAddr,
    deadline: Instant,
    data: &[u8],
) -> Result<Established> {
    let sh = &*rc.sh;
    loop {
        // XRC exchanges of a context run one at a time, and the TCP connection is made
        // under that lock: otherwise a listener could accept the connection of a thread
        // still waiting here, and wait for its Hello while the thread it should be
        // answering waits for it (16 threads connecting at once through one context timed
        // out every time).
        let one_at_a_time = crate::xrc::exchange_lock(sh, deadline)?;
        let mut stream = bootstrap::connect(addr, deadline)?;
        bootstrap::auth::connector(&mut stream, sh.cfg.auth_key.as_ref(), deadline)?;
        match crate::xrc::connect(rc, one_at_a_time, stream, addr, deadline, data) {
            Err(Error::Bootstrap(BootstrapError::Rejected(r))) if r == bootstrap::REJECT_BUSY => {
                // Our lock is released: the peer's own exchange with us can go ahead.
                let pause = Duration::from_millis(5 + crate::util::random_u64() % 40);
                if crate::util::host_now() + pause >= deadline {
                    return Err(Error::Bootstrap(BootstrapError::Rejected(r)));
                }
                tracing::debug!(%addr, ?pause, "the listener is busy; trying again");
                std::thread::sleep(pause);
            }
            other => return other,
        }
    }
}

/// Two endpoints of this process, one on each of two RC transports, connected to each
/// other with no side channel: each side's description goes straight to the other.
pub(crate) fn connect_local(a: &RcRef, b: &RcRef) -> Result<(Established, Established)> {
    if a.sh.node.is_some() || b.sh.node.is_some() {
        return Err(Error::InvalidArgument(
            "in-process pairs are RC endpoints: neither context may be on an XRC node".into(),
        ));
    }
    let (psn_a, psn_b) = (random_psn(), random_psn());
    let qp_a = Arc::new(create_qp(&a.sh)?);
    let (ka, ida, info_a) = register(a, qp_a, psn_a, Vec::new())?;
    let qp_b = match create_qp(&b.sh) {
        Ok(q) => Arc::new(q),
        Err(e) => {
            crate::setup::unregister(a, ka);
            return Err(e);
        }
    };
    let (kb, idb, info_b) = match register(b, qp_b, psn_b, Vec::new()) {
        Ok(r) => r,
        Err(e) => {
            crate::setup::unregister(a, ka);
            return Err(e);
        }
    };
    let result = (|| -> Result<()> {
        check_peer(&b.sh, &info_a)?;
        check_peer(&a.sh, &info_b)?;
        bring_up_endpoint(b, kb, psn_b, &info_a)?;
        bring_up_endpoint(a, ka, psn_a, &info_b)?;
        // (Both windows were bound before either side opens.)
        complete(b, kb, &info_a, true);
        complete(a, ka, &info_b, true);
        Ok(())
    })();
    if let Err(e) = result {
        crate::setup::unregister(a, ka);
        crate::setup::unregister(b, kb);
        return Err(e);
    }
    let ea = settle(a, ka, ida, Ok(()), "connected in-process", device_addr(b))?;
    let eb = settle(b, kb, idb, Ok(()), "connected in-process", device_addr(a))?;
    Ok((ea, eb))
}

/// The address of a context's device (its first port), which names it as a peer when
/// there is no side channel.
pub(crate) fn device_addr(rc: &RcRef) -> SocketAddr {
    rc.sh
        .vctx
        .port_addr(1)
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)))
}

/// The listening side, after the TCP accept. `None`: the exchange was declined for now
/// (XRC, context busy with another exchange); the caller accepts the next connection.
pub(crate) fn accept(
    rc: &RcRef,
    mut stream: TcpStream,
    from: SocketAddr,
) -> Result<Option<Established>> {
    let sh = &*rc.sh;
    let deadline = crate::util::host_now() + sh.cfg.connect_timeout;
    // Before anything exists here: the peer proves the key (within a second).
    bootstrap::auth::listener(&mut stream, sh.cfg.auth_key.as_ref(), deadline)?;
    let peer = bootstrap::expect_hello(&mut stream, deadline)?;
    if sh.node.is_some() && peer.transport == Transport::Xrc {
        return crate::xrc::accept(rc, stream, from, &peer, deadline);
    }
    if let Err(e) = check_peer(sh, &peer) {
        let _ = bootstrap::reject(&mut stream, &e.to_string(), deadline);
        return Err(e);
    }
    let psn = random_psn();
    let qp = match create_qp(sh) {
        Ok(q) => q,
        Err(e) => {
            let _ = bootstrap::reject(&mut stream, "cannot create a queue pair", deadline);
            return Err(e);
        }
    };
    let data = sh.accept_data.lock().clone();
    let (key, id, info) = register(rc, Arc::new(qp), psn, data)?;
    let result = (|| -> Result<()> {
        bring_up_endpoint(rc, key, psn, &peer)?;
        complete(rc, key, &peer, false);
        bootstrap::send_frame(&mut stream, &Frame::Accept(info), deadline)?;
        if sh.confine {
            bootstrap::expect_ready(&mut stream, deadline)?;
            crate::setup::peer_ready(rc, key);
        }
        Ok(())
    })();
    settle(rc, key, id, result, "accepted", from).map(Some)
}
