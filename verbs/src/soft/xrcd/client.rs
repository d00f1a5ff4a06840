//! The member side of a shared XRC domain: requests to the host (one at a time, answered in
//! order), a reader thread that injects forwarded completions and events into the member's
//! own NIC, and the provider interface for the member's XRC SRQs and target QPs, which live
//! in the host's NIC.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use socket2::Socket;

use super::proto::{self, Frame, Push, Reply, Request};
use crate::error::{PostError, VerbsError};
use crate::mem::RegisteredMemory;
use crate::provider::Provider;
use crate::soft::driver::sys::{self, EventFd};
use crate::soft::driver::{ChannelInner, Shared};
use crate::types::{
    AccessFlags, DeviceAttr, Gid, PortAttr, QpAttr, QpAttrMask, QpCap, QpType, Qpn, WorkCompletion,
};
use crate::vocab::{AsyncEvent, QpConfig, SrqState};
use crate::wr::{RecvWr, SendWr};

/// How long a request may wait for the host's answer.
const RPC_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a request polls for the host's answer itself before it waits for the reader
/// thread to hand the answer over.
const RPC_SPIN: Duration = Duration::from_micros(50);

/// A member's link to the host of a shared domain.
#[derive(Debug)]
pub(crate) struct Client {
    dev: Arc<Shared>,
    name: Vec<u8>,
    sock: Socket,
    /// One request in flight at a time.
    rpc: Mutex<()>,
    /// Wakes the reader thread when the device's polling application thread goes to sleep.
    wake: EventFd,
    /// Held while frames are read and dispatched (by the reader thread, or by a thread
    /// busy-polling the member's device), so forwarded completions keep their order; holds
    /// the receive buffer.
    rx: Mutex<Vec<u8>>,
    reply: Mutex<Option<Reply>>,
    replied: Condvar,
    gone: AtomicBool,
    xrcd: u32,
    ports: Vec<SocketAddr>,
    /// The SRQs and targets this member has in the domain (for the events it gets when
    /// the host goes away).
    srqs: Mutex<HashSet<u32>>,
    targets: Mutex<HashSet<Qpn>>,
}

impl Drop for Client {
    fn drop(&mut self) {
        // Ends the reader thread and tells the host, which removes this member's objects.
        let _ = self.sock.shutdown(Shutdown::Both);
        self.wake.signal();
    }
}

impl Client {
    /// Greets the host over the connected socket, mirrors the device's registrations and
    /// starts the reader.
    pub(crate) fn join(
        dev: &Arc<Shared>,
        sock: Socket,
        name: Vec<u8>,
    ) -> Result<Arc<Self>, VerbsError> {
        let io = |op| move |error| VerbsError::Io { op, error };
        sys::allow_ptrace_by(sys::peer_pid(std::os::fd::AsRawFd::as_raw_fd(&sock)).ok());
        sock.set_read_timeout(Some(RPC_TIMEOUT))
            .map_err(io("XRC domain socket timeout"))?;
        (&sock)
            .write(
                &Frame::Request(Request::Hello {
                    version: proto::VERSION,
                })
                .encode(),
            )
            .map_err(io("greet the XRC domain host"))?;
        let mut buf = vec![0u8; proto::MAX_FRAME];
        let n = (&sock)
            .read(&mut buf)
            .map_err(io("hear from the XRC domain host"))?;
        let (xrcd, ports) = match Frame::decode(&buf[..n]) {
            Some(Frame::Reply(Reply::Welcome { xrcd, ports })) => (xrcd, ports),
            Some(Frame::Reply(Reply::Failed { kind, text })) => {
                return Err(Reply::into_error(kind, text));
            }
            _ => {
                return Err(VerbsError::InvalidArgument(
                    "the XRC domain host answered with something else than a welcome".into(),
                ));
            }
        };
        sock.set_read_timeout(None)
            .map_err(io("XRC domain socket timeout"))?;
        let client = Arc::new(Self {
            dev: dev.clone(),
            name,
            sock,
            rpc: Mutex::new(()),
            wake: EventFd::new().map_err(io("eventfd"))?,
            rx: Mutex::new(vec![0u8; proto::MAX_FRAME]),
            reply: Mutex::new(None),
            replied: Condvar::new(),
            gone: AtomicBool::new(false),
            xrcd,
            ports,
            srqs: Mutex::new(HashSet::new()),
            targets: Mutex::new(HashSet::new()),
        });
        let weak = Arc::downgrade(&client);
        std::thread::Builder::new()
            .name("rdmx-xrcd-member".into())
            .spawn(move || read_loop(&weak))
            .map_err(io("spawn the XRC domain reader"))?;
        for (key, pd, addr, len, access) in dev.with_nic(|n, _| n.local_mrs()) {
            if !client.mirror_mr(key, pd, addr, len, access)? {
                return Err(VerbsError::ResourceExhausted(
                    "memory key taken in the shared XRC domain",
                ));
            }
        }
        tracing::debug!(xrcd, "joined a shared XRC domain");
        Ok(client)
    }

