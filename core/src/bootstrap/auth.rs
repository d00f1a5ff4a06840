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
//! What one source address can make a listener do is bounded by [`super::Gate`].

use std::fmt;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
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

impl AuthKey {
    /// A key for authenticating datagrams of one purpose (`label`, `context`: a group's
    /// name, say), derived from this one: HMAC(key, label | context). Peers holding the
    /// same key derive the same one; the shared key itself never keys a datagram MAC.
    pub fn datagram_key(&self, label: &[u8], context: &[u8]) -> DatagramKey {
        let mut m = <HmacSha256 as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        m.update(b"rdmx datagram key ");
        m.update(label);
        m.update(&[0]);
        m.update(context);
        let derived = m.finalize().into_bytes();
        DatagramKey(
            <HmacSha256 as Mac>::new_from_slice(&derived)
                .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length")),
        )
    }
}

/// A key that authenticates datagrams (see [`AuthKey::datagram_key`]): a tag of
/// [`TAG_LEN`](Self::TAG_LEN) bytes, HMAC-SHA-256 truncated, over the parts given. Keyed
/// once: each tag starts from a copy of the keyed state. Its `Debug` shows nothing of it.
#[derive(Clone)]
pub struct DatagramKey(HmacSha256);

impl DatagramKey {
    /// Length of a tag (128 bits).
    pub const TAG_LEN: usize = 16;

    fn mac(&self, parts: &[&[u8]]) -> HmacSha256 {
        let mut m = self.0.clone();
        for p in parts {
            m.update(p);
        }
        m
    }

    /// The tag of the concatenation of `parts`.
    pub fn tag(&self, parts: &[&[u8]]) -> [u8; Self::TAG_LEN] {
        let full = self.mac(parts).finalize().into_bytes();
        let mut t = [0u8; Self::TAG_LEN];
        t.copy_from_slice(&full[..Self::TAG_LEN]);
        t
    }

    /// Whether `tag` is the tag of `parts` (compared in constant time).
    pub fn verify(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        tag.len() == Self::TAG_LEN && self.mac(parts).verify_truncated_left(tag).is_ok()
    }
}

impl fmt::Debug for DatagramKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DatagramKey(..)")
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

/// The key of the datagrams of one connection, derived from the shared key and both sides'
/// nonces (fresh for every connection: a datagram of one does not pass in another).
fn connection_key(
    key: &AuthKey,
    connector: &[u8; AUTH_LEN],
    listener: &[u8; AUTH_LEN],
) -> DatagramKey {
    let mut both = [0u8; 2 * AUTH_LEN];
    both[..AUTH_LEN].copy_from_slice(connector);
    both[AUTH_LEN..].copy_from_slice(listener);
    key.datagram_key(b"connection", &both)
}

/// The connector's side: proves the key and checks the listener's proof (nothing to do
/// without a key). With a key, returns the connection's datagram key (the same on both
/// sides, fresh for this connection): what a transport whose datagrams travel outside the
/// connection (UD) authenticates them with.
///
/// # Errors
/// [`BootstrapError::AuthFailed`] when the listener's proof is wrong; `Rejected` with the
/// listener's reason (it has no key, or found ours wrong); those of the connection.
pub fn connector(
    stream: &mut TcpStream,
    key: Option<&AuthKey>,
    deadline: Instant,
) -> Result<Option<DatagramKey>, BootstrapError> {
    let Some(key) = key else {
        return Ok(None);
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
    send_frame(stream, &Frame::AuthProof(mac), deadline)?;
    Ok(Some(connection_key(key, &mine, &theirs)))
}

/// The listener's side, before it reads the `Hello`: with a key, the challenge (within
/// [`AUTH_TIMEOUT`]); a peer that fails it is told why and refused.
///
/// With a key, returns the connection's datagram key (see [`connector`]).
///
/// # Errors
/// [`BootstrapError::AuthFailed`] for a wrong key, no proof, or a peer that does not hold
/// ours; those of the connection.
pub fn listener(
    stream: &mut TcpStream,
    key: Option<&AuthKey>,
    deadline: Instant,
) -> Result<Option<DatagramKey>, BootstrapError> {
    let Some(key) = key else {
        return Ok(None);
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
        Frame::AuthProof(p) if key.verify(CONNECTOR, &mine, &theirs, &p) => {
            Ok(Some(connection_key(key, &theirs, &mine)))
        }
        Frame::AuthProof(_) => refuse(stream, "authentication failed: wrong key"),
        Frame::Reject(reason) => Err(BootstrapError::Rejected(reason)),
        _ => refuse(
            stream,
            "unexpected frame instead of the authentication proof",
        ),
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
    fn datagram_keys_are_derived_per_purpose_and_check_their_tags() {
        let k = AuthKey::new(b"0123456789abcdef").unwrap();
        let g1 = k.datagram_key(b"group", b"prices");
        let g2 = k.datagram_key(b"group", b"orders");
        let t = g1.tag(&[b"head", b"body"]);
        assert!(g1.verify(&[b"head", b"body"], &t));
        assert!(g1.verify(&[b"headbody"], &t), "the parts are concatenated");
        assert!(!g1.verify(&[b"head", b"bodY"], &t), "another datagram");
        assert!(!g2.verify(&[b"head", b"body"], &t), "another group's key");
        assert!(!g1.verify(&[b"head", b"body"], &t[..15]), "a short tag");
        let other = AuthKey::new(b"0123456789abcdeF").unwrap();
        assert!(
            !other
                .datagram_key(b"group", b"prices")
                .verify(&[b"head", b"body"], &t)
        );
        assert_eq!(
            k.datagram_key(b"group", b"prices").tag(&[b"x"]),
            g1.tag(&[b"x"]),
            "the same key, purpose and context give the same key"
        );
        assert_eq!(format!("{g1:?}"), "DatagramKey(..)");
    }
}
