use super::*;
use crate::engine::speculation_knobs::SpeculationKnobs;
use crate::engine::speculation_settings::RequestSpeculation;

#[test]
fn one_resolution_for_drafting_verifying_and_trees() {
    let live = SpeculationKnobs {
        tree_nodes: Some(3),
        under_load_queue_depth: Some(4),
        lenience_under_load: Some(0.5),
        ..Default::default()
    }
    .apply(&SpeculationSettings::default(), 8)
    .unwrap();
    let none = RequestSpeculation::default();
    // Idle: exact, the server's tree, the server's adaptive γ.
    let idle = live.for_round(&none, 0);
    assert_eq!((idle.lenience, idle.tree_nodes), (Lenience::EXACT, 3));
    assert_eq!(idle.gamma, RoundGamma::Adaptive { min: 1, max: 8 });
    // Under load a request that set no lenience is lenient, and so drafts no tree it could
    // not verify.
    let loaded = live.for_round(&none, 5);
    assert_eq!(loaded.lenience.get(), 0.5);
    assert_eq!(loaded.tree_nodes, 0);
    // A request's own settings win.
    let own = live.for_round(
        &RequestSpeculation {
            lenience: Some(Lenience::EXACT),
            tree_nodes: Some(TreeNodes::within(1, 8).unwrap()),
            ..Default::default()
        },
        5,
    );
    assert_eq!((own.lenience, own.tree_nodes), (Lenience::EXACT, 1));
    let pricing = RequestSpeculation {
        confidence_pricing: Some(true),
        ..Default::default()
    };
    assert!(live.for_round(&pricing, 0).confidence_pricing);
    assert!(!live.for_round(&none, 0).confidence_pricing);
    // How sampled drafts are proposed: the server's, unless the request set its own.
    assert_eq!(live.for_round(&none, 0).sampled_drafts, SampledDrafts::Auto);
    let sample = SpeculationKnobs {
        sampled_drafts: Some("sample".into()),
        ..Default::default()
    };
    let live = sample.apply(&live, 8).unwrap();
    assert_eq!(
        live.for_round(&none, 0).sampled_drafts,
        SampledDrafts::Sample
    );
    let likeliest = SpeculationKnobs {
        sampled_drafts: Some("likeliest".into()),
        ..Default::default()
    }
    .for_request(8)
    .unwrap();
    assert_eq!(
        live.for_round(&likeliest, 0).sampled_drafts,
        SampledDrafts::Likeliest
    );
    let bad = SpeculationKnobs {
        sampled_drafts: Some("best".into()),
        ..Default::default()
    };
    assert_eq!(bad.for_request(8).unwrap_err().key, "sampled_drafts");
    assert_eq!(bad.apply(&live, 8).unwrap_err().key, "sampled_drafts");
}

#[test]
fn a_request_sets_its_own_knobs_checked_and_never_the_servers_policy() {
    let r = SpeculationKnobs {
        gamma: Some(3),
        lenience: Some(0.5),
        tree_nodes: Some(2),
        draft_p_min: Some(0.4),
        ..Default::default()
    }
    .for_request(8)
    .unwrap();
    assert_eq!(r.gamma, GammaPolicy::Fixed(Gamma::try_from(3).unwrap()));
    assert_eq!(r.lenience.map(Lenience::get), Some(0.5));
    assert_eq!(r.tree_nodes.map(TreeNodes::get), Some(2));
    assert_eq!(r.gate.draft_p_min, Some(0.4));
    let off = SpeculationKnobs {
        enabled: Some(false),
        gamma: Some(3),
        ..Default::default()
    };
    assert_eq!(off.for_request(8).unwrap().gamma, GammaPolicy::Off);
    for (bad, key) in [
        (
            SpeculationKnobs {
                gamma: Some(9),
                ..Default::default()
            },
            "gamma",
        ),
        (
            SpeculationKnobs {
                tree_nodes: Some(8),
                ..Default::default()
            },
            "tree_nodes",
        ),
        (
            SpeculationKnobs {
                egag_threshold: Some(2.0),
                ..Default::default()
            },
            "egag_threshold",
        ),
        (
            SpeculationKnobs {
                gamma_min: Some(2),
                ..Default::default()
            },
            "gamma_min",
        ),
        (
            SpeculationKnobs {
                adaptive: Some(false),
                ..Default::default()
            },
            "adaptive",
        ),
    ] {
        assert_eq!(bad.for_request(8).unwrap_err().key, key);
    }
    // A refusal quotes the number sent: as an f32, 1e-300 is 0 and 0.9 is 0.8999999761581421.
    for (bad, key, sent) in [
        (
            SpeculationKnobs {
                lenience: Some(1e-300),
                ..Default::default()
            },
            "lenience",
            "must be in (0, 1] (1 = exact), got 1e-300 (0 as a 32-bit float)",
        ),
        (
            SpeculationKnobs {
                egag_threshold: Some(0.9),
                egag_ema_beta: Some(1.9),
                ..Default::default()
            },
            "egag_ema_beta",
            "must be in [0, 1), got 1.9",
        ),
    ] {
        let e = bad.for_request(8).unwrap_err();
        assert_eq!((e.key, e.reason.as_str()), (key, sent), "{e}");
    }
}