    pub(crate) fn name(&self) -> &[u8] {
        &self.name
    }

    /// The host's handle of the domain.
    pub(crate) fn xrcd(&self) -> u32 {
        self.xrcd
    }

    /// Makes the reader thread look at the socket again.
    pub(crate) fn wake_reader(&self) {
        self.wake.signal();
    }

    /// The UDP addresses where the domain's targets receive (the host's ports).
    pub(crate) fn ports(&self) -> &[SocketAddr] {
        &self.ports
    }

    /// True once the host went away.
    pub(crate) fn is_gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    /// Sends one request and waits for its reply.
    fn call(&self, req: Request) -> Result<Reply, VerbsError> {
        let gone = || VerbsError::Io {
            op: "reach the shared XRC domain's host",
            error: std::io::Error::from(std::io::ErrorKind::NotConnected),
        };
        let _one = self.rpc.lock();
        if self.is_gone() {
            return Err(gone());
        }
        *self.reply.lock() = None;
        (&self.sock)
            .write(&Frame::Request(req).encode())
            .map_err(|_| gone())?;
        // Whoever reads the socket stores the answer in `reply`: this thread (a short spin
        // first, which saves a wake-up and a hand-over), a thread busy-polling the device,
        // or the reader thread.
        let spin_until = crate::soft::driver::clock::monotonic() + RPC_SPIN;
        let deadline = crate::soft::driver::clock::monotonic() + RPC_TIMEOUT;
        loop {
            let drained = self
                .rx
                .try_lock()
                .map(|mut buf| self.drain_frames(&mut buf));
            if matches!(drained, Some(Pumped::Closed)) {
                return Err(gone());
            }
            let mut r = self.reply.lock();
            if let Some(reply) = r.take() {
                return Ok(reply);
            }
            if self.is_gone() {
                return Err(gone());
            }
            let now = crate::soft::driver::clock::monotonic();
            if now >= deadline {
                // A late answer could be taken for the next request's: the link is given up.
                drop(r);
                let _ = self.sock.shutdown(Shutdown::Both);
                return Err(VerbsError::Io {
                    op: "wait for the shared XRC domain's host",
                    error: std::io::Error::from(std::io::ErrorKind::TimedOut),
                });
            }
            if now < spin_until {
                drop(r);
                std::hint::spin_loop();
            } else if self.dev.poller_remaining().is_some() {
                // The reader thread stays off the socket while the device is busy-polled:
                // wait for the answer on the socket itself (briefly, as a polling thread
                // may take it first and hand it over through `reply`).
                drop(r);
                let fd = std::os::fd::AsRawFd::as_raw_fd(&self.sock);
                let _ = sys::poll_readable(&[fd], Some(Duration::from_micros(200)));
            } else {
                // Woken by the reader thread when it stores the answer (under this lock,
                // so the notification cannot be missed).
                let _ = self.replied.wait_for(&mut r, Duration::from_millis(5));
            }
        }
    }

    fn value(&self, req: Request) -> Result<u64, VerbsError> {
        match self.call(req)? {
            Reply::Value(v) => Ok(v),
            Reply::Failed { kind, text } => Err(Reply::into_error(kind, text)),
            Reply::Missing => Err(VerbsError::NoSuchObject("object in the shared XRC domain")),
            _ => Err(VerbsError::InvalidArgument(
                "unexpected reply from the XRC domain host".into(),
            )),
        }
    }

