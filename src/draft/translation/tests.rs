//! Token-Level Intersection proven exact by enumeration, with the drafter's q made by the code
//! that drafts (the shared columns gathered, then the ordinary draw), on tiny vocabularies
//! with tokens only the target has, only the drafter has, and shared; and the translation of
//! contexts into the drafter's tokens.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::*;
use crate::draft::draw::{draw_draft, DrawLane, DrawScratch};
use crate::draft::siblings::Siblings;
use crate::draft::{DraftJob, Proposal};
use crate::sampling::enumeration::{dist, draft_sequences, extend_plainly, round_outcomes};
use crate::sampling::{DraftGate, GateRound, SamplingParams, SeededRng};

/// Drafter ids 0..4, target ids 0..5: drafter 0, 2, 3 are target 1, 3, 0; drafter 1 has no
/// target token; target 2 and 4 no drafter token.
const DRAFT_VOCAB: usize = 4;
const TARGET_VOCAB: usize = 5;
const PAIRS: [(u32, u32); 3] = [(0, 1), (2, 3), (3, 0)];

fn columns() -> SharedColumns {
    let map = VocabMap::from_pairs(DRAFT_VOCAB, TARGET_VOCAB, &PAIRS);
    SharedColumns::new(&map, DRAFT_VOCAB, TARGET_VOCAB)
}

/// The drafter's q over target ids after `context`, as a translating draft model draws it:
/// its row (here the logs of a distribution over its own vocabulary) gathered at the shared
/// columns, then drawn from at temperature 1; `(q, the token drawn)`.
fn drafted(columns: &SharedColumns, draft_p: &[f32], params: &SamplingParams) -> (Vec<f32>, u32) {
    let row: Vec<f32> = draft_p.iter().map(|&x| x.ln()).collect();
    let mut shared = Vec::new();
    columns.gather(&row, &mut shared);
    let mut rng = SeededRng::new(1);
    let mut out = Proposal {
        vocab: TARGET_VOCAB,
        ..Proposal::default()
    };
    let history = [0u32];
    let mut job = DraftJob {
        seq: 1,
        scope: 0,
        context: &history,
        generated_from: 1,
        gamma: 1,
        params,
        rng: &mut rng,
        out: &mut out,
        gate: DraftGate::OFF,
        min_tokens: 0,
        confidence: false,
        tree_nodes: 0,
        grammar: None,
        lookup: true,
        likeliest: false,
        result: Ok(()),
    };
    let lane = DrawLane {
        step: 0,
        gate: &mut GateRound::default(),
        siblings: &mut Siblings::new(),
        history: &history,
    };
    let t = draw_draft(
        &shared,
        Some(columns.target_ids()),
        &mut job,
        lane,
        &mut DrawScratch::default(),
    )
    .unwrap()
    .unwrap();
    (out.dists, t)
}

/// The drafter's own distribution after a target context (any deterministic function of it
/// will do: the claim holds for every drafter).
fn draft_p(seed: u64, ctx: &[u32], kind: u64) -> Vec<f32> {
    dist(seed ^ 0x5EED, ctx, DRAFT_VOCAB, kind)
}

#[test]
fn tli_q_lives_on_the_shared_tokens_renormalized() {
    let c = columns();
    let sampled = SamplingParams {
        temperature: 1.0,
        ..Default::default()
    };
    let p = [0.1f32, 0.5, 0.3, 0.1];
    let (q, _) = drafted(&c, &p, &sampled);
    // Drafter 1 (0.5) has no target token: the rest (0.5) is renormalized to 1.
    let want = [0.2f32, 0.2, 0.0, 0.6, 0.0];
    for (a, b) in q.iter().zip(want) {
        assert!((a - b).abs() < 1e-6, "{q:?}");
    }
    // Greedy: the best shared token (drafter 2, target 3), not the drafter's own best.
    let (_, t) = drafted(&c, &p, &SamplingParams::greedy());
    assert_eq!(t, 3);
}

