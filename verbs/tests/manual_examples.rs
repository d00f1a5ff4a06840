//! The reference manual's example programs (`verbs/examples/`), run as tests: each checks
//! its own results and fails on a mismatch.
#![allow(missing_docs)]

#[path = "../examples/rc_example.rs"]
#[allow(
    dead_code,
    clippy::print_stdout,
    reason = "an example program, run here"
)]
mod rc_example;

#[test]
fn the_rc_example_sends_reads_and_writes() {
    if let Err(e) = rc_example::run_both() {
        panic!("{e}");
    }
}

#[path = "../examples/srq_example.rs"]
#[allow(
    dead_code,
    clippy::print_stdout,
    reason = "an example program, run here"
)]
mod srq_example;

#[test]
fn the_srq_example_receives_every_qps_messages_through_one_srq() {
    if let Err(e) = srq_example::run(4, 3) {
        panic!("{e}");
    }
}

#[path = "../examples/apm_example.rs"]
#[allow(
    dead_code,
    clippy::print_stdout,
    reason = "an example program, run here"
)]
mod apm_example;

#[test]
fn the_apm_example_migrates_and_traffic_goes_on() {
    if std::env::var("RDMX_TEST_DEVICE").is_ok_and(|d| !d.starts_with("soft:")) {
        eprintln!("skipped: the APM example picks two two-port soft devices");
        return;
    }
    if let Err(e) = apm_example::run() {
        panic!("{e}");
    }
}

#[path = "../examples/xrc_example.rs"]
#[allow(
    dead_code,
    clippy::print_stdout,
    reason = "an example program, run here"
)]
mod xrc_example;

#[test]
fn the_xrc_example_reaches_every_srq_through_one_initiator() {
    if let Err(e) = xrc_example::run(3) {
        panic!("{e}");
    }
}

#[path = "../examples/rdma_cm_example.rs"]
#[allow(
    dead_code,
    clippy::print_stdout,
    reason = "an example program, run here"
)]
mod rdma_cm_example;

#[test]
fn the_rdma_cm_example_connects_exchanges_and_disconnects() {
    if std::env::var("RDMX_TEST_DEVICE").is_ok_and(|d| !d.starts_with("soft:")) {
        eprintln!("skipped: the connection manager runs on soft devices only");
        return;
    }
    if let Err(e) = rdma_cm_example::run_both() {
        panic!("{e}");
    }
}

#[path = "../examples/mckey_example.rs"]
#[allow(
    dead_code,
    clippy::print_stdout,
    reason = "an example program, run here"
)]
mod mckey_example;

#[test]
fn the_mckey_example_reaches_every_receiver_through_the_group() {
    if std::env::var("RDMX_TEST_DEVICE").is_ok_and(|d| !d.starts_with("soft:")) {
        eprintln!("skipped: the connection manager runs on soft devices only");
        return;
    }
    // A group unique to this process, so that parallel test runs do not mix.
    let pid = std::process::id();
    let group = std::net::Ipv4Addr::new(239, 79, (pid % 250) as u8, 1);
    if let Err(e) = mckey_example::run(group.into(), 2, 4, 64) {
        panic!("{e}");
    }
}