    /// Mirrors one registration; false when the host already has the key.
    pub(crate) fn mirror_mr(
        &self,
        key: u32,
        pd: u32,
        addr: u64,
        len: u64,
        access: AccessFlags,
    ) -> Result<bool, VerbsError> {
        Ok(self.value(Request::RegMr {
            key,
            pd,
            addr,
            len,
            access,
        })? == 1)
    }

    /// Withdraws a mirrored registration; returns once the host no longer touches it.
    pub(crate) fn unmirror_mr(&self, key: u32) {
        let _ = self.value(Request::DeregMr { key });
    }

    /// The host went away: fails the waiting request and reports the member's objects.
    fn lost(&self) {
        self.gone.store(true, Ordering::Release);
        {
            let _r = self.reply.lock();
            self.replied.notify_all();
        }
        tracing::warn!("the shared XRC domain's host went away");
        let dev = &self.dev;
        let srqs: Vec<u32> = self.srqs.lock().iter().copied().collect();
        let qps: Vec<Qpn> = self.targets.lock().iter().copied().collect();
        dev.with_nic(|n, _| {
            for s in srqs {
                n.inject_event(AsyncEvent::SrqError(s));
            }
            for q in qps {
                n.inject_event(AsyncEvent::QpFatal(q));
            }
        });
    }
}

/// What reading the socket found.
enum Pumped {
    /// This many frames were dispatched; none is left for now.
    Frames(usize),
    /// The host closed the connection, or sent something malformed.
    Closed,
}

impl Client {
    /// Reads and dispatches every frame queued on the socket, without blocking. The caller
    /// holds `rx` (passed as `buf`).
    fn drain_frames(&self, buf: &mut [u8]) -> Pumped {
        let fd = std::os::fd::AsRawFd::as_raw_fd(&self.sock);
        let mut n = 0;
        loop {
            let len = match sys::recv_dontwait(fd, buf) {
                Ok(None) => return Pumped::Frames(n),
                Ok(Some(0)) | Err(_) => return Pumped::Closed,
                Ok(Some(len)) => len,
            };
            match Frame::decode(&buf[..len]) {
                Some(Frame::Reply(r)) => {
                    *self.reply.lock() = Some(r);
                    self.replied.notify_all();
                }
                Some(Frame::Push(Push::Completions(list))) => {
                    self.dev.with_nic(|nic, _| {
                        for (cq, wc, solicited) in list {
                            nic.inject_completion(cq, wc, solicited);
                        }
                    });
                }
                Some(Frame::Push(Push::Event(e))) => {
                    self.dev.with_nic(|nic, _| nic.inject_event(e));
                }
                _ => {
                    tracing::warn!("malformed frame from the XRC domain host; leaving the domain");
                    return Pumped::Closed;
                }
            }
            n += 1;
        }
    }

    /// Dispatches what the host sent, if no other thread is doing so: called by threads
    /// busy-polling the member's device, so that forwarded completions do not wait for the
    /// reader thread to wake up. Returns the frames dispatched.
    pub(crate) fn poll(&self) -> usize {
        let Some(mut buf) = self.rx.try_lock() else {
            return 0;
        };
        match self.drain_frames(&mut buf) {
            Pumped::Frames(n) => n,
            // The reader thread notices too and reports the loss.
            Pumped::Closed => 0,
        }
    }
}

/// Waits for the host's frames and dispatches them until the socket closes. While an
/// application thread busy-polls the member's device, that thread reads the frames
/// (`Client::poll`) and this one stays off the socket, so the host's writes wake nobody; it
/// comes back when the poller goes to sleep (`Shared::release`) or its claim runs out.
fn read_loop(client: &Weak<Client>) {
    let Some((fd, wake)) = client
        .upgrade()
        .map(|c| (std::os::fd::AsRawFd::as_raw_fd(&c.sock), c.wake.raw()))
    else {
        return;
    };
    loop {
        let Some(c) = client.upgrade() else {
            return;
        };
        let polled_elsewhere = c.dev.poller_remaining();
        drop(c);
        // The fds stay open while the client lives; once it is dropped, `upgrade` fails
        // below (its Drop shut the socket down and signalled `wake`).
        let r = match polled_elsewhere {
            Some(left) => sys::poll_readable(&[wake], Some(left)),
            None => sys::poll_readable(&[fd, wake], None),
        };
        if r.is_err() {
            std::thread::sleep(Duration::from_millis(1));
        }
        let Some(c) = client.upgrade() else {
            return;
        };
        c.wake.drain();
        if c.dev.poller_remaining().is_some() {
            continue;
        }
        let closed = {
            let mut buf = c.rx.lock();
            matches!(c.drain_frames(&mut buf), Pumped::Closed)
        };
        if closed {
            let _ = c.sock.shutdown(Shutdown::Both);
            c.lost();
            return;
        }
    }
}

