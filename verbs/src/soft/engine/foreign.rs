//! What a NIC needs to host an XRC domain shared with other processes (`soft::xrcd`):
//! memory regions mirrored from a member process under the member's own keys, CQs whose
//! completions are handed out for forwarding, and injection of completions and events that
//! a hosting NIC forwarded to a member.

use std::sync::Arc;

use super::{AsyncEvent, MrEntry, Nic};
use crate::mem::RegisteredMemory;
use crate::types::{AccessFlags, WorkCompletion};

/// A registration as the domain protocol carries it: (key, PD, address, length, access).
pub(crate) type MrInfo = (u32, u32, u64, u64, AccessFlags);

impl Nic {
    /// Registers `mem` under a key chosen elsewhere (a member's own key, so that the R_Keys
    /// it hands out work at the hosting NIC's target QPs). False when the key is taken.
    pub fn reg_mr_with_key(
        &mut self,
        pd: u32,
        mem: Arc<RegisteredMemory>,
        access: AccessFlags,
        key: u32,
    ) -> bool {
        if !self.res.mr_key_free(key) {
            return false;
        }
        self.res.mrs.insert(key, MrEntry::new(pd, mem, access));
        true
    }

    /// Every registration of local (not foreign) memory, to mirror into a domain host.
    pub(crate) fn local_mrs(&self) -> Vec<MrInfo> {
        self.res
            .mrs
            .iter()
            .filter(|(_, e)| e.mem.foreign_pid().is_none())
            .map(|(&k, e)| (k, e.pd, e.mem.addr(), e.mem.len() as u64, e.access))
            .collect()
    }

    /// Makes `cq` a forwarding CQ: its completions go to [`take_forwarded`](Self::take_forwarded)
    /// instead of its queue.
    pub fn set_forwarding(&mut self, cq: u32) {
        self.res.forward_cqs.insert(cq);
    }

    /// Forgets a forwarding CQ (before it is destroyed).
    pub fn clear_forwarding(&mut self, cq: u32) {
        self.res.forward_cqs.remove(&cq);
    }

    /// Moves the completions produced for forwarding CQs into `out`.
    pub fn take_forwarded(&mut self, out: &mut Vec<(u32, WorkCompletion, bool)>) {
        out.append(&mut self.res.forwarded);
    }

    /// Queues a completion a hosting NIC produced for this NIC's CQ `cq`, exactly as if
    /// this NIC had produced it (capacity, overflow and notification rules apply).
    pub fn inject_completion(&mut self, cq: u32, wc: WorkCompletion, solicited: bool) {
        self.res.complete(cq, wc, solicited);
    }

    /// The XRC domain of target QP `qpn`, if it is one.
    pub fn qp_xrcd(&self, qpn: crate::types::Qpn) -> Option<u32> {
        self.qps.get(&qpn.0).and_then(|q| q.xrcd)
    }

    /// Queues an asynchronous event a hosting NIC forwarded.
    pub fn inject_event(&mut self, ev: AsyncEvent) {
        self.res.events.push_back(ev);
    }
}
