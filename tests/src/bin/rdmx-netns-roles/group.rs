//! Multicast group roles: members of an `rdmx` group (`Context::join`), one publishing a
//! numbered stream, the others receiving and checking it. `group-garbage` sends malformed
//! and forged datagrams to the group's address from a plain UD queue pair.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use rdmx::verbs::{AhAttr, Gid, Qpn, SendWr, WcStatus, WorkCompletion};
use rdmx::{Context, Group, McastConfig, McastEvent, McastStats};

use crate::{Args, Ctx, Res, mcast, unix_ns};

/// The Q_Key of group queue pairs (`rdmx_ud::attach::QKEY`: "rdmx").
const QKEY: u32 = 0x7264_6d78;

/// The first bytes of a message: its number.
const SEQ_LEN: usize = 8;

/// The options every member of a group shares.
const SHARED: [&str; 5] = [
    "device",
    "name",
    "member-timeout-ms",
    "slow-timeout-ms",
    "publisher-timeout-ms",
];

fn join(a: &Args) -> Res<(Context, Group)> {
    let device: String = a.req("device")?;
    let name: String = a.req("name")?;
    let ctx = Context::builder()
        .device(device.clone())
        .build()
        .ctx(&format!("context on {device}"))?;
    let cfg = McastConfig {
        member_timeout: Duration::from_millis(a.or("member-timeout-ms", 1000)?),
        slow_timeout: Duration::from_millis(a.or("slow-timeout-ms", 1000)?),
        publisher_timeout: Duration::from_millis(a.or("publisher-timeout-ms", 1000)?),
        ..McastConfig::default()
    };
    let g = ctx.join_with(&name, cfg).ctx(&format!("join {name}"))?;
    println!("READY member={} {}", g.member_id(), unix_ns());
    Ok((ctx, g))
}

/// Message `seq` of `size` bytes: its number, then bytes that depend on it.
fn message(seq: u64, size: usize) -> Vec<u8> {
    let mut m = vec![0u8; size.max(SEQ_LEN)];
    m[..SEQ_LEN].copy_from_slice(&seq.to_le_bytes());
    for (i, b) in m.iter_mut().enumerate().skip(SEQ_LEN) {
        *b = (seq as usize).wrapping_mul(31).wrapping_add(i) as u8;
    }
    m
}

/// The number of message `m`, if its bytes are those [`message`] made.
fn check(m: &[u8]) -> Option<u64> {
    let seq = u64::from_le_bytes(m.get(..SEQ_LEN)?.try_into().ok()?);
    (message(seq, m.len()) == m).then_some(seq)
}

/// Prints an event line.
fn print_event(e: &McastEvent) {
    let t = unix_ns();
    match e {
        McastEvent::MemberRemoved { member, why } => {
            println!("EVENT MemberRemoved {t} member={member} why={why:?}");
        }
        McastEvent::RemovedBy { publisher } => {
            println!("EVENT RemovedBy {t} publisher={publisher}");
        }
        McastEvent::PublisherJoined { publisher } => {
            println!("EVENT PublisherJoined {t} publisher={publisher}");
        }
        McastEvent::PublisherGone { publisher, why } => {
            println!(
                "EVENT PublisherGone {t} publisher={publisher} why={}",
                why.replace(' ', "_")
            );
        }
        McastEvent::Lost {
            publisher,
            datagrams,
        } => println!("EVENT Lost {t} publisher={publisher} datagrams={datagrams}"),
    }
}

fn stats_words(s: &McastStats) -> String {
    format!(
        "refused={} malformed={} forged={} naks_sent={} naks_suppressed={} repairs_sent={} \
         duplicates={} lost={} send_dropped={}",
        s.refused,
        s.malformed,
        s.forged,
        s.naks_sent,
        s.naks_suppressed,
        s.repairs_sent,
        s.duplicates,
        s.lost,
        s.send_dropped
    )
}

