//! The hosting side of a shared XRC domain: a thread accepting members, a thread per member
//! serving its requests on the host's NIC, and the forwarding of completions and events for
//! members' objects (called from the driver's flush, in NIC order).

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;
use socket2::Socket;

use super::proto::{self, Frame, Push, Reply, Request};
use crate::mem::RegisteredMemory;
use crate::soft::driver::{Shared, sys};
use crate::soft::engine::{AsyncEvent, QpConfig};
use crate::types::{QpCap, QpType, Qpn, WorkCompletion};
use crate::wr::RecvWr;

/// How long a push to a member may block before the member is dropped as stuck.
const PUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// A target QP members use, and who has it open.
#[derive(Debug, Default)]
struct Target {
    openers: Vec<u64>,
    /// Created through a member (destroyed when the last opener closes it), not by the
    /// host's own application.
    member_created: bool,
}

/// What forwarding needs, shared by all member threads.
#[derive(Debug, Default)]
struct Routes {
    /// Host CQ -> (member, the member's CQ).
    cqs: HashMap<u32, (u64, u32)>,
    /// XRC SRQ -> member.
    srqs: HashMap<u32, u64>,
    targets: HashMap<Qpn, Target>,
    socks: HashMap<u64, Arc<Socket>>,
}

/// A hosted shared domain.
#[derive(Debug)]
pub(crate) struct Host {
    dev: Weak<Shared>,
    name: Vec<u8>,
    xrcd: u32,
    /// The PD target QPs are created in (a target uses the PD of the SRQ each message
    /// names, so this one only satisfies the QP's creation).
    target_pd: u32,
    listener: Socket,
    /// The domain file, open while the domain lives (see `socket_name`).
    _file: std::fs::File,
    routes: Mutex<Routes>,
    stopped: AtomicBool,
    next_member: AtomicU64,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// One member's objects, kept by its thread.
#[derive(Debug, Default)]
struct Objects {
    /// Member PD -> host PD.
    pds: HashMap<u32, u32>,
    /// Member CQ -> host (forwarding) CQ.
    cqs: HashMap<u32, u32>,
    mrs: HashMap<u32, Arc<RegisteredMemory>>,
    srqs: HashSet<u32>,
    targets: HashSet<Qpn>,
}

impl Host {
    /// Starts hosting on the bound, listening socket.
    pub(crate) fn start(
        dev: &Arc<Shared>,
        listener: Socket,
        name: Vec<u8>,
        file: std::fs::File,
    ) -> Result<Arc<Self>, crate::error::VerbsError> {
        let (xrcd, target_pd) = dev.with_nic(|n, _| (n.alloc_xrcd(), n.alloc_pd()));
        let host = Arc::new(Self {
            dev: Arc::downgrade(dev),
            name,
            xrcd,
            target_pd,
            listener,
            _file: file,
            routes: Mutex::new(Routes::default()),
            stopped: AtomicBool::new(false),
            next_member: AtomicU64::new(1),
            threads: Mutex::new(Vec::new()),
        });
        let h = host.clone();
        let t = std::thread::Builder::new()
            .name("rdmx-xrcd-host".into())
            .spawn(move || h.accept_loop())
            .map_err(|error| crate::error::VerbsError::Io {
                op: "spawn the XRC domain host thread",
                error,
            })?;
        host.threads.lock().push(t);
        tracing::debug!(xrcd, "hosting a shared XRC domain");
        Ok(host)
    }

    pub(crate) fn name(&self) -> &[u8] {
        &self.name
    }

    pub(crate) fn xrcd(&self) -> u32 {
        self.xrcd
    }

    /// Stops accepting and serving; members see the socket close.
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        let _ = self.listener.shutdown(Shutdown::Both);
        for s in self.routes.lock().socks.values() {
            let _ = s.shutdown(Shutdown::Both);
        }
        let me = std::thread::current().id();
        for t in self.threads.lock().drain(..) {
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
    }

