//! Fan-out without copies: a received message made shareable and sent to several
//! endpoints (each peer reads it where it arrived), and a message sent from several slices.
#![allow(missing_docs)]

use std::time::{Duration, Instant};

use rdmx_rc::{Context, Endpoint, SharedBuf};

const T: Duration = Duration::from_secs(10);

fn connect(s: &Context, c: &Context) -> (Endpoint, Endpoint) {
    let listener = s.listen("127.0.0.1:0").expect("listen");
    let addr = listener.local_addr();
    let t = std::thread::spawn(move || listener.accept().expect("accept"));
    let cep = c.connect(addr).expect("connect");
    (cep, t.join().expect("accept thread"))
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[test]
fn a_received_message_goes_to_three_followers_without_a_copy() {
    let leader = Context::builder().pool_max(64 << 20).build().unwrap();
    let client = Context::builder().build().unwrap();
    let (to_leader, at_leader) = connect(&leader, &client);
    let followers: Vec<(Context, Endpoint, Endpoint)> = (0..3)
        .map(|_| {
            let f = Context::builder().build().unwrap();
            let (from_leader, at_follower) = connect(&f, &leader);
            (f, from_leader, at_follower)
        })
        .collect();
    for (round, len) in [300_000usize, 100, 40_000].into_iter().enumerate() {
        let value = pattern(len, round as u8);
        to_leader.send(&value).unwrap();
        let m = at_leader.recv_timeout(T).unwrap();
        let rndv = m.is_rendezvous();
        assert_eq!(rndv, len >= 32 * 1024, "{len} bytes");
        let shared: SharedBuf = m.into_shared().unwrap();
        let before = leader.stats();
        for (_, to_follower, _) in &followers {
            to_follower.send_shared_buf(&shared).unwrap();
        }
        for (_, _, at_follower) in &followers {
            assert_eq!(&at_follower.recv_timeout(T).unwrap()[..], &value[..]);
        }
        let after = leader.stats();
        if rndv {
            // Read three times where it arrived: three rendezvous sends, no copy made.
            assert_eq!(after.sent_rndv - before.sent_rndv, 3, "{after:?}");
        }
        // Once every read is done, only this handle holds the buffer.
        let end = Instant::now() + T;
        while shared.holders() > 1 {
            assert!(Instant::now() < end, "{} holders", shared.holders());
            leader.progress();
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(&shared.try_unwrap().unwrap()[..], &value[..]);
    }
}

#[test]
fn a_message_from_several_slices() {
    let s = Context::builder().build().unwrap();
    let c = Context::builder().build().unwrap();
    let (cep, sep) = connect(&s, &c);
    let header = b"HDR:0042|";
    for len in [0usize, 10, 150, 5_000, 200_000] {
        let body = pattern(len, 7);
        cep.send_parts(&[header, &body, b"|END"]).unwrap();
        let m = sep.recv_timeout(T).unwrap();
        assert_eq!(m.len(), header.len() + len + 4);
        assert_eq!(&m[..header.len()], header);
        assert_eq!(&m[header.len()..header.len() + len], &body[..]);
        assert_eq!(&m[header.len() + len..], b"|END");
    }
    cep.send_parts(&[]).unwrap();
    assert!(sep.recv_timeout(T).unwrap().is_empty());
    // Inside a batch, small messages from slices are packed like any other.
    {
        let _b = c.batch();
        for i in 0..10u8 {
            cep.send_parts_timeout(&[&[i], b"-x"], T).unwrap();
        }
    }
    for i in 0..10u8 {
        assert_eq!(&sep.recv_timeout(T).unwrap()[..], &[i, b'-', b'x']);
    }
}
