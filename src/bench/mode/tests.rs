use super::*;

fn parse(spec: &str) -> Result<Mode, BenchError> {
    Mode::parse(spec, 8, &BenchDrafters::default())
}

fn modes(list: &str) -> Result<Vec<Mode>, BenchError> {
    parse_modes(list, 8, &BenchDrafters::default())
}

fn default_model() -> Box<DraftSpec> {
    Box::new(DraftSpec::Model("default".into()))
}

#[test]
fn draft_modes_take_how_another_vocabulary_drafts() {
    let m = parse("draft+pld:cross_vocabulary=tli:ngram=2-3").unwrap();
    assert_eq!(
        m.drafter,
        Some(DraftSpec::LookupThen(
            PromptLookup::new(2, 3),
            default_model()
        ))
    );
    assert_eq!(m.cross_vocabulary, Some(GreedyAcross::TokenLevel));
    assert!(parse("draft:cross_vocabulary=both").is_err());
    assert!(parse("pld:cross_vocabulary=slem").is_err());
}

#[test]
fn draft_modes_take_the_confidence_gate() {
    let m = parse("pld:tree=3:confidence=true").unwrap();
    assert_eq!(m.tree_nodes.map(TreeNodes::get), Some(3));
    assert_eq!(m.confidence_pricing, Some(true));
    assert!(parse("pld:confidence=maybe").is_err());
    assert!(parse("pld:tree=8").is_err());
    assert!(parse("pld:tree=x").is_err());
    let m = parse("draft:gamma=4:egag=0.25:egag_beta=0.5:p_min=0.125").unwrap();
    assert_eq!(m.gate.use_egag, Some(true));
    assert_eq!(m.gate.egag_threshold, Some(0.25));
    assert_eq!(m.gate.egag_ema_beta, Some(0.5));
    assert_eq!(m.gate.draft_p_min, Some(0.125));
    assert!(parse("pld:egag=0.5").is_err());
    let by_keys = parse(
        "draft:gamma=4:use_egag=true:egag_threshold=0.25:egag_ema_beta=0.5:draft_p_min=0.125",
    )
    .unwrap();
    assert_eq!(
        by_keys.gate, m.gate,
        "the config's keys and the short ones alike"
    );
    let e = parse("draft:egag=1.5").unwrap_err().to_string();
    assert!(e.contains("egag_threshold"), "{e}");
    assert!(parse("draft:p_min=1").is_err());
}

#[test]
fn modes_parse_with_defaults_and_settings() {
    let m =
        modes("pld:gamma=2,draft:gamma=adaptive:pipeline=true:lenience=0.5,pld:ngram=2-5").unwrap();
    assert_eq!(m.len(), 4, "plain is added");
    assert!(m[0].is_plain());
    assert_eq!(m[0].gamma, GammaPolicy::Off);
    assert_eq!(
        m[1].drafter,
        Some(DraftSpec::PromptLookup(PromptLookup::new(1, 3)))
    );
    assert_eq!(
        m[3].drafter,
        Some(DraftSpec::PromptLookup(PromptLookup::new(2, 5)))
    );
    assert_ne!(m[1].engine_key(), m[3].engine_key(), "its own engine");
    assert_eq!(m[1].gamma, GammaPolicy::Fixed(Gamma::try_from(2).unwrap()));
    assert_eq!(m[2].drafter, Some(*default_model()));
    assert_eq!(m[2].gamma, GammaPolicy::Adaptive);
    assert!(m[2].pipeline);
    assert_eq!(m[2].lenience.map(Lenience::get), Some(0.5));
    assert_eq!(
        m[2].engine_key(),
        (Some(*default_model()), None, true, true)
    );
    // The prefix cache is on unless a mode turns it off, plain included: its own engine.
    let m = modes("plain,plain:prefix_cache=false").unwrap();
    assert_eq!(m.len(), 2);
    assert!(m[0].prefix_cache && !m[1].prefix_cache && m[1].is_plain());
    assert_ne!(m[0].engine_key(), m[1].engine_key());
}