const NOT_HERE: &str = "this operation on a shared XRC domain's link";

impl Provider for Client {
    fn query_device(&self) -> DeviceAttr {
        Provider::query_device(&*self.dev)
    }
    fn query_port(&self, _port: u8) -> Result<PortAttr, VerbsError> {
        Err(VerbsError::Unsupported(NOT_HERE))
    }
    fn query_gid(&self, _port: u8, _index: u32) -> Result<Gid, VerbsError> {
        Err(VerbsError::Unsupported(NOT_HERE))
    }
    fn port_addr(&self, port: u8) -> Result<SocketAddr, VerbsError> {
        usize::from(port)
            .checked_sub(1)
            .and_then(|i| self.ports.get(i))
            .copied()
            .ok_or_else(|| VerbsError::InvalidArgument(format!("port {port} does not exist")))
    }
    fn pop_event(&self) -> Option<AsyncEvent> {
        None
    }
    fn event_fd(&self) -> RawFd {
        -1
    }
    fn shutdown(&self) {}
    fn alloc_pd(&self) -> Result<u32, VerbsError> {
        Err(VerbsError::Unsupported(NOT_HERE))
    }
    fn reg_mr(
        &self,
        _pd: u32,
        _mem: &Arc<RegisteredMemory>,
        _access: AccessFlags,
    ) -> Result<(u32, u32), VerbsError> {
        Err(VerbsError::Unsupported(NOT_HERE))
    }
    fn dereg_mr(&self, _lkey: u32, _mem: &Arc<RegisteredMemory>) {}
    fn dereg_mr_checked(&self, _lkey: u32) -> Result<(), VerbsError> {
        Err(VerbsError::Unsupported(NOT_HERE))
    }
    fn create_cq(&self, _cqe: usize, _ch: &Arc<ChannelInner>) -> Result<u32, VerbsError> {
        Err(VerbsError::Unsupported(NOT_HERE))
    }
    fn destroy_cq(&self, _cq: u32) {}
    fn poll_cq(&self, _cq: u32, _wc: &mut [WorkCompletion]) -> usize {
        0
    }
    fn req_notify_cq(&self, _cq: u32, _solicited_only: bool) {}
    fn progress(&self) -> usize {
        0
    }
    fn release(&self) {}

