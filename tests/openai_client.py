"""The official `openai` Python package as a client of a running `tandem serve`.

Run by tests/server.rs with the server's base URL (http://HOST:PORT/v1). Exits non-zero with a
message on any failure.
"""

import sys

try:
    import openai
except ImportError:
    sys.exit("the `openai` package is missing: python3 -m pip install openai (scripts/test does)")


def main(base_url: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)

    models = client.models.list()
    model = models.data[0].id

    # A streaming chat completion with usage in the last chunk.
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Say hello in French."}],
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert text.strip(), "empty streamed chat answer"
    assert finish in ("stop", "length"), finish
    assert usage is not None and usage.completion_tokens > 0, usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, usage

    # The same chat, not streamed: greedy, so the same text.
    full = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Say hello in French."}],
        max_tokens=24,
        temperature=0,
    )
    assert full.choices[0].message.content == text, (full.choices[0].message.content, text)
    assert full.usage.completion_tokens == usage.completion_tokens

    # A completion with tandem's extensions passed through extra_body.
    c = client.completions.create(
        model=model,
        prompt="One, two, three, four,",
        max_tokens=12,
        temperature=0,
        extra_body={"speculative": {"gamma": 2}, "top_k": 40},
    )
    assert c.choices[0].text, c
    assert c.usage.completion_tokens == 12 or c.choices[0].finish_reason == "stop", c
    spec = c.usage.model_extra["speculative"]
    assert spec["accepted_tokens"] <= spec["draft_tokens"], spec

    # Chat logprobs: the client's typed objects; the entries spell the answer, greedy takes the
    # most likely token, and each lists the alternatives asked for.
    chat = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Name two planets."}],
        max_tokens=16,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = chat.choices[0].logprobs.content
    assert b"".join(bytes(e.bytes) for e in content).decode() == chat.choices[0].message.content
    for e in content:
        assert len(e.top_logprobs) == 2, e
        assert e.top_logprobs[0].token == e.token and e.logprob <= 0, e

    # Streamed with two choices: each choice's chunks carry its index and its entries.
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Name two planets."}],
        max_tokens=16,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts, entries, usage = ["", ""], [[], []], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.logprobs is not None:
                entries[choice.index] += choice.logprobs.content or []
    for i in range(2):
        assert texts[i] == chat.choices[0].message.content, (i, texts)
        assert [e.logprob for e in entries[i]] == [e.logprob for e in content], i
    assert usage.completion_tokens == 2 * chat.usage.completion_tokens, usage
    assert usage.prompt_tokens == chat.usage.prompt_tokens, usage

    # Completions: logprobs with echo score the prompt (the first token unscored), as
    # evaluation harnesses ask; n = 3 seeded choices each differ and come back indexed.
    scored = client.completions.create(
        model=model, prompt="The capital of France is Paris", max_tokens=1, temperature=0,
        logprobs=1, echo=True,
    )
    lp = scored.choices[0].logprobs
    assert scored.choices[0].text.startswith("The capital of France is Paris"), scored
    assert lp.token_logprobs[0] is None and all(x <= 0 for x in lp.token_logprobs[1:]), lp
    assert len(lp.tokens) == scored.usage.prompt_tokens + scored.usage.completion_tokens
    assert "".join(lp.tokens) == scored.choices[0].text
    three = client.completions.create(
        model=model, prompt="Once upon a time", max_tokens=8, temperature=1.0, seed=3, n=3,
    )
    assert sorted(c.index for c in three.choices) == [0, 1, 2], three
    assert len({c.text for c in three.choices}) > 1, three

    # The tokenizer routes (not part of OpenAI's API: through the client's HTTP session).
    root = base_url.rsplit("/v1", 1)[0]
    http = client._client
    toks = http.post(f"{root}/tokenize", json={"prompt": "The capital of France is Paris"}).json()
    assert toks["count"] == scored.usage.prompt_tokens, toks
    text = http.post(f"{root}/detokenize", json={"tokens": toks["tokens"]}).json()
    assert text["content"] == "The capital of France is Paris", text

    # A bad request surfaces as the client's own error type with the server's message.
    try:
        client.completions.create(model=model, prompt="hi", temperature=-1)
    except openai.BadRequestError as e:
        assert "temperature" in str(e), e
    else:
        raise AssertionError("temperature -1 was accepted")

    print("openai client: ok", openai.__version__)


if __name__ == "__main__":
    main(sys.argv[1])
