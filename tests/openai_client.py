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
    assert client.models.retrieve(model).id == model
    try:
        client.models.retrieve("no-such-model")
        raise AssertionError("an unknown model id was retrieved")
    except openai.NotFoundError as e:
        assert "no-such-model" in str(e), e

    # A streaming chat completion with usage in the last chunk.
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Say hello in French."}],
        max_tokens=24,
        temperature=0,
        modalities=["text"],
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

    structured_outputs(client, model)
    tool_calls(client, model)
    responses(client, model)

    print("openai client: ok", openai.__version__)


def structured_outputs(client, model: str) -> None:
    """`parse()` with a Pydantic model (nested object, enum, list, integer), json_object."""
    import enum
    import json
    from typing import List

    from pydantic import BaseModel, Field

    class Kind(str, enum.Enum):
        cat = "cat"
        dog = "dog"

    class Owner(BaseModel):
        name: str = Field(max_length=16)
        age: int

    class Pet(BaseModel):
        name: str = Field(max_length=16)
        kind: Kind
        age: int
        toys: List[str] = Field(max_length=3)
        owner: Owner

    ask = [{"role": "user", "content": "Describe a pet dog named Rex, 3 years old, owned by Ann (31)."}]
    parsed = client.chat.completions.parse(
        model=model, messages=ask, response_format=Pet, max_tokens=200, temperature=0,
    )
    pet = parsed.choices[0].message.parsed
    assert parsed.choices[0].finish_reason == "stop", parsed
    assert isinstance(pet, Pet) and isinstance(pet.owner, Owner), parsed
    assert pet.kind in (Kind.cat, Kind.dog) and len(pet.toys) <= 3, pet
    # Forced tokens (keys, separators) were drafted and stood.
    spec = parsed.usage.model_extra["speculative"]
    assert 0 < spec["forced_accepted_tokens"] <= spec["forced_tokens"], spec

    # JSON as the model writes it (indented lines), or compact on request (vLLM's field).
    obj = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Describe a person (name and age) as JSON."}],
        response_format={"type": "json_object"},
        max_tokens=100,
        temperature=0,
    )
    assert obj.choices[0].finish_reason == "stop", obj
    assert isinstance(json.loads(obj.choices[0].message.content), dict), obj
    assert "\n  " in obj.choices[0].message.content, obj
    compact = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Give the capital of France as JSON."}],
        response_format={"type": "json_object"},
        extra_body={"guided_whitespace_pattern": ""},
        max_tokens=100,
        temperature=0,
    )
    text = compact.choices[0].message.content
    assert compact.choices[0].finish_reason == "stop" and "\n" not in text, compact
    assert isinstance(json.loads(text), dict), compact

    # Several sampled choices with logprobs: each its own grammar state, each valid JSON, each
    # token's entry from the masked distribution it was drawn from.
    two = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Give the capital of France as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "capital", "schema": {
            "type": "object", "properties": {"capital": {"type": "string", "maxLength": 20}},
            "required": ["capital"], "additionalProperties": False}}},
        max_tokens=100, temperature=0.7, seed=5, n=2, logprobs=True,
    )
    for c in two.choices:
        assert c.finish_reason == "stop", two
        assert isinstance(json.loads(c.message.content), dict), c
        text = b"".join(bytes(e.bytes) for e in c.logprobs.content).decode()
        assert text == c.message.content and all(e.logprob <= 0 for e in c.logprobs.content), c

    try:
        client.chat.completions.create(
            model=model, messages=ask, max_tokens=8,
            response_format={"type": "json_schema", "json_schema": {
                "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "strin"}}}}},
        )
    except openai.BadRequestError as e:
        assert e.body["param"] == "response_format", e.body
    else:
        raise AssertionError("a schema with an unknown type was accepted")


def tool_calls(client, model: str) -> None:
    """Tools with tool_choice required, named and auto; streamed calls; a tool-result turn."""
    import json

    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 20},
                               "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    }
    clock = {"type": "function", "function": {"name": "get_time", "description": "The time now"}}
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]

    def check(call):
        assert call.type == "function" and call.id, call
        args = json.loads(call.function.arguments)
        if call.function.name == "get_weather":
            assert set(args) == {"city", "unit"}, args
            assert args["unit"] in ("celsius", "fahrenheit"), args
        else:
            assert call.function.name == "get_time" and args == {}, call

    required = client.chat.completions.create(
        model=model, messages=ask, tools=[weather, clock], tool_choice="required",
        parallel_tool_calls=False, max_tokens=120, temperature=0,
    )
    choice = required.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, required
    for call in choice.message.tool_calls:
        check(call)

    named = client.chat.completions.create(
        model=model, messages=ask, tools=[weather, clock],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=False, max_tokens=60, temperature=0,
    )
    calls = named.choices[0].message.tool_calls
    assert named.choices[0].finish_reason == "tool_calls" and len(calls) == 1, named
    assert calls[0].function.name == "get_time", calls
    check(calls[0])

    # Streamed: the client assembles the calls from their deltas, by index.
    stream = client.chat.completions.create(
        model=model, messages=ask, tools=[weather, clock], tool_choice="required",
        parallel_tool_calls=False, max_tokens=120, temperature=0, stream=True,
    )
    assembled, finish = {}, None
    for chunk in stream:
        for c in chunk.choices:
            finish = c.finish_reason or finish
            for d in c.delta.tool_calls or []:
                entry = assembled.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                entry["id"] += d.id or ""
                entry["name"] += d.function.name or ""
                entry["arguments"] += d.function.arguments or ""
    assert finish == "tool_calls", finish
    whole = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
    streamed = [(e["name"], json.loads(e["arguments"])) for _, e in sorted(assembled.items())]
    assert streamed == whole, (streamed, whole)

    # The tool's result goes back, and the model answers (auto: text or another call).
    first = choice.message.tool_calls[0]
    turn = ask + [
        {"role": "assistant", "content": None, "tool_calls": [first.model_dump()]},
        {"role": "tool", "tool_call_id": first.id, "content": "18 degrees, sunny"},
    ]
    answer = client.chat.completions.create(
        model=model, messages=turn, tools=[weather, clock], max_tokens=60, temperature=0,
    )
    a = answer.choices[0]
    assert a.finish_reason in ("stop", "length", "tool_calls"), answer
    if a.finish_reason == "tool_calls":
        for call in a.message.tool_calls:
            check(call)
    else:
        assert a.message.content and not a.message.content.startswith("<tool_call>"), answer

    # A tool from a Pydantic model with a nested model and an Enum, as the client's own helper
    # writes it ($defs and $ref): named, it is one call whose arguments the model parses back.
    import enum

    from pydantic import BaseModel

    class Unit(str, enum.Enum):
        celsius = "celsius"
        fahrenheit = "fahrenheit"

    class Place(BaseModel):
        city: str
        country: str

    class Forecast(BaseModel):
        place: Place
        unit: Unit
        days: int

    tool = openai.pydantic_function_tool(Forecast, name="forecast")
    assert "$defs" in json.dumps(tool["function"]["parameters"]), tool
    parsed = client.chat.completions.parse(
        model=model, messages=ask, tools=[tool],
        tool_choice={"type": "function", "function": {"name": "forecast"}},
        max_tokens=120, temperature=0,
    )
    calls = parsed.choices[0].message.tool_calls
    assert len(calls) == 1 and calls[0].function.name == "forecast", parsed
    args = calls[0].function.parsed_arguments
    assert isinstance(args, Forecast) and isinstance(args.place, Place), args

    try:
        client.chat.completions.create(
            model=model, messages=ask, tools=[weather],
            tool_choice={"type": "function", "function": {"name": "missing"}},
        )
    except openai.BadRequestError as e:
        assert e.body["param"] == "tool_choice", e.body
    else:
        raise AssertionError("tool_choice naming a missing function was accepted")


