//! Path-migration roles: an RC connection between two two-port soft devices, primary path
//! over port 1 (link A), alternate over port 2 (link B), armed on both sides; the client
//! streams numbered sends, the server checks that every one arrives once and in order.
//!
//! The QP numbers, PSNs and port addresses are exchanged over TCP across link A before any
//! RDMA traffic (the TCP connection is closed before the stream starts, so a cut of link A
//! only affects the RDMA traffic).

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdmx::verbs::{
    AccessFlags, AhAttr, AsyncEvent, CompletionQueue, Context, Device, Gid, MemoryRegion, MigState,
    Mtu, QpAttr, QpAttrMask as M, QpCap, QpInitAttr, QpState, QueuePair, RecvWr, SendWr, WcStatus,
    WorkCompletion,
};

use crate::{Args, Ctx, Res, unix_ns};

/// Bytes per buffer slot (messages are at most one path MTU, 1024 bytes on a veth).
const SLOT: usize = 1024;
/// Bytes of the sequence number at the start of every message.
const SEQ_LEN: usize = 8;
/// Limit for the TCP exchange steps.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);

/// What a peer needs to connect to our QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PeerInfo {
    qpn: u32,
    psn: u32,
    /// UDP address of port 1 (link A) and port 2 (link B).
    ports: [SocketAddr; 2],
}

impl PeerInfo {
    fn to_line(self) -> String {
        format!(
            "QP {} {} {} {}\n",
            self.qpn, self.psn, self.ports[0], self.ports[1]
        )
    }

    fn from_line(l: &str) -> Res<Self> {
        let w: Vec<&str> = l.split_whitespace().collect();
        let bad = || format!("bad peer info line {l:?}");
        if w.len() != 5 || w[0] != "QP" {
            return Err(bad());
        }
        Ok(Self {
            qpn: w[1].parse().map_err(|_| bad())?,
            psn: w[2].parse().map_err(|_| bad())?,
            ports: [
                w[3].parse().map_err(|_| bad())?,
                w[4].parse().map_err(|_| bad())?,
            ],
        })
    }
}

/// Connection settings shared by both roles.
#[derive(Debug, Clone, Copy)]
struct Settings {
    /// Local ACK timeout exponent (4.096 us x 2^t), primary and alternate path.
    ack_timeout: u8,
    retry_cnt: u8,
    size: usize,
    /// Send and receive queue depth.
    depth: usize,
}

impl Settings {
    fn from_args(a: &Args, depth: usize) -> Res<Self> {
        let s = Self {
            ack_timeout: a.or("ack-timeout", 12)?,
            retry_cnt: a.or("retry-cnt", 3)?,
            size: a.or("size", 256)?,
            depth,
        };
        if !(1..=31).contains(&s.ack_timeout) {
            return Err("--ack-timeout must be 1..=31".into());
        }
        if s.retry_cnt > 7 {
            return Err("--retry-cnt must be 0..=7".into());
        }
        if !(SEQ_LEN..=SLOT).contains(&s.size) {
            return Err(format!("--size must be {SEQ_LEN}..={SLOT}"));
        }
        Ok(s)
    }

    fn ack_timeout_us(self) -> f64 {
        4.096 * f64::from(1u32 << self.ack_timeout)
    }
}

/// An RC QP on a two-port device, with its resources.
struct Rc {
    ctx: Context,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
    psn: u32,
    mtu: Mtu,
}