#[test]
fn structured_modes_measure_against_plain_under_the_same_structure() {
    let m = modes("plain,plain:structured=json,pld:structured=json,forced:structured=json,pld")
        .unwrap();
    assert!(m[1].is_plain() && m[1].structured == Structured::Json);
    assert!(!m[3].is_plain() && m[3].drafter.is_none());
    assert_eq!(m[3].gamma, GammaPolicy::Adaptive);
    assert_eq!(
        m[3].engine_key(),
        m[0].engine_key(),
        "no drafter: plain's engine"
    );
    let label = |x: Option<&Mode>| x.map(|b| b.label.clone());
    assert_eq!(label(m[0].baseline(&m)), None);
    assert_eq!(label(m[1].baseline(&m)), Some("plain".into()));
    assert_eq!(
        label(m[2].baseline(&m)),
        Some("plain:structured=json".into())
    );
    assert_eq!(
        label(m[3].baseline(&m)),
        Some("plain:structured=json".into())
    );
    assert_eq!(label(m[4].baseline(&m)), Some("plain".into()));
    // Tool calls' constraint is measured against the same prompt unconstrained, when
    // that mode runs; their speculation against constrained plain decoding.
    let m =
        modes("plain,plain:structured=tools,plain:structured=tools_prompt,pld:structured=tools")
            .unwrap();
    assert!(m[1].structured.is_constrained() && !m[2].structured.is_constrained());
    assert_eq!(
        label(m[1].baseline(&m)),
        Some("plain:structured=tools_prompt".into())
    );
    assert_eq!(label(m[2].baseline(&m)), Some("plain".into()));
    assert_eq!(
        label(m[3].baseline(&m)),
        Some("plain:structured=tools".into())
    );
    let m = modes("plain,plain:structured=tools").unwrap();
    assert_eq!(label(m[1].baseline(&m)), Some("plain".into()));
}

#[test]
fn mode_names_are_the_config_drafter_names() {
    let drafters = BenchDrafters {
        draft_model: DraftSpec::SelfLayers(6),
        head: Some("heads/mine".into()),
    };
    let m = parse_modes(
        "prompt-lookup,suffix,draft,draft+prompt-lookup,head,head+prompt-lookup",
        8,
        &drafters,
    )
    .unwrap();
    let got: Vec<String> = m[1..]
        .iter()
        .map(|m| m.drafter.as_ref().unwrap().to_string())
        .collect();
    assert_eq!(
        got,
        [
            "prompt-lookup:1-3",
            "suffix:1-3",
            "self:6",
            "draft+prompt-lookup:self:6",
            "head:heads/mine",
            "head+prompt-lookup:heads/mine",
        ]
    );
    // The old spellings are the same modes.
    for (alias, canonical) in [
        ("pld", "prompt-lookup"),
        ("draft+pld", "draft+prompt-lookup"),
        ("draft+lookup", "draft+prompt-lookup"),
        ("head+pld", "head+prompt-lookup"),
        ("head+lookup", "head+prompt-lookup"),
    ] {
        let a = Mode::parse(alias, 8, &drafters).unwrap();
        let c = Mode::parse(canonical, 8, &drafters).unwrap();
        assert_eq!(a.engine_key(), c.engine_key(), "{alias}");
    }
    let none = BenchDrafters {
        draft_model: DraftSpec::None,
        head: None,
    };
    let e = Mode::parse("draft", 8, &none).unwrap_err().to_string();
    assert!(e.contains("--draft-model"), "{e}");
}

#[test]
fn bad_modes_are_refused_clearly() {
    for (spec, needle) in [
        ("eagle", "unknown mode"),
        ("pld:gamma=0", "gamma"),
        ("pld:gamma=9", "gamma"),
        ("pld:lenience=2", "lenience"),
        ("pld:speed=3", "unknown setting"),
        ("pld:gamma", "key=value"),
        ("plain:gamma=2", "no settings"),
        ("plain:structured=yaml", "structured"),
        ("plain:prefix_cache=maybe", "prefix_cache"),
        ("pld,pld", "twice"),
        ("pld:ngram=0-2", "n-gram sizes"),
        ("draft:ngram=1-3", "prompt-lookup setting"),
    ] {
        let e = modes(spec).unwrap_err().to_string();
        assert!(e.contains(needle), "{spec}: {e}");
    }
}
