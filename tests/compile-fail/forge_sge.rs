// An SGE made from an address and a key would name any registered memory, pool buffers
// the application writes among them.
use rdmx::verbs::{Lkey, Sge};

fn main() {
    let _sge = Sge { addr: 0x1000, length: 4096, lkey: Lkey(7) };
}
