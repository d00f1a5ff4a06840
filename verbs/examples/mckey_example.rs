//! The RDMA Aware Networks Programming User Manual's multicast example (`mckey`), on
//! rdmx-verbs' connection manager: each node is a UD ID that resolves the multicast
//! address (ADDR_RESOLVED), creates its QP and buffers, posts its receives and joins the
//! group (MULTICAST_JOIN, whose UD parameters give the address handle, QPN and Q_Key).
//! The sender's nodes send `message_count` SEND_WITH_IMMs to the group; every receiver node
//! gets each of them, with the sender node's number as immediate data and the message's
//! pattern intact. Then all nodes leave the group. A mismatch exits non-zero.
//!
//! ```sh
//! cargo run -p rdmx-verbs --example mckey_example                      # both, loopback
//! cargo run -p rdmx-verbs --example mckey_example -- receiver 239.1.2.3 # one side each
//! cargo run -p rdmx-verbs --example mckey_example -- sender 239.1.2.3
//! ```

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use rdmx_verbs::ah::GRH_LEN;
use rdmx_verbs::cm::{CmEventKind as K, CmId, EventChannel, PortSpace, UdParam};
use rdmx_verbs::{
    AddressHandle, CompletionQueue, MemoryRegion, QpCap, QpInitAttr, SendFlags, SendWr, WcFlags,
    WcOpcode, WcStatus, WrOpcode,
};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const WAIT: Duration = Duration::from_secs(10);
/// The UDP port of the multicast address (rdma_cm ports; not used by RoCE multicast).
const PORT: u16 = 7174;
/// The immediate data of sender node `n`'s messages is `IMM_BASE + n`.
const IMM_BASE: u32 = 0x1000;

/// One node (`struct cmatest_node`).
struct Node {
    id: CmId,
    mr: MemoryRegion,
    recv_cq: CompletionQueue,
    /// From MULTICAST_JOIN: the group's address handle, QPN and Q_Key.
    dest: Option<(AddressHandle, UdParam)>,
}

/// The message node `n` sends, `size` bytes.
fn pattern(n: usize, size: usize) -> Vec<u8> {
    (0..size).map(|i| (i + 7 * n) as u8).collect()
}

/// `addr_handler`: `init_node` (CQs, UD QP, buffer), `post_recvs`, `rdma_join_multicast`.
fn init_node(id: CmId, group: IpAddr, count: usize, size: usize, sender: bool) -> Res<Node> {
    let ctx = id.context().ok_or("the ID is not bound")?.clone();
    let send_cq = ctx.create_cq(count + 1, None)?;
    let recv_cq = ctx.create_cq(count + 1, None)?;
    let mut attr = QpInitAttr::ud(&send_cq, &recv_cq);
    attr.cap = QpCap {
        max_send_wr: count as u32 + 1,
        max_recv_wr: count as u32 + 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        ..QpCap::default()
    };
    id.create_qp(None, &attr)?;
    let slot = size + GRH_LEN;
    let mr = id.reg_msgs(slot * count.max(1))?;
    if !sender {
        for i in 0..count {
            id.post_recv(i as u64, &mr, i * slot, slot)?;
        }
    }
    id.join_multicast(group)?;
    Ok(Node {
        id,
        mr,
        recv_cq,
        dest: None,
    })
}

/// Creates `connections` nodes and joins them all: `run` up to `connect_events`, whose
/// `cma_handler` takes ADDR_RESOLVED (`addr_handler`) and MULTICAST_JOIN (`join_handler`)
/// in whatever order they come.
fn join_all(
    ch: &EventChannel,
    group: IpAddr,
    connections: usize,
    count: usize,
    size: usize,
    sender: bool,
) -> Res<Vec<Node>> {
    for _ in 0..connections {
        let id = ch.create_id(PortSpace::Udp)?;
        let src = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
        id.resolve_addr(
            Some(src),
            SocketAddr::new(group, PORT),
            Duration::from_secs(2),
        )?;
    }
    let mut nodes: Vec<Node> = Vec::new();
    let mut connects_left = connections;
    while connects_left > 0 {
        let ev = ch.get_event(WAIT).ok_or("no CM event in time")?;
        match ev.kind {
            K::AddrResolved => nodes.push(init_node(ev.id, group, count, size, sender)?),
            K::MulticastJoin => {
                let ud = ev.ud.ok_or("MULTICAST_JOIN without UD parameters")?;
                let node = nodes
                    .iter_mut()
                    .find(|n| n.id == ev.id)
                    .ok_or("an event for an unknown node")?;
                let pd = node.id.pd().ok_or("no PD")?;
                node.dest = Some((pd.create_ah(&ud.ah_attr)?, ud));
                connects_left -= 1;
            }
            other => return Err(format!("mckey: event {other}, error {}", ev.status).into()),
        }
    }
    println!("mckey: {connections} node(s) joined {group}");
    Ok(nodes)
}

