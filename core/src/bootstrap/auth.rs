//! Optional authentication of the bootstrap (a shared secret: `RDMX_AUTH_KEY` or
//! `ContextBuilder::auth_key`), and the listener's guard against floods.
//!
//! With a key, the connector and the listener prove to each other that they hold it before
//! any endpoint state, queue pair or memory key exists on either side:
//!
//! ```text
//! connector                                   listener
//!   AuthHello(nonce_c)  ───────────────────▶  (a fresh nonce_l)
//!                       ◀───────────────────  AuthChallenge(nonce_l, mac_l)
//!   checks mac_l                              mac_l = HMAC(key, "rdmx listener" | nonce_c | nonce_l)
//!   AuthProof(mac_c)    ───────────────────▶  checks mac_c
//!   mac_c = HMAC(key, "rdmx connector" | nonce_l | nonce_c)
//!   Hello(info) …       (the exchange as without a key)
//! ```
//!
//! HMAC-SHA-256 with 32-byte nonces from the OS's random source; the MACs are compared in
//! constant time. Each side's MAC covers both nonces, so a recorded exchange cannot be
//! replayed, and the two labels keep one side's MAC from serving as the other's. A
//! listener with a key refuses a `Hello` that comes without the proof ("authentication
//! required"); one without a key refuses an `AuthHello` ("this listener does not
//! authenticate"); a wrong key fails on both sides with [`BootstrapError::AuthFailed`].
//! What this does not do: hide or protect what follows (the `EndpointInfo` travels in the
//! clear, and an attacker that can take over an authenticated TCP connection takes over
//! the exchange): that takes TLS, which rdmx does not implement.
//!
//! [`Gate`] bounds what one source address can make a listener do: exchanges at once and
//! failed attempts in a window, beyond which its connections are closed at once (counted).

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use parking_lot::Mutex;
use sha2::Sha256;

use super::exchange::{recv_frame, reject, send_frame};
use super::wire::{BootstrapError, Frame};

/// Length of a nonce and of a MAC.
pub const AUTH_LEN: usize = 32;
/// Shortest key accepted.
pub const MIN_KEY_LEN: usize = 16;
/// How long a listener waits for an unauthenticated peer's proof (a silent connection
/// holds one of its exchange slots no longer than this).
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(1);

type HmacSha256 = Hmac<Sha256>;

/// A shared secret. Its `Debug` shows the length only.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthKey(Arc<[u8]>);

impl AuthKey {
    /// A key of `bytes` (at least [`MIN_KEY_LEN`]).
    ///
    /// # Errors
    /// `Invalid` for a shorter key.
    pub fn new(bytes: impl AsRef<[u8]>) -> Result<Self, BootstrapError> {
        let b = bytes.as_ref();
        if b.len() < MIN_KEY_LEN {
            return Err(BootstrapError::Invalid(format!(
                "an authentication key needs at least {MIN_KEY_LEN} bytes, not {}",
                b.len()
            )));
        }
        Ok(Self(Arc::from(b)))
    }

    fn mac(&self, label: &[u8], a: &[u8; AUTH_LEN], b: &[u8; AUTH_LEN]) -> HmacSha256 {
        // (Any key length is valid for HMAC.)
        let mut m = <HmacSha256 as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        m.update(label);
        m.update(a);
        m.update(b);
        m
    }

    fn sign(&self, label: &[u8], a: &[u8; AUTH_LEN], b: &[u8; AUTH_LEN]) -> [u8; AUTH_LEN] {
        self.mac(label, a, b).finalize().into_bytes().into()
    }

    fn verify(&self, label: &[u8], a: &[u8; AUTH_LEN], b: &[u8; AUTH_LEN], tag: &[u8]) -> bool {
        self.mac(label, a, b).verify_slice(tag).is_ok()
    }
}

impl fmt::Debug for AuthKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AuthKey(<{} bytes>)", self.0.len())
    }
}

const LISTENER: &[u8] = b"rdmx listener";
const CONNECTOR: &[u8] = b"rdmx connector";

fn nonce() -> [u8; AUTH_LEN] {
    let mut n = [0u8; AUTH_LEN];
    for c in n.chunks_mut(8) {
        c.copy_from_slice(&rdmx_verbs::random_u64().to_ne_bytes());
    }
    n
}

