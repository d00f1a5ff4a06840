//! The verbs QP state machine: which transitions are legal and which attribute-mask bits each
//! one requires or allows, per QP type (spec §9.4, the kernel's `qp_state_table`).
//!
//! Pure functions shared by every provider: `QueuePair::modify` runs [`check_modify`] on
//! the QP's current state before it calls the provider, so an illegal transition or a
//! missing or extra mask bit gives the same named error on the soft NIC and on libibverbs
//! (where the kernel would only say EINVAL). The soft engine runs it again under its lock.

use crate::error::VerbsError;
use crate::types::{QpAttr, QpAttrMask as M, QpState as S, QpType};

/// Required and optional mask bits of one transition.
#[derive(Debug, Clone, Copy)]
struct Rule {
    req: M,
    opt: M,
}

const fn m(bits: u32) -> M {
    M(bits)
}

const NONE: M = m(0);

/// The rule for `from -> to`, or `None` when the transition is illegal for `qp_type`.
fn rule(qp_type: QpType, from: S, to: S) -> Option<Rule> {
    use QpType as T;
    let ud_like = matches!(qp_type, T::Ud);
    let uc = matches!(qp_type, T::Uc);
    let r = |req: M, opt: M| Some(Rule { req, opt });
    match (from, to) {
        (_, S::Reset) | (_, S::Err) => r(NONE, NONE),
        (S::Reset, S::Init) => {
            if ud_like {
                r(m(M::PKEY_INDEX.0 | M::PORT.0 | M::QKEY.0), NONE)
            } else {
                r(m(M::PKEY_INDEX.0 | M::PORT.0 | M::ACCESS_FLAGS.0), NONE)
            }
        }
        (S::Init, S::Init) => {
            if ud_like {
                r(NONE, m(M::PKEY_INDEX.0 | M::PORT.0 | M::QKEY.0))
            } else {
                r(NONE, m(M::PKEY_INDEX.0 | M::PORT.0 | M::ACCESS_FLAGS.0))
            }
        }
        (S::Init, S::Rtr) => match qp_type {
            T::Ud => r(NONE, m(M::PKEY_INDEX.0 | M::QKEY.0)),
            T::Uc | T::XrcSend => r(
                m(M::AV.0 | M::PATH_MTU.0 | M::DEST_QPN.0 | M::RQ_PSN.0),
                m(M::ALT_PATH.0 | M::ACCESS_FLAGS.0 | M::PKEY_INDEX.0),
            ),
            T::Rc | T::XrcRecv => r(
                m(M::AV.0
                    | M::PATH_MTU.0
                    | M::DEST_QPN.0
                    | M::RQ_PSN.0
                    | M::MAX_DEST_RD_ATOMIC.0
                    | M::MIN_RNR_TIMER.0),
                m(M::ALT_PATH.0 | M::ACCESS_FLAGS.0 | M::PKEY_INDEX.0),
            ),
        },
        (S::Rtr, S::Rts) => match qp_type {
            T::Ud => r(M::SQ_PSN, m(M::CUR_STATE.0 | M::QKEY.0)),
            T::Uc => r(
                M::SQ_PSN,
                m(M::CUR_STATE.0 | M::ALT_PATH.0 | M::ACCESS_FLAGS.0 | M::PATH_MIG_STATE.0),
            ),
            T::Rc => r(
                m(M::TIMEOUT.0
                    | M::RETRY_CNT.0
                    | M::RNR_RETRY.0
                    | M::SQ_PSN.0
                    | M::MAX_QP_RD_ATOMIC.0),
                m(M::CUR_STATE.0
                    | M::ALT_PATH.0
                    | M::ACCESS_FLAGS.0
                    | M::MIN_RNR_TIMER.0
                    | M::PATH_MIG_STATE.0),
            ),
            T::XrcSend => r(
                m(M::TIMEOUT.0
                    | M::RETRY_CNT.0
                    | M::RNR_RETRY.0
                    | M::SQ_PSN.0
                    | M::MAX_QP_RD_ATOMIC.0),
                m(M::CUR_STATE.0 | M::ALT_PATH.0 | M::ACCESS_FLAGS.0 | M::PATH_MIG_STATE.0),
            ),
            T::XrcRecv => r(
                m(M::TIMEOUT.0 | M::SQ_PSN.0),
                m(M::CUR_STATE.0
                    | M::ALT_PATH.0
                    | M::ACCESS_FLAGS.0
                    | M::MIN_RNR_TIMER.0
                    | M::PATH_MIG_STATE.0),
            ),
        },
        (S::Rts, S::Rts) | (S::Sqd, S::Rts) => match qp_type {
            T::Ud => r(NONE, m(M::CUR_STATE.0 | M::QKEY.0)),
            T::Uc | T::XrcSend => r(
                NONE,
                m(M::CUR_STATE.0 | M::ACCESS_FLAGS.0 | M::ALT_PATH.0 | M::PATH_MIG_STATE.0),
            ),
            T::Rc | T::XrcRecv => r(
                NONE,
                m(M::CUR_STATE.0
                    | M::ACCESS_FLAGS.0
                    | M::ALT_PATH.0
                    | M::PATH_MIG_STATE.0
                    | M::MIN_RNR_TIMER.0),
            ),
        },
        (S::Rts, S::Sqd) => r(NONE, M::EN_SQD_ASYNC_NOTIFY),
        (S::Sqd, S::Sqd) => match qp_type {
            T::Ud => r(NONE, m(M::PKEY_INDEX.0 | M::QKEY.0)),
            _ => r(
                NONE,
                m(M::PORT.0
                    | M::AV.0
                    | M::TIMEOUT.0
                    | M::RETRY_CNT.0
                    | M::RNR_RETRY.0
                    | M::MAX_QP_RD_ATOMIC.0
                    | M::MAX_DEST_RD_ATOMIC.0
                    | M::ALT_PATH.0
                    | M::ACCESS_FLAGS.0
                    | M::PKEY_INDEX.0
                    | M::MIN_RNR_TIMER.0
                    | M::PATH_MIG_STATE.0),
            ),
        },
        (S::Sqe, S::Rts) if ud_like || uc => r(NONE, m(M::CUR_STATE.0 | M::QKEY.0)),
        _ => None,
    }
}

