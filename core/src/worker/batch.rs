//! Send batches: while a thread holds one, what it sends may leave together.

use super::Worker;

thread_local! {
    /// The workers (by identity) with a send batch open on this thread, innermost last.
    static OPEN_BATCHES: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// An open send batch ([`Worker::batch`]); dropping it sends what it held.
#[derive(Debug)]
#[must_use = "the batch ends when the guard is dropped"]
pub struct Batch<'a> {
    worker: &'a Worker,
    // Dropped after `drop` below has had the transports send what they hold, so that it
    // leaves with the rest of the batch.
    _posts: rdmx_verbs::PostBatch<'a>,
    // The open batch is recorded per thread.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Worker {
    /// Opens a send batch on this thread: until the returned guard is dropped, what this
    /// thread sends through the worker's transports may be held by the device and leave
    /// together, and a transport may pack small messages of one endpoint into shared
    /// frames ([`batch_open`](Self::batch_open) tells it). Delivery, order and errors are
    /// those of the same sends made one by one.
    pub fn batch(&self) -> Batch<'_> {
        let me = self.id();
        OPEN_BATCHES.with(|b| b.borrow_mut().push(me));
        Batch {
            worker: self,
            _posts: self.verbs_context().batch_posts(),
            _not_send: std::marker::PhantomData,
        }
    }

    /// True when the calling thread has a send batch open on this worker.
    pub fn batch_open(&self) -> bool {
        let me = self.id();
        OPEN_BATCHES.with(|b| b.borrow().contains(&me))
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        let me = self.worker.id();
        OPEN_BATCHES.with(|b| {
            let mut b = b.borrow_mut();
            if let Some(i) = b.iter().rposition(|&x| x == me) {
                b.remove(i);
            }
        });
        let mut st = self.worker.lock();
        self.worker.flush_batches(&mut st);
    }
}
