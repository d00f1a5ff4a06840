//! XRC domains shared between processes (`ibv_open_xrcd` with a file).
//!
//! On hardware, processes that open the same file get the same XRC domain: a target QP one
//! of them creates delivers into XRC SRQs of all of them, so a remote node needs one
//! connection per node rather than per process. The soft provider is a NIC per process,
//! so one of those NICs has to do the delivering:
//!
//! * The first process to open the file **hosts** the domain: its soft NIC owns the
//!   domain's target QPs and XRC SRQs and is where remote initiators send. It listens on an
//!   abstract Unix socket named after the file's device and inode, and keeps the file open
//!   meanwhile (as the kernel does), so that the inode cannot be reused by another file.
//! * Every later process (or another device of the same process) is a **member**: it
//!   connects to that socket. Its XRC SRQs and targets are created in the host's NIC, its
//!   memory registrations are mirrored there under the member's own keys, and the host
//!   reads and writes the member's registered memory with `process_vm_readv` /
//!   `process_vm_writev` (the soft equivalent of DMA). Receive completions and events for
//!   the member's objects are forwarded to it and injected into its own CQs, so the member
//!   polls them like any other completion.
//!
//! What differs from hardware: the domain lives as long as its host's device. When the
//! host closes its device or dies, members see `SrqError` for their XRC SRQs and
//! `QpFatal` for their targets, and the file's next opener starts a new, empty domain.
//! Reaching another process's memory needs ptrace permission over it (same user, and a
//! Yama `ptrace_scope` of 0, or root); a member allows its host explicitly with
//! `PR_SET_PTRACER` where Yama is active: that one process (from the socket's
//! `SO_PEERCRED`), or any process of the user when it is a member of domains with different
//! hosts (Yama keeps one tracer per process).

mod client;
mod host;
pub(crate) mod proto;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use socket2::{Domain, SockAddr, Socket, Type};

pub(crate) use client::Client;
pub(crate) use host::Host;

use super::driver::Shared;
use crate::error::VerbsError;
use crate::types::WorkCompletion;
use crate::vocab::AsyncEvent;

/// The shared domains a device hosts or is a member of.
#[derive(Debug, Default)]
pub(crate) struct Links {
    hosts: Mutex<Vec<Arc<Host>>>,
    clients: Mutex<Vec<Weak<Client>>>,
    hosting: std::sync::atomic::AtomicBool,
    /// True once the device joined a domain as a member (it may have frames to read).
    member: std::sync::atomic::AtomicBool,
}

impl Links {
    /// True once the device hosts a shared domain (completions may need forwarding).
    pub(crate) fn hosting(&self) -> bool {
        self.hosting.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Hands forwarded completions and the events about members' objects to the hosts.
    pub(crate) fn forward(
        &self,
        fwd: &mut Vec<(u32, WorkCompletion, bool)>,
        events: &mut Vec<AsyncEvent>,
    ) {
        let hosts = self.hosts.lock().clone();
        for h in hosts {
            h.forward(fwd, events);
        }
        fwd.clear();
    }

    /// Reads what the hosts of the domains this device is a member of sent, on the calling
    /// (busy-polling) thread. Returns the frames dispatched.
    /// Whether this device is a member of a shared XRC domain (reader threads then carry
    /// its member links while nobody polls).
    pub(crate) fn is_member(&self) -> bool {
        self.member.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn poll_members(&self) -> usize {
        if !self.member.load(std::sync::atomic::Ordering::Relaxed) {
            return 0;
        }
        self.clients().iter().map(|c| c.poll()).sum()
    }

    /// An application thread stopped polling: the member links' reader threads take over
    /// reading from their hosts.
    pub(crate) fn wake_members(&self) {
        if !self.member.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        for c in self.clients() {
            c.wake_reader();
        }
    }

    /// The live member links.
    pub(crate) fn clients(&self) -> Vec<Arc<Client>> {
        let mut v = self.clients.lock();
        v.retain(|w| w.strong_count() > 0);
        v.iter().filter_map(Weak::upgrade).collect()
    }

    /// Stops hosting (the device is closing).
    pub(crate) fn shutdown(&self) {
        for h in self.hosts.lock().drain(..) {
            h.stop();
        }
    }
}

/// How a device is attached to a shared domain.
#[derive(Debug, Clone)]
pub(crate) enum Attached {
    /// This device hosts the domain, whose handle in its NIC is the value.
    Host(u32),
    /// This device is a member through the link.
    Member(Arc<Client>),
}

/// The abstract socket name for the domain file at `path` (created if missing), and the
/// open file. A host keeps the file open for as long as it serves the domain, as the kernel
/// does for an XRC domain: the inode cannot be freed and reused by another file meanwhile,
/// so a file deleted and created again names a new domain, never the old one.
fn socket_name(path: &Path) -> Result<(Vec<u8>, std::fs::File), VerbsError> {
    let io = |op| move |error| VerbsError::Io { op, error };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(io("open XRC domain file"))?;
    let m = f.metadata().map_err(io("stat XRC domain file"))?;
    Ok((
        format!("\0rdmx-xrcd-{:x}-{:x}", m.dev(), m.ino()).into_bytes(),
        f,
    ))
}

/// Opens the shared domain of the file at `path` on device `dev`: hosts it if nobody does
/// yet, joins it otherwise.
pub(crate) fn open(dev: &Arc<Shared>, path: &Path) -> Result<Attached, VerbsError> {
    let (name, file) = socket_name(path)?;
    let io = |op| move |error| VerbsError::Io { op, error };
    let addr = SockAddr::unix(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&name))
        .map_err(io("XRC domain socket name"))?;
    // Already attached through this device?
    for h in dev.xrc_links().hosts.lock().iter() {
        if h.name() == name.as_slice() {
            return Ok(Attached::Host(h.xrcd()));
        }
    }
    for c in dev.xrc_links().clients() {
        if c.name() == name.as_slice() && !c.is_gone() {
            return Ok(Attached::Member(c));
        }
    }
    let mut last = None;
    for _ in 0..5 {
        let s = Socket::new(Domain::UNIX, Type::SEQPACKET.cloexec(), None)
            .map_err(io("XRC domain socket"))?;
        match s.bind(&addr) {
            Ok(()) => {
                s.listen(64)
                    .map_err(io("listen on the XRC domain socket"))?;
                let host = Host::start(dev, s, name, file)?;
                let xrcd = host.xrcd();
                let links = dev.xrc_links();
                links.hosts.lock().push(host);
                links
                    .hosting
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                return Ok(Attached::Host(xrcd));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {}
            Err(e) => return Err(io("bind the XRC domain socket")(e)),
        }
        let c = Socket::new(Domain::UNIX, Type::SEQPACKET.cloexec(), None)
            .map_err(io("XRC domain socket"))?;
        match c.connect(&addr) {
            Ok(()) => {
                let client = Client::join(dev, c, name)?;
                let links = dev.xrc_links();
                links.clients.lock().push(Arc::downgrade(&client));
                links
                    .member
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                return Ok(Attached::Member(client));
            }
            // The host went away between the two calls: try to become the host.
            Err(e) => last = Some(e),
        }
    }
    Err(VerbsError::Io {
        op: "join the shared XRC domain",
        error: last.unwrap_or_else(|| std::io::Error::other("no host")),
    })
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::time::Duration;

    use super::*;
    use crate::soft::xrcd::proto::{Frame, Reply, Request};

    fn raw_member(path: &Path) -> Socket {
        let (name, _file) = socket_name(path).unwrap();
        let addr =
            SockAddr::unix(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&name))
                .unwrap();
        let s = Socket::new(Domain::UNIX, Type::SEQPACKET, None).unwrap();
        s.connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }

    /// Reads until the host closes the connection; returns the frames it sent first.
    fn until_closed(s: &Socket) -> Vec<Option<Frame>> {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match (&*s).read(&mut buf) {
                Ok(0) => return got,
                Ok(n) => got.push(Frame::decode(&buf[..n])),
                Err(e) => panic!("the host neither answered nor closed: {e}"),
            }
        }
    }