#[test]
fn a_change_is_logged_in_words() {
    let before = SpeculationSettings::default();
    assert_eq!(describe_change(&before, &before), "no change");
    let after = SpeculationKnobs {
        lenience: Some(0.5),
        gamma: Some(3),
        ..Default::default()
    }
    .apply(&before, 8)
    .unwrap();
    let words = describe_change(&before, &after);
    assert!(words.contains("lenience 1.0 -> 0.5"), "{words}");
    assert!(words.contains("gamma 4 -> 3"), "{words}");
    assert!(!words.contains("SpeculationSettings"), "{words}");
    // As written, not as the f32 widened (0.8999999761581421).
    let after = SpeculationKnobs {
        lenience: Some(0.9),
        egag_threshold: Some(0.9),
        ..Default::default()
    }
    .apply(&before, 8)
    .unwrap();
    let words = describe_change(&before, &after);
    assert!(words.contains("lenience 1.0 -> 0.9"), "{words}");
    assert!(words.contains("egag_threshold 0.5 -> 0.9"), "{words}");
    assert!(!words.contains("0.899"), "{words}");
}

#[test]
fn bad_values_name_their_key_and_change_nothing() {
    let live = LiveSpeculation::new(SpeculationSettings::default(), 8).unwrap();
    let cases: [(SpeculationKnobs, &str); 7] = [
        (
            SpeculationKnobs {
                tree_nodes: Some(8),
                ..Default::default()
            },
            "tree_nodes",
        ),
        (
            SpeculationKnobs {
                lenience: Some(0.0),
                ..Default::default()
            },
            "lenience",
        ),
        (
            SpeculationKnobs {
                lenience: Some(1.5),
                ..Default::default()
            },
            "lenience",
        ),
        (
            SpeculationKnobs {
                gamma: Some(0),
                ..Default::default()
            },
            "gamma",
        ),
        (
            SpeculationKnobs {
                gamma_max: Some(9),
                ..Default::default()
            },
            "gamma_max",
        ),
        (
            SpeculationKnobs {
                gamma_min: Some(5),
                gamma_max: Some(3),
                ..Default::default()
            },
            "gamma_min",
        ),
        (
            SpeculationKnobs {
                lenience_under_load: Some(f64::NAN),
                ..Default::default()
            },
            "lenience_under_load",
        ),
    ];
    for (update, key) in cases {
        let e = live.update(&update).unwrap_err();
        assert_eq!(e.key, key, "{e}");
        assert_eq!(live.get(), SpeculationSettings::default());
    }
}

#[test]
fn valid_changes_apply_and_a_lone_gamma_means_fixed() {
    let live = LiveSpeculation::new(SpeculationSettings::default(), 8).unwrap();
    let s = live
        .update(&SpeculationKnobs {
            lenience: Some(0.5),
            gamma: Some(3),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(
        (s.lenience.get(), s.gamma.get(), s.adaptive),
        (0.5, 3, false)
    );
    assert_eq!(live.get(), s);
    let s = live
        .update(&SpeculationKnobs {
            adaptive: Some(true),
            enabled: Some(false),
            ..Default::default()
        })
        .unwrap();
    assert!(s.adaptive && !s.enabled && s.gamma.get() == 3);
}

#[test]
fn lenience_drops_only_above_the_queue_depth() {
    let half = Lenience::try_from(0.5).unwrap();
    let s = SpeculationSettings {
        lenience: Lenience::EXACT,
        under_load_queue_depth: 4,
        lenience_under_load: half,
        ..Default::default()
    };
    assert_eq!(s.lenience_for_queue(4), Lenience::EXACT);
    assert_eq!(s.lenience_for_queue(5), half);
    let off = SpeculationSettings {
        under_load_queue_depth: 0,
        lenience_under_load: half,
        ..Default::default()
    };
    assert_eq!(off.lenience_for_queue(100), Lenience::EXACT);
}

#[test]
fn a_policy_comes_to_a_round_gamma_under_the_live_settings() {
    let on = SpeculationSettings::default();
    let fixed = SpeculationSettings {
        adaptive: false,
        ..on
    };
    let off = SpeculationSettings {
        enabled: false,
        ..on
    };
    let adaptive = RoundGamma::Adaptive { min: 1, max: 8 };
    let three = GammaPolicy::Fixed(Gamma::try_from(3).unwrap());
    let cases = [
        (GammaPolicy::Server, on, adaptive),
        (GammaPolicy::Server, fixed, RoundGamma::Fixed(4)),
        (GammaPolicy::Server, off, RoundGamma::Plain),
        (GammaPolicy::On, on, adaptive),
        (GammaPolicy::On, fixed, RoundGamma::Fixed(4)),
        (GammaPolicy::On, off, adaptive),
        (GammaPolicy::Off, on, RoundGamma::Plain),
        (GammaPolicy::Adaptive, off, adaptive),
        (three, off, RoundGamma::Fixed(3)),
    ];
    for (policy, live, want) in cases {
        assert_eq!(live.round_gamma(policy), want, "{policy:?} under {live:?}");
    }
}