/// Checks a `modify_qp` call: `to` is the target state (the current one when the mask has
/// no `STATE` bit). Errors name the offending attribute, as verbs' EINVAL would mean.
pub(crate) fn check(qp_type: QpType, from: S, to: S, mask: M) -> Result<(), VerbsError> {
    let Some(rule) = rule(qp_type, from, to) else {
        return Err(VerbsError::IllegalTransition { qp_type, from, to });
    };
    let given = mask & !M::STATE;
    let missing = rule.req & !given;
    if let Some(attr) = missing.names().first() {
        return Err(VerbsError::MissingAttribute { from, to, attr });
    }
    let extra = given & !(rule.req | rule.opt);
    if let Some(attr) = extra.names().first() {
        return Err(VerbsError::UnexpectedAttribute { from, to, attr });
    }
    if mask.contains(M::CUR_STATE) && !matches!(from, S::Rtr | S::Rts | S::Sqd | S::Sqe) {
        return Err(VerbsError::UnexpectedAttribute {
            from,
            to,
            attr: "CUR_STATE",
        });
    }
    Ok(())
}

/// Checks a `modify_qp` call on a QP of `qp_type` that is in state `from`, and returns the
/// target state (`a.qp_state`, or `from` when the mask has no `STATE` bit): the transition
/// must be legal, the mask must hold every bit it requires and no bit it does not allow
/// ([`check`]), and a `CUR_STATE` attribute must name the state the QP is in.
pub(crate) fn check_modify(qp_type: QpType, from: S, a: &QpAttr, mask: M) -> Result<S, VerbsError> {
    let to = if mask.contains(M::STATE) {
        a.qp_state
    } else {
        from
    };
    check(qp_type, from, to, mask)?;
    if mask.contains(M::CUR_STATE) && a.cur_qp_state != from {
        return Err(VerbsError::InvalidAttribute {
            attr: "CUR_STATE",
            reason: format!("QP is in {from}, not {}", a.cur_qp_state),
        });
    }
    Ok(to)
}