    fn create_qp(&self, cfg: &QpConfig) -> Result<Qpn, VerbsError> {
        if cfg.qp_type != QpType::XrcRecv {
            return Err(VerbsError::Unsupported(
                "queue pairs other than XRC targets in a shared XRC domain",
            ));
        }
        let v = self.value(Request::CreateTarget)?;
        let qpn = Qpn(v as u32);
        self.targets.lock().insert(qpn);
        Ok(qpn)
    }
    fn destroy_qp(&self, qpn: Qpn) {
        self.targets.lock().remove(&qpn);
        let _ = self.value(Request::CloseTarget { qpn });
    }
    fn modify_qp(&self, qpn: Qpn, attr: &QpAttr, mask: QpAttrMask) -> Result<(), VerbsError> {
        self.value(Request::ModifyQp {
            qpn,
            attr: Box::new(*attr),
            mask,
        })
        .map(|_| ())
    }
    fn query_qp(&self, qpn: Qpn) -> Option<(QpAttr, QpCap)> {
        match self.call(Request::QueryQp { qpn }) {
            Ok(Reply::Qp(b)) => Some(*b),
            _ => None,
        }
    }
    fn post_send(&self, _qpn: Qpn, _wrs: &[SendWr<'_>]) -> Result<(), (usize, PostError)> {
        Err((
            0,
            PostError::InvalidWorkRequest("an XRC target QP has no send queue"),
        ))
    }
    fn post_recv(&self, _qpn: Qpn, _wr: &RecvWr<'_>) -> Result<(), PostError> {
        Err(PostError::InvalidWorkRequest(
            "an XRC target QP has no receive queue; post to the XRC SRQ",
        ))
    }
    fn attach_mcast(&self, _qpn: Qpn, _gid: Gid, _port: u8) -> Result<(), VerbsError> {
        Err(VerbsError::Unsupported(NOT_HERE))
    }
    fn detach_mcast(&self, _qpn: Qpn, _gid: Gid, _port: u8) -> Result<(), VerbsError> {
        Err(VerbsError::Unsupported(NOT_HERE))
    }

    fn create_srq(
        &self,
        pd: u32,
        xrc: Option<(u32, u32)>,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<u32, VerbsError> {
        let Some((_, cq)) = xrc else {
            return Err(VerbsError::Unsupported(
                "plain SRQs in a shared XRC domain (create them on the device)",
            ));
        };
        let v = self.value(Request::CreateSrq {
            pd,
            cq,
            max_wr,
            max_sge,
        })?;
        let srq = v as u32;
        self.srqs.lock().insert(srq);
        Ok(srq)
    }
    fn destroy_srq(&self, srq: u32) -> Result<(), VerbsError> {
        self.srqs.lock().remove(&srq);
        self.value(Request::DestroySrq { srq }).map(|_| ())
    }
    fn post_srq_recv(&self, srq: u32, wr: &RecvWr<'_>) -> Result<(), PostError> {
        self.post_srq_recv_list(srq, std::slice::from_ref(wr))
            .map_err(|(_, e)| e)
    }
    fn post_srq_recv_list(&self, srq: u32, wrs: &[RecvWr<'_>]) -> Result<(), (usize, PostError)> {
        // One request per frame's worth of receives.
        let mut start = 0;
        while start < wrs.len() {
            let mut end = start;
            while end < wrs.len()
                && end - start < proto::MAX_LIST
                && proto::list_frame_len(wrs[start..=end].iter().map(|w| w.sg_list.len()))
                    <= proto::MAX_FRAME
            {
                if wrs[end].sg_list.len() > proto::MAX_SGES {
                    break;
                }
                end += 1;
            }
            if end == start {
                // A receive with too many SGEs for one frame.
                return Err((
                    start,
                    PostError::TooManySge {
                        count: wrs[start].sg_list.len(),
                        max: proto::MAX_SGES as u32,
                    },
                ));
            }
            let req = Request::PostSrqRecvList {
                srq,
                wrs: wrs[start..end]
                    .iter()
                    .map(|w| (w.wr_id, w.sg_list.to_vec()))
                    .collect(),
            };
            match self.call(req) {
                Ok(Reply::Value(_)) => {}
                Ok(Reply::PostFailedAt(i, e)) => return Err((start + i as usize, e)),
                _ => return Err((start, PostError::Destroyed)),
            }
            start = end;
        }
        Ok(())
    }
    fn modify_srq(
        &self,
        srq: u32,
        max_wr: Option<u32>,
        limit: Option<u32>,
    ) -> Result<(), VerbsError> {
        self.value(Request::ModifySrq { srq, max_wr, limit })
            .map(|_| ())
    }
    fn query_srq(&self, srq: u32) -> Option<SrqState> {
        match self.call(Request::QuerySrq { srq }) {
            Ok(Reply::Srq(s)) => Some(s),
            _ => None,
        }
    }
    fn alloc_xrcd(&self) -> Result<u32, VerbsError> {
        Ok(self.xrcd)
    }
    fn xrcd_has_target(&self, _xrcd: u32, qpn: Qpn) -> Result<bool, VerbsError> {
        match self.call(Request::OpenTarget { qpn })? {
            Reply::Value(_) => Ok(true),
            Reply::Missing => Ok(false),
            Reply::Failed { kind, text } => Err(Reply::into_error(kind, text)),
            _ => Err(VerbsError::InvalidArgument(
                "unexpected reply from the XRC domain host".into(),
            )),
        }
    }
}