fn rc(device: &str, s: Settings, psn: u32) -> Res<Rc> {
    let ctx = Device::open(device).ctx(&format!("open {device}"))?;
    let ports = ctx.query_device().phys_port_cnt;
    if ports != 2 {
        return Err(format!(
            "{device} has {ports} port(s); path migration needs 2 (soft:<ip a>,<ip b>)"
        ));
    }
    let mtu = [1u8, 2]
        .iter()
        .map(|&p| ctx.query_port(p).map(|a| a.active_mtu))
        .collect::<Result<Vec<Mtu>, _>>()
        .ctx("query_port")?
        .into_iter()
        .min_by_key(|m| m.bytes())
        .unwrap_or(Mtu::Mtu1024);
    if s.size > mtu.bytes() {
        return Err(format!(
            "--size {} is above the ports' active MTU {}",
            s.size,
            mtu.bytes()
        ));
    }
    let pd = ctx.alloc_pd().ctx("alloc_pd")?;
    let cq = ctx.create_cq(4 * s.depth + 16, None).ctx("create_cq")?;
    let mut a = QpInitAttr::rc(&cq, &cq);
    a.cap = QpCap {
        max_send_wr: s.depth as u32,
        max_recv_wr: s.depth as u32,
        ..QpCap::default()
    };
    let qp = pd.create_qp(&a).ctx("create RC QP")?;
    let mr = pd
        .reg_mr(s.depth * SLOT, AccessFlags::LOCAL_WRITE)
        .ctx("reg_mr")?;
    Ok(Rc {
        ctx,
        cq,
        qp,
        mr,
        psn,
        mtu,
    })
}

impl Rc {
    fn info(&self) -> Res<PeerInfo> {
        Ok(PeerInfo {
            qpn: self.qp.qp_num().0,
            psn: self.psn,
            ports: [
                self.ctx.port_addr(1).ctx("port_addr")?,
                self.ctx.port_addr(2).ctx("port_addr")?,
            ],
        })
    }

    /// INIT -> RTR -> RTS with the primary path to the peer's port 1, then RTS -> RTS with
    /// the alternate path to its port 2 and PATH_MIG_STATE = REARM.
    fn connect(&self, peer: &PeerInfo, s: Settings) -> Res<()> {
        let av = |port: u8| {
            let a = peer.ports[usize::from(port) - 1];
            let mut av = AhAttr::new(Gid::from_ip(a.ip())).with_udp_port(a.port());
            av.port_num = port;
            av
        };
        let init = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: AccessFlags::LOCAL_WRITE,
            ..QpAttr::default()
        };
        self.qp
            .modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
            .ctx("RC QP to INIT")?;
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            ah_attr: av(1),
            path_mtu: self.mtu,
            dest_qp_num: peer.qpn,
            rq_psn: peer.psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 1,
            ..QpAttr::default()
        };
        let m = M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER;
        self.qp.modify(&rtr, m).ctx("RC QP to RTR")?;
        let rts = QpAttr {
            qp_state: QpState::Rts,
            timeout: s.ack_timeout,
            retry_cnt: s.retry_cnt,
            rnr_retry: 7,
            sq_psn: self.psn,
            max_rd_atomic: 1,
            ..QpAttr::default()
        };
        let m =
            M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC;
        self.qp.modify(&rts, m).ctx("RC QP to RTS")?;
        let rearm = QpAttr {
            qp_state: QpState::Rts,
            path_mig_state: MigState::Rearm,
            alt_ah_attr: av(2),
            alt_port_num: 2,
            alt_timeout: s.ack_timeout,
            ..QpAttr::default()
        };
        self.qp
            .modify(&rearm, M::STATE | M::ALT_PATH | M::PATH_MIG_STATE)
            .ctx("RC QP: load the alternate path and REARM")?;
        Ok(())
    }
}

/// Prints the QP's path-migration state when it changes (`ARMED <ns>` the first time it is
/// armed, `MIGSTATE <state> port=<n> <ns>` on every change).
struct MigWatch {
    last: Option<(MigState, u8)>,
    armed_printed: bool,
}

impl MigWatch {
    fn new() -> Self {
        Self {
            last: None,
            armed_printed: false,
        }
    }

    fn check(&mut self, qp: &QueuePair) -> Res<(MigState, u8)> {
        let (a, _) = qp.query().ctx("query_qp")?;
        let now = (a.path_mig_state, a.port_num);
        if self.last != Some(now) {
            println!("MIGSTATE {:?} port={} {}", now.0, now.1, unix_ns());
            self.last = Some(now);
        }
        if now.0 == MigState::Armed && !self.armed_printed {
            println!("ARMED {}", unix_ns());
            self.armed_printed = true;
        }
        Ok(now)
    }
}

