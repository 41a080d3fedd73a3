//! Bad input to the acceptance rules: non-finite numbers, shapes that do not fit, lenience
//! outside (0, 1]. Each is an error naming what is wrong, never a panic or a silent result.

use super::*;

#[test]
fn invalid_numbers_are_errors() {
    let good = [0.5f32, 0.5];
    let nan = [f32::NAN, 0.5];
    let inf = [0.5f32, f32::INFINITY];
    let neg = [-0.1f32, 1.1];
    let zeros = [0.0f32, 0.0];
    let mut rng = SeededRng::new(0);
    let mut s = Vec::new();
    let err = accept_sampled(
        &[0],
        &[DraftDist::Full(&good)],
        &[&good, &nan],
        Lenience::EXACT,
        &mut rng,
        &mut s,
    );
    let err = err.unwrap_err();
    assert!(matches!(
        err,
        SpecError::InvalidValue {
            row: 1,
            token: 0,
            ..
        }
    ));
    assert!(err.to_string().contains("NaN"), "{err}");
    let err = accept_sampled(
        &[0],
        &[DraftDist::Full(&inf)],
        &[&good, &good],
        Lenience::EXACT,
        &mut rng,
        &mut s,
    );
    assert!(matches!(
        err.unwrap_err(),
        SpecError::InvalidValue {
            what: DRAFT,
            row: 0,
            token: 1,
            ..
        }
    ));
    let err = accept_sampled(
        &[0],
        &[DraftDist::Full(&neg)],
        &[&good, &good],
        Lenience::EXACT,
        &mut rng,
        &mut s,
    );
    assert!(matches!(err.unwrap_err(), SpecError::InvalidValue { .. }));
    let err = accept_sampled(
        &[0],
        &[DraftDist::PointMass],
        &[&zeros, &good],
        Lenience::EXACT,
        &mut rng,
        &mut s,
    );
    assert!(matches!(err.unwrap_err(), SpecError::NoMass { row: 0, .. }));
    let err = accept_greedy(&[0], &[&good, &nan], Lenience::EXACT).unwrap_err();
    assert!(matches!(
        err,
        SpecError::InvalidValue {
            row: 1,
            token: 0,
            ..
        }
    ));
    let err = accept_greedy(&[0], &[&inf, &good], Lenience::EXACT).unwrap_err();
    assert!(matches!(
        err,
        SpecError::InvalidValue {
            row: 0,
            token: 1,
            ..
        }
    ));
    let all_masked = [f32::NEG_INFINITY; 2];
    let err = accept_greedy(&[], &[&all_masked], Lenience::EXACT).unwrap_err();
    assert_eq!(err, SpecError::Sampling(SamplingError::Empty));
    let err =
        first_token_distribution(&nan, DraftDist::PointMass, Some(0), Lenience::EXACT).unwrap_err();
    assert!(matches!(err, SpecError::InvalidValue { .. }));
}

#[test]
fn shape_mismatches_are_errors() {
    let a = [0.5f32, 0.5];
    let b = [0.2f32, 0.3, 0.5];
    let mut rng = SeededRng::new(0);
    let mut s = Vec::new();
    let full = DraftDist::Full(&a);
    // p needs γ + 1 rows.
    let err = accept_sampled(
        &[0, 1],
        &[full, full],
        &[&a, &a],
        Lenience::EXACT,
        &mut rng,
        &mut s,
    );
    assert_eq!(
        err.unwrap_err(),
        SpecError::RowCount {
            what: TARGET,
            expected: 3,
            got: 2
        }
    );
    // q needs γ rows.
    let err = accept_sampled(
        &[0, 1],
        &[full],
        &[&a, &a, &a],
        Lenience::EXACT,
        &mut rng,
        &mut s,
    );
    assert!(matches!(
        err.unwrap_err(),
        SpecError::RowCount {
            what: DRAFT,
            expected: 2,
            got: 1
        }
    ));
    // Vocabulary sizes must agree, for p rows and for q.
    let err = accept_sampled(&[0], &[full], &[&a, &b], Lenience::EXACT, &mut rng, &mut s);
    assert!(matches!(
        err.unwrap_err(),
        SpecError::VocabMismatch {
            what: TARGET,
            row: 1,
            expected: 2,
            got: 3
        }
    ));
    let err = accept_sampled(
        &[0],
        &[DraftDist::Full(&b)],
        &[&a, &a],
        Lenience::EXACT,
        &mut rng,
        &mut s,
    );
    assert!(matches!(
        err.unwrap_err(),
        SpecError::VocabMismatch { what: DRAFT, .. }
    ));
    let err = accept_sampled(&[5], &[full], &[&a, &a], Lenience::EXACT, &mut rng, &mut s);
    assert!(matches!(
        err.unwrap_err(),
        SpecError::DraftOutOfVocab { token: 5, .. }
    ));
    let err = accept_greedy(&[0, 1], &[&a, &a], Lenience::EXACT).unwrap_err();
    assert!(matches!(
        err,
        SpecError::RowCount {
            expected: 3,
            got: 2,
            ..
        }
    ));
    let err = accept_greedy(&[0], &[&a, &b], Lenience::EXACT).unwrap_err();
    assert!(matches!(err, SpecError::VocabMismatch { .. }));
    let err = first_token_distribution(&a, DraftDist::Full(&b), None, Lenience::EXACT).unwrap_err();
    assert!(matches!(err, SpecError::VocabMismatch { .. }));
    let err =
        first_token_distribution(&a, DraftDist::PointMass, None, Lenience::EXACT).unwrap_err();
    assert_eq!(err, SpecError::MissingDraftToken);
}