/// The connector's side: proves the key and checks the listener's proof (nothing to do
/// without a key).
///
/// # Errors
/// [`BootstrapError::AuthFailed`] when the listener's proof is wrong; `Rejected` with the
/// listener's reason (it has no key, or found ours wrong); those of the connection.
pub fn connector(
    stream: &mut TcpStream,
    key: Option<&AuthKey>,
    deadline: Instant,
) -> Result<(), BootstrapError> {
    let Some(key) = key else {
        return Ok(());
    };
    let mine = nonce();
    send_frame(stream, &Frame::AuthHello(mine), deadline)?;
    let (theirs, proof) = match recv_frame(stream, deadline)? {
        Frame::AuthChallenge { nonce, mac } => (nonce, mac),
        Frame::Reject(reason) => return Err(BootstrapError::Rejected(reason)),
        _ => {
            return Err(BootstrapError::Unexpected(
                "wrong frame while waiting for the listener's challenge",
            ));
        }
    };
    if !key.verify(LISTENER, &mine, &theirs, &proof) {
        // Tell the listener too, so that both sides report the same thing.
        let why = "authentication failed: wrong key (the two sides hold different keys)";
        let _ = reject(stream, why, deadline);
        return Err(BootstrapError::AuthFailed(why.into()));
    }
    let mac = key.sign(CONNECTOR, &theirs, &mine);
    send_frame(stream, &Frame::AuthProof(mac), deadline)
}

/// The listener's side, before it reads the `Hello`: with a key, the challenge (within
/// [`AUTH_TIMEOUT`]); a peer that fails it is told why and refused.
///
/// # Errors
/// [`BootstrapError::AuthFailed`] for a wrong key, no proof, or a peer that does not hold
/// ours; those of the connection.
pub fn listener(
    stream: &mut TcpStream,
    key: Option<&AuthKey>,
    deadline: Instant,
) -> Result<(), BootstrapError> {
    let Some(key) = key else {
        return Ok(());
    };
    let by = deadline.min(Instant::now() + AUTH_TIMEOUT);
    let refuse = |stream: &mut TcpStream, why: &str| {
        let _ = reject(stream, why, by);
        Err(BootstrapError::AuthFailed(why.into()))
    };
    let theirs = match recv_frame(stream, by)? {
        Frame::AuthHello(n) => n,
        Frame::Hello(_) => {
            return refuse(
                stream,
                "this listener requires authentication (RDMX_AUTH_KEY); the peer has no key",
            );
        }
        _ => return refuse(stream, "unexpected frame before authentication"),
    };
    let mine = nonce();
    let mac = key.sign(LISTENER, &theirs, &mine);
    send_frame(stream, &Frame::AuthChallenge { nonce: mine, mac }, by)?;
    match recv_frame(stream, by)? {
        Frame::AuthProof(p) if key.verify(CONNECTOR, &mine, &theirs, &p) => Ok(()),
        Frame::AuthProof(_) => refuse(stream, "authentication failed: wrong key"),
        Frame::Reject(reason) => Err(BootstrapError::Rejected(reason)),
        _ => refuse(
            stream,
            "unexpected frame instead of the authentication proof",
        ),
    }
}

/// Bounds on what one source address may make a listener do.
#[derive(Debug)]
pub struct Gate {
    /// Exchanges one address may have running at once.
    pub max_running: u32,
    /// Failed exchanges one address may have in `window` before its connections are
    /// closed at once until the window passes.
    pub max_failures: u32,
    /// The failure window.
    pub window: Duration,
    state: Mutex<GateState>,
}

#[derive(Debug, Default)]
struct GateState {
    by_ip: HashMap<IpAddr, Source>,
    refused: u64,
}

#[derive(Debug, Clone, Copy)]
struct Source {
    running: u32,
    failures: u32,
    since: Instant,
}

/// Addresses remembered at most (the oldest idle ones are forgotten first).
const MAX_SOURCES: usize = 4096;

/// An admitted exchange: its address's slot is given back when this is dropped.
#[derive(Debug)]
pub struct Ticket {
    gate: Arc<Gate>,
    ip: IpAddr,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut st = self.gate.state.lock();
        if let Some(s) = st.by_ip.get_mut(&self.ip) {
            s.running = s.running.saturating_sub(1);
        }
    }
}

