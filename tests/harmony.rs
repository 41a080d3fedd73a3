//! A model that answers in harmony's channels (gpt-oss's format) through the API: its analysis
//! channel is `reasoning_content`, its final channel `content`, and no markup reaches either,
//! whole or streamed; the Responses API gives the analysis channel as a `reasoning` item before
//! the final channel's message, and takes it back as input; constraints and
//! token sources, which would shape or mark the reasoning too, are refused by name.
//!
//! The model is built here to write one harmony answer: a Mistral-style layer whose window of 2
//! averages the current and the previous token into a second half of the residual (queries
//! and keys are zero), and an output head that picks each next token from the current one, the
//! previous one breaking the ties where a marker has two successors. Greedy decoding after the
//! chat template's `<|start|>assistant` writes exactly
//! `<|channel|>analysis<|message|>Think<|end|><|channel|>final<|message|>Go!<|return|>`.

use crate::common;

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use common::http::{post_json, Server};
use serde_json::{json, Value};

/// The tokenizer's special tokens, ids from 256, and its ordinary added words after them.
const SPECIALS: [&str; 5] = [
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|end|>",
    "<|return|>",
];
const WORDS: [&str; 3] = ["assistant", "analysis", "final"];
const VOCAB: usize = 264;
/// Two halves: the current token's one-hot, then the window's average.
const HIDDEN: usize = 2 * VOCAB;

fn id(token: &str) -> usize {
    if let Some(i) = SPECIALS.iter().position(|s| *s == token) {
        return 256 + i;
    }
    if let Some(i) = WORDS.iter().position(|s| *s == token) {
        return 256 + SPECIALS.len() + i;
    }
    // Printable ASCII is its own character in the byte-level alphabet.
    let c = token
        .chars()
        .next()
        .filter(|c| c.is_ascii_graphic())
        .unwrap();
    assert_eq!(token.len(), 1, "{token}");
    alphabet().iter().position(|&x| x == c).unwrap()
}

/// The byte-level alphabet, sorted: the tokenizer's first 256 ids.
fn alphabet() -> Vec<char> {
    let mut chars: Vec<char> = tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet()
        .into_iter()
        .collect();
    chars.sort();
    chars
}

fn tokenizer_json() -> String {
    let added: Vec<(&str, bool)> = SPECIALS
        .iter()
        .map(|t| (*t, true))
        .chain(WORDS.iter().map(|t| (*t, false)))
        .collect();
    common::byte_level_tokenizer_json(VOCAB, &[], &added)
}

/// The answer, token after token, from the template's last token (`assistant`).
const SCRIPT: [&str; 17] = [
    "assistant",
    "<|channel|>",
    "analysis",
    "<|message|>",
    "T",
    "h",
    "i",
    "n",
    "k",
    "<|end|>",
    "<|channel|>",
    "final",
    "<|message|>",
    "G",
    "o",
    "!",
    "<|return|>",
];