/// Checks that the attributes named in `mask` fit the fields verbs defines for them (the
/// 3-bit retry counts, 5-bit timers, 24-bit QPN and the four access bits), with the soft
/// NIC's wording. A provider that hands attributes to hardware runs this so an
/// out-of-range value is rejected by name instead of being truncated on its way to the NIC.
/// Device-dependent limits (ports, P_Key indexes, RDMA-read depths, path MTU) are left to
/// the provider.
pub(crate) fn check_ranges(a: &QpAttr, mask: M) -> Result<(), VerbsError> {
    let bad =
        |attr: &'static str, reason: String| Err(VerbsError::InvalidAttribute { attr, reason });
    if mask.contains(M::ACCESS_FLAGS) && a.qp_access_flags.bits() & !0xF != 0 {
        return bad(
            "ACCESS_FLAGS",
            format!("unknown bits {:#x}", a.qp_access_flags.bits()),
        );
    }
    if mask.contains(M::TIMEOUT) && a.timeout > 31 {
        return bad("TIMEOUT", format!("{} > 31", a.timeout));
    }
    if mask.contains(M::RETRY_CNT) && a.retry_cnt > 7 {
        return bad("RETRY_CNT", format!("{} > 7", a.retry_cnt));
    }
    if mask.contains(M::RNR_RETRY) && a.rnr_retry > 7 {
        return bad("RNR_RETRY", format!("{} > 7", a.rnr_retry));
    }
    if mask.contains(M::MIN_RNR_TIMER) && a.min_rnr_timer > 31 {
        return bad("MIN_RNR_TIMER", format!("{} > 31", a.min_rnr_timer));
    }
    if mask.contains(M::ALT_PATH) && a.alt_timeout > 31 {
        return bad("ALT_PATH", format!("alt_timeout {} > 31", a.alt_timeout));
    }
    if mask.contains(M::DEST_QPN) && a.dest_qp_num > 0x00FF_FFFF {
        return bad(
            "DEST_QPN",
            format!("{:#x} is not a 24-bit QPN", a.dest_qp_num),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rc_init() -> M {
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS
    }

    #[test]
    fn rc_happy_path() {
        check(QpType::Rc, S::Reset, S::Init, rc_init()).unwrap();
        let rtr = M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER;
        check(QpType::Rc, S::Init, S::Rtr, rtr).unwrap();
        let rts =
            M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC;
        check(QpType::Rc, S::Rtr, S::Rts, rts).unwrap();
    }

    #[test]
    fn missing_and_extra_attributes_are_named() {
        let e = check(
            QpType::Rc,
            S::Reset,
            S::Init,
            M::STATE | M::PKEY_INDEX | M::PORT,
        );
        assert!(matches!(
            e,
            Err(VerbsError::MissingAttribute {
                attr: "ACCESS_FLAGS",
                ..
            })
        ));
        let e = check(QpType::Rc, S::Reset, S::Init, rc_init() | M::SQ_PSN);
        assert!(matches!(
            e,
            Err(VerbsError::UnexpectedAttribute { attr: "SQ_PSN", .. })
        ));
        let e = check(QpType::Ud, S::Reset, S::Init, rc_init());
        assert!(matches!(
            e,
            Err(VerbsError::MissingAttribute { attr: "QKEY", .. })
        ));
    }

    #[test]
    fn check_modify_returns_the_target_and_checks_cur_state() {
        let a = QpAttr {
            qp_state: S::Init,
            ..QpAttr::default()
        };
        assert_eq!(
            check_modify(QpType::Rc, S::Reset, &a, rc_init()).unwrap(),
            S::Init
        );
        // No STATE bit: the QP stays where it is.
        assert_eq!(
            check_modify(QpType::Rc, S::Rts, &a, M::MIN_RNR_TIMER).unwrap(),
            S::Rts
        );
        let cur = |s| QpAttr {
            qp_state: S::Rts,
            cur_qp_state: s,
            ..QpAttr::default()
        };
        let mask = M::STATE | M::CUR_STATE;
        assert_eq!(
            check_modify(QpType::Ud, S::Sqe, &cur(S::Sqe), mask).unwrap(),
            S::Rts
        );
        assert!(matches!(
            check_modify(QpType::Ud, S::Rts, &cur(S::Sqe), mask),
            Err(VerbsError::InvalidAttribute {
                attr: "CUR_STATE",
                ..
            })
        ));
        // The transition is judged first.
        assert!(matches!(
            check_modify(QpType::Rc, S::Sqe, &cur(S::Sqe), mask),
            Err(VerbsError::IllegalTransition { .. })
        ));
    }

    #[test]
    fn out_of_range_values_are_named() {
        let ok = QpAttr {
            timeout: 31,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 31,
            alt_timeout: 31,
            dest_qp_num: 0x00FF_FFFF,
            qp_access_flags: crate::types::AccessFlags(0xF),
            ..QpAttr::default()
        };
        let all = M::TIMEOUT
            | M::RETRY_CNT
            | M::RNR_RETRY
            | M::MIN_RNR_TIMER
            | M::ALT_PATH
            | M::DEST_QPN
            | M::ACCESS_FLAGS;
        check_ranges(&ok, all).unwrap();
        let cases: [(&str, M, QpAttr); 7] = [
            ("TIMEOUT", M::TIMEOUT, QpAttr { timeout: 32, ..ok }),
            ("RETRY_CNT", M::RETRY_CNT, QpAttr { retry_cnt: 8, ..ok }),
            ("RNR_RETRY", M::RNR_RETRY, QpAttr { rnr_retry: 8, ..ok }),
            (
                "MIN_RNR_TIMER",
                M::MIN_RNR_TIMER,
                QpAttr {
                    min_rnr_timer: 32,
                    ..ok
                },
            ),
            (
                "ALT_PATH",
                M::ALT_PATH,
                QpAttr {
                    alt_timeout: 32,
                    ..ok
                },
            ),
            (
                "DEST_QPN",
                M::DEST_QPN,
                QpAttr {
                    dest_qp_num: 1 << 24,
                    ..ok
                },
            ),
            (
                "ACCESS_FLAGS",
                M::ACCESS_FLAGS,
                QpAttr {
                    qp_access_flags: crate::types::AccessFlags(0x10),
                    ..ok
                },
            ),
        ];
        for (name, bit, bad) in cases {
            match check_ranges(&bad, all) {
                Err(VerbsError::InvalidAttribute { attr, .. }) => assert_eq!(attr, name),
                other => panic!("{name}: {other:?}"),
            }
            // Only fields named in the mask are read.
            check_ranges(&bad, M(all.0 & !bit.0)).unwrap();
        }
    }

    #[test]
    fn illegal_transitions() {
        assert!(matches!(
            check(QpType::Rc, S::Reset, S::Rts, M::STATE),
            Err(VerbsError::IllegalTransition { .. })
        ));
        assert!(check(QpType::Rc, S::Sqe, S::Rts, M::STATE).is_err());
        assert!(check(QpType::Ud, S::Sqe, S::Rts, M::STATE).is_ok());
        assert!(check(QpType::Rc, S::Rts, S::Err, M::STATE).is_ok());
        assert!(check(QpType::Rc, S::Init, S::Reset, M::STATE).is_ok());
        assert!(check(QpType::Rc, S::Rtr, S::Init, M::STATE).is_err());
    }
}