impl Ticket {
    /// The exchange failed (a wrong key, garbage, a timeout): counted against its address.
    pub fn failed(&self, now: Instant) {
        let mut st = self.gate.state.lock();
        let window = self.gate.window;
        if let Some(s) = st.by_ip.get_mut(&self.ip) {
            if now.duration_since(s.since) > window {
                s.failures = 0;
                s.since = now;
            }
            s.failures = s.failures.saturating_add(1);
        }
    }
}

impl Gate {
    /// The defaults: 8 exchanges at once and 32 failures a minute per address.
    pub fn new() -> Arc<Self> {
        Self::with(8, 32, Duration::from_secs(60))
    }

    /// A gate with these bounds.
    pub fn with(max_running: u32, max_failures: u32, window: Duration) -> Arc<Self> {
        Arc::new(Self {
            max_running,
            max_failures,
            window,
            state: Mutex::new(GateState::default()),
        })
    }

    /// Admits an exchange from `ip` now, or `None` (the caller closes the connection).
    pub fn admit(self: &Arc<Self>, ip: IpAddr, now: Instant) -> Option<Ticket> {
        let mut st = self.state.lock();
        if !st.by_ip.contains_key(&ip) && st.by_ip.len() >= MAX_SOURCES {
            // Forget an idle address (the one whose window started longest ago).
            let oldest = st
                .by_ip
                .iter()
                .filter(|(_, s)| s.running == 0)
                .min_by_key(|(_, s)| s.since)
                .map(|(ip, _)| *ip);
            match oldest {
                Some(o) => {
                    st.by_ip.remove(&o);
                }
                None => {
                    st.refused += 1;
                    return None;
                }
            }
        }
        let window = self.window;
        let s = st.by_ip.entry(ip).or_insert(Source {
            running: 0,
            failures: 0,
            since: now,
        });
        if now.duration_since(s.since) > window {
            s.failures = 0;
            s.since = now;
        }
        if s.running >= self.max_running || s.failures >= self.max_failures {
            st.refused += 1;
            return None;
        }
        s.running += 1;
        Some(Ticket {
            gate: Arc::clone(self),
            ip,
        })
    }

    /// Connections closed at once so far.
    pub fn refused(&self) -> u64 {
        self.state.lock().refused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_bind_both_nonces_and_the_side() {
        let k = AuthKey::new(b"0123456789abcdef").unwrap();
        let (a, b) = ([1u8; AUTH_LEN], [2u8; AUTH_LEN]);
        let m = k.sign(LISTENER, &a, &b);
        assert!(k.verify(LISTENER, &a, &b, &m));
        assert!(!k.verify(CONNECTOR, &a, &b, &m), "the other side's label");
        assert!(!k.verify(LISTENER, &b, &a, &m), "nonces swapped");
        let other = AuthKey::new(b"0123456789abcdeF").unwrap();
        assert!(!other.verify(LISTENER, &a, &b, &m));
        assert!(!k.verify(LISTENER, &a, &b, &m[..31]), "truncated");
        assert!(AuthKey::new(b"short").is_err());
        assert_eq!(format!("{k:?}"), "AuthKey(<16 bytes>)");
    }

    #[test]
    fn the_gate_bounds_running_and_failures_per_address() {
        let g = Gate::with(2, 3, Duration::from_secs(10));
        let t0 = Instant::now();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let t1 = g.admit(a, t0).unwrap();
        let t2 = g.admit(a, t0).unwrap();
        assert!(g.admit(a, t0).is_none(), "two at once");
        assert!(g.admit(b, t0).is_some(), "another address is not held back");
        drop(t1);
        let t3 = g.admit(a, t0).unwrap();
        for t in [&t2, &t3] {
            t.failed(t0);
        }
        drop((t2, t3));
        let t4 = g.admit(a, t0).unwrap();
        t4.failed(t0);
        drop(t4);
        assert!(g.admit(a, t0).is_none(), "three failures");
        assert!(
            g.admit(a, t0 + Duration::from_secs(11)).is_some(),
            "the window passed"
        );
        assert_eq!(g.refused(), 2);
    }
}
