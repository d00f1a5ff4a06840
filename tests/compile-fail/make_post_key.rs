// Only a worker makes the key that lets code post pool buffers.
use rdmx::core::pool::PostKey;

fn main() {
    let _key = PostKey(());
}