/// `group-pub --device soft:<ip> --name G --count N [--size S] [--receivers R]
/// [--rate MSGS_PER_S] [--linger-ms L] [--wait-s W]`: joins, waits (up to W s) until R
/// members are heard, publishes messages 0..N (S bytes each, numbered; at most R per
/// second), prints `PUB <k> <ns>` every 500, `EVENT ...` per event, waits until the
/// live members have taken everything (`FLUSHED <bool>`), stays L ms (watching), and ends with `RESULT sent=N flushed=.. removed=<members removed> publish_ms=.. elapsed_ms=..
/// <counters>`.
pub(crate) fn publisher(a: &Args) -> Res<bool> {
    let mut known = SHARED.to_vec();
    known.extend(["count", "size", "receivers", "rate", "linger-ms", "wait-s"]);
    a.only(&known)?;
    let count: u64 = a.req("count")?;
    let size: usize = a.or("size", 64)?;
    let receivers: usize = a.or("receivers", 0)?;
    let rate: Option<f64> = a.opt("rate")?;
    let linger = Duration::from_millis(a.or("linger-ms", 1500)?);
    let wait = Duration::from_secs(a.or("wait-s", 30)?);
    let (_ctx, g) = join(a)?;
    let deadline = Instant::now() + wait;
    while g.receivers() < receivers {
        if Instant::now() > deadline {
            return Err(format!(
                "only {} of {receivers} members heard within {wait:?}",
                g.receivers()
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    println!("RECEIVERS {} {}", g.receivers(), unix_ns());
    let mut removed = 0u64;
    let mut events = |g: &Group| {
        while let Some(e) = g.poll_event() {
            if matches!(e, McastEvent::MemberRemoved { .. }) {
                removed += 1;
            }
            print_event(&e);
        }
    };
    let start = Instant::now();
    for seq in 0..count {
        if let Some(r) = rate {
            let due = start + Duration::from_secs_f64(seq as f64 / r);
            if let Some(d) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(d);
            }
        }
        g.publish_timeout(&message(seq, size), wait)
            .ctx(&format!("publish message {seq}"))?;
        if (seq + 1) % 500 == 0 {
            println!("PUB {} {}", seq + 1, unix_ns());
        }
        events(&g);
    }
    let publishing = start.elapsed();
    println!("SENT {count} {}", unix_ns());
    // Until every live member has taken everything.
    let flushed = g.flush_timeout(wait);
    let elapsed = start.elapsed();
    println!("FLUSHED {} {}", flushed.is_ok(), unix_ns());
    let end = Instant::now() + linger;
    while Instant::now() < end {
        events(&g);
        std::thread::sleep(Duration::from_millis(10));
    }
    events(&g);
    println!(
        "RESULT sent={count} flushed={} removed={removed} receivers={} publish_ms={} \
         elapsed_ms={} {}",
        flushed.is_ok(),
        g.receivers(),
        publishing.as_millis(),
        elapsed.as_millis(),
        stats_words(&g.stats())
    );
    Ok(true)
}

/// Prints the events waiting; notes whether this member was removed or its publisher went.
fn take_events(g: &Group, removed: &mut bool, gone: &mut bool) {
    while let Some(e) = g.poll_event() {
        print_event(&e);
        match e {
            McastEvent::RemovedBy { .. } => *removed = true,
            McastEvent::PublisherGone { .. } => *gone = true,
            _ => {}
        }
    }
}

/// `group-sub --device soft:<ip> --name G --last K [--delay-us D] [--stall-after M]
/// [--wait-s W]`: joins and receives one publisher's stream until message K (the last)
/// arrives, the publisher is reported gone, this member is removed, or W s pass. Checks
/// that messages come in order without gaps or duplicates from the first it got, intact,
/// from one publisher. With `--delay-us` it takes D us per message (a slow reader); with
/// `--stall-after` it stops taking messages after M (and waits to be removed). Prints
/// `GOT <n> <ns>` every 500 messages, `EVENT ...` per event, and `RESULT got=.. first=..
/// last=.. in_order=.. intact=.. publishers=.. removed=.. gone=.. <counters>`.
pub(crate) fn subscriber(a: &Args) -> Res<bool> {
    let mut known = SHARED.to_vec();
    known.extend(["last", "delay-us", "stall-after", "wait-s"]);
    a.only(&known)?;
    let last: u64 = a.req("last")?;
    let delay = Duration::from_micros(a.or("delay-us", 0)?);
    let stall_after: Option<u64> = a.opt("stall-after")?;
    let wait = Duration::from_secs(a.or("wait-s", 60)?);
    let (_ctx, g) = join(a)?;
    let deadline = Instant::now() + wait;
    let (mut got, mut first, mut prev) = (0u64, None::<u64>, None::<u64>);
    let (mut in_order, mut intact) = (true, true);
    let mut publishers = std::collections::BTreeSet::new();
    let (mut removed, mut gone) = (false, false);
    let mut stalled = false;
    while Instant::now() < deadline && !removed && !gone && prev != Some(last) {
        take_events(&g, &mut removed, &mut gone);
        if stall_after.is_some_and(|m| got >= m) {
            if !stalled {
                println!("STALLED {got} {}", unix_ns());
                stalled = true;
            }
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        let (from, m) = match g.recv_timeout(Duration::from_millis(50)) {
            Ok(x) => x,
            Err(rdmx::Error::Timeout(_)) => continue,
            Err(e) => return Err(format!("recv: {e}")),
        };
        publishers.insert(from);
        match check(&m) {
            Some(seq) => {
                if let Some(p) = prev
                    && seq != p + 1
                {
                    if in_order {
                        println!("DISORDER after={p} got={seq}");
                    }
                    in_order = false;
                }
                first.get_or_insert(seq);
                prev = Some(seq);
            }
            None => intact = false,
        }
        got += 1;
        if got % 500 == 0 {
            println!("GOT {got} {}", unix_ns());
        }
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
    }
    // Events that came with the last messages.
    take_events(&g, &mut removed, &mut gone);
    let words = |o: Option<u64>| o.map_or("none".to_string(), |v| v.to_string());
    println!(
        "RESULT got={got} first={} last={} in_order={in_order} intact={intact} publishers={} \
         removed={removed} gone={gone} {}",
        words(first),
        words(prev),
        publishers.len(),
        stats_words(&g.stats())
    );
    Ok(true)
}

/// The multicast header's fields (the format documented in `rdmx_ud::mcast::wire`, written
/// here from that description as a stranger would).
struct Forged {
    kind: u8,
    flags: u8,
    group: u32,
    source: u32,
    stream: u32,
    seq: u32,
    aux: u32,
    epoch: u32,
}

impl Forged {
    fn bytes(&self, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![0x81, self.kind, self.flags, 0];
        for w in [
            self.group,
            self.source,
            self.stream,
            self.seq,
            self.aux,
            self.epoch,
        ] {
            v.extend_from_slice(&w.to_be_bytes());
        }
        v.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        v.extend_from_slice(&[0, 0]);
        v.extend_from_slice(payload);
        v
    }
}

/// The id of group `name` (FNV-1a of its bytes, as the group layer maps names).
fn group_id(name: &str) -> u32 {
    name.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// `group-garbage --device soft:<ip> --name G --forge <member id> [--count N]`: from a UD
/// queue pair that is not a member, sends N rounds to the group's address (the multicast
/// IP of its id) of: random bytes; truncated headers; a header of another version; a
/// datagram of another group; and, naming member `--forge` as their source, a whole data
/// message far ahead in its stream, a data message in another epoch (a restart), a
/// `Leave`, and a `Removed` of every member. Prints `RESULT sent=<datagrams>`.
pub(crate) fn garbage(a: &Args) -> Res<bool> {
    a.only(&["device", "name", "forge", "count"])?;
    let device: String = a.req("device")?;
    let name: String = a.req("name")?;
    let forge: u32 = a.req("forge")?;
    let count: u64 = a.or("count", 20)?;
    let group = group_id(&name);
    let [_, b, c, d] = group.to_be_bytes();
    let addr = Ipv4Addr::new(239, b.max(1), c, d);
    let depth = 16;
    let u = mcast::ud(&device, QKEY, depth)?;
    let ah =
        u.pd.create_ah(&AhAttr::new(Gid::from(addr)))
            .ctx("create_ah")?;
    let mut rng = unix_ns() | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let data = |source: u32, seq: u32, epoch: u32, grp: u32| {
        let msg = b"forged message";
        let mut p = (msg.len() as u32).to_be_bytes().to_vec();
        p.extend_from_slice(msg);
        Forged {
            kind: 1,
            flags: 1 | 2,
            group: grp,
            source,
            stream: source,
            seq,
            aux: seq,
            epoch,
        }
        .bytes(&p)
    };
    let mut frames: Vec<Vec<u8>> = Vec::new();
    for i in 0..count as u32 {
        let n = (next() % 200) as usize + 1;
        frames.push((0..n).map(|_| next() as u8).collect());
        let whole = data(forge, 1_000_000 + i, next() as u32, group);
        frames.push(whole[..(i as usize % 31) + 1].to_vec());
        let mut other_version = whole.clone();
        other_version[0] = 0x82;
        frames.push(other_version);
        frames.push(data(forge, i, 7, group ^ 0x5a5a));
        frames.push(whole);
        frames.push(data(forge, 1_000 + i, 0xdead_0000 + i, group));
        let ctl = |kind: u8, seq: u32| {
            Forged {
                kind,
                flags: 0,
                group,
                source: forge,
                stream: forge,
                seq,
                aux: 0,
                epoch: 0,
            }
            .bytes(&[])
        };
        frames.push(ctl(6, 0));
        frames.push(ctl(5, next() as u32));
    }
    let mut wc = [WorkCompletion::EMPTY; 16];
    let mut sent = 0u64;
    for f in &frames {
        u.mr.write(0, f).ctx("write")?;
        let s = [u.mr.sge(0, f.len())];
        let wr = SendWr::send(sent, &s)
            .signaled()
            .to(&ah, Qpn::MULTICAST, QKEY);
        u.qp.post_send(&wr).ctx("post_send")?;
        // One at a time: the buffer is reused.
        let n =
            u.cq.poll_blocking(&mut wc, Duration::from_secs(5))
                .ctx("poll")?;
        if n == 0 || wc[0].status != WcStatus::Success {
            return Err(format!("a send did not complete: {:?}", &wc[..n]));
        }
        sent += 1;
        std::thread::sleep(Duration::from_micros(300));
    }
    println!("RESULT sent={sent} {}", unix_ns());
    Ok(true)
}
