"""The client libraries people build on, unchanged, against a running `tandem serve`: LangChain
(`with_structured_output` in its three methods, `bind_tools`, the Responses API), LiteLLM
(completion, streaming, responses) and instructor (TOOLS, JSON_SCHEMA and JSON modes).

Run by tests/client_libraries.rs with the server's base URL (http://HOST:PORT/v1), with the
pinned versions scripts/test installs under target/client-libraries on PYTHONPATH. Exits
non-zero with a message on any failure.
"""

import os
import sys

# LiteLLM would fetch its model price list from the internet at import.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

try:
    import instructor
    from instructor.core import InstructorRetryException
    import litellm
    import openai
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field
except ImportError as e:
    sys.exit(f"a client library is missing ({e}): scripts/test installs them under "
             "target/client-libraries")


class Colour(BaseModel):
    """A colour and whether it is warm."""

    name: str = Field(max_length=16, description="the colour's name")
    warm: bool


def get_weather(city: str) -> str:
    """The weather in a city."""
    return "sunny"


ASK_JSON = "Describe the colour red as JSON with the keys name and warm."


def langchain(base_url: str, model: str) -> None:
    chat = ChatOpenAI(base_url=base_url, api_key="unused", model=model, temperature=0,
                      max_tokens=48, max_retries=0)
    assert chat.invoke("Say hello.").content.strip()
    for method in ("json_schema", "function_calling"):
        out = chat.with_structured_output(Colour, method=method).invoke(ASK_JSON)
        assert isinstance(out, Colour), (method, out)
    # json_mode asks for any JSON object: the server holds the answer to one; whether it has
    # the model's fields is the model's doing.
    out = chat.with_structured_output(Colour, method="json_mode", include_raw=True).invoke(
        ASK_JSON)
    if not isinstance(out["parsed"], Colour):
        import json

        assert isinstance(json.loads(out["raw"].content), dict), out
    called = chat.bind_tools([get_weather], tool_choice="any").invoke(
        "What is the weather in Paris?")
    assert called.tool_calls and called.tool_calls[0]["name"] == "get_weather", called
    assert isinstance(called.tool_calls[0]["args"]["city"], str), called.tool_calls
    responses = ChatOpenAI(base_url=base_url, api_key="unused", model=model, temperature=0,
                           max_tokens=48, max_retries=0, use_responses_api=True)
    assert responses.invoke("Say hello.").text.strip()
    out = responses.with_structured_output(Colour, method="json_schema").invoke(ASK_JSON)
    assert isinstance(out, Colour), out


def lite_llm(base_url: str, model: str) -> None:
    common = {"model": f"openai/{model}", "api_base": base_url, "api_key": "unused"}
    r = litellm.completion(messages=[{"role": "user", "content": "Say hello."}],
                           max_tokens=24, temperature=0, **common)
    text = r.choices[0].message.content
    assert text.strip(), r
    streamed = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in litellm.completion(
            messages=[{"role": "user", "content": "Say hello."}], max_tokens=24,
            temperature=0, stream=True, **common))
    assert streamed == text, (streamed, text)
    r = litellm.responses(input="Say hello.", max_output_tokens=24, temperature=0, **common)
    said = "".join(c.text for o in r.output if o.type == "message" for c in o.content)
    assert said.strip(), r


def instructor_modes(base_url: str, model: str) -> None:
    def ask(mode):
        client = instructor.from_openai(
            openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0), mode=mode)
        return client.chat.completions.create(
            model=model, response_model=Colour, max_retries=0, max_tokens=200, temperature=0,
            messages=[{"role": "user", "content": ASK_JSON}])

    for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA):
        out = ask(mode)
        assert isinstance(out, Colour), (mode, out)
    # JSON mode asks for any JSON object (`response_format: json_object`) and puts the schema
    # in the prompt: the server holds the answer to a JSON object; whether it is an instance
    # of the schema is the model's doing (the 135M default model writes the schema back).
    try:
        assert isinstance(ask(instructor.Mode.JSON), Colour)
    except InstructorRetryException as e:
        import json

        answer = e.last_completion.choices[0].message.content
        assert isinstance(json.loads(answer), dict), answer


def main(base_url: str) -> None:
    model = openai.OpenAI(base_url=base_url, api_key="unused").models.list().data[0].id
    langchain(base_url, model)
    lite_llm(base_url, model)
    instructor_modes(base_url, model)
    print("client libraries: ok")


if __name__ == "__main__":
    main(sys.argv[1])
