// A transport gets the posting key, so implementing `Transport` is a promise (`unsafe impl`).
use std::time::Instant;

use rdmx::core::worker::{Cx, Message, Transport, WaitSlot};
use rdmx::core::Buf;
use rdmx::verbs::AsyncEvent;

#[derive(Debug)]
struct Rogue;

impl Transport for Rogue {
    fn arm(&self) {}
    fn progress(&mut self, _: &mut Cx<'_>) -> usize { 0 }
    fn handle_event(&mut self, _: &mut Cx<'_>, _: AsyncEvent) {}
    fn next_timer(&self) -> Option<Instant> { None }
    fn handle_timer(&mut self, _: &mut Cx<'_>, _: Instant) {}
    fn take_back(&mut self, _: &mut Cx<'_>, _: Buf) {}
    fn hand_over(&mut self, _: &mut Cx<'_>) {}
    fn take_message(&mut self, _: &mut Cx<'_>, _: usize) -> Option<Message> { None }
    fn wait_slot(&mut self, _: usize) -> Option<&mut WaitSlot> { None }
    fn flush_batch(&mut self, _: &mut Cx<'_>) {}
    fn is_idle(&self) -> bool { true }
}

fn main() {}
