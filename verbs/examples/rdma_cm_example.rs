//! The RDMA Aware Networks Programming User Manual's RDMA_CM client/server, on rdmx-verbs'
//! connection manager: the server binds and listens, the client resolves the server's
//! address and route and connects with private data naming its buffer; the server creates
//! its QP on the new ID, posts a receive, and accepts with private data naming its own
//! buffer. The client SENDs a message and the server answers with another; the client
//! RDMA-WRITEs into the server's buffer and RDMA-READs the server's greeting back, then
//! disconnects, and both sides see DISCONNECTED. Every step is checked; a mismatch exits
//! non-zero.
//!
//! ```sh
//! cargo run -p rdmx-verbs --example rdma_cm_example                     # both, loopback
//! cargo run -p rdmx-verbs --example rdma_cm_example -- server 7471      # one side each
//! cargo run -p rdmx-verbs --example rdma_cm_example -- client 127.0.0.1:7471
//! ```

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::Duration;

use rdmx_verbs::cm::{CmEventKind as K, CmId, ConnParam, EventChannel, PortSpace};
use rdmx_verbs::{QpCap, QpInitAttr, Rkey, SendFlags, WcStatus, WorkCompletion};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const WAIT: Duration = Duration::from_secs(10);
const PING: &[u8] = b"hello from the rdma_cm client";
const PONG: &[u8] = b"hello from the rdma_cm server";
const WRITTEN: &[u8] = b"written by the client with RDMA WRITE";
const BUF: usize = 4096;
/// Where in its buffer each side keeps what the other reads or writes.
const REMOTE_OFF: usize = 2048;

/// Buffer address and key, as private data (`addr:8 rkey:4`, big-endian).
fn buf_info(addr: u64, rkey: Rkey) -> Vec<u8> {
    let mut v = addr.to_be_bytes().to_vec();
    v.extend_from_slice(&rkey.0.to_be_bytes());
    v
}

fn parse_info(b: &[u8]) -> Res<(u64, Rkey)> {
    let addr = b.get(..8).ok_or("short private data")?;
    let rkey = b.get(8..12).ok_or("short private data")?;
    Ok((
        u64::from_be_bytes(addr.try_into()?),
        Rkey(u32::from_be_bytes(rkey.try_into()?)),
    ))
}

/// `rdma_create_qp` with a send and a receive CQ of the ID's device (so that
/// `get_send_comp` and `get_recv_comp` each see their own); every send is signaled.
fn create_qp(id: &CmId) -> Res<()> {
    let ctx = id.context().ok_or("the ID is not bound to a device")?;
    let send_cq = ctx.create_cq(16, None)?;
    let recv_cq = ctx.create_cq(16, None)?;
    let mut attr = QpInitAttr::rc(&send_cq, &recv_cq);
    attr.cap = QpCap {
        max_send_wr: 8,
        max_recv_wr: 8,
        ..QpCap::default()
    };
    attr.sq_sig_all = true;
    id.create_qp(None, &attr)?;
    Ok(())
}

fn check(wc: WorkCompletion, what: &str) -> Res<WorkCompletion> {
    if wc.status != WcStatus::Success {
        return Err(format!("{what} completed with {:?}", wc.status).into());
    }
    Ok(wc)
}

/// The server side: listens at `addr`, tells `bound` the address it got, serves one client.
fn server(addr: SocketAddr, bound: Option<mpsc::Sender<SocketAddr>>) -> Res<()> {
    let ch = EventChannel::new()?;
    let listen_id = ch.create_id(PortSpace::Tcp)?;
    listen_id.bind_addr(addr)?;
    listen_id.listen(1)?;
    let at = listen_id.local_addr().ok_or("no local address")?;
    println!("server: listening on {at}");
    if let Some(tx) = bound {
        tx.send(at)?;
    }
    let req = ch.expect_event(K::ConnectRequest, Duration::from_secs(60))?;
    // (The client names its buffer too, as the manual's exchange does; this server does
    // not use it.)
    parse_info(&req.private_data)?;
    let id = req.id;
    create_qp(&id)?;
    let mr = id.reg_write(BUF)?;
    mr.write(REMOTE_OFF, PONG)?;
    // rdma_post_recv before rdma_accept: the client's first send needs it.
    id.post_recv(1, &mr, 0, 256)?;
    let mr_read = id.reg_read(BUF)?;
    mr_read.write(0, PONG)?;
    let mut accept = ConnParam::with_private_data(&buf_info(mr.addr(), mr.rkey()));
    accept
        .private_data
        .extend_from_slice(&buf_info(mr_read.addr(), mr_read.rkey()));
    id.accept(&accept)?;
    ch.expect_event(K::Established, WAIT)?;
    println!("server: connection established");

    let wc = check(id.get_recv_comp(WAIT)?, "the receive")?;
    if mr.to_vec(0, wc.byte_len as usize)? != PING {
        return Err("server: the client's message is wrong".into());
    }
    println!("server: received {:?}", String::from_utf8_lossy(PING));
    mr.write(256, PONG)?;
    id.post_send(2, &mr, 256, PONG.len(), SendFlags::EMPTY)?;
    check(id.get_send_comp(WAIT)?, "the send")?;

    // The client writes, reads, then disconnects.
    ch.expect_event(K::Disconnected, WAIT)?;
    if mr.to_vec(REMOTE_OFF, WRITTEN.len())? != WRITTEN {
        return Err("server: the RDMA WRITE did not land".into());
    }
    println!("server: RDMA WRITE landed, client disconnected");
    Ok(())
}

