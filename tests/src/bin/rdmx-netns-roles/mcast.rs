//! UD multicast roles: a group member that receives numbered datagrams, and a sender that is
//! not a member.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use rdmx::verbs::ah::{GRH_LEN, grh_destination};
use rdmx::verbs::{
    AccessFlags, AhAttr, CompletionQueue, Context, Device, Gid, MemoryRegion, ProtectionDomain,
    QpAttr, QpAttrMask as M, QpInitAttr, QpState, Qpn, QueuePair, RecvWr, SendWr, WcStatus,
    WorkCompletion,
};

use crate::{Args, Ctx, Res, unix_ns};

/// Bytes per receive buffer: the GRH and a datagram of up to one (1024-byte) path MTU.
const SLOT: usize = 2048;
/// Bytes of the sequence number at the start of every datagram.
const SEQ_LEN: usize = 8;

/// A UD queue pair with its resources.
pub(crate) struct Ud {
    ctx: Context,
    pub(crate) pd: ProtectionDomain,
    pub(crate) cq: CompletionQueue,
    pub(crate) qp: QueuePair,
    pub(crate) mr: MemoryRegion,
}

/// Opens `device` and brings a UD QP with `depth` send and receive entries to RTS.
pub(crate) fn ud(device: &str, qkey: u32, depth: usize) -> Res<Ud> {
    let ctx = Device::open(device).ctx(&format!("open {device}"))?;
    let pd = ctx.alloc_pd().ctx("alloc_pd")?;
    let cq = ctx.create_cq(2 * depth + 16, None).ctx("create_cq")?;
    let mut a = QpInitAttr::ud(&cq, &cq);
    a.cap.max_recv_wr = depth as u32;
    a.cap.max_send_wr = depth as u32;
    let qp = pd.create_qp(&a).ctx("create UD QP")?;
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qkey,
        ..QpAttr::default()
    };
    qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)
        .ctx("UD QP to INIT")?;
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ..QpAttr::default()
    };
    qp.modify(&rtr, M::STATE).ctx("UD QP to RTR")?;
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: 1,
        ..QpAttr::default()
    };
    qp.modify(&rts, M::STATE | M::SQ_PSN).ctx("UD QP to RTS")?;
    let mr = pd
        .reg_mr(depth * SLOT, AccessFlags::LOCAL_WRITE)
        .ctx("reg_mr")?;
    Ok(Ud {
        ctx,
        pd,
        cq,
        qp,
        mr,
    })
}

/// The payload of datagram `seq`: the number, then a pattern derived from it.
fn payload(seq: u64, size: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..size).map(|i| (seq as usize + i) as u8).collect();
    v[..SEQ_LEN].copy_from_slice(&seq.to_be_bytes());
    v
}

/// What one receive completion held.
struct Datagram {
    seq: u64,
    intact: bool,
}

impl Ud {
    fn post_slot(&self, slot: usize) -> Res<()> {
        let s = [self.mr.sge(slot * SLOT, SLOT)];
        self.qp
            .post_recv(&RecvWr::new(slot as u64, &s))
            .ctx("post_recv")
    }

    /// Checks a receive completion, reads its datagram, and posts its buffer again.
    fn take(&self, wc: &WorkCompletion, group: Ipv4Addr) -> Res<Datagram> {
        if wc.status != WcStatus::Success {
            return Err(format!("receive completed with {:?}: {wc:?}", wc.status));
        }
        let slot = wc.wr_id as usize;
        let len = (wc.byte_len as usize)
            .checked_sub(GRH_LEN)
            .filter(|&l| l >= SEQ_LEN)
            .ok_or_else(|| format!("datagram too short: {wc:?}"))?;
        let grh = self.mr.to_vec(slot * SLOT, GRH_LEN).ctx("read GRH")?;
        let body = self.mr.to_vec(slot * SLOT + GRH_LEN, len).ctx("read")?;
        self.post_slot(slot)?;
        let seq = u64::from_be_bytes(body[..SEQ_LEN].try_into().unwrap_or_default());
        let to_group = grh_destination(&grh) == Some(IpAddr::V4(group));
        Ok(Datagram {
            seq,
            intact: to_group && body == payload(seq, len),
        })
    }
}