/// Prints every asynchronous event as `EVENT <name> <ns> <detail>` from a thread of its own
/// (so the time stamp is taken when the event is queued, not when the main loop looks).
/// Returns the flag that is set on `PathMigrated`.
fn watch_events(ctx: &Context) -> Res<Arc<AtomicBool>> {
    let migrated = Arc::new(AtomicBool::new(false));
    let (ctx, flag) = (ctx.clone(), Arc::clone(&migrated));
    std::thread::Builder::new()
        .name("events".into())
        .spawn(move || {
            loop {
                let Some(e) = ctx.get_async_event(Duration::from_millis(100)) else {
                    continue;
                };
                let t = unix_ns();
                match e {
                    AsyncEvent::PathMigrated(q) => {
                        flag.store(true, Ordering::SeqCst);
                        println!("EVENT PathMigrated {t} qpn={}", q.0);
                    }
                    AsyncEvent::PathMigrationError(q) => {
                        println!("EVENT PathMigrationError {t} qpn={}", q.0);
                    }
                    AsyncEvent::PortError(p) => println!("EVENT PortError {t} port={p}"),
                    AsyncEvent::PortActive(p) => println!("EVENT PortActive {t} port={p}"),
                    other => println!("EVENT Other {t} {other:?}"),
                }
            }
        })
        .ctx("spawn the event thread")?;
    Ok(migrated)
}

fn read_line(r: &mut impl BufRead, what: &str) -> Res<String> {
    let mut l = String::new();
    let n = r.read_line(&mut l).ctx(&format!("read {what}"))?;
    if n == 0 {
        return Err(format!("connection closed before {what}"));
    }
    Ok(l.trim().to_string())
}

fn settings_line(role: &str, s: Settings, mtu: Mtu, extra: &str) {
    println!(
        "SETTINGS role={role} ack_timeout={} ack_timeout_us={:.0} retry_cnt={} path_mtu={} \
         size={} depth={}{extra}",
        s.ack_timeout,
        s.ack_timeout_us(),
        s.retry_cnt,
        mtu.bytes(),
        s.size,
        s.depth
    );
}

/// The payload of message `seq`: the number, then a pattern derived from it.
fn payload(seq: u64, size: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..size).map(|i| (seq as usize * 7 + i) as u8).collect();
    v[..SEQ_LEN].copy_from_slice(&seq.to_be_bytes());
    v
}