fn write_model(dir: &Path) {
    let config = json!({
        "architectures": ["MistralForCausalLM"], "model_type": "mistral",
        "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": 16,
        "num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1,
        "head_dim": HIDDEN, "sliding_window": 2, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "max_position_embeddings": 512, "tie_word_embeddings": false,
        "bos_token_id": id("<|start|>"), "eos_token_id": id("<|return|>"),
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let template = "{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}\
                    <|end|>{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}";
    let tok_config = json!({"bos_token": "<|start|>", "eos_token": "<|return|>",
                            "add_bos_token": false, "chat_template": template});
    std::fs::write(dir.join("tokenizer_config.json"), tok_config.to_string()).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json()).unwrap();

    let zeros = |r: usize, c: usize| vec![0f32; r * c];
    let mut embed = zeros(VOCAB, HIDDEN);
    for t in 0..VOCAB {
        embed[t * HIDDEN + t] = 1.0;
    }
    // v copies the normed one-hot (√HIDDEN) into the second half at 1.
    let mut v = zeros(HIDDEN, HIDDEN);
    for t in 0..VOCAB {
        v[(VOCAB + t) * HIDDEN + t] = 1.0 / (HIDDEN as f32).sqrt();
    }
    let mut o = zeros(HIDDEN, HIDDEN);
    for d in VOCAB..HIDDEN {
        o[d * HIDDEN + d] = 1.0;
    }
    // Each next token from the current one (4); the previous breaks a marker's tie (2, seen
    // at half weight through the window's average).
    let mut head = zeros(VOCAB, HIDDEN);
    for pair in SCRIPT.windows(2) {
        head[id(pair[1]) * HIDDEN + id(pair[0])] = 4.0;
    }
    for pair in SCRIPT.windows(3) {
        if ["<|channel|>", "<|message|>"].contains(&pair[1]) {
            head[id(pair[2]) * HIDDEN + VOCAB + id(pair[0])] = 2.0;
        }
    }
    let t = |v: Vec<f32>, r: usize, c: usize| Tensor::from_vec(v, (r, c), &Device::Cpu).unwrap();
    let ones = |n: usize| Tensor::ones(n, candle_core::DType::F32, &Device::Cpu).unwrap();
    let p = "model.layers.0";
    let tensors: HashMap<String, Tensor> = [
        (
            "model.embed_tokens.weight".to_string(),
            t(embed, VOCAB, HIDDEN),
        ),
        (format!("{p}.input_layernorm.weight"), ones(HIDDEN)),
        (format!("{p}.post_attention_layernorm.weight"), ones(HIDDEN)),
        (
            format!("{p}.self_attn.q_proj.weight"),
            t(zeros(HIDDEN, HIDDEN), HIDDEN, HIDDEN),
        ),
        (
            format!("{p}.self_attn.k_proj.weight"),
            t(zeros(HIDDEN, HIDDEN), HIDDEN, HIDDEN),
        ),
        (format!("{p}.self_attn.v_proj.weight"), t(v, HIDDEN, HIDDEN)),
        (format!("{p}.self_attn.o_proj.weight"), t(o, HIDDEN, HIDDEN)),
        (
            format!("{p}.mlp.gate_proj.weight"),
            t(zeros(16, HIDDEN), 16, HIDDEN),
        ),
        (
            format!("{p}.mlp.up_proj.weight"),
            t(zeros(16, HIDDEN), 16, HIDDEN),
        ),
        (
            format!("{p}.mlp.down_proj.weight"),
            t(zeros(HIDDEN, 16), HIDDEN, 16),
        ),
        ("model.norm.weight".to_string(), ones(HIDDEN)),
        ("lm_head.weight".to_string(), t(head, VOCAB, HIDDEN)),
    ]
    .into_iter()
    .collect();
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).unwrap();
}

fn ask(stream: bool) -> Value {
    json!({"messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 40,
           "temperature": 0, "stream": stream})
}

