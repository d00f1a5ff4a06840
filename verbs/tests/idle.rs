//! An idle soft device must not spin a core: its engine thread sleeps in the kernel (and so
//! does the connection manager's channel thread).

mod common;

use std::time::Duration;

/// CPU time (user + system) of this process, from /proc/self/stat, in clock ticks.
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("read /proc/self/stat");
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

#[test]
fn idle_devices_do_not_spin() {
    // Two connected devices with posted receives, then nothing happens for 1.5 s.
    let a = common::Side::new(4096, 1);
    let b = common::Side::new(4096, 2);
    a.connect(&b.info());
    b.connect(&a.info());
    let r = [b.mr.sge(0, 64)];
    b.qp.post_recv(&rdmx_verbs::RecvWr::new(1, &r)).unwrap();
    // And a connection manager listening, whose channel thread must sleep too.
    let cm = rdmx_verbs::EventChannel::new().unwrap();
    let listener = cm.create_id(rdmx_verbs::PortSpace::Tcp).unwrap();
    listener.bind_addr("127.0.0.1:0".parse().unwrap()).unwrap();
    listener.listen(4).unwrap();
    // Let any start-up work finish.
    std::thread::sleep(Duration::from_millis(100));
    let before = cpu_ticks();
    std::thread::sleep(Duration::from_millis(1500));
    let used = cpu_ticks() - before;
    // Clock ticks are usually 10 ms; a spinning engine thread would use ~150.
    assert!(used <= 10, "idle devices used {used} ticks of CPU in 1.5 s");
}
