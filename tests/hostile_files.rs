//! Files that cannot hurt the server, as a hostile model supplier would write them: a GGUF
//! header whose values the reader trusted (alignment 0), weights that are NaN in one layer or
//! in one token's embedding, and chat templates that run away on every conversation or on one.
//! Each is refused at start-up naming the cause, or fails only its own request while `/health`
//! says what is wrong and other requests are served.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use candle_core::quantized::gguf_file;
use candle_core::{Device, Tensor};
use common::http::{get, post_json, Server};
use common::tandem_command;
use common::{write_tiny_llama, TinySpec};
use serde_json::json;

/// `tandem generate` on `model`: whether it succeeded, and its stderr.
fn generate(model: &Path) -> (Option<i32>, String) {
    let out = tandem_command()
        .args(["generate", "--model", model.to_str().unwrap()])
        .args(["--raw", "--prompt", "Hello", "--max-tokens", "2"])
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_gguf_whose_alignment_is_zero_is_refused_by_name_without_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("alignment-0.gguf");
    let arch = gguf_file::Value::String("llama".into());
    let zero = gguf_file::Value::U32(0);
    let mut f = std::fs::File::create(&path).unwrap();
    gguf_file::write(
        &mut f,
        &[
            ("general.architecture", &arch),
            ("general.alignment", &zero),
        ],
        &[],
    )
    .unwrap();
    drop(f);
    let (code, err) = generate(&path);
    assert_eq!(code, Some(1), "a clean error, not a panic's 101: {err}");
    assert!(err.contains("general.alignment is 0"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_gguf_whose_tensor_sizes_overflow_is_refused_without_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.gguf");
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(1u64.to_le_bytes()); // tensors
    b.extend(1u64.to_le_bytes()); // metadata pairs
    let key = "general.architecture";
    b.extend((key.len() as u64).to_le_bytes());
    b.extend(key.as_bytes());
    b.extend(8u32.to_le_bytes()); // a string
    b.extend(5u64.to_le_bytes());
    b.extend(b"llama");
    let name = "token_embd.weight";
    b.extend((name.len() as u64).to_le_bytes());
    b.extend(name.as_bytes());
    b.extend(2u32.to_le_bytes());
    b.extend((1u64 << 40).to_le_bytes());
    b.extend((1u64 << 40).to_le_bytes());
    b.extend(0u32.to_le_bytes()); // F32
    b.extend(0u64.to_le_bytes());
    b.resize(b.len().next_multiple_of(32) + 64, 0);
    std::fs::write(&path, b).unwrap();
    let (code, err) = generate(&path);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("token_embd.weight"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// A tiny model folder whose weight `name` has `edit` applied.
fn tiny_with(dir: &Path, name: &str, edit: impl Fn(Vec<f32>) -> Vec<f32>) {
    write_tiny_llama(dir, &TinySpec::untied(11));
    let file = dir.join("model.safetensors");
    let mut tensors = candle_core::safetensors::load(&file, &Device::Cpu).unwrap();
    let t = &tensors[name];
    let shape = t.shape().clone();
    let values = edit(t.flatten_all().unwrap().to_vec1::<f32>().unwrap());
    tensors.insert(
        name.to_string(),
        Tensor::from_vec(values, shape, &Device::Cpu).unwrap(),
    );
    candle_core::safetensors::save(&tensors, &file).unwrap();
}

#[test]
fn weights_that_are_nan_stop_start_up_naming_the_layer() {
    let dir = tempfile::tempdir().unwrap();
    tiny_with(dir.path(), "model.layers.1.input_layernorm.weight", |v| {
        vec![f32::NAN; v.len()]
    });
    let (code, err) = generate(dir.path());
    assert_ne!(code, Some(0), "{err}");
    assert!(err.contains("the target model: layer 1 (blk.1)"), "{err}");
    assert!(err.contains("NaN or infinite"), "{err}");
    // The same file as the draft model of a sound target.
    let sound = tempfile::tempdir().unwrap();
    write_tiny_llama(sound.path(), &TinySpec::untied(11));
    let out = tandem_command()
        .args(["generate", "--model", sound.path().to_str().unwrap()])
        .args(["--draft-model", dir.path().to_str().unwrap()])
        .args(["--raw", "--prompt", "Hello", "--max-tokens", "2"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("the draft model: layer 1 (blk.1)"), "{err}");
}

#[test]
fn a_forward_that_gives_nan_turns_health_503_until_one_is_sound() {
    // Token 259 (a padding token no text produces) embeds as NaN: the start-up check's text
    // never reads it, a request that sends it does.
    let dir = tempfile::tempdir().unwrap();
    let hidden = TinySpec::default().hidden;
    tiny_with(dir.path(), "model.embed_tokens.weight", |mut v| {
        v[259 * hidden..260 * hidden].fill(f32::NAN);
        v
    });
    let server = Server::start(
        &[
            "--model",
            dir.path().to_str().unwrap(),
            "--draft-model",
            "none",
        ],
        &[],
    );
    let addr = server.addr.clone();
    let ok = json!({"prompt": "Hello", "max_tokens": 3, "temperature": 0});
    assert_eq!(post_json(&addr, "/v1/completions", &ok).status, 200);
    let broken = json!({"prompt": [72, 259], "max_tokens": 3, "temperature": 0});
    let r = post_json(&addr, "/v1/completions", &broken);
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(r.text().contains("NaN"), "{}", r.text());
    let h = get(&addr, "/health");
    assert_eq!(h.status, 503, "{}", h.text());
    assert_eq!(h.json()["status"], "broken_model");
    assert!(
        server
            .metric("tandem_non_finite_forwards_total", "")
            .unwrap()
            >= 1.0
    );
    // Other requests are still served, and a sound forward clears the report.
    assert_eq!(post_json(&addr, "/v1/completions", &ok).status, 200);
    assert_eq!(get(&addr, "/health").status, 200);
}

/// ChatML as the default model writes it, with `spin` run before the turns when a message's
/// content is `trigger` (or always, for an empty trigger).
fn chatml_with(spin: &str, trigger: &str) -> String {
    let cond = if trigger.is_empty() {
        "true".to_string()
    } else {
        format!("messages | selectattr('content', 'equalto', '{trigger}') | list | length > 0")
    };
    format!(
        "{{% if {cond} %}}{spin}{{% endif %}}{{% for m in messages %}}<|im_start|>{{{{ m.role }}}}\n\
         {{{{ m.content }}}}<|im_end|>\n{{% endfor %}}{{% if add_generation_prompt %}}\
         <|im_start|>assistant\n{{% endif %}}"
    )
}

const FOREVER: &str =
    "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}";

/// A server on the default model with `spin` in its chat template, run when a message is
/// `trigger`; the folder holding the template lives as long as the server is used.
fn serve_with_template(spin: &str, trigger: &str) -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("template.jinja");
    std::fs::write(&template, chatml_with(spin, trigger)).unwrap();
    let server = Server::start(
        &[
            "--draft-model",
            "prompt-lookup",
            "--chat-template",
            template.to_str().unwrap(),
        ],
        &[],
    );
    (server, dir)
}

/// Why `tandem serve` refused to start with `spin` run on every conversation.
fn start_up_error(spin: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("template.jinja");
    std::fs::write(&template, chatml_with(spin, "")).unwrap();
    let out = tandem_command()
        .args(["serve", "--port", "0", "--draft-model", "none"])
        .args(["--chat-template", template.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn chat(content: &str) -> serde_json::Value {
    json!({"messages": [{"role": "user", "content": content}], "max_tokens": 4, "temperature": 0})
}

#[test]
fn a_template_that_runs_away_on_every_conversation_stops_start_up() {
    let started = Instant::now();
    let err = start_up_error(FOREVER);
    assert!(
        err.contains("the chat template fails on a one-message conversation"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(120));
}

/// Doubles a string in a loop: a few steps, any amount of memory.
const DOUBLING: &str = "{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(100000) %}\
                        {% set ns.s = ns.s ~ ns.s %}{% endfor %}";

#[test]
fn a_template_that_takes_memory_on_one_conversation_is_stopped_and_the_server_lives() {
    let (server, _dir) = serve_with_template(DOUBLING, "grow");
    let addr = server.addr.clone();
    let r = post_json(&addr, "/v1/chat/completions", &chat("grow"));
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(r.text().contains("MiB"), "{}", r.text());
    assert_eq!(get(&addr, "/health").status, 200);
    assert_eq!(
        post_json(&addr, "/v1/chat/completions", &chat("Hello")).status,
        200,
        "the stopped render's place is given back"
    );
    // What the stopped render keeps is bounded by its budget (RSS of the whole server, with
    // the model: well under a doubling that ran on).
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.pid())).unwrap();
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    assert!(rss_kib < 2 << 20, "RSS {rss_kib} KiB");
}

#[test]
fn a_template_that_takes_memory_on_every_conversation_stops_start_up() {
    let err = start_up_error(DOUBLING);
    assert!(err.contains("MiB"), "{err}");
}

#[test]
fn a_template_that_runs_away_on_one_conversation_fails_only_that_request() {
    let (server, _dir) = serve_with_template(FOREVER, "spin");
    let addr = server.addr.clone();
    // Two runaway renders at once (every render thread), while /health and another request
    // are asked.
    let spinners: Vec<_> = (0..2)
        .map(|_| {
            let addr = addr.clone();
            std::thread::spawn(move || post_json(&addr, "/v1/chat/completions", &chat("spin")))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let asked = Instant::now();
    let h = get(&addr, "/health");
    assert_eq!(h.status, 200, "{}", h.text());
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "{:?}",
        asked.elapsed()
    );
    let r = post_json(
        &addr,
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 3}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    for s in spinners {
        let r = s.join().unwrap();
        assert_eq!(r.status, 500, "{}", r.text());
        assert!(r.text().contains("chat template"), "{}", r.text());
    }
    // Once the runaway renders have spent their fuel, chats are served again.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = post_json(&addr, "/v1/chat/completions", &chat("Hello"));
        if r.status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "{}", r.text());
        std::thread::sleep(Duration::from_millis(200));
    }
}