/// `apm-server`.
pub(crate) fn server(a: &Args) -> Res<bool> {
    a.only(&[
        "device",
        "listen",
        "count",
        "size",
        "ack-timeout",
        "retry-cnt",
        "linger-ms",
        "depth",
        "wait-s",
    ])?;
    let device: String = a.req("device")?;
    let listen: SocketAddr = a.req("listen")?;
    let count: u64 = a.req("count")?;
    let linger = Duration::from_millis(a.or("linger-ms", 500)?);
    let wait = Duration::from_secs(a.or("wait-s", 90)?);
    let s = Settings::from_args(a, a.or("depth", 256)?)?;
    let r = rc(&device, s, 0x2000)?;
    settings_line("server", s, r.mtu, "");

    let listener = TcpListener::bind(listen).ctx(&format!("bind {listen}"))?;
    println!("LISTEN {}", listener.local_addr().ctx("local_addr")?);
    let (stream, from) = listener.accept().ctx("accept")?;
    drop(listener);
    stream
        .set_read_timeout(Some(EXCHANGE_TIMEOUT))
        .ctx("timeout")?;
    let mut w = stream.try_clone().ctx("clone the stream")?;
    let mut rd = BufReader::new(stream);
    w.write_all(r.info()?.to_line().as_bytes())
        .ctx("send QP info")?;
    let peer = PeerInfo::from_line(&read_line(&mut rd, "the client's QP info")?)?;
    r.connect(&peer, s)?;
    for slot in 0..s.depth {
        let sg = [r.mr.sge(slot * SLOT, SLOT)];
        r.qp.post_recv(&RecvWr::new(slot as u64, &sg))
            .ctx("post_recv")?;
    }
    let migrated = watch_events(&r.ctx)?;
    let mut mig = MigWatch::new();
    mig.check(&r.qp)?;
    w.write_all(b"GO\n").ctx("send GO")?;
    drop((w, rd));
    println!("CONNECTED peer={from} peer_qpn={} {}", peer.qpn, unix_ns());

    let deadline = Instant::now() + wait;
    let mut buf = [WorkCompletion::EMPTY; 64];
    let mut t = Tally::default();
    while t.got < count && t.error.is_none() && Instant::now() < deadline {
        let n =
            r.cq.poll_blocking(&mut buf, Duration::from_millis(20))
                .ctx("poll")?;
        let (_, port) = mig.check(&r.qp)?;
        t.take(&r, &buf[..n], count, s.size, port)?;
    }
    let done_ns = unix_ns();
    // Anything arriving after the last message would be a duplicate; and the migration
    // event may still be on its way.
    let until = Instant::now() + linger;
    while t.error.is_none() && Instant::now() < until {
        let n =
            r.cq.poll_blocking(&mut buf, Duration::from_millis(20))
                .ctx("poll")?;
        let (_, port) = mig.check(&r.qp)?;
        t.take(&r, &buf[..n], count, s.size, port)?;
    }
    let (state, port) = mig.check(&r.qp)?;
    let c = r.ctx.counters();
    let ok = t.got == count && t.in_order && t.intact && t.extra == 0 && t.error.is_none();
    println!(
        "RESULT role=server got={} expected={count} in_order={} intact={} extra={} error={} \
         migrated={} mig_state={state:?} port={port} duplicates_seen={} acks_sent={} \
         done_ns={done_ns} ok={ok}",
        t.got,
        t.in_order,
        t.intact,
        t.extra,
        t.error.as_deref().unwrap_or("none"),
        migrated.load(Ordering::SeqCst),
        c.rx_duplicates,
        c.acks_sent,
    );
    Ok(ok)
}

/// What the server has received.
#[derive(Debug)]
struct Tally {
    got: u64,
    next: u64,
    /// Messages after the expected count (duplicates).
    extra: u64,
    in_order: bool,
    intact: bool,
    error: Option<String>,
}

impl Default for Tally {
    fn default() -> Self {
        Self {
            got: 0,
            next: 0,
            extra: 0,
            in_order: true,
            intact: true,
            error: None,
        }
    }
}

impl Tally {
    /// Checks receive completions, prints `RECV <seq> <ns> port=<port>` for each (`port`: the
    /// QP's primary port when they were polled), and posts the buffers again.
    fn take(
        &mut self,
        r: &Rc,
        wcs: &[WorkCompletion],
        count: u64,
        size: usize,
        port: u8,
    ) -> Res<()> {
        for wc in wcs {
            if wc.status != WcStatus::Success {
                self.error
                    .get_or_insert(format!("{:?}_wr_id_{}", wc.status, wc.wr_id));
                println!("ERROR {wc:?} {}", unix_ns());
                continue;
            }
            let slot = wc.wr_id as usize;
            let body = r.mr.to_vec(slot * SLOT, wc.byte_len as usize).ctx("read")?;
            let sg = [r.mr.sge(slot * SLOT, SLOT)];
            r.qp.post_recv(&RecvWr::new(slot as u64, &sg))
                .ctx("post_recv")?;
            let seq = body
                .get(..SEQ_LEN)
                .and_then(|b| b.try_into().ok())
                .map_or(u64::MAX, u64::from_be_bytes);
            println!("RECV {seq} {} port={port}", unix_ns());
            self.intact &= body == payload(seq, size);
            if self.got >= count {
                self.extra += 1;
            } else {
                self.in_order &= seq == self.next;
                self.next = seq.wrapping_add(1);
                self.got += 1;
            }
        }
        Ok(())
    }
}

