//! The multicast group flows, run by `netns_groups.rs` (members in network namespaces) and
//! `loopback_groups.rs` (members as processes on loopback): see those files.

#![allow(
    dead_code,
    reason = "each test file that includes these flows runs some of them"
)]

use std::process::Command;
use std::time::{Duration, Instant};

use rdmx_tests::lines::{Line, describe, lines_with, wait_for_line, wait_for_nth};
use rdmx_tests::netns::{Bridge, Hosts, Topology};
use rdmx_tests::process::{Proc, spawn};

const ROLES: &str = env!("CARGO_BIN_EXE_rdmx-netns-roles");
/// Bound for every wait on a role's output.
const WAIT: Duration = Duration::from_secs(40);
/// Hard limit of every role process.
const LIMIT: Duration = Duration::from_secs(90);

/// Where the members run: each in a network namespace of its own on one bridge, or all on
/// this host's loopback.
pub(crate) enum Place {
    /// Hosts (namespaces) named after their roles.
    Netns(Hosts),
    /// Processes of this host, every device on 127.0.0.1.
    Loopback,
}

impl Place {
    /// Namespaces `hosts` on one bridge.
    pub(crate) fn netns(hosts: &[&str]) -> Self {
        let mut t = Topology::new();
        for h in hosts {
            t = t.host(*h);
        }
        let built = t
            .bridge(Bridge::new("lan", hosts.iter().copied()))
            .build()
            .expect("build the topology");
        Self::Netns(built)
    }

    /// Starts role `role` in `host` with `args` (and `--device`, `--limit-s`), and with
    /// `RDMX_FAULTS=faults` when given.
    fn start(&self, host: &str, role: &str, args: &[&str], faults: Option<&str>) -> Proc {
        let ip = match self {
            Self::Netns(hosts) => hosts.host(host).addr("lan").to_string(),
            Self::Loopback => "127.0.0.1".to_string(),
        };
        let mut c = Command::new(ROLES);
        c.arg(role)
            .args(["--device", &format!("soft:{ip}")])
            .args(["--limit-s", &LIMIT.as_secs().to_string()])
            .args(args);
        if let Some(f) = faults {
            c.env("RDMX_FAULTS", f);
        }
        let timeout = LIMIT + Duration::from_secs(10);
        match self {
            Self::Netns(hosts) => hosts.spawn_with_timeout(host, c, timeout),
            Self::Loopback => spawn(c, timeout),
        }
        .unwrap_or_else(|e| panic!("start {role} in {host}: {e}"))
    }
}

/// The member id a role printed in its `READY` line.
fn member_id(p: &Proc, who: &str) -> u64 {
    let line = wait_for_line(p, "READY", WAIT).unwrap_or_else(|e| panic!("{who}: {e}"));
    Line::parse(&line)
        .and_then(|l| l.num("member"))
        .unwrap_or_else(|| panic!("{who}: no member id in {line:?}"))
}

/// Waits for `p`'s `RESULT` line and its successful exit.
fn result(p: &Proc, who: &str) -> String {
    let line = wait_for_line(p, "RESULT", WAIT).unwrap_or_else(|e| panic!("{who}: {e}"));
    let ok = p.wait().is_ok_and(|o| o.status.success());
    assert!(ok, "{who} failed: {}", describe(p));
    for e in lines_with(&p.stdout_now(), "EVENT") {
        eprintln!("{who}: EVENT {}", e.words.join(" "));
    }
    eprintln!("{who}: {line}");
    line
}

/// The `EVENT <kind>` lines `p` printed.
fn events(p: &Proc, kind: &str) -> Vec<String> {
    lines_with(&p.stdout_now(), "EVENT")
        .into_iter()
        .filter(|l| l.words.first().is_some_and(|w| *w == kind))
        .map(|l| l.words.join(" "))
        .collect()
}

/// Checks that a member got messages `first..=last` of one publisher, in order, intact,
/// with nothing lost, and was neither removed nor told the publisher went away.
fn assert_whole(line: &str, who: &str, first: Option<u64>, last: u64) {
    let r = Line::parse(line).expect("a RESULT line");
    let got_first = r
        .num("first")
        .unwrap_or_else(|| panic!("{who}: nothing received: {line}"));
    if let Some(f) = first {
        assert_eq!(got_first, f, "{who}: first message: {line}");
    }
    assert_eq!(r.num("last"), Some(last), "{who}: last message: {line}");
    assert_eq!(
        r.num("got"),
        Some(last - got_first + 1),
        "{who}: count: {line}"
    );
    assert_eq!(r.flag("in_order"), Some(true), "{who}: {line}");
    assert_eq!(r.flag("intact"), Some(true), "{who}: {line}");
    assert_eq!(r.num("publishers"), Some(1), "{who}: {line}");
    assert_eq!(r.num("lost"), Some(0), "{who}: {line}");
    assert_eq!(r.flag("removed"), Some(false), "{who}: {line}");
    assert_eq!(r.flag("gone"), Some(false), "{who}: {line}");
}