#[test]
fn reasoning_and_content_come_apart_without_markup() {
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path());
    let model = dir.path().to_str().unwrap();
    let server = Server::start(&["--model", model, "--weights-dtype", "f32"], &[]);
    let addr = &server.addr;

    // The raw answer is the whole script, markup included (completions report text as is).
    let prompt = "<|start|>user<|message|>2+2?<|end|><|start|>assistant";
    let raw = post_json(
        addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 40, "temperature": 0}),
    );
    assert_eq!(raw.status, 200, "{}", raw.text());
    assert_eq!(
        raw.json()["choices"][0]["text"],
        "<|channel|>analysis<|message|>Think<|end|><|channel|>final<|message|>Go!"
    );

    let whole = post_json(addr, "/v1/chat/completions", &ask(false));
    assert_eq!(whole.status, 200, "{}", whole.text());
    let message = &whole.json()["choices"][0]["message"];
    assert_eq!(message["content"], "Go!");
    assert_eq!(message["reasoning_content"], "Think");
    assert_eq!(whole.json()["choices"][0]["finish_reason"], "stop");

    let streamed = post_json(addr, "/v1/chat/completions", &ask(true));
    assert_eq!(streamed.status, 200);
    let (mut reasoning, mut content) = (String::new(), String::new());
    for data in streamed.sse_data() {
        if data == "[DONE]" {
            continue;
        }
        let chunk: Value = serde_json::from_str(&data).unwrap();
        let delta = &chunk["choices"][0]["delta"];
        reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
        content.push_str(delta["content"].as_str().unwrap_or(""));
    }
    assert_eq!((reasoning.as_str(), content.as_str()), ("Think", "Go!"));

    // The Responses API: the reasoning as a `reasoning` item before the answer's message,
    // whole and streamed; the output sent back as input continues the conversation.
    let ask_responses = |stream: bool| json!({"input": "2+2?", "max_output_tokens": 40, "temperature": 0, "stream": stream});
    let response = post_json(addr, "/v1/responses", &ask_responses(false));
    assert_eq!(response.status, 200, "{}", response.text());
    let output = response.json()["output"].clone();
    assert_eq!(output[0]["type"], "reasoning", "{output}");
    assert_eq!(output[0]["content"][0]["text"], "Think");
    assert_eq!(output[1]["type"], "message");
    assert_eq!(output[1]["content"][0]["text"], "Go!");
    assert_eq!(output.as_array().unwrap().len(), 2);
    let streamed = post_json(addr, "/v1/responses", &ask_responses(true));
    assert_eq!(streamed.status, 200);
    let (mut reasoning, mut content, mut done) = (String::new(), String::new(), Value::Null);
    for data in streamed.sse_data() {
        let event: Value = serde_json::from_str(&data).unwrap();
        match event["type"].as_str().unwrap() {
            "response.reasoning_text.delta" => reasoning.push_str(event["delta"].as_str().unwrap()),
            "response.output_text.delta" => content.push_str(event["delta"].as_str().unwrap()),
            "response.completed" => done = event["response"]["output"].clone(),
            _ => {}
        }
    }
    assert_eq!((reasoning.as_str(), content.as_str()), ("Think", "Go!"));
    // The same items as unstreamed (each response has ids of its own).
    let without_ids = |items: &Value| {
        let mut items = items.clone();
        for item in items.as_array_mut().unwrap() {
            item.as_object_mut().unwrap().remove("id");
        }
        items
    };
    assert_eq!(without_ids(&done), without_ids(&output));
    let mut input = vec![json!({"role": "user", "content": "2+2?"})];
    input.extend(output.as_array().unwrap().iter().cloned());
    input.push(json!({"role": "user", "content": "And 3+3?"}));
    let again = post_json(
        addr,
        "/v1/responses",
        &json!({"input": input, "max_output_tokens": 40, "temperature": 0}),
    );
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(again.json()["output"][1]["content"][0]["text"], "Go!");

    for (field, body) in [
        (
            "response_format",
            json!({"response_format": {"type": "json_object"}}),
        ),
        (
            "speculative.token_sources",
            json!({"speculative": {"token_sources": true}}),
        ),
    ] {
        let mut req = ask(false);
        for (k, v) in body.as_object().unwrap() {
            req[k] = v.clone();
        }
        let r = post_json(addr, "/v1/chat/completions", &req);
        assert_eq!(r.status, 400, "{field}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], field, "{}", r.text());
    }
}