/// `mcast-recv`.
pub(crate) fn recv(a: &Args) -> Res<bool> {
    a.only(&[
        "device",
        "group",
        "count",
        "qkey",
        "first",
        "detach-after",
        "grace-ms",
        "wait-s",
    ])?;
    let device: String = a.req("device")?;
    let group: Ipv4Addr = a.req("group")?;
    let count: u64 = a.req("count")?;
    let qkey = a.u32_any("qkey")?;
    let first: u64 = a.or("first", 0)?;
    let detach_after: Option<u64> = a.opt("detach-after")?;
    let grace = Duration::from_millis(a.or("grace-ms", 2000)?);
    let wait = Duration::from_secs(a.or("wait-s", 60)?);
    if !group.is_multicast() {
        return Err(format!("--group {group} is not a multicast address"));
    }
    let expect = detach_after.map_or(count, |k| k.min(count));
    let depth = (count as usize + 16).min(4096);
    let u = ud(&device, qkey, depth)?;
    for slot in 0..depth {
        u.post_slot(slot)?;
    }
    let gid = Gid::from(group);
    u.qp.attach_mcast(gid, 0).ctx("attach_mcast")?;
    println!(
        "READY qpn={} group={group} port={} {}",
        u.qp.qp_num().0,
        u.ctx.port_addr(1).ctx("port_addr")?,
        unix_ns()
    );
    let deadline = Instant::now() + wait;
    let mut seqs = Vec::new();
    let mut intact = true;
    // Source QPs seen (one per sender process).
    let mut srcs: Vec<Qpn> = Vec::new();
    let mut last_ns = 0;
    let mut buf = [WorkCompletion::EMPTY; 32];
    while (seqs.len() as u64) < expect && Instant::now() < deadline {
        let left = deadline.saturating_duration_since(Instant::now());
        let n =
            u.cq.poll_blocking(&mut buf, left.min(Duration::from_millis(100)))
                .ctx("poll")?;
        for wc in &buf[..n] {
            let d = u.take(wc, group)?;
            last_ns = unix_ns();
            println!("RECV {} {last_ns}", d.seq);
            intact &= d.intact;
            if !srcs.contains(&wc.src_qp) {
                srcs.push(wc.src_qp);
            }
            seqs.push(d.seq);
        }
    }
    let mut late = 0u64;
    let mut detached = false;
    if detach_after.is_some() && seqs.len() as u64 == expect {
        u.qp.detach_mcast(gid, 0).ctx("detach_mcast")?;
        detached = true;
        println!("DETACHED {}", unix_ns());
        let until = Instant::now() + grace;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let n = u.cq.poll_blocking(&mut buf, left).ctx("poll")?;
            for wc in &buf[..n] {
                let d = u.take(wc, group)?;
                println!("LATE {} {}", d.seq, unix_ns());
                late += 1;
            }
        }
    }
    let got = seqs.len() as u64;
    let in_order = seqs.iter().copied().eq(first..first + got);
    let ok = got == expect && in_order && intact && late == 0;
    let c = u.ctx.counters();
    println!(
        "RESULT got={got} expected={expect} seqs_ok={in_order} intact={intact} \
         senders={} detached={detached} late={late} last_ns={last_ns} \
         end_ns={} rx_no_recv={} rx_qkey_violations={} ok={ok}",
        srcs.len(),
        unix_ns(),
        c.rx_no_recv,
        c.rx_qkey_violations
    );
    if !in_order {
        eprintln!("sequence numbers received: {seqs:?}");
    }
    Ok(ok)
}

/// `mcast-send`.
pub(crate) fn send(a: &Args) -> Res<bool> {
    a.only(&[
        "device", "group", "count", "qkey", "first", "pace-us", "size",
    ])?;
    let device: String = a.req("device")?;
    let group: Ipv4Addr = a.req("group")?;
    let count: u64 = a.req("count")?;
    let qkey = a.u32_any("qkey")?;
    let first: u64 = a.or("first", 0)?;
    let pace = Duration::from_micros(a.or("pace-us", 200)?);
    let size: usize = a.or("size", 64)?;
    if !group.is_multicast() {
        return Err(format!("--group {group} is not a multicast address"));
    }
    let depth = 64;
    let u = ud(&device, qkey, depth)?;
    let mtu = u.ctx.query_port(1).ctx("query_port")?.active_mtu.bytes();
    if !(SEQ_LEN..=mtu).contains(&size) {
        return Err(format!(
            "--size {size} must be {SEQ_LEN}..={mtu} (the port's MTU)"
        ));
    }
    let ah =
        u.pd.create_ah(&AhAttr::new(Gid::from(group)))
            .ctx("create_ah")?;
    let mut buf = [WorkCompletion::EMPTY; 64];
    let (mut posted, mut done) = (0u64, 0u64);
    let start = Instant::now();
    let reap = |done: &mut u64, wait: Duration, buf: &mut [WorkCompletion]| -> Res<()> {
        let n = u.cq.poll_blocking(buf, wait).ctx("poll")?;
        for wc in &buf[..n] {
            if wc.status != WcStatus::Success {
                return Err(format!("send completed with {:?}: {wc:?}", wc.status));
            }
            *done += 1;
        }
        Ok(())
    };
    while posted < count {
        // A steady pace (UD has no flow control: do not overrun the receivers).
        let at = start + pace * posted as u32;
        let now = Instant::now();
        if at > now {
            std::thread::sleep(at - now);
        }
        while posted - done >= depth as u64 {
            reap(&mut done, Duration::from_millis(100), &mut buf)?;
        }
        let seq = first + posted;
        let slot = (posted % depth as u64) as usize;
        u.mr.write(slot * SLOT, &payload(seq, size)).ctx("write")?;
        let s = [u.mr.sge(slot * SLOT, size)];
        let wr = SendWr::send(seq, &s)
            .signaled()
            .to(&ah, Qpn::MULTICAST, qkey);
        u.qp.post_send(&wr).ctx("post_send")?;
        posted += 1;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while done < posted && Instant::now() < deadline {
        reap(&mut done, Duration::from_millis(100), &mut buf)?;
    }
    println!(
        "RESULT sent={posted} completed={done} first={first} elapsed_us={} {}",
        start.elapsed().as_micros(),
        unix_ns()
    );
    Ok(done == posted)
}
