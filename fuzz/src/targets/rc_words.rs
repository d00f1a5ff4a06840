//! `rc_words`: the RC transport's mailbox and recall words and its signal immediates
//! (`rdmx_rc::wire`: `Mailbox::from_word`, `Recall::from_word`, `Signal::from_imm`), and
//! what consumes the counters a peer writes: the credit window (`SendWindow::update`,
//! `rdmx_core::credit`), which `apply_peer_counters` feeds with the word's grant. The input
//! is a sequence of 8-byte words as the mailbox holds them (big-endian).

use rdmx_core::credit::SendWindow;
use rdmx_core::header::seq_after;
use rdmx_rc::wire::{Mailbox, Recall, Signal};

use super::{FnRunner, Runner, Target, numbered};

pub(crate) const TARGET: Target = Target {
    name: "rc_words",
    about: "rdmx-rc mailbox and recall words, signal immediates, credit window",
    max_alloc: 0,
    max_total: 0,
    max_len: 512,
    framed: false,
    seeds,
    runner,
};

fn runner() -> Box<dyn Runner> {
    Box::new(FnRunner(run))
}

fn run(input: &[u8]) {
    let mut window = SendWindow::new(16);
    let mut recalls = 0u32;
    for chunk in input.chunks(8) {
        let mut b = [0u8; 8];
        b[..chunk.len()].copy_from_slice(chunk);
        let w = u64::from_be_bytes(b);

        let m = Mailbox::from_word(w);
        assert_eq!(m.to_word(), w, "every mailbox bit is a field");
        let before = window;
        let grew = window.update(m.grant);
        assert_eq!(grew, seq_after(m.grant, before.limit));
        let _ = window.take();

        let r = Recall::from_word(w);
        assert_eq!(r.to_word(), w, "every recall bit is a field");
        assert_eq!(
            r.is_gone(),
            w >> 32 & u64::from(Recall::COUNTER_MASK) == 0x1FFF_FFFF
        );
        let next = Recall::next_request(r.recall);
        assert!(next < Recall::COUNTER_MASK, "a request never looks gone");
        recalls = Recall::next_request(recalls);

        for imm in [w as u32, (w >> 32) as u32] {
            if let Some((sig, tag)) = Signal::from_imm(imm) {
                assert_eq!(sig.to_imm(tag), imm, "signal round trip");
            }
        }
    }
}

fn seeds() -> Vec<(String, Vec<u8>)> {
    let words = [
        Mailbox {
            grant: 64,
            rndv_done: 3,
        }
        .to_word(),
        Recall {
            returned: 5,
            recall: 9,
            starving: true,
            closing: false,
            all: true,
        }
        .to_word(),
        Recall::GONE,
        u64::from(Signal::RecallRequest.to_imm(7)) << 32
            | u64::from(Signal::ReadDone.to_imm(65535)),
        u64::from(Signal::RecallReturned.to_imm(1)),
    ];
    let all: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
    let mut out: Vec<Vec<u8>> = words.iter().map(|w| w.to_be_bytes().to_vec()).collect();
    out.push(all);
    numbered("words", out)
}
