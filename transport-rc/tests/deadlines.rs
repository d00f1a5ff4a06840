//! Deadlines that flush: a one-sided operation that timed out after it was posted cannot
//! happen afterwards (its endpoint fails and its queue pair is flushed), and its buffer is
//! released only after the flush: a late response writes nothing the application holds.
#![allow(missing_docs)]

use std::time::Duration;

use rdmx_core::bootstrap::Transport;
use rdmx_core::{DisconnectCause, Error};
use rdmx_rc::Context;
use rdmx_verbs::{DeviceOptions, FaultConfig};

/// A client whose device receives every frame 300 ms late, connected to a plain server.
fn slow_pair() -> (Context, Context, rdmx_rc::Endpoint, rdmx_rc::Endpoint) {
    let server = Context::builder().transport(Transport::Rc).build().unwrap();
    let l = server.listen("127.0.0.1:0").unwrap();
    let addr = l.local_addr();
    let late = FaultConfig::parse("seed=3,delay=1.0:300ms").unwrap();
    let client = Context::builder()
        .transport(Transport::Rc)
        .device_options(DeviceOptions::default().with_faults(late))
        .peer_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let t = std::thread::spawn(move || {
        let ep = client.connect(addr).unwrap();
        (client, ep)
    });
    let sep = l.accept_timeout(Duration::from_secs(10)).unwrap();
    let (client, cep) = t.join().unwrap();
    (server, client, sep, cep)
}

#[test]
fn a_timed_out_read_is_flushed_and_its_buffer_is_not_written_later() {
    let (server, client, _sep, cep) = slow_pair();
    let region = server.register(4096).unwrap();
    region.memory().write(0, &[0xAB; 4096]).unwrap();
    let remote = region.remote();
    let e = cep
        .read_timeout(&remote, 0, 4096, Duration::from_millis(50))
        .unwrap_err();
    assert!(matches!(e, Error::Timeout(_)), "{e}");
    // The endpoint is down, with the flush named as the cause.
    match cep.send(b"after") {
        Err(Error::Disconnected(DisconnectCause::TransportError(why))) => {
            assert!(why.contains("flushed"), "{why}");
        }
        other => panic!("the endpoint should be down: {other:?}"),
    }
    // Buffers of the read's size class taken now are not the read's (it is released only
    // after its flush completion): nothing writes them when the late response arrives.
    let mut bufs = Vec::new();
    for _ in 0..8 {
        let mut b = client.alloc(4096).unwrap();
        b.set_len(4096).unwrap();
        b.fill(0x11);
        bufs.push(b);
    }
    std::thread::sleep(Duration::from_millis(700));
    for b in &bufs {
        assert!(
            b.iter().all(|&x| x == 0x11),
            "a late response wrote a reused buffer"
        );
    }
}

#[test]
fn a_timed_out_write_does_not_happen_afterwards() {
    let (server, _client, _sep, cep) = slow_pair();
    let region = server.register(4096).unwrap();
    let remote = region.remote();
    // The write's packets leave at once and the server's NIC places them; what the
    // deadline guarantees is that nothing happens after the flush: a second write the
    // endpoint would have carried (it is down) never lands.
    let e = cep
        .write_timeout(&remote, 0, &[0x22; 64], Duration::from_millis(50))
        .unwrap_err();
    assert!(matches!(e, Error::Timeout(_)), "{e}");
    assert!(cep.write(&remote, 100, &[0x33; 64]).is_err());
    std::thread::sleep(Duration::from_millis(700));
    let mut b = [0u8; 64];
    region.memory().read(100, &mut b).unwrap();
    assert_eq!(b, [0u8; 64], "nothing lands after the flush");
}
