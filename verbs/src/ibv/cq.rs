//! Completion queues on the device's completion channel.

use std::sync::Arc;

use super::{IbvDevice, Ptr, events, ffi, last_err};
use crate::error::VerbsError;
use crate::soft::driver::ChannelInner;
use crate::types::WorkCompletion;

impl IbvDevice {
    pub(super) fn create_cq(
        &self,
        cqe: usize,
        channel: &Arc<ChannelInner>,
    ) -> Result<u32, VerbsError> {
        if self.chan.is_null() {
            return Err(self.unsupported("CQs: this device has no completion channel"));
        }
        let n = std::os::raw::c_int::try_from(cqe)
            .map_err(|_| VerbsError::InvalidArgument(format!("CQ size {cqe}")))?;
        let h = self.t.lock().next_handle();
        self.shared
            .channels
            .lock()
            .insert(h, Arc::downgrade(channel));
        // SAFETY: `ctx` and `chan` are live until `Drop`, which destroys CQs first. The CQ
        // context is the handle as an integer, never dereferenced.
        let cq = unsafe {
            ffi::ibv_create_cq(
                self.ctx,
                n,
                h as usize as *mut std::os::raw::c_void,
                self.chan,
                0,
            )
        };
        if cq.is_null() {
            let e = last_err("ibv_create_cq");
            self.shared.channels.lock().remove(&h);
            return Err(e);
        }
        self.t.lock().cqs.insert(h, Ptr(cq));
        Ok(h)
    }

    pub(super) fn destroy_cq(&self, cq: u32) {
        let p = self.t.lock().cqs.remove(&cq);
        if let Some(p) = p {
            // SAFETY: live CQ removed from the table; its QPs/SRQs hold the public CQ, so none
            // is left. Events are acknowledged by the event thread as they arrive.
            let rc = unsafe { ffi::ibv_destroy_cq(p.0) };
            if rc != 0 {
                tracing::warn!(device = %self.name, cq, rc, "ibv_destroy_cq failed; leaked");
            }
        }
        self.shared.channels.lock().remove(&cq);
    }

    pub(super) fn poll_cq(&self, cq: u32, wc: &mut [WorkCompletion]) -> usize {
        let Some(p) = self.cq(cq) else {
            return 0;
        };
        // SAFETY: `p` is a live CQ (see `Ptr`); its context's ops table is filled by the
        // provider at open and never changes.
        let Some(poll) = (unsafe { (*(*p.0).context).ops.poll_cq }) else {
            return 0;
        };
        let mut buf = [events::RawWc::default(); 16];
        let mut done = 0;
        while done < wc.len() {
            let want = (wc.len() - done).min(buf.len());
            // SAFETY: `buf` holds at least `want` entries laid out as `struct ibv_wc` (checked
            // at compile time in `events`); the CQ is live.
            let n = unsafe { poll(p.0, want as std::os::raw::c_int, buf.as_mut_ptr().cast()) };
            let Ok(n) = usize::try_from(n) else {
                tracing::warn!(device = %self.name, cq, rc = n, "ibv_poll_cq failed");
                break;
            };
            let n = n.min(want);
            for (dst, src) in wc[done..done + n].iter_mut().zip(&buf[..n]) {
                *dst = src.to_wc();
            }
            done += n;
            if n < want {
                break;
            }
        }
        done
    }

    pub(super) fn req_notify_cq(&self, cq: u32, solicited_only: bool) {
        let Some(p) = self.cq(cq) else {
            return;
        };
        // SAFETY: live CQ; see `poll_cq`.
        let Some(notify) = (unsafe { (*(*p.0).context).ops.req_notify_cq }) else {
            return;
        };
        // SAFETY: live CQ; the call only arms it.
        let rc = unsafe { notify(p.0, std::os::raw::c_int::from(solicited_only)) };
        if rc != 0 {
            tracing::warn!(device = %self.name, cq, rc, "ibv_req_notify_cq failed");
        }
    }
}