/// `post_sends`: every node sends `count` messages of `size` bytes to the group.
fn post_sends(nodes: &[Node], count: usize, size: usize) -> Res<()> {
    for (n, node) in nodes.iter().enumerate() {
        let (ah, ud) = node.dest.as_ref().ok_or("the node has not joined")?;
        node.mr.write(0, &pattern(n, size))?;
        let qp = node.id.qp().ok_or("no QP")?;
        for i in 0..count {
            let sge = [node.mr.sge(0, size)];
            let wr = SendWr::new(
                i as u64,
                WrOpcode::SendWithImm {
                    imm: IMM_BASE + n as u32,
                },
                &sge,
            )
            .flags(SendFlags::SIGNALED)
            .to(ah, ud.qp_num, ud.qkey);
            qp.post_send(&wr)?;
            let wc = node.id.get_send_comp(WAIT)?;
            if wc.status != WcStatus::Success {
                return Err(format!("send {i} completed with {:?}", wc.status).into());
            }
        }
    }
    Ok(())
}

/// `poll_cqs`: every node receives `count` messages from sender node 0.
fn poll_cqs(nodes: &[Node], count: usize, size: usize) -> Res<()> {
    let want = pattern(0, size);
    for (n, node) in nodes.iter().enumerate() {
        for _ in 0..count {
            let wc = node.id.get_recv_comp(WAIT)?;
            if wc.status != WcStatus::Success || wc.opcode != WcOpcode::Recv {
                return Err(format!("node {n}: receive completed with {:?}", wc.status).into());
            }
            let imm = wc.wc_flags.contains(WcFlags::WITH_IMM) && wc.imm_data == IMM_BASE;
            if !imm || wc.byte_len as usize != GRH_LEN + size {
                return Err(format!("node {n}: unexpected completion {wc:?}").into());
            }
            let off = wc.wr_id as usize * (size + GRH_LEN) + GRH_LEN;
            if node.mr.to_vec(off, size)? != want {
                return Err(format!("node {n}: the message's bytes are wrong").into());
            }
        }
        let _ = &node.recv_cq;
    }
    println!(
        "mckey: {} node(s) received {count} message(s) each",
        nodes.len()
    );
    Ok(())
}

fn leave_all(nodes: &[Node], group: IpAddr) -> Res<()> {
    for node in nodes {
        node.id.leave_multicast(group)?;
    }
    Ok(())
}

/// Receivers and one sender in this process, on `group`.
pub(crate) fn run(group: IpAddr, receivers: usize, count: usize, size: usize) -> Res<()> {
    let rch = EventChannel::new()?;
    let rx = join_all(&rch, group, receivers, count, size, false)?;
    let sch = EventChannel::new()?;
    let tx = join_all(&sch, group, 1, count, size, true)?;
    post_sends(&tx, count, size)?;
    poll_cqs(&rx, count, size)?;
    leave_all(&tx, group)?;
    leave_all(&rx, group)?;
    println!("mckey: data transfers complete");
    Ok(())
}

#[allow(dead_code, reason = "the tests call run, not main")]
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let group =
        |i: usize| -> Res<IpAddr> { Ok(args.get(i).map_or("239.1.2.3", String::as_str).parse()?) };
    let (count, size) = (10, 100);
    let r = match args.first().map(String::as_str) {
        None => group(99).and_then(|g| run(g, 2, count, size)),
        Some("receiver") => group(1).and_then(|g| {
            let ch = EventChannel::new()?;
            let nodes = join_all(&ch, g, 1, count, size, false)?;
            let r = poll_cqs(&nodes, count, size);
            leave_all(&nodes, g)?;
            r
        }),
        Some("sender") => group(1).and_then(|g| {
            let ch = EventChannel::new()?;
            let nodes = join_all(&ch, g, 1, count, size, true)?;
            post_sends(&nodes, count, size)?;
            leave_all(&nodes, g)
        }),
        Some(other) => {
            Err(format!("usage: mckey_example [receiver|sender GROUP] ({other}?)").into())
        }
    };
    match r {
        Ok(()) => println!("mckey_example: ok"),
        Err(e) => {
            eprintln!("mckey_example: {e}");
            std::process::exit(1);
        }
    }
}
