//! The request bodies as clients send them: refused fields, wrong types, every accepted shape.

use super::*;

#[test]
fn fields_tandem_does_not_do_are_refused_by_name() {
    for field in ["functions", "suffix", "structured_outputs"] {
        let body = format!(r#"{{"prompt":"hi","{field}":{{"a":1}}}}"#);
        let e = parse_request::<CompletionRequest>(body.as_bytes()).unwrap_err();
        assert_eq!(e.param.as_deref(), Some(field), "{}", e.message);
    }
    // Fields that change nothing in the answer pass, and so does an explicit null.
    parse_request::<CompletionRequest>(br#"{"prompt":"hi","user":"u","suffix":null}"#).unwrap();
}

#[test]
fn wrong_types_name_the_field() {
    let e =
        parse_request::<CompletionRequest>(br#"{"prompt":"hi","temperature":"hot"}"#).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("temperature"), "{}", e.message);
    let e =
        parse_request::<ChatRequest>(br#"{"messages":[{"role":"user","content":5}]}"#).unwrap_err();
    assert!(e.param.unwrap().starts_with("messages"));
    let e = parse_request::<CompletionRequest>(br#"{"prompt": "hi", "#).unwrap_err();
    assert!(e.message.contains("not valid JSON"), "{}", e.message);
    let e = parse_request::<CompletionRequest>(b"  ").unwrap_err();
    assert!(e.message.contains("empty"), "{}", e.message);
    let e = parse_request::<CompletionRequest>(b"[1]").unwrap_err();
    assert!(e.message.contains("object"), "{}", e.message);
    let e = parse_request::<CompletionRequest>(br#"{"prompt":"x","speculative":{"gama":2}}"#)
        .unwrap_err();
    assert!(e.message.contains("gama"), "{}", e.message);
}

#[test]
fn speculative_takes_an_object_and_says_so() {
    for bad in ["[1]", "[true]", "true", "3", r#""fast""#] {
        let body = format!(r#"{{"prompt":"x","speculative":{bad}}}"#);
        let e = parse_request::<CompletionRequest>(body.as_bytes()).unwrap_err();
        assert_eq!(
            e.param.as_deref(),
            Some("speculative"),
            "{bad}: {}",
            e.message
        );
        assert!(
            e.message
                .contains("expected an object of speculation settings, such as"),
            "{bad}: {}",
            e.message
        );
        assert!(
            !e.message.contains("expected a boolean"),
            "{bad}: {}",
            e.message
        );
    }
    let e = parse_request::<CompletionRequest>(br#"{"prompt":"x","speculative":[1]}"#).unwrap_err();
    assert!(e.message.contains("invalid type: array"), "{}", e.message);
    let (_, c): (CompletionRequest, _) =
        parse_request(br#"{"prompt":"x","speculative":{"enabled":false,"lenience":0.9}}"#).unwrap();
    let s = c.speculative.unwrap();
    assert_eq!((s.enabled, s.lenience), (Some(false), Some(0.9)));
    let (_, c): (CompletionRequest, _) =
        parse_request(br#"{"prompt":"x","speculative":null}"#).unwrap();
    assert!(c.speculative.is_none());
}

#[test]
fn prompts_and_stops_take_every_openai_shape() {
    let (r, c): (CompletionRequest, _) =
        parse_request(br#"{"prompt":["a"],"stop":"x","n":1,"logprobs":null}"#).unwrap();
    assert!(matches!(r.prompt, Some(PromptInput::Texts(ref v)) if v.len() == 1));
    assert_eq!(c.stop.unwrap().to_vec(), vec!["x"]);
    let (r, _): (CompletionRequest, _) =
        parse_request(br#"{"prompt":[1,2,3],"stop":["a","b"]}"#).unwrap();
    assert!(matches!(r.prompt, Some(PromptInput::Tokens(ref v)) if v == &[1, 2, 3]));
    let (_, c): (CompletionRequest, _) = parse_request(br#"{"prompt":"x","n":9}"#).unwrap();
    assert_eq!(c.choices(8).unwrap_err().param.as_deref(), Some("n"));
    assert_eq!(c.choices(9).unwrap(), 9);
    let (_, c): (ChatRequest, _) = parse_request(
        br#"{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"logprobs":false}"#,
    )
    .unwrap();
    assert_eq!(c.chat_logprobs().unwrap(), None);
}

#[test]
fn logprobs_take_each_endpoints_shape() {
    let chat = |body: &str| {
        let (_, c): (ChatRequest, _) = parse_request(body.as_bytes()).unwrap();
        c.chat_logprobs()
    };
    assert_eq!(chat(r#"{"logprobs":true}"#).unwrap(), Some(0));
    assert_eq!(
        chat(r#"{"logprobs":true,"top_logprobs":5}"#).unwrap(),
        Some(5)
    );
    for bad in [
        r#"{"logprobs":3}"#,
        r#"{"top_logprobs":2}"#,
        r#"{"logprobs":true,"top_logprobs":21}"#,
    ] {
        assert!(chat(bad).is_err(), "{bad}");
    }
    let completion = |body: &str| {
        let (_, c): (CompletionRequest, _) = parse_request(body.as_bytes()).unwrap();
        c.completion_logprobs()
    };
    assert_eq!(completion(r#"{"logprobs":0}"#).unwrap(), Some(0));
    assert_eq!(completion(r#"{"logprobs":20}"#).unwrap(), Some(20));
    assert_eq!(completion(r#"{"logprobs":null}"#).unwrap(), None);
    for bad in [
        r#"{"logprobs":21}"#,
        r#"{"logprobs":true}"#,
        r#"{"logprobs":-1}"#,
        r#"{"logprobs":2,"top_logprobs":2}"#,
    ] {
        assert!(completion(bad).is_err(), "{bad}");
    }
}