/// The client side: connects to `dst` and runs the exchange.
fn client(dst: SocketAddr) -> Res<()> {
    let ch = EventChannel::new()?;
    let id = ch.create_id(PortSpace::Tcp)?;
    id.resolve_addr(None, dst, Duration::from_secs(2))?;
    ch.expect_event(K::AddrResolved, WAIT)?;
    id.resolve_route(Duration::from_secs(2))?;
    ch.expect_event(K::RouteResolved, WAIT)?;
    create_qp(&id)?;
    let mr = id.reg_write(BUF)?;
    id.post_recv(1, &mr, 0, 256)?;
    id.connect(&ConnParam::with_private_data(&buf_info(
        mr.addr(),
        mr.rkey(),
    )))?;
    let est = ch.expect_event(K::Established, WAIT)?;
    let (srv_addr, srv_rkey) = parse_info(&est.private_data)?;
    let (read_addr, read_rkey) = parse_info(est.private_data.get(12..).unwrap_or_default())?;
    println!("client: connected to {dst}");

    mr.write(256, PING)?;
    id.post_send(2, &mr, 256, PING.len(), SendFlags::EMPTY)?;
    check(id.get_send_comp(WAIT)?, "the send")?;
    let wc = check(id.get_recv_comp(WAIT)?, "the receive")?;
    if mr.to_vec(0, wc.byte_len as usize)? != PONG {
        return Err("client: the server's answer is wrong".into());
    }
    println!("client: received {:?}", String::from_utf8_lossy(PONG));

    mr.write(1024, WRITTEN)?;
    let target = srv_addr + REMOTE_OFF as u64;
    id.post_write(
        3,
        &mr,
        1024,
        WRITTEN.len(),
        target,
        srv_rkey,
        SendFlags::EMPTY,
    )?;
    check(id.get_send_comp(WAIT)?, "the RDMA WRITE")?;
    id.post_read(
        4,
        &mr,
        3072,
        PONG.len(),
        read_addr,
        read_rkey,
        SendFlags::EMPTY,
    )?;
    check(id.get_send_comp(WAIT)?, "the RDMA READ")?;
    if mr.to_vec(3072, PONG.len())? != PONG {
        return Err("client: the RDMA READ brought the wrong bytes".into());
    }
    println!("client: RDMA WRITE and READ done");

    id.disconnect()?;
    ch.expect_event(K::Disconnected, WAIT)?;
    println!("client: disconnected");
    Ok(())
}

/// Both sides on loopback, the server on an ephemeral port.
pub(crate) fn run_both() -> Res<()> {
    let (tx, rx) = mpsc::channel();
    let srv = std::thread::spawn(move || {
        server("127.0.0.1:0".parse().map_err(|e| format!("{e}"))?, Some(tx))
            .map_err(|e| format!("server: {e}"))
    });
    let at = rx
        .recv_timeout(WAIT)
        .map_err(|_| "the server did not start")?;
    let c = client(at).map_err(|e| format!("client: {e}"));
    let s = srv.join().map_err(|_| "the server thread panicked")?;
    c?;
    s?;
    Ok(())
}

#[allow(dead_code, reason = "the tests call run_both, not main")]
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        None => run_both(),
        Some("server") => {
            let port: u16 = args.get(1).and_then(|p| p.parse().ok()).unwrap_or(7471);
            server(SocketAddr::from(([127, 0, 0, 1], port)), None)
        }
        Some("client") => {
            let at = args.get(1).map_or("127.0.0.1:7471", String::as_str);
            match at.parse::<SocketAddr>() {
                Ok(dst) => client(dst),
                Err(e) => Err(e.into()),
            }
        }
        Some(other) => Err(format!(
            "usage: rdma_cm_example [server PORT | client ADDR:PORT] ({other}?)"
        )
        .into()),
    };
    match r {
        Ok(()) => println!("rdma_cm_example: ok"),
        Err(e) => {
            eprintln!("rdma_cm_example: {e}");
            std::process::exit(1);
        }
    }
}