/// Hosts of [`loss_death_late_joiner_forgeries`].
pub(crate) const LOSS_HOSTS: [&str; 6] = ["pub", "m1", "m2", "m3", "late", "bad"];

/// 1 publisher and 3 members losing 5 % of their frames; one killed mid-stream, a late
/// joiner, a stranger's garbage and forgeries.
pub(crate) fn loss_death_late_joiner_forgeries(hosts: &Place, group: &str) {
    const COUNT: u64 = 12_000;
    let name = ["--name", group];
    let last = (COUNT - 1).to_string();
    let sub_args = [name[0], name[1], "--last", &last];
    let m: Vec<Proc> = ["m1", "m2", "m3"]
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let faults = format!("seed={},drop=5%", 11 + i);
            hosts.start(h, "group-sub", &sub_args, Some(&faults))
        })
        .collect();
    let ids: Vec<u64> = m
        .iter()
        .zip(["m1", "m2", "m3"])
        .map(|(p, h)| member_id(p, h))
        .collect();
    let count = COUNT.to_string();
    let p = hosts.start(
        "pub",
        "group-pub",
        &[
            name[0],
            name[1],
            "--count",
            &count,
            "--rate",
            "3000",
            "--receivers",
            "3",
            "--linger-ms",
            "2500",
        ],
        None,
    );
    let pub_id = member_id(&p, "pub");

    // A late joiner, mid-stream.
    wait_for_nth(&m[0], "GOT", 2, WAIT).unwrap_or_else(|e| panic!("m1: {e}"));
    let late = hosts.start("late", "group-sub", &sub_args, None);
    member_id(&late, "late");
    // A stranger forges the publisher's datagrams once every member knows it. (A member
    // binds a member id to the address it first hears it from: a forger that speaks first
    // for an id takes it, which only authentication can prevent.)
    wait_for_nth(&late, "GOT", 1, WAIT).unwrap_or_else(|e| panic!("late: {e}"));
    let forge = pub_id.to_string();
    let bad = hosts.start(
        "bad",
        "group-garbage",
        &[name[0], name[1], "--forge", &forge, "--count", "20"],
        None,
    );
    // m3 dies mid-stream.
    wait_for_nth(&m[2], "GOT", 8, WAIT).unwrap_or_else(|e| panic!("m3: {e}"));
    assert!(m[2].kill(), "m3 ended before it was killed");
    let killed_at = Instant::now();

    let bad_line = result(&bad, "bad");
    let bad_sent = Line::parse(&bad_line).and_then(|l| l.num("sent"));
    assert_eq!(bad_sent, Some(160), "{bad_line}");
    for (p, who) in [(&m[0], "m1"), (&m[1], "m2")] {
        let line = result(p, who);
        assert_whole(&line, who, Some(0), COUNT - 1);
        let r = Line::parse(&line).expect("a RESULT line");
        let asked = r.num("naks_sent").unwrap_or(0) + r.num("naks_suppressed").unwrap_or(0);
        assert!(asked > 0, "{who} missed nothing: {line}");
        // Of each round of 8: random bytes, a truncated header, another version (malformed,
        // though random bytes may look like a header of another kind); 5 naming the
        // publisher from another address (forged). 5 % of them are lost on the way.
        let forged = r.num("forged").unwrap_or(0);
        let malformed = r.num("malformed").unwrap_or(0);
        assert!(
            (70..=100).contains(&forged),
            "{who}: forged={forged}: {line}"
        );
        assert!(
            (40..=60).contains(&malformed),
            "{who}: malformed={malformed}: {line}"
        );
    }
    let line = result(&late, "late");
    let r = Line::parse(&line).expect("a RESULT line");
    assert!(
        r.num("first").is_some_and(|f| f > 0),
        "the late joiner started at the beginning: {line}"
    );
    assert_whole(&line, "late", None, COUNT - 1);

    let line = result(&p, "pub");
    let r = Line::parse(&line).expect("a RESULT line");
    assert_eq!(r.num("sent"), Some(COUNT), "{line}");
    assert_eq!(r.flag("flushed"), Some(true), "{line}");
    let removed = events(&p, "MemberRemoved");
    assert_eq!(removed.len(), 1, "{removed:?}\n{}", describe(&p));
    assert!(
        removed[0].contains(&format!("member={} ", ids[2])) && removed[0].contains("why=Silent"),
        "{removed:?} (m3 is {})",
        ids[2]
    );
    eprintln!(
        "m3 killed; removed {removed:?}; {:?} after the kill the publisher ended",
        killed_at.elapsed()
    );
    assert!(r.num("repairs_sent").unwrap_or(0) > 0, "{line}");
}