def responses(client, model: str) -> None:
    """The Responses API as the client uses it: plain, streamed, continued, retrieved and
    deleted, with a function tool, and parsed into a Pydantic model through `text.format`."""
    import json
    first = client.responses.create(
        model=model, input="Name a colour of the rainbow.", instructions="Answer in one line.",
        max_output_tokens=24, temperature=0,
    )
    assert first.output_text.strip(), first
    assert first.usage.output_tokens > 0 and first.usage.input_tokens > 0, first.usage

    text, kinds, final = "", [], None
    with client.responses.stream(
        model=model, input="Name a colour of the rainbow.", instructions="Answer in one line.",
        max_output_tokens=24, temperature=0,
    ) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                text += event.delta
            if event.type in ("response.completed", "response.incomplete"):
                final = event.response
    assert kinds[0] == "response.created" and kinds[-1] in (
        "response.completed", "response.incomplete"), kinds
    assert final.status == first.status, (final.status, first.status)
    assert text == first.output_text == final.output_text, (text, first.output_text)

    later = client.responses.create(
        model=model, input="And another one?", previous_response_id=first.id,
        max_output_tokens=24, temperature=0,
    )
    assert later.output_text.strip() and later.previous_response_id == first.id, later
    assert client.responses.retrieve(first.id).output_text == first.output_text
    client.responses.delete(first.id)
    try:
        client.responses.retrieve(first.id)
        raise AssertionError("a deleted response was retrieved")
    except openai.NotFoundError:
        pass

    weather = {"type": "function", "name": "get_weather", "description": "The weather in a city",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                              "required": ["city"], "additionalProperties": False},
               "strict": True}
    called = client.responses.create(
        model=model, input="What is the weather in Paris?", tools=[weather],
        tool_choice="required", max_output_tokens=60, temperature=0,
    )
    calls = [o for o in called.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather", called.output
    assert isinstance(json.loads(calls[0].arguments)["city"], str), calls[0]
    answered = client.responses.create(
        model=model, previous_response_id=called.id, tools=[weather], tool_choice="none",
        input=[{"type": "function_call_output", "call_id": c.call_id, "output": "18C, sunny"}
               for c in calls],
        max_output_tokens=24, temperature=0,
    )
    assert answered.output_text.strip(), answered

    from pydantic import BaseModel, Field

    class Colour(BaseModel):
        name: str = Field(max_length=16)
        warm: bool

    parsed = client.responses.parse(
        model=model, input="Describe the colour red as JSON.", text_format=Colour,
        max_output_tokens=60, temperature=0,
    )
    assert isinstance(parsed.output_parsed, Colour), parsed.output_text

    try:
        client.responses.create(model=model, input="hi", reasoning={"effort": "low"})
    except openai.BadRequestError as e:
        assert e.body["param"] == "reasoning.effort", e.body
    else:
        raise AssertionError("reasoning settings were accepted")


if __name__ == "__main__":
    main(sys.argv[1])
