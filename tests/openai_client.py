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
