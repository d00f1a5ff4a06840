//! The RDMA Aware Networks Programming User Manual's RC example (`RDMA_RC_example.c`), on
//! rdmx-verbs: a server and a client exchange their queue pair numbers, GIDs, buffer
//! addresses and keys over TCP (`sock_sync_data`), bring their RC queue pairs to RTS, then
//! the server SENDs a message, the client RDMA-READs the server's buffer and RDMA-WRITEs it,
//! and the server checks what was written. Every step is checked; a mismatch exits non-zero.
//!
//! ```sh
//! cargo run -p rdmx-verbs --example rc_example                 # both sides, on loopback
//! cargo run -p rdmx-verbs --example rc_example -- server 19875 # one side each
//! cargo run -p rdmx-verbs --example rc_example -- client 127.0.0.1:19875
//! ```
//! `RDMX_TEST_DEVICE` names the device (default `soft:127.0.0.1`).
#![expect(
    clippy::disallowed_methods,
    reason = "an application program: its completion poll is bounded in time, as the manual's"
)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use rdmx_verbs::{
    AccessFlags, AhAttr, CompletionQueue, Context, Device, Gid, MemoryRegion, Mtu, QpAttr,
    QpAttrMask as M, QpInitAttr, QpState, QueuePair, RecvWr, Rkey, SendWr, WcOpcode, WcStatus,
    WorkCompletion, WrOpcode,
};

const MSG: &[u8] = b"SEND operation ";
const RDMAMSGR: &[u8] = b"RDMA read operation ";
const RDMAMSGW: &[u8] = b"RDMA write operation";
const MSG_SIZE: usize = 64;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// What each side tells the other (`struct cm_con_data_t`).
#[derive(Debug, Clone, Copy)]
struct ConData {
    addr: u64,
    rkey: u32,
    qp_num: u32,
    gid: [u8; 16],
    udp_port: u16,
}

impl ConData {
    fn to_bytes(self) -> [u8; 34] {
        let mut b = [0u8; 34];
        b[..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..16].copy_from_slice(&self.qp_num.to_be_bytes());
        b[16..32].copy_from_slice(&self.gid);
        b[32..].copy_from_slice(&self.udp_port.to_be_bytes());
        b
    }

    fn from_bytes(b: &[u8; 34]) -> Self {
        let word = |r: std::ops::Range<usize>| -> [u8; 4] {
            let mut w = [0u8; 4];
            w.copy_from_slice(&b[r]);
            w
        };
        let mut addr = [0u8; 8];
        addr.copy_from_slice(&b[..8]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[16..32]);
        Self {
            addr: u64::from_be_bytes(addr),
            rkey: u32::from_be_bytes(word(8..12)),
            qp_num: u32::from_be_bytes(word(12..16)),
            gid,
            udp_port: u16::from_be_bytes([b[32], b[33]]),
        }
    }
}

/// `sock_sync_data`: sends ours, then reads as many bytes of theirs.
fn sock_sync_data(sock: &mut TcpStream, local: &[u8], remote: &mut [u8]) -> Res<()> {
    sock.write_all(local)?;
    sock.read_exact(remote)?;
    Ok(())
}

/// The resources of one side (`struct resources`).
struct Resources {
    ctx: Context,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
    sock: TcpStream,
}

fn resources_create(sock: TcpStream) -> Res<Resources> {
    let dev = std::env::var("RDMX_TEST_DEVICE").unwrap_or_else(|_| "soft:127.0.0.1".into());
    let ctx = Device::open(&dev)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(1, None)?;
    let mr = pd.reg_mr(
        MSG_SIZE,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
    )?;
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq))?;
    Ok(Resources {
        ctx,
        cq,
        qp,
        mr,
        sock,
    })
}

/// `connect_qp`: exchange, INIT, a receive posted, RTR, RTS, and a sync.
fn connect_qp(res: &mut Resources, server: bool) -> Res<ConData> {
    let local = ConData {
        addr: res.mr.addr(),
        rkey: res.mr.rkey().0,
        qp_num: res.qp.qp_num().0,
        gid: res.ctx.query_gid(1, 0)?.0,
        udp_port: res.ctx.port_addr(1).map_or(4791, |a| a.port()),
    };
    let mut theirs = [0u8; 34];
    sock_sync_data(&mut res.sock, &local.to_bytes(), &mut theirs)?;
    let remote = ConData::from_bytes(&theirs);
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: access,
        ..QpAttr::default()
    };
    res.qp
        .modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)?;
    // Let the client post a receive for the server's SEND before the QPs are connected.
    if !server {
        post_receive(res)?;
    }
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: AhAttr::new(Gid(remote.gid)).with_udp_port(remote.udp_port),
        path_mtu: Mtu::Mtu256,
        dest_qp_num: remote.qp_num,
        rq_psn: 0,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 0x12,
        ..QpAttr::default()
    };
    res.qp.modify(
        &rtr,
        M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER,
    )?;
    let rts = QpAttr {
        qp_state: QpState::Rts,
        timeout: 0x12,
        retry_cnt: 6,
        rnr_retry: 0,
        sq_psn: 0,
        max_rd_atomic: 1,
        ..QpAttr::default()
    };
    res.qp.modify(
        &rts,
        M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
    )?;
    sync(res, b'Q')?;
    Ok(remote)
}

