//! `rdmx devices`: device and port attributes, in the spirit of `ibv_devinfo -v`.

use std::fmt::Write as _;

use clap::Args;
use rdmx::verbs::{Context, Device, DeviceAttr, Mtu, PortState};

use crate::error::{Error, Result, ResultExt};

/// Options of `rdmx devices`.
#[derive(Debug, Args)]
pub(crate) struct DevicesArgs {
    /// Show only this device (e.g. `soft:127.0.0.1` or `soft:10.0.0.1:4791`).
    #[arg(long, short = 'd')]
    device: Option<String>,
}

/// Runs `rdmx devices`.
pub(crate) fn run(args: &DevicesArgs) -> Result<()> {
    let names: Vec<String> = match &args.device {
        Some(d) => vec![d.clone()],
        None => Device::list()
            .ctx("listing RDMA devices")?
            .iter()
            .map(|d| d.name().to_string())
            .collect(),
    };
    if names.is_empty() {
        println!("No RDMA devices found");
        return Ok(());
    }
    let mut failed = Vec::new();
    for (i, name) in names.iter().enumerate() {
        if i > 0 {
            println!();
        }
        match Device::open(name) {
            Ok(ctx) => print!("{}", describe(name, &ctx)?),
            Err(e) => {
                eprintln!(
                    "rdmx: {}",
                    Error::with_source(format!("cannot open device {name}"), e)
                );
                failed.push(name.clone());
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Error::msg(format!("could not open {}", failed.join(", "))))
    }
}

fn mtu_str(m: Mtu) -> String {
    format!("{} ({})", m.bytes(), m as u32)
}

fn guid_str(g: u64) -> String {
    let b = g.to_be_bytes();
    format!(
        "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
    )
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn capabilities(a: &DeviceAttr) -> String {
    format!(
        "SRQ: {} (max_srq {}), XRC: {}, APM: {}, multicast: {} (max_mcast_grp {})",
        yes_no(a.max_srq > 0),
        a.max_srq,
        yes_no(a.xrc),
        yes_no(a.auto_path_mig),
        yes_no(a.max_mcast_grp > 0),
        a.max_mcast_grp
    )
}

/// Formats one opened device (a `String`, so that a failure half-way prints nothing).
fn describe(name: &str, ctx: &Context) -> Result<String> {
    let a = ctx.query_device();
    let mut s = String::new();
    let w = &mut s;
    // Writing into a String cannot fail.
    let _ = writeln!(w, "hca_id:\t{name}");
    let _ = writeln!(w, "\topened as:\t\t{}", ctx.name());
    let _ = writeln!(w, "\ttransport:\t\tRoCEv2 over UDP (soft provider)");
    let _ = writeln!(w, "\tfw_ver:\t\t\t{}", a.fw_ver);
    let _ = writeln!(w, "\tnode_guid:\t\t{}", guid_str(a.node_guid));
    let _ = writeln!(w, "\tvendor_id:\t\t{:#06x}", a.vendor_id);
    let _ = writeln!(w, "\tphys_port_cnt:\t\t{}", a.phys_port_cnt);
    let _ = writeln!(w, "\tmax_mr_size:\t\t{:#x}", a.max_mr_size);
    let _ = writeln!(w, "\tmax_qp:\t\t\t{}", a.max_qp);
    let _ = writeln!(w, "\tmax_qp_wr:\t\t{}", a.max_qp_wr);
    let _ = writeln!(w, "\tmax_sge:\t\t{}", a.max_sge);
    let _ = writeln!(w, "\tmax_cq:\t\t\t{}", a.max_cq);
    let _ = writeln!(w, "\tmax_cqe:\t\t{}", a.max_cqe);
    let _ = writeln!(w, "\tmax_mr:\t\t\t{}", a.max_mr);
    let _ = writeln!(w, "\tmax_pd:\t\t\t{}", a.max_pd);
    let _ = writeln!(w, "\tmax_qp_rd_atom:\t\t{}", a.max_qp_rd_atom);
    let _ = writeln!(w, "\tmax_qp_init_rd_atom:\t{}", a.max_qp_init_rd_atom);
    let _ = writeln!(w, "\tmax_inline_data:\t{}", a.max_inline_data);
    let atomic = if a.atomic_glob {
        "ATOMIC_GLOB (2)"
    } else {
        "ATOMIC_HCA (1)"
    };
    let _ = writeln!(w, "\tatomic_cap:\t\t{atomic}");
    let _ = writeln!(w, "\tcapabilities:\t\t{}", capabilities(&a));
    for port in 1..=a.phys_port_cnt {
        let p = ctx
            .query_port(port)
            .with_ctx(|| format!("querying port {port}"))?;
        let gid = ctx
            .query_gid(port, 0)
            .with_ctx(|| format!("querying GID 0 of port {port}"))?;
        // The entry rdmx endpoints use (`RDMX_GID_INDEX` overrides it).
        let chosen = ctx
            .roce_v2_gid_index(port)
            .with_ctx(|| format!("choosing the GID of port {port}"))?;
        let chosen_gid = ctx
            .query_gid(port, chosen)
            .with_ctx(|| format!("querying GID {chosen} of port {port}"))?;
        let chosen_type = ctx
            .query_gid_type(port, chosen)
            .map_or_else(|_| "type unknown".to_string(), |t| format!("{t:?}"));
        let addr = ctx
            .port_addr(port)
            .with_ctx(|| format!("address of port {port}"))?;
        let state = match p.state {
            PortState::Active => "PORT_ACTIVE (4)",
            PortState::Down => "PORT_DOWN (1)",
        };
        let _ = writeln!(w, "\t\tport:\t{port}");
        let _ = writeln!(w, "\t\t\tstate:\t\t{state}");
        let _ = writeln!(w, "\t\t\tmax_mtu:\t{}", mtu_str(p.max_mtu));
        let _ = writeln!(w, "\t\t\tactive_mtu:\t{}", mtu_str(p.active_mtu));
        let _ = writeln!(w, "\t\t\tmax_msg_sz:\t{:#x}", p.max_msg_sz);
        let _ = writeln!(w, "\t\t\tgid_tbl_len:\t{}", p.gid_tbl_len);
        let _ = writeln!(w, "\t\t\tlink_layer:\t{}", p.link_layer);
        let _ = writeln!(w, "\t\t\tGID[0]:\t\t{gid}");
        let _ = writeln!(
            w,
            "\t\t\trdmx GID:\tGID[{chosen}] {chosen_gid} ({chosen_type}; RDMX_GID_INDEX overrides)"
        );
        let _ = writeln!(w, "\t\t\tudp_addr:\t{addr}");
    }
    Ok(s)
}
