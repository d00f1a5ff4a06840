// The misuse: post a pooled buffer as a receive and write it while the NIC may.
// Naming a buffer's bytes in a work request takes a `PostKey`, which only transports get.
use rdmx::core::pool::{BufferPool, PoolConfig};
use rdmx::verbs::{Device, QpInitAttr, RecvWr};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = Device::open("soft:127.0.0.1")?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(16, None)?;
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq))?;
    let pool = BufferPool::new(
        &pd,
        PoolConfig { max_bytes: 1 << 24, remote_read_min: usize::MAX, extra_classes: Vec::new() },
    );
    let mut buf = pool.try_alloc(4096)?;
    qp.post_recv(&RecvWr::new(1, &[buf.sge()]))?;
    buf[0] = 1; // the NIC may write these bytes at the same time
    Ok(())
}