    /// A process that connects to a domain's socket and misbehaves is dropped; the host and
    /// its well-behaved members carry on.
    #[test]
    fn a_misbehaving_member_is_dropped_and_others_carry_on() {
        let path = std::env::temp_dir().join(format!("rdmx-xrcd-hostile-{}", std::process::id()));
        let host = crate::Device::open("soft:127.0.0.1").unwrap();
        let xrcd = host.open_xrcd_file(&path).unwrap();
        assert!(!xrcd.is_remote());

        // Garbage instead of a frame.
        let s = raw_member(&path);
        (&s).write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        assert!(until_closed(&s).is_empty());

        // A request before the greeting.
        let s = raw_member(&path);
        (&s).write_all(&Frame::Request(Request::CreateTarget).encode())
            .unwrap();
        assert!(until_closed(&s).is_empty());

        // Another protocol version: told why, then closed.
        let s = raw_member(&path);
        (&s).write_all(&Frame::Request(Request::Hello { version: 99 }).encode())
            .unwrap();
        let got = until_closed(&s);
        assert!(
            matches!(&got[..], [Some(Frame::Reply(Reply::Failed { text, .. }))] if text.contains("99")),
            "{got:?}"
        );

        // Greeted, then asking for objects that are not its own.
        let s = raw_member(&path);
        (&s).write_all(
            &Frame::Request(Request::Hello {
                version: proto::VERSION,
            })
            .encode(),
        )
        .unwrap();
        let mut buf = [0u8; 4096];
        let n = (&s).read(&mut buf).unwrap();
        assert!(matches!(
            Frame::decode(&buf[..n]),
            Some(Frame::Reply(Reply::Welcome { .. }))
        ));
        for req in [
            Request::DestroySrq { srq: 1 },
            Request::QuerySrq { srq: 1 },
            Request::ModifyQp {
                qpn: crate::types::Qpn(1),
                attr: Box::default(),
                mask: crate::types::QpAttrMask::STATE,
            },
            Request::DeregMr { key: 1 },
        ] {
            (&s).write_all(&Frame::Request(req).encode()).unwrap();
            let n = (&s).read(&mut buf).unwrap();
            let reply = Frame::decode(&buf[..n]);
            assert!(
                matches!(reply, Some(Frame::Reply(Reply::Missing | Reply::Value(0)))),
                "{reply:?}"
            );
        }
        drop(s);

        // A well-behaved member still joins and works.
        let member = crate::Device::open("soft:127.0.0.1").unwrap();
        let m = member.open_xrcd_file(&path).unwrap();
        assert!(m.is_remote());
        let pd = member.alloc_pd().unwrap();
        let cq = member.create_cq(16, None).unwrap();
        let srq = pd
            .create_xrc_srq(&m, &cq, &crate::srq::SrqInitAttr::default())
            .unwrap();
        assert_eq!(srq.query().unwrap().posted, Some(0));
        let _ = std::fs::remove_file(&path);
    }
}