/// `apm-client`.
pub(crate) fn client(a: &Args) -> Res<bool> {
    a.only(&[
        "device",
        "connect",
        "count",
        "size",
        "pace-us",
        "max-outstanding",
        "ack-timeout",
        "retry-cnt",
        "linger-ms",
        "wait-s",
    ])?;
    let device: String = a.req("device")?;
    let target: SocketAddr = a.req("connect")?;
    let count: u64 = a.req("count")?;
    let pace = Duration::from_micros(a.or("pace-us", 1000)?);
    let max_out: u64 = a.or("max-outstanding", 16)?;
    let linger = Duration::from_millis(a.or("linger-ms", 500)?);
    let wait = Duration::from_secs(a.or("wait-s", 90)?);
    if max_out == 0 {
        return Err("--max-outstanding must be at least 1".into());
    }
    let s = Settings::from_args(a, max_out as usize)?;
    let r = rc(&device, s, 0x1000)?;
    settings_line(
        "client",
        s,
        r.mtu,
        &format!(" pace_us={} max_outstanding={max_out}", pace.as_micros()),
    );

    let stream = TcpStream::connect_timeout(&target, EXCHANGE_TIMEOUT)
        .ctx(&format!("connect to {target}"))?;
    stream
        .set_read_timeout(Some(EXCHANGE_TIMEOUT))
        .ctx("timeout")?;
    let mut w = stream.try_clone().ctx("clone the stream")?;
    let mut rd = BufReader::new(stream);
    let peer = PeerInfo::from_line(&read_line(&mut rd, "the server's QP info")?)?;
    w.write_all(r.info()?.to_line().as_bytes())
        .ctx("send QP info")?;
    r.connect(&peer, s)?;
    let migrated = watch_events(&r.ctx)?;
    let mut mig = MigWatch::new();
    mig.check(&r.qp)?;
    let go = read_line(&mut rd, "GO")?;
    if go != "GO" {
        return Err(format!("expected GO from the server, got {go:?}"));
    }
    drop((w, rd));
    println!("CONNECTED peer_qpn={} {}", peer.qpn, unix_ns());

    let start = Instant::now();
    let deadline = start + wait;
    let mut buf = [WorkCompletion::EMPTY; 64];
    let (mut posted, mut done) = (0u64, 0u64);
    let mut error = None;
    while done < count && error.is_none() && Instant::now() < deadline {
        // Post what is due, at most `max_out` outstanding.
        while posted < count
            && posted - done < max_out
            && start + pace * posted as u32 <= Instant::now()
        {
            let slot = (posted % max_out) as usize;
            r.mr.write(slot * SLOT, &payload(posted, s.size))
                .ctx("write")?;
            let sg = [r.mr.sge(slot * SLOT, s.size)];
            r.qp.post_send(&SendWr::send(posted, &sg).signaled())
                .ctx("post_send")?;
            posted += 1;
        }
        let wait = if posted < count && posted - done < max_out {
            (start + pace * posted as u32).saturating_duration_since(Instant::now())
        } else {
            Duration::from_millis(20)
        };
        let n =
            r.cq.poll_blocking(&mut buf, wait.min(Duration::from_millis(20)))
                .ctx("poll")?;
        for wc in &buf[..n] {
            if wc.status != WcStatus::Success || wc.wr_id != done {
                error.get_or_insert(format!(
                    "{:?}_wr_id_{}_expected_{done}",
                    wc.status, wc.wr_id
                ));
                println!("ERROR {wc:?} {}", unix_ns());
                continue;
            }
            done += 1;
        }
        mig.check(&r.qp)?;
    }
    let done_ns = unix_ns();
    let until = Instant::now() + linger;
    while Instant::now() < until && !migrated.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(10));
        mig.check(&r.qp)?;
    }
    let (state, port) = mig.check(&r.qp)?;
    let c = r.ctx.counters();
    let ok = done == count && error.is_none();
    println!(
        "RESULT role=client sent={posted} completed={done} expected={count} error={} \
         migrated={} mig_state={state:?} port={port} retransmits={} ack_timeouts={} \
         tx_errors={} elapsed_ms={} done_ns={done_ns} ok={ok}",
        error.as_deref().unwrap_or("none"),
        migrated.load(Ordering::SeqCst),
        c.retransmits,
        c.ack_timeouts,
        r.ctx.tx_errors(),
        start.elapsed().as_millis(),
    );
    Ok(ok)
}
