//! The verbs QP state machine: which transitions are legal and which attribute-mask bits each
//! one requires or allows, per QP type (spec §9.4, the kernel's `qp_state_table`).

use crate::error::VerbsError;
use crate::types::{QpAttrMask as M, QpState as S, QpType};

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
