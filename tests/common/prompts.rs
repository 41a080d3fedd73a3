//! Prompts for the tests: reproducible random token ids, and real questions in the model's
//! chat template.

use tandem::model::{ChatMessage, LoadedModel};
use tandem::sampling::SeededRng;

/// Deterministic pseudo-random token ids below `vocab`.
pub fn random_tokens(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    let mut rng = SeededRng::new(seed);
    (0..n)
        .map(|_| (rng.next_u64() % vocab as u64) as u32)
        .collect()
}

/// The first turns of the first `n` Spec-Bench dev questions of distinct categories, as chat
/// prompts in the model's template.
pub fn spec_bench_prompts(model: &LoadedModel, n: usize) -> Vec<Vec<u32>> {
    let mut seen = std::collections::HashSet::new();
    let template = model.tokenizer.chat_template().unwrap();
    let prompts: Vec<Vec<u32>> = dev_questions()
        .into_iter()
        .filter(|q| seen.insert(q["category"].as_str().unwrap().to_owned()))
        .take(n)
        .map(|q| {
            let chat = template
                .render(
                    &[tandem::model::ChatMessage::new(
                        "user",
                        q["turns"][0].as_str().unwrap(),
                    )],
                    true,
                )
                .unwrap();
            model.tokenizer.encode(&chat, true).unwrap()
        })
        .collect();
    assert_eq!(prompts.len(), n);
    prompts
}

/// The first `n` tokens of the Spec-Bench dev questions' turns as plain text, one after
/// another (no chat template): a real text to measure a forward's next-token distributions on.
pub fn development_text(model: &LoadedModel, n: usize) -> Vec<u32> {
    let mut text = String::new();
    for q in dev_questions().iter().take(40) {
        for turn in q["turns"].as_array().unwrap() {
            text.push_str(turn.as_str().unwrap());
            text.push_str("\n\n");
        }
    }
    let mut tokens = model.tokenizer.encode(&text, false).unwrap();
    assert!(tokens.len() >= n, "{} tokens of text", tokens.len());
    tokens.truncate(n);
    tokens
}

/// The project's Spec-Bench development questions, in file order.
fn dev_questions() -> Vec<serde_json::Value> {
    let data = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/data/spec_bench_dev.jsonl"
    ))
    .unwrap();
    data.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `question` as the user's turn in the default model's chat template, ready for its answer.
pub fn chat_prompt(loaded: &LoadedModel, question: &str) -> Vec<u32> {
    let text = loaded
        .tokenizer
        .chat_template()
        .expect("SmolLM2 ships a chat template")
        .render(&[ChatMessage::new("user", question)], true)
        .unwrap();
    loaded.tokenizer.encode(&text, true).unwrap()
}
