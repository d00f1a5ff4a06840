//! One loop for messages and events: `Context::recv_or_event` gives whichever comes first,
//! and the async forms let a tokio program `select!` on a peer's end.
#![allow(missing_docs)]

use std::time::{Duration, Instant};

use rdmx_core::{Arrival, DisconnectCause, Event};
use rdmx_rc::{Context, Endpoint};

fn connect(s: &Context, c: &Context) -> (Endpoint, Endpoint) {
    let listener = s.listen("127.0.0.1:0").expect("listen");
    let addr = listener.local_addr();
    let t = std::thread::spawn(move || listener.accept().expect("accept"));
    let cep = c.connect(addr).expect("connect");
    (cep, t.join().expect("accept thread"))
}

fn builder() -> rdmx_rc::ContextBuilder {
    Context::builder().peer_timeout(Duration::from_millis(800))
}

#[test]
fn a_server_loop_sees_messages_and_a_peers_end_without_polling_for_events() {
    let s = builder().build().unwrap();
    let c1 = builder().build().unwrap();
    let c2 = builder().build().unwrap();
    let (a, sa) = connect(&s, &c1);
    let (b, sb) = connect(&s, &c2);
    for i in 0..10u32 {
        a.send(&i.to_le_bytes()).unwrap();
        b.send(&(100 + i).to_le_bytes()).unwrap();
    }
    let mut got = Vec::new();
    while got.len() < 20 {
        match s.recv_or_event_timeout(Duration::from_secs(10)).unwrap() {
            Arrival::Message(m) => got.push(u32::from_le_bytes(m[..4].try_into().unwrap())),
            Arrival::Event(e) => panic!("an event before the peers went: {e:?}"),
        }
    }
    got.sort_unstable();
    assert_eq!(got, (0..10).chain(100..110).collect::<Vec<_>>());
    // One peer closes in order, the other's context goes away: both show up in the same
    // loop, each once (a blocked receive is woken by the event, not by a later poll).
    a.close().unwrap();
    let t0 = Instant::now();
    let e = s.recv_or_event_timeout(Duration::from_secs(10)).unwrap();
    let Arrival::Event(Event::Disconnected { endpoint, cause }) = e else {
        panic!("{e:?}");
    };
    assert_eq!((endpoint, cause), (sa.id(), DisconnectCause::PeerClosed));
    drop(b);
    drop(c2);
    let e = s.recv_or_event_timeout(Duration::from_secs(10)).unwrap();
    let Arrival::Event(Event::Disconnected { endpoint, .. }) = e else {
        panic!("{e:?}");
    };
    assert_eq!(endpoint, sb.id());
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // Nothing else is queued.
    assert!(s.recv_or_event_timeout(Duration::from_millis(50)).is_err());
}

#[cfg(feature = "tokio")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn select_on_a_message_or_a_peers_end() {
    let s = builder().build().unwrap();
    let c = builder().build().unwrap();
    let (a, sa) = connect(&s, &c);
    a.send(b"first").unwrap();
    let mut messages = 0;
    let ended = loop {
        tokio::select! {
            m = s.recv_async() => {
                assert_eq!(&m.unwrap()[..], b"first");
                messages += 1;
                a.start_close();
            }
            e = s.next_event_async() => break e.unwrap(),
        }
    };
    assert_eq!(messages, 1);
    assert!(
        matches!(ended, Event::Disconnected { endpoint, .. } if endpoint == sa.id()),
        "{ended:?}"
    );
    // The combined async form.
    let (b, _sb) = connect(&s, &c);
    b.send(b"x").unwrap();
    match s.recv_or_event_async().await.unwrap() {
        Arrival::Message(m) => assert_eq!(&m[..], b"x"),
        Arrival::Event(e) => panic!("{e:?}"),
    }
}