#[test]
fn tli_rounds_are_plain_sampling_from_the_target_for_every_gamma_up_to_three() {
    let c = columns();
    let sampled = SamplingParams {
        temperature: 1.0,
        ..Default::default()
    };
    let mut cases = 0;
    for gamma in 1..=3usize {
        for (case, (p_kind, q_kind)) in [(0, 0), (1, 0), (0, 1), (2, 2), (1, 1)]
            .into_iter()
            .enumerate()
        {
            let seed = (gamma * 10 + case) as u64;
            let p = move |ctx: &[u32]| dist(seed, ctx, TARGET_VOCAB, p_kind);
            let q = |ctx: &[u32]| drafted(&c, &draft_p(seed, ctx, q_kind), &sampled).0;
            let mut got = BTreeMap::new();
            for (drafts, w) in draft_sequences(gamma, &q) {
                let q_rows: Vec<Vec<f32>> = (0..gamma).map(|i| q(&drafts[..i])).collect();
                for row in &q_rows {
                    assert_eq!(row[2] + row[4], 0.0, "q on a token the drafter lacks");
                }
                let p_rows: Vec<Vec<f32>> = (0..=gamma).map(|i| p(&drafts[..i])).collect();
                for (emitted, pw) in round_outcomes(&drafts, &q_rows, &p_rows) {
                    extend_plainly(&emitted, gamma + 1, w * pw, &p, &mut got);
                }
            }
            let mut want = BTreeMap::new();
            extend_plainly(&[], gamma + 1, 1.0, &p, &mut want);
            let total: f64 = got.values().sum();
            assert!((total - 1.0).abs() < 1e-6, "γ={gamma}: mass {total}");
            for (seq, &w) in &want {
                let g = got.get(seq).copied().unwrap_or(0.0);
                assert!(
                    (g - w).abs() < 1e-6,
                    "γ={gamma} case {case} {seq:?}: round {g}, plain {w}"
                );
            }
            assert!(got.keys().all(|k| want.contains_key(k)));
            cases += 1;
        }
    }
    assert_eq!(cases, 15);
}

/// A byte-level tokenizer whose ids are the 256 byte characters rotated by `offset`, then
/// `extra` whole-word tokens (never produced by encoding: there are no merges).
fn tiny_tokenizer(dir: &std::path::Path, offset: usize, extra: &[&str]) -> Arc<TextTokenizer> {
    let alphabet = tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet();
    let mut chars: Vec<char> = alphabet.into_iter().collect();
    chars.sort();
    let mut vocab = serde_json::Map::new();
    for i in 0..256 {
        vocab.insert(chars[(i + offset) % 256].to_string(), (i as u32).into());
    }
    for (j, w) in extra.iter().enumerate() {
        vocab.insert(w.to_string(), (256 + j as u32).into());
    }
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": []}
    });
    std::fs::write(dir.join("tokenizer.json"), json.to_string()).unwrap();
    Arc::new(TextTokenizer::from_hf_dir(dir).unwrap())
}

#[test]
fn a_context_is_translated_token_by_token_and_cut_at_a_length() {
    let (dd, td) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let draft = tiny_tokenizer(dd.path(), 7, &["xy"]);
    let target = tiny_tokenizer(td.path(), 0, &["ab", "xy"]);
    let t = Arc::new(Translation::between(draft.clone(), 257, target.clone(), 258).unwrap());
    // Every byte and "xy" are shared; "ab" only the target has.
    assert_eq!(t.shared(), 257);
    let id = |tok: &TextTokenizer, s: &str| tok.encode(s, false).unwrap();
    let (ab, xy) = (256u32, 257u32);
    assert_eq!(t.draft_of(xy), Some(256));
    assert_eq!(t.draft_of(ab), None);
    // What a catch-up on each costs the drafter: "ab" is its "a" and "b".
    assert_eq!(t.piece_count(xy), 1);
    assert_eq!(t.piece_count(ab), 2);
    let mut tr = Translator::new(Arc::clone(&t));
    let context = [id(&target, "q")[0], ab, xy, id(&target, "!")[0]];
    let own = tr.translate(5, &context).unwrap().to_vec();
    let mut want = id(&draft, "qab");
    want.push(256);
    want.extend(id(&draft, "!"));
    assert_eq!(own, want);
    assert_eq!(draft.decode(&own).unwrap(), "qabxy!");
    // Where each target token's translation ends.
    assert_eq!(
        (0..=4).map(|n| tr.draft_len(5, n)).collect::<Vec<_>>(),
        [0, 1, 3, 4, 5]
    );
    // Another continuation of the first two tokens: their translation stays, the rest is new.
    let other = [context[0], ab, id(&target, "z")[0]];
    let own2 = tr.translate(5, &other).unwrap().to_vec();
    assert_eq!(own2[..3], own[..3]);
    assert_eq!(draft.decode(&own2).unwrap(), "qabz");
    tr.forget(5);
    assert_eq!(tr.draft_len(5, 2), 0);
}

#[test]
fn ids_past_a_models_rows_are_not_shared_nor_fed() {
    let (dd, td) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let draft = tiny_tokenizer(dd.path(), 2, &[]);
    let target = tiny_tokenizer(td.path(), 0, &[]);
    // Six-token models, as the engine's tiny tests have: target ids 0..6 are the first six
    // byte characters, the drafter's the six from the third on.
    let t = Translation::between(draft, 6, target, 6).unwrap();
    assert_eq!(t.columns().target_ids(), [2, 3, 4, 5]);
    let mut tr = Translator::new(Arc::new(t));
    // Target 0 and 1 are the drafter's 254 and 255: past its rows, so they come to nothing.
    assert_eq!(tr.translate(1, &[0, 2, 1, 5]).unwrap(), [0, 3]);
}