    fn accept_loop(self: Arc<Self>) {
        while !self.stopped.load(Ordering::Relaxed) {
            let s = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) => {
                    if self.stopped.load(Ordering::Relaxed) {
                        break;
                    }
                    tracing::warn!("XRC domain host: accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            let id = self.next_member.fetch_add(1, Ordering::Relaxed);
            let h = self.clone();
            match std::thread::Builder::new()
                .name(format!("rdmx-xrcd-member-{id}"))
                .spawn(move || h.serve(id, s))
            {
                Ok(t) => {
                    let mut ts = self.threads.lock();
                    ts.retain(|t| !t.is_finished());
                    ts.push(t);
                }
                Err(e) => tracing::warn!("XRC domain host: cannot serve a member: {e}"),
            }
        }
    }

    /// Serves one member until it disconnects, then removes everything it had.
    fn serve(self: Arc<Self>, id: u64, sock: Socket) {
        let pid = match sys::peer_pid(std::os::fd::AsRawFd::as_raw_fd(&sock)) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("XRC domain host: no peer credentials: {e}");
                return;
            }
        };
        let _ = sock.set_write_timeout(Some(PUSH_TIMEOUT));
        let sock = Arc::new(sock);
        self.routes.lock().socks.insert(id, sock.clone());
        let mut objs = Objects::default();
        let mut buf = vec![0u8; proto::MAX_FRAME];
        let mut greeted = false;
        loop {
            let n = match (&*sock).read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let Some(Frame::Request(req)) = Frame::decode(&buf[..n]) else {
                tracing::warn!(
                    member = id,
                    "XRC domain host: malformed frame; member dropped"
                );
                break;
            };
            let hello = matches!(req, Request::Hello { .. });
            if hello == greeted {
                tracing::warn!(member = id, "XRC domain host: protocol order violated");
                break;
            }
            let Some(dev) = self.dev.upgrade() else {
                break;
            };
            let reply = match req {
                Request::Hello { version } if version == proto::VERSION => {
                    greeted = true;
                    Reply::Welcome {
                        xrcd: self.xrcd,
                        ports: dev.addrs().to_vec(),
                    }
                }
                Request::Hello { version } => Reply::Failed {
                    kind: 0,
                    text: format!(
                        "protocol version {version}, the host speaks {}",
                        proto::VERSION
                    ),
                },
                other => self.handle(&dev, id, pid, &mut objs, other),
            };
            let failed_hello = !greeted;
            if (&*sock).write(&Frame::Reply(reply).encode()).is_err() || failed_hello {
                break;
            }
        }
        let _ = sock.shutdown(Shutdown::Both);
        self.routes.lock().socks.remove(&id);
        if let Some(dev) = self.dev.upgrade() {
            self.cleanup(&dev, id, objs);
        }
        tracing::debug!(member = id, pid, "XRC domain member left");
    }

