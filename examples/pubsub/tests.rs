//! The bench's tests.

use super::*;

fn opts(pubs: usize, subs: usize, mode: Mode) -> BenchOptions {
    BenchOptions {
        pubs,
        subs,
        size: 64,
        secs: 0.3,
        json: true,
        mode,
        ..BenchOptions::default()
    }
}

/// This test binary as the children: they run [`bench_child`] (the harness has no
/// subcommands), their arguments in [`CHILD_ENV`].
fn test_launcher() -> Launcher {
    Launcher {
        exe: std::env::current_exe().unwrap(),
        harness_args: [
            "--exact",
            "tests::bench_child",
            "--ignored",
            "--nocapture",
            "--quiet",
            "--test-threads=1",
        ]
        .map(String::from)
        .to_vec(),
        via_env: true,
    }
}

fn check(r: &BenchReport, pubs: usize, subs: usize, mode: &str) {
    assert_eq!((r.pubs, r.subs, r.mode), (pubs, subs, mode), "{r:?}");
    assert!(r.published > 0, "{r:?}");
    assert_eq!(r.rates.len(), subs, "{r:?}");
    assert!(r.rates.iter().all(|&x| x > 0.0), "{r:?}");
    assert!(r.p50_us > 0.0 && r.p50_us <= r.p99_us && r.p99_us <= r.p999_us);
    assert_eq!(r.lost, 0, "{r:?}");
    assert_eq!(r.out_of_order, 0, "{r:?}");
    assert_eq!(r.removed, 0, "{r:?}");
    assert!(r.json().contains("\"rate_per_sub\""));
    assert!(r.json().contains(&format!("\"mode\":\"{mode}\"")));
}

#[test]
fn runs() {
    let r = bench(&opts(1, 2, Mode::Threads), &test_launcher()).unwrap();
    check(&r, 1, 2, "threads");
}

#[test]
fn two_publishers() {
    let r = bench(&opts(2, 2, Mode::Threads), &test_launcher()).unwrap();
    check(&r, 2, 2, "threads");
}

/// Every participant a child process (this test binary, through [`bench_child`]).
#[test]
fn processes() {
    let r = bench(&opts(2, 2, Mode::Procs), &test_launcher()).unwrap();
    check(&r, 2, 2, "procs");
}

/// Every participant in a network namespace of its own. Needs root: skipped (with a word
/// on stderr) otherwise, unless `RDMX_REQUIRE_NETNS=1` (CI), which makes it fail.
#[test]
fn netns() {
    if effective_uid() != Some(0) {
        assert!(
            std::env::var("RDMX_REQUIRE_NETNS").as_deref() != Ok("1"),
            "RDMX_REQUIRE_NETNS=1 but not root: cannot create network namespaces"
        );
        eprintln!("pubsub netns test skipped: needs root (network namespaces)");
        return;
    }
    let r = bench(&opts(1, 2, Mode::Netns), &test_launcher()).unwrap();
    check(&r, 1, 2, "netns");
    let prefix = format!("rdmx-{}-ps-", std::process::id());
    assert!(
        !list_netns().unwrap().iter().any(|n| n.starts_with(&prefix)),
        "namespaces left"
    );
}

/// The children's entry under `cargo test` (run by the tests above with their
/// arguments in [`CHILD_ENV`]; alone it has nothing to do).
#[test]
#[ignore = "the child processes' entry, not a test"]
fn bench_child() {
    let Ok(args) = std::env::var(CHILD_ENV) else {
        return;
    };
    let args: Vec<String> = args.lines().map(String::from).collect();
    if let Err(e) = child_main(&args) {
        eprintln!("pubsub child: {e}");
        std::process::exit(1);
    }
}

#[test]
fn bad_options() {
    let parse =
        |s: &str| BenchOptions::parse(&s.split_whitespace().map(String::from).collect::<Vec<_>>());
    assert!(parse("").is_ok());
    let o = parse("--pubs 2 --subs 3 --procs --size 32 --rate 1000 --json").unwrap();
    assert_eq!((o.pubs, o.subs, o.mode, o.size), (2, 3, Mode::Procs, 32));
    assert_eq!(parse("--procs --netns").unwrap().mode, Mode::Netns);
    assert_eq!(parse("--netns --procs").unwrap().mode, Mode::Netns);
    for bad in [
        "--subs 0",
        "--pubs 0",
        "--size 15",
        "--size x",
        "--secs 0",
        "--secs -1",
        "--rate 0",
        "--subs",
        "--bogus",
        "--pubs 100 --subs 100",
    ] {
        assert!(parse(bad).is_err(), "{bad} accepted");
    }
}

#[test]
fn results_round_trip() {
    let mut lat = Histogram::default();
    for ns in [0, 5, 127, 128, 129, 1_000, 65_000, 1 << 40, u64::MAX] {
        lat.record(ns);
        let v = Histogram::value(Histogram::bucket(ns));
        assert!((v - ns as f64).abs() <= ns as f64 / 64.0, "{ns}: {v}");
    }
    let s = Outcome::Sub(SubResult {
        got: 9,
        first_ns: 1,
        last_ns: 2,
        streams: vec![StreamSeen {
            publisher: 7,
            got: 9,
            next: 10,
            gaps: 1,
            out_of_order: 0,
            ended: true,
        }],
        lat,
        naks_sent: 3,
    });
    assert_eq!(Outcome::decode(&s.encode()).unwrap(), s);
    let p = Outcome::Pub(PubResult {
        member: 1,
        published: 2,
        repairs_sent: 3,
        naks_sent: 5,
        removed: 4,
    });
    assert_eq!(Outcome::decode(&p.encode()).unwrap(), p);
}
