//! Multicast groups through `rdmx::Context::join`, whatever the endpoints' transport.
#![expect(clippy::unwrap_used, reason = "test")]

use std::time::{Duration, Instant};

use rdmx::{Context, McastEvent};

#[test]
fn contexts_join_a_group_and_every_member_gets_every_message() {
    let name = format!("rdmx-ctx-group-{}", std::process::id());
    let (a, b, c) = (
        Context::new().unwrap(),
        Context::new().unwrap(),
        Context::new().unwrap(),
    );
    let (ga, gb, gc) = (
        a.join(&name).unwrap(),
        b.join(&name).unwrap(),
        c.join(&name).unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while ga.receivers() < 2 {
        assert!(Instant::now() < deadline, "the group never formed");
        std::thread::sleep(Duration::from_millis(5));
    }
    for i in 0..200u32 {
        ga.publish_timeout(&i.to_le_bytes(), Duration::from_secs(5))
            .unwrap();
    }
    for g in [&gb, &gc] {
        for i in 0..200u32 {
            let (from, m) = g.recv_timeout(Duration::from_secs(5)).unwrap();
            assert_eq!(from, ga.member_id());
            assert_eq!(m, i.to_le_bytes());
        }
    }
    assert!(std::iter::from_fn(|| gb.poll_event()).any(|e| e
        == McastEvent::PublisherJoined {
            publisher: ga.member_id()
        }));
}

/// The context's key (`auth_key`, or `RDMX_AUTH_KEY`) reaches its groups: contexts with the
/// same key form the group; a context with another key is not heard and takes nothing.
#[test]
fn contexts_with_a_key_authenticate_their_groups() {
    const KEY: &[u8] = b"the facade's group key, long enough";
    let name = format!("rdmx-ctx-group-auth-{}", std::process::id());
    let keyed = || Context::builder().auth_key(KEY).build().unwrap();
    let (a, b) = (keyed(), keyed());
    let other = Context::builder()
        .auth_key(b"another key, also long enough")
        .build()
        .unwrap();
    let (ga, gb, go) = (
        a.join(&name).unwrap(),
        b.join(&name).unwrap(),
        other.join(&name).unwrap(),
    );
    go.publish_timeout(b"from a stranger", Duration::from_secs(5))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while ga.receivers() < 1 {
        assert!(Instant::now() < deadline, "the group never formed");
        std::thread::sleep(Duration::from_millis(5));
    }
    ga.publish_timeout(b"for members", Duration::from_secs(5))
        .unwrap();
    let (from, m) = gb.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!((from, &m[..]), (ga.member_id(), &b"for members"[..]));
    assert!(go.recv_timeout(Duration::from_millis(100)).is_err());
    assert!(gb.recv_timeout(Duration::from_millis(100)).is_err());
    assert_eq!(ga.receivers(), 1);
    assert!(gb.stats().unauthenticated > 0);
}