    fn handle(
        &self,
        dev: &Shared,
        id: u64,
        pid: libc::pid_t,
        objs: &mut Objects,
        req: Request,
    ) -> Reply {
        match req {
            Request::Hello { .. } => Reply::Missing,
            Request::RegMr {
                key,
                pd,
                addr,
                len,
                access,
            } => {
                let Some(mem) = usize::try_from(len)
                    .ok()
                    .and_then(|l| RegisteredMemory::foreign(pid, addr, l))
                else {
                    return Reply::failed(&crate::error::VerbsError::InvalidArgument(
                        "memory region address or length".into(),
                    ));
                };
                let mem = Arc::new(mem);
                let hpd = self.pd_of(dev, objs, pd);
                let m = mem.clone();
                if dev.with_nic(|n, _| n.reg_mr_with_key(hpd, m, access, key)) {
                    objs.mrs.insert(key, mem);
                    Reply::Value(1)
                } else {
                    Reply::Value(0)
                }
            }
            Request::DeregMr { key } => {
                if let Some(mem) = objs.mrs.remove(&key) {
                    dev.with_nic(|n, _| {
                        mem.revoke();
                        n.dereg_mr(key)
                    });
                }
                Reply::Value(0)
            }
            Request::CreateSrq {
                pd,
                cq,
                max_wr,
                max_sge,
            } => {
                let hpd = self.pd_of(dev, objs, pd);
                let hcq = match objs.cqs.get(&cq) {
                    Some(&c) => c,
                    None => {
                        let c = dev.with_nic(|n, _| {
                            let c = n.create_cq(1);
                            n.set_forwarding(c);
                            c
                        });
                        objs.cqs.insert(cq, c);
                        self.routes.lock().cqs.insert(c, (id, cq));
                        c
                    }
                };
                let xrcd = self.xrcd;
                match dev.with_nic(|n, _| n.create_xrc_srq(hpd, xrcd, hcq, max_wr, max_sge)) {
                    Ok(srq) => {
                        objs.srqs.insert(srq);
                        self.routes.lock().srqs.insert(srq, id);
                        Reply::Value(u64::from(srq))
                    }
                    Err(e) => Reply::failed(&e),
                }
            }
            Request::DestroySrq { srq } => {
                if !objs.srqs.remove(&srq) {
                    return Reply::Missing;
                }
                self.routes.lock().srqs.remove(&srq);
                match dev.with_nic(|n, _| n.destroy_srq(srq)) {
                    Ok(()) => Reply::Value(0),
                    Err(e) => Reply::failed(&e),
                }
            }
            Request::PostSrqRecvList { srq, wrs } => {
                if !objs.srqs.contains(&srq) {
                    return Reply::PostFailedAt(0, crate::error::PostError::Destroyed);
                }
                let list: Vec<RecvWr<'_>> = wrs
                    .iter()
                    .map(|(wr_id, sges)| RecvWr {
                        wr_id: *wr_id,
                        sg_list: sges,
                    })
                    .collect();
                match dev.with_nic(|n, _| n.post_srq_recv_list(srq, &list)) {
                    Ok(()) => Reply::Value(list.len() as u64),
                    Err((i, e)) => Reply::PostFailedAt(i as u32, e),
                }
            }
            Request::ModifySrq { srq, max_wr, limit } => {
                if !objs.srqs.contains(&srq) {
                    return Reply::Missing;
                }
                match dev.with_nic(|n, _| n.modify_srq(srq, max_wr, limit)) {
                    Ok(()) => Reply::Value(0),
                    Err(e) => Reply::failed(&e),
                }
            }
            Request::QuerySrq { srq } => {
                if !objs.srqs.contains(&srq) {
                    return Reply::Missing;
                }
                dev.with_nic(|n, _| n.query_srq(srq))
                    .map_or(Reply::Missing, Reply::Srq)
            }
            Request::CreateTarget => {
                let cfg = QpConfig {
                    pd: self.target_pd,
                    qp_type: QpType::XrcRecv,
                    send_cq: 0,
                    recv_cq: 0,
                    cap: QpCap {
                        max_send_wr: 0,
                        max_recv_wr: 0,
                        ..QpCap::default()
                    },
                    sq_sig_all: false,
                    srq: None,
                    xrcd: Some(self.xrcd),
                    send_ops: crate::types::SendOps::EMPTY,
                };
                match dev.with_nic(|n, _| n.create_qp(&cfg)) {
                    Ok(qpn) => {
                        objs.targets.insert(qpn);
                        self.routes.lock().targets.insert(
                            qpn,
                            Target {
                                openers: vec![id],
                                member_created: true,
                            },
                        );
                        Reply::Value(u64::from(qpn.0))
                    }
                    Err(e) => Reply::failed(&e),
                }
            }
            Request::OpenTarget { qpn } => {
                let xrcd = self.xrcd;
                if dev.with_nic(|n, _| n.qp_xrcd(qpn)) != Some(xrcd) {
                    return Reply::Missing;
                }
                if objs.targets.insert(qpn) {
                    self.routes
                        .lock()
                        .targets
                        .entry(qpn)
                        .or_default()
                        .openers
                        .push(id);
                }
                Reply::Value(u64::from(qpn.0))
            }
            Request::ModifyQp { qpn, attr, mask } => {
                if !objs.targets.contains(&qpn) {
                    return Reply::Missing;
                }
                match dev.with_nic(|n, now| n.modify_qp(now, qpn, &attr, mask)) {
                    Ok(()) => Reply::Value(0),
                    Err(e) => Reply::failed(&e),
                }
            }
            Request::QueryQp { qpn } => {
                if !objs.targets.contains(&qpn) {
                    return Reply::Missing;
                }
                dev.with_nic(|n, _| n.query_qp(qpn))
                    .map_or(Reply::Missing, |q| Reply::Qp(Box::new(q)))
            }
            Request::CloseTarget { qpn } => {
                if !objs.targets.remove(&qpn) {
                    return Reply::Missing;
                }
                self.close_target(dev, id, qpn);
                Reply::Value(0)
            }
        }
    }