/// Hosts of [`slow_reader_and_stalled_member`].
pub(crate) const SLOW_HOSTS: [&str; 4] = ["pub", "fast", "slow", "stall"];

/// A slow reader paces the publisher; a member that stops reading is removed.
pub(crate) fn slow_reader_and_stalled_member(hosts: &Place, group: &str) {
    const COUNT: u64 = 5_000;
    let name = ["--name", group];
    let last = (COUNT - 1).to_string();
    let fast = hosts.start(
        "fast",
        "group-sub",
        &[name[0], name[1], "--last", &last],
        None,
    );
    // 1 ms a message: at most 1,000 messages/s.
    let slow = hosts.start(
        "slow",
        "group-sub",
        &[name[0], name[1], "--last", &last, "--delay-us", "1000"],
        None,
    );
    let stall = hosts.start(
        "stall",
        "group-sub",
        &[name[0], name[1], "--last", &last, "--stall-after", "500"],
        None,
    );
    member_id(&fast, "fast");
    member_id(&slow, "slow");
    let stall_id = member_id(&stall, "stall");
    let count = COUNT.to_string();
    let p = hosts.start(
        "pub",
        "group-pub",
        &[
            name[0],
            name[1],
            "--count",
            &count,
            "--size",
            "3000",
            "--receivers",
            "3",
            "--linger-ms",
            "500",
            "--slow-timeout-ms",
            "1000",
        ],
        None,
    );
    member_id(&p, "pub");

    let line = result(&stall, "stall");
    let r = Line::parse(&line).expect("a RESULT line");
    assert_eq!(r.flag("removed"), Some(true), "{line}");
    assert_eq!(r.num("got"), Some(500), "{line}");
    for (q, who) in [(&fast, "fast"), (&slow, "slow")] {
        let line = result(q, who);
        assert_whole(&line, who, Some(0), COUNT - 1);
    }
    let line = result(&p, "pub");
    let r = Line::parse(&line).expect("a RESULT line");
    // The slow reader takes 1 ms a message; the publisher cannot run further ahead of it
    // than a window of datagrams (512, of one 3,000-byte message each) and its queue
    // (1 MiB: about 350 messages), so it needs at least (COUNT - 900) ms.
    assert_eq!(r.flag("flushed"), Some(true), "{line}");
    let elapsed = r.num("publish_ms").expect("publish_ms");
    assert!(
        elapsed >= 3_000,
        "the publisher was not paced by the slow reader: {line}"
    );
    let removed = events(&p, "MemberRemoved");
    assert_eq!(removed.len(), 1, "{removed:?}\n{}", describe(&p));
    assert!(
        removed[0].contains(&format!("member={stall_id} ")) && removed[0].contains("why=TooSlow"),
        "{removed:?} (the stalled member is {stall_id})"
    );
}

/// Hosts of [`killed_publisher`].
pub(crate) const PUBDEATH_HOSTS: [&str; 3] = ["pub", "m1", "m2"];

/// A publisher killed mid-stream is reported gone to its members.
pub(crate) fn killed_publisher(hosts: &Place, group: &str) {
    let name = ["--name", group];
    let args = [
        name[0],
        name[1],
        "--last",
        "999999",
        "--publisher-timeout-ms",
        "1000",
    ];
    let m1 = hosts.start("m1", "group-sub", &args, None);
    let m2 = hosts.start("m2", "group-sub", &args, None);
    member_id(&m1, "m1");
    member_id(&m2, "m2");
    let p = hosts.start(
        "pub",
        "group-pub",
        &[
            name[0],
            name[1],
            "--count",
            "1000000",
            "--rate",
            "2000",
            "--receivers",
            "2",
        ],
        None,
    );
    let pub_id = member_id(&p, "pub");
    wait_for_nth(&m1, "GOT", 2, WAIT).unwrap_or_else(|e| panic!("m1: {e}"));
    assert!(p.kill(), "the publisher ended before it was killed");
    let killed = Instant::now();
    for (q, who) in [(&m1, "m1"), (&m2, "m2")] {
        let line = result(q, who);
        let after = killed.elapsed();
        let r = Line::parse(&line).expect("a RESULT line");
        assert_eq!(r.flag("gone"), Some(true), "{who}: {line}");
        assert_eq!(r.flag("in_order"), Some(true), "{who}: {line}");
        assert_eq!(r.flag("intact"), Some(true), "{who}: {line}");
        let gone = events(q, "PublisherGone");
        assert!(
            gone.len() == 1 && gone[0].contains(&format!("publisher={pub_id} ")),
            "{who}: {gone:?}"
        );
        // The publisher timeout (1 s), and what it takes to notice and print.
        assert!(
            after < Duration::from_secs(5),
            "{who}: reported after {after:?}"
        );
    }
}
