//! Message-layer failover roles: an `rdmx` endpoint between two contexts on two-port soft
//! devices (port 1 on link A, port 2 on link B), so the endpoint's queue pair has an
//! alternate path. The client streams numbered messages; the server checks that each arrives
//! exactly once and in order, whatever happens to link A meanwhile.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdmx::{Context, Error, Event};

use crate::{Args, Ctx, Res, unix_ns};

const SEQ_LEN: usize = 8;

fn context(a: &Args) -> Res<Context> {
    let device: String = a.req("device")?;
    let transport = match a.or("transport", "rc".to_string())?.as_str() {
        "rc" => rdmx::Transport::Rc,
        "xrc" => rdmx::Transport::Xrc,
        other => return Err(format!("--transport {other:?}: rc or xrc")),
    };
    Context::builder()
        .device(device.clone())
        .transport(transport)
        .peer_timeout(Duration::from_millis(a.or("peer-timeout-ms", 1000)?))
        .build()
        .ctx(&format!("context on {device}"))
}

/// Prints every event as `EVENT <name> <ns> endpoint=<id>` from a thread of its own; stops
/// when `stop` is set.
fn watch_events(ctx: &Context, stop: &Arc<AtomicBool>) -> Res<()> {
    let (ctx, stop) = (ctx.clone(), Arc::clone(stop));
    std::thread::Builder::new()
        .name("events".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Some(e) = ctx.wait_event(Duration::from_millis(50)) else {
                    continue;
                };
                let t = unix_ns();
                match e {
                    Event::PathMigrated { endpoint } => {
                        println!("EVENT PathMigrated {t} endpoint={endpoint}");
                    }
                    Event::PathRearmed { endpoint } => {
                        println!("EVENT PathRearmed {t} endpoint={endpoint}");
                    }
                    Event::Disconnected { endpoint, cause } => {
                        println!("EVENT Disconnected {t} endpoint={endpoint} cause={cause:?}");
                    }
                    other => println!("EVENT Other {t} {other:?}"),
                }
            }
        })
        .ctx("spawn the event thread")?;
    Ok(())
}

/// `msg-server --device soft:<a>,<b> --listen <a>:<port> --count N [--peer-timeout-ms T]
/// [--transport rc|xrc]`:
/// prints `LISTEN <addr>`, accepts one endpoint, prints `RECV <seq> <ns>` per message and
/// `RESULT got=.. in_order=.. intact=.. error=..` after N messages and the peer's close.
pub(crate) fn server(a: &Args) -> Res<bool> {
    a.only(&[
        "device",
        "listen",
        "count",
        "size",
        "peer-timeout-ms",
        "transport",
    ])?;
    let count: u64 = a.req("count")?;
    let listen: String = a.req("listen")?;
    let ctx = context(a)?;
    let listener = ctx.listen(listen.as_str()).ctx("listen")?;
    println!("LISTEN {}", listener.local_addr());
    let ep = listener.accept().ctx("accept")?;
    let stop = Arc::new(AtomicBool::new(false));
    watch_events(&ctx, &stop)?;
    let (mut got, mut in_order, mut intact) = (0u64, true, true);
    let mut error = "none".to_string();
    loop {
        match ep.recv_timeout(Duration::from_secs(30)) {
            Ok(m) => {
                let mut s = [0u8; SEQ_LEN];
                s.copy_from_slice(m.get(..SEQ_LEN).unwrap_or(&[0xff; SEQ_LEN]));
                let seq = u64::from_le_bytes(s);
                if seq != got {
                    eprintln!("GAP expected {got} got {seq} stats {:?}", ctx.stats());
                }
                in_order &= seq == got;
                intact &= m[SEQ_LEN..].iter().all(|&b| b == seq as u8);
                println!("RECV {seq} {}", unix_ns());
                got += 1;
            }
            Err(Error::Disconnected(rdmx::DisconnectCause::PeerClosed)) => break,
            Err(e) => {
                error = format!("{e:?}").replace(' ', "_");
                break;
            }
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let ok = got == count && in_order && intact && error == "none";
    let st = ctx.stats();
    println!(
        "RESULT got={got} in_order={in_order} intact={intact} error={error} ok={ok} \
         stray={} protocol_errors={} delivered={}",
        st.stray_completions, st.protocol_errors, st.delivered
    );
    Ok(ok)
}

/// `msg-client --device soft:<a>,<b> --connect <addr> --count N [--size S] [--pace-us U]
/// [--peer-timeout-ms T] [--transport rc|xrc]`: streams N numbered messages of S bytes (one per U us), closes
/// the endpoint and prints `RESULT sent=.. error=..`.
pub(crate) fn client(a: &Args) -> Res<bool> {
    a.only(&[
        "device",
        "connect",
        "count",
        "size",
        "pace-us",
        "peer-timeout-ms",
        "transport",
    ])?;
    let count: u64 = a.req("count")?;
    let size: usize = a.or("size", 256)?;
    let pace = Duration::from_micros(a.or("pace-us", 1000)?);
    if size < SEQ_LEN {
        return Err(format!("--size must be at least {SEQ_LEN}"));
    }
    let target: String = a.req("connect")?;
    let ctx = context(a)?;
    let ep = ctx.connect(target.as_str()).ctx("connect")?;
    let stop = Arc::new(AtomicBool::new(false));
    watch_events(&ctx, &stop)?;
    println!("CONNECTED {}", unix_ns());
    let mut error = "none".to_string();
    let mut sent = 0u64;
    let mut msg = vec![0u8; size];
    for seq in 0..count {
        msg[..SEQ_LEN].copy_from_slice(&seq.to_le_bytes());
        msg[SEQ_LEN..].fill(seq as u8);
        if let Err(e) = ep.send(&msg) {
            error = format!("{e:?}").replace(' ', "_");
            break;
        }
        sent += 1;
        std::thread::sleep(pace);
    }
    if error == "none"
        && let Err(e) = ep.close()
    {
        error = format!("close:{e:?}").replace(' ', "_");
    }
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let ok = sent == count && error == "none";
    println!("RESULT sent={sent} error={error} ok={ok}");
    Ok(ok)
}