    /// The host PD standing in for the member's PD `pd`.
    fn pd_of(&self, dev: &Shared, objs: &mut Objects, pd: u32) -> u32 {
        *objs
            .pds
            .entry(pd)
            .or_insert_with(|| dev.with_nic(|n, _| n.alloc_pd()))
    }

    /// Member `id` no longer has target `qpn` open; destroys it when it was created through
    /// a member and nobody has it open any more.
    fn close_target(&self, dev: &Shared, id: u64, qpn: Qpn) {
        let destroy = {
            let mut r = self.routes.lock();
            let Some(t) = r.targets.get_mut(&qpn) else {
                return;
            };
            t.openers.retain(|&m| m != id);
            let d = t.openers.is_empty();
            let created = t.member_created;
            if d {
                r.targets.remove(&qpn);
            }
            d && created
        };
        if destroy {
            dev.with_nic(|n, _| n.destroy_qp(qpn));
        }
    }

    /// Removes everything a departed member had: its SRQs, mirrored registrations (no
    /// write reaches its memory afterwards), forwarding CQs, and its hold on targets.
    fn cleanup(&self, dev: &Shared, id: u64, objs: Objects) {
        {
            let mut r = self.routes.lock();
            for s in &objs.srqs {
                r.srqs.remove(s);
            }
            for c in objs.cqs.values() {
                r.cqs.remove(c);
            }
        }
        dev.with_nic(|n, _| {
            for &s in &objs.srqs {
                let _ = n.destroy_srq(s);
            }
            for (&k, mem) in &objs.mrs {
                mem.revoke();
                n.dereg_mr(k);
            }
            for &c in objs.cqs.values() {
                n.clear_forwarding(c);
                let _ = n.destroy_cq(c);
            }
        });
        for &q in &objs.targets {
            self.close_target(dev, id, q);
        }
    }

    /// Sends members the completions of their CQs and the events about their SRQs and
    /// targets; events about targets the host's application created stay in `events`.
    pub(crate) fn forward(
        &self,
        fwd: &[(u32, WorkCompletion, bool)],
        events: &mut Vec<AsyncEvent>,
    ) {
        let mut out: Vec<(Arc<Socket>, Vec<u8>)> = Vec::new();
        {
            let r = self.routes.lock();
            if r.socks.is_empty() {
                return;
            }
            // Per member, in order, as few frames as fit.
            let mut lists: Vec<(u64, Vec<proto::Forwarded>)> = Vec::new();
            for &(cq, wc, solicited) in fwd {
                if let Some(&(m, mcq)) = r.cqs.get(&cq) {
                    match lists
                        .iter_mut()
                        .find(|(id, l)| *id == m && l.len() < proto::MAX_COMPLETIONS)
                    {
                        Some((_, l)) => l.push((mcq, wc, solicited)),
                        None => lists.push((m, vec![(mcq, wc, solicited)])),
                    }
                }
            }
            for (m, list) in lists {
                if let Some(s) = r.socks.get(&m) {
                    out.push((s.clone(), Frame::Push(Push::Completions(list)).encode()));
                }
            }
            events.retain(|e| {
                let (members, keep): (Vec<u64>, bool) = match *e {
                    AsyncEvent::SrqLimitReached(s) | AsyncEvent::SrqError(s) => {
                        match r.srqs.get(&s) {
                            Some(&m) => (vec![m], false),
                            None => (Vec::new(), true),
                        }
                    }
                    AsyncEvent::CommEstablished(q)
                    | AsyncEvent::QpFatal(q)
                    | AsyncEvent::QpRequestError(q)
                    | AsyncEvent::QpAccessError(q)
                    | AsyncEvent::QpLastWqeReached(q)
                    | AsyncEvent::PathMigrated(q)
                    | AsyncEvent::PathMigrationError(q) => match r.targets.get(&q) {
                        Some(t) => (t.openers.clone(), !t.member_created),
                        None => (Vec::new(), true),
                    },
                    _ => (Vec::new(), true),
                };
                if proto::forwardable(e) {
                    for m in members {
                        if let Some(s) = r.socks.get(&m) {
                            out.push((s.clone(), Frame::Push(Push::Event(*e)).encode()));
                        }
                    }
                }
                keep
            });
        }
        for (s, f) in out {
            if (&*s).write(&f).is_err() {
                // A member that cannot take its completions is dropped; its thread cleans up.
                tracing::warn!("XRC domain host: a member is not reading; disconnecting it");
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}
