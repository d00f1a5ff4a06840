//! Misuses that must not compile: ways safe code could touch bytes the NIC may be reading
//! or writing (a posted pool buffer, a forged scatter/gather element, a posting key made by
//! hand, a transport that did not vouch for its posting, a received buffer kept past its
//! message). Each case in `compile-fail/` has the compiler's expected error beside it.
#![allow(missing_docs)]

#[test]
fn misuses_of_posted_memory_do_not_compile() {
    let t = trybuild::TestCases::new();
    t.compile_fail("compile-fail/*.rs");
}