/// gpt-oss's own chat template (as its GGUF carries it) renders through tandem's template
/// engine: the system header harmony wants, each turn on its own, and the generation prompt
/// the splitter expects, `<|start|>assistant`, with no channel forced.
#[test]
fn gpt_oss_template_renders_harmony_turns() {
    use tandem::model::text::chat_template::{ChatMessage, ChatTemplate};
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates/gpt-oss.jinja");
    let source = std::fs::read_to_string(path).unwrap();
    let template = ChatTemplate::new(&source, None, Some("<|return|>".into())).unwrap();
    let messages = [
        ChatMessage::new("system", "Answer briefly."),
        ChatMessage::new("user", "2+2?"),
        ChatMessage::new("assistant", "4."),
        ChatMessage::new("user", "And 3+3?"),
    ];
    let text = template.render(&messages, true).unwrap();
    // An assistant turn's reasoning (chat's `reasoning_content`, a Responses reasoning item)
    // reaches the template as `thinking`, which it writes where harmony keeps it: here, the
    // last turn of a conversation rendered without a generation prompt.
    let mut answered = messages[..3].to_vec();
    answered[2].thinking = Some("Add two and two.".into());
    let with_thinking = template.render(&answered, false).unwrap();
    assert!(
        with_thinking.contains("<|channel|>analysis<|message|>Add two and two.<|end|>"),
        "{with_thinking}"
    );
    assert!(text.starts_with("<|start|>system<|message|>"), "{text}");
    assert!(text.contains("Reasoning: medium"), "{text}");
    assert!(
        text.contains("<|start|>developer<|message|># Instructions\n\nAnswer briefly."),
        "{text}"
    );
    assert!(
        text.contains("<|start|>user<|message|>2+2?<|end|>"),
        "{text}"
    );
    assert!(
        text.contains("<|start|>assistant<|channel|>final<|message|>4.<|end|>"),
        "{text}"
    );
    assert!(
        text.ends_with("<|start|>user<|message|>And 3+3?<|end|><|start|>assistant"),
        "{text}"
    );
}

/// `reasoning_effort` reaches a chat template that reads it (gpt-oss's writes it into its
/// system header) and is refused by name where the template would ignore it or the value is
/// not one of OpenAI's three; with gpt-oss's own template the answer still comes apart.
#[test]
fn reasoning_effort_reaches_a_template_that_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path());
    let model = dir.path().to_str().unwrap();
    let plain = Server::start(&["--model", model, "--weights-dtype", "f32"], &[]);
    let mut req = ask(false);
    req["reasoning_effort"] = "high".into();
    let r = post_json(&plain.addr, "/v1/chat/completions", &req);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "reasoning_effort");
    // The Responses API's `reasoning.effort` is the same setting, refused in its own words.
    let effort = json!({"input": "2+2?", "reasoning": {"effort": "high"}});
    let r = post_json(&plain.addr, "/v1/responses", &effort);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "reasoning.effort");
    // Only an assistant turn carries reasoning.
    let mut user_reasons = ask(false);
    user_reasons["messages"][0]["reasoning_content"] = "no".into();
    let r = post_json(&plain.addr, "/v1/chat/completions", &user_reasons);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "messages[0].reasoning_content");
    drop(plain);

    let template =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates/gpt-oss.jinja");
    let server = Server::start(
        &[
            "--model",
            model,
            "--weights-dtype",
            "f32",
            "--chat-template",
            template.to_str().unwrap(),
        ],
        &[],
    );
    let addr = &server.addr;
    for effort in ["low", "high"] {
        req["reasoning_effort"] = effort.into();
        let rendered = post_json(addr, "/v1/chat/completions/render", &req);
        assert_eq!(rendered.status, 200, "{}", rendered.text());
        let ids = rendered.json()["token_ids"].clone();
        let text = post_json(addr, "/detokenize", &json!({"tokens": ids})).json()["content"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(text.contains(&format!("Reasoning: {effort}\n")), "{text}");
    }
    let r = post_json(addr, "/v1/responses", &effort);
    assert_eq!(r.status, 200, "{}", r.text());
    req["reasoning_effort"] = "extreme".into();
    let r = post_json(addr, "/v1/chat/completions", &req);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "reasoning_effort");
    req["reasoning_effort"] = "low".into();
    let r = post_json(addr, "/v1/chat/completions", &req);
    assert_eq!(r.status, 200, "{}", r.text());
    let message = &r.json()["choices"][0]["message"];
    assert_eq!(
        (&message["reasoning_content"], &message["content"]),
        (&json!("Think"), &json!("Go!"))
    );
}