fn sync(res: &mut Resources, c: u8) -> Res<()> {
    let mut t = [0u8; 1];
    sock_sync_data(&mut res.sock, &[c], &mut t)?;
    if t[0] != c {
        return Err(format!("out of step: {:?} against {:?}", t[0] as char, c as char).into());
    }
    Ok(())
}

fn post_receive(res: &Resources) -> Res<()> {
    let sge = [res.mr.sge(0, MSG_SIZE)];
    res.qp.post_recv(&RecvWr::new(0, &sge))?;
    Ok(())
}

fn post_send(res: &Resources, op: WrOpcode) -> Res<()> {
    let sge = [res.mr.sge(0, MSG_SIZE)];
    res.qp.post_send(&SendWr::new(0, op, &sge).signaled())?;
    Ok(())
}

/// `poll_completion`: one completion, within 2 s (the manual's `MAX_POLL_CQ_TIMEOUT`).
fn poll_completion(res: &Resources, want: WcOpcode) -> Res<()> {
    let end = Instant::now() + Duration::from_secs(2);
    let mut wc = [WorkCompletion::EMPTY; 1];
    loop {
        if res.cq.poll(&mut wc) == 1 {
            let w = wc[0];
            if w.status != WcStatus::Success || w.opcode != want {
                return Err(format!("a bad completion: {w:?} (wanted {want:?})").into());
            }
            return Ok(());
        }
        if Instant::now() > end {
            return Err("completion wasn't found in the CQ after timeout".into());
        }
        std::thread::yield_now();
    }
}

fn padded(s: &[u8]) -> Vec<u8> {
    let mut v = s.to_vec();
    v.resize(MSG_SIZE, 0);
    v
}

fn run(sock: TcpStream, server: bool) -> Res<()> {
    let mut res = resources_create(sock)?;
    if server {
        res.mr.write(0, &padded(MSG))?;
    }
    let remote = connect_qp(&mut res, server)?;
    // The server SENDs; both sides expect a completion.
    if server {
        post_send(&res, WrOpcode::Send)?;
        poll_completion(&res, WcOpcode::Send)?;
    } else {
        poll_completion(&res, WcOpcode::Recv)?;
        let got = res.mr.to_vec(0, MSG_SIZE)?;
        if got != padded(MSG) {
            return Err(format!("the SEND carried {got:?}").into());
        }
        println!("Message is: {}", String::from_utf8_lossy(MSG));
    }
    if server {
        res.mr.write(0, &padded(RDMAMSGR))?;
    }
    sync(&mut res, b'R')?;
    if !server {
        // The client reads the server's buffer, then writes it.
        post_send(
            &res,
            WrOpcode::RdmaRead {
                remote_addr: remote.addr,
                rkey: Rkey(remote.rkey),
            },
        )?;
        poll_completion(&res, WcOpcode::RdmaRead)?;
        let got = res.mr.to_vec(0, MSG_SIZE)?;
        if got != padded(RDMAMSGR) {
            return Err(format!("the RDMA read gave {got:?}").into());
        }
        println!(
            "Contents of server's buffer: {}",
            String::from_utf8_lossy(RDMAMSGR)
        );
        res.mr.write(0, &padded(RDMAMSGW))?;
        post_send(
            &res,
            WrOpcode::RdmaWrite {
                remote_addr: remote.addr,
                rkey: Rkey(remote.rkey),
            },
        )?;
        poll_completion(&res, WcOpcode::RdmaWrite)?;
        println!(
            "Now replacing it with: {}",
            String::from_utf8_lossy(RDMAMSGW)
        );
    }
    sync(&mut res, b'W')?;
    if server {
        let got = res.mr.to_vec(0, MSG_SIZE)?;
        if got != padded(RDMAMSGW) {
            return Err(format!("the server's buffer holds {got:?} after the write").into());
        }
        println!(
            "Contents of server buffer: {}",
            String::from_utf8_lossy(RDMAMSGW)
        );
    }
    Ok(())
}

/// Both sides in this process, over TCP on loopback.
pub(crate) fn run_both() -> Res<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let server = std::thread::spawn(move || -> Result<(), String> {
        let (sock, _) = listener.accept().map_err(|e| e.to_string())?;
        run(sock, true).map_err(|e| format!("server: {e}"))
    });
    let client = run(TcpStream::connect(addr)?, false).map_err(|e| format!("client: {e}"));
    let server = server.join().map_err(|_| "the server thread panicked")?;
    client?;
    server?;
    Ok(())
}

#[allow(dead_code, reason = "the tests call run_both, not main")]
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        None => run_both(),
        Some("server") => {
            let port = args.get(1).map_or("19875", String::as_str);
            TcpListener::bind(("0.0.0.0", port.parse().unwrap_or(19875)))
                .map_err(Into::into)
                .and_then(|l| {
                    println!("waiting on port {port} for TCP connection");
                    let (s, _) = l.accept()?;
                    run(s, true)
                })
        }
        Some("client") => {
            let at = args.get(1).map_or("127.0.0.1:19875", String::as_str);
            TcpStream::connect(at)
                .map_err(Into::into)
                .and_then(|s| run(s, false))
        }
        Some(other) => {
            Err(format!("usage: rc_example [server PORT | client ADDR] ({other}?)").into())
        }
    };
    match r {
        Ok(()) => println!("test result is 0"),
        Err(e) => {
            eprintln!("rc_example: {e}");
            std::process::exit(1);
        }
    }
}
