//! The fleet workload: interleaved multi-turn conversations, each with a system prompt of its
//! own (~320 tokens), a first question and three follow-ups that resend the whole history, as
//! chat clients do. Every conversation's next turn comes after every other conversation's
//! turn, so a replica must keep many conversations cached at once to serve a follow-up from
//! its cache.

use std::time::Instant;

use serde_json::{json, Value};

use crate::common::http::{open_stream, Server};

const ROLES: [&str; 8] = [
    "a bicycle repair shop",
    "a public library",
    "a mountain hotel",
    "a bakery",
    "a city museum",
    "a garden centre",
    "a train operator",
    "a dental clinic",
];

const RULES: [&str; 12] = [
    "Greet the customer politely and keep every answer short, friendly and concrete.",
    "Never promise a refund; explain that the manager decides on refunds within five days.",
    "Opening hours are nine to six on weekdays and ten to four on Saturdays; Sundays closed.",
    "If a question is about prices, give the price list's figure and mention seasonal offers.",
    "Do not share any personal data about other customers, staff or suppliers, ever.",
    "When you do not know an answer, say so and offer to pass the question to a colleague.",
    "Recommend the loyalty card to customers who visit more than twice a month.",
    "Bookings can be changed up to two days ahead without a fee, later for a small fee.",
    "Use plain words, avoid jargon, and give one example whenever you explain a rule.",
    "Accessibility: the entrance has a ramp, and assistance can be booked by phone.",
    "Payment by card, cash or bank transfer is accepted; invoices are sent by email.",
    "Close every answer by asking whether anything else is needed today.",
];

const QUESTIONS: [&str; 6] = [
    "What are your opening hours this week?",
    "Can I change my booking for next Friday?",
    "Do you accept payment by bank transfer?",
    "Is the entrance accessible with a wheelchair?",
    "How much does the loyalty card cost?",
    "Can I get a refund for last month's order?",
];

const FOLLOW_UPS: [&str; 3] = [
    "Thanks. Can you say a bit more about that?",
    "Could you give me an example?",
    "Please sum it up in one sentence.",
];

/// Conversation `id`'s system prompt: its own from the first words.
fn system_prompt(id: usize) -> String {
    let mut text = format!(
        "Conversation {id}. You are the assistant of {} number {}. Follow these rules.",
        ROLES[id % ROLES.len()],
        id * 7 + 3
    );
    let mut state = id as u64 * 2_654_435_761 + 1;
    for n in 1..=14 {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let rule = RULES[(state >> 33) as usize % RULES.len()];
        text.push_str(&format!(" ({n}) {rule}"));
    }
    text
}

/// Follow-ups' time to first token over a run, in seconds.
pub struct FirstTokenTimes {
    pub median: f64,
    pub p90: f64,
}

pub struct Workload {
    conversations: Vec<Vec<Value>>,
}

impl Workload {
    /// Conversations `first..first + n` (different numbers, different system prompts).
    pub fn new(first: usize, n: usize) -> Self {
        let conversations = (first..first + n)
            .map(|id| {
                vec![
                    json!({"role": "system", "content": system_prompt(id)}),
                    json!({"role": "user", "content": QUESTIONS[id % QUESTIONS.len()]}),
                ]
            })
            .collect();
        Self { conversations }
    }

    /// Runs every turn through `addr` (the conversations of a turn spread over `clients`
    /// concurrent clients); the follow-ups' times to first token.
    pub fn run(mut self, addr: &str, model: &str, clients: usize) -> FirstTokenTimes {
        let mut times = Vec::new();
        for turn in 0..=FOLLOW_UPS.len() {
            let chunk = self.conversations.len().div_ceil(clients.max(1));
            let results: Vec<Vec<(String, f64)>> = std::thread::scope(|scope| {
                let handles: Vec<_> = self
                    .conversations
                    .chunks(chunk)
                    .map(|group| {
                        scope.spawn(move || {
                            group
                                .iter()
                                .map(|messages| ask(addr, model, messages))
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for (messages, (text, first)) in self
                .conversations
                .iter_mut()
                .zip(results.into_iter().flatten())
            {
                if turn > 0 {
                    times.push(first);
                }
                messages.push(json!({"role": "assistant", "content": text}));
                if let Some(next) = FOLLOW_UPS.get(turn) {
                    messages.push(json!({"role": "user", "content": next}));
                }
            }
        }
        times.sort_by(f64::total_cmp);
        let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
        FirstTokenTimes {
            median: at(0.5),
            p90: at(0.9),
        }
    }
}

/// One streamed turn: its text and the seconds to its first content.
fn ask(addr: &str, model: &str, messages: &[Value]) -> (String, f64) {
    let body = json!({
        "model": model,
        "messages": messages,
        "max_tokens": 24,
        "temperature": 0,
        "stream": true,
    });
    let start = Instant::now();
    let mut stream = open_stream(addr, "/v1/chat/completions", &body);
    assert_eq!(stream.status, 200);
    let (mut text, mut first) = (String::new(), None);
    while let Some(data) = stream.next_data() {
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(&data).unwrap();
        if let Some(piece) = chunk["choices"][0]["delta"]["content"].as_str() {
            if !piece.is_empty() && first.is_none() {
                first = Some(start.elapsed().as_secs_f64());
            }
            text.push_str(piece);
        }
    }
    (text, first.unwrap_or_else(|| start.elapsed().as_secs_f64()))
}

/// A replica's prefix-cache counters: prompt tokens looked up, and those found cached.
pub fn hit_tokens(server: &Server) -> (f64, f64) {
    let queried = server.metric("vllm:prefix_cache_queries_total", "");
    let hit = server.metric("tandem_prefix_cache_hit_tokens_total", "model=\"target\"");
    (queried.unwrap_or(0.0), hit.unwrap_or(0.0))
}
