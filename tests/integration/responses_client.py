"""Drive `bmoe serve --served-name local-model` with the official OpenAI
Python client's Responses API (run by the integration test
`serve_dialects::the_openai_clients_responses_api_works`): responses.create
and responses.stream (text, a function tool, a function_call_output round
trip), usage with cached input tokens, and 400s raised as the client's own
error type naming the field. Exits non-zero on failure."""

import sys

import openai

base_url = sys.argv[1]
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
ids = [m.id for m in client.models.list().data]
assert ids == ["local-model", "other-name"], ids
model = ids[0]

story = "Tell me a story."
first = client.responses.create(model=model, input=story, max_output_tokens=12, store=False)
assert first.status == "incomplete", first
assert first.incomplete_details.reason == "max_output_tokens", first
assert first.output_text, first
assert first.usage.output_tokens == 12, first.usage
assert first.usage.total_tokens == first.usage.input_tokens + 12, first.usage
again = client.responses.create(model=model, input=story, max_output_tokens=12)
assert again.output_text == first.output_text, (again.output_text, first.output_text)
assert again.usage.input_tokens_details.cached_tokens > 0, again.usage

told = client.responses.create(
    model=model, instructions="Answer in French.", input=story, max_output_tokens=2
)
as_message = client.responses.create(
    model=model,
    input=[
        {"role": "developer", "content": "Answer in French."},
        {"role": "user", "content": [{"type": "input_text", "text": story}]},
    ],
    max_output_tokens=2,
)
assert told.usage.input_tokens == as_message.usage.input_tokens, (told.usage, as_message.usage)
assert told.usage.input_tokens != first.usage.input_tokens, (told.usage, first.usage)

# Streamed: the same text as the whole reply, the events numbered in order,
# the last one response.incomplete (cut at max_output_tokens).
types, numbers, deltas, last = [], [], [], None
with client.responses.stream(model=model, input=story, max_output_tokens=12) as stream:
    for event in stream:
        types.append(event.type)
        numbers.append(event.sequence_number)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        last = event
assert numbers == list(range(len(numbers))), numbers
assert types[:4] == [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
], types
assert "response.output_text.done" in types and "response.output_item.done" in types, types
assert types[-1] == "response.incomplete", types
assert "".join(deltas) == first.output_text, ("".join(deltas), first.output_text)
assert last.response.usage.output_tokens == 12, last.response.usage

# A function tool: its schema goes into the prompt; tool_choice none leaves it out.
tools = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
        "strict": True,
    },
    {"type": "web_search"},
]
asked = "What is the weather in Paris?"
plain = client.responses.create(model=model, input=asked, max_output_tokens=2)
with_tools = client.responses.create(
    model=model, input=asked, tools=tools, tool_choice="auto", max_output_tokens=8
)
assert with_tools.usage.input_tokens > plain.usage.input_tokens + 20, (plain.usage, with_tools.usage)
for item in with_tools.output:
    assert item.type in ("message", "function_call"), item
no_tools = client.responses.create(
    model=model, input=asked, tools=tools, tool_choice="none", max_output_tokens=2
)
assert no_tools.usage.input_tokens == plain.usage.input_tokens, no_tools.usage

with client.responses.stream(
    model=model, input=asked, tools=tools, max_output_tokens=8
) as stream:
    for event in stream:
        last = event
assert last.type in ("response.completed", "response.incomplete"), last
assert last.response.usage.input_tokens == with_tools.usage.input_tokens, last.response.usage

# The round trip: the model's call and its output go back as items.
called = [
    {"role": "user", "content": [{"type": "input_text", "text": asked}]},
    {
        "type": "function_call",
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
    },
    {"type": "function_call_output", "call_id": "call_1", "output": "18C and sunny"},
]
after = client.responses.create(
    model=model,
    input=called,
    tools=tools,
    tool_choice={"type": "function", "name": "get_weather"},
    max_output_tokens=2,
)
assert after.usage.input_tokens > with_tools.usage.input_tokens + 10, after.usage
with client.responses.stream(model=model, input=called, tools=tools, max_output_tokens=2) as stream:
    for event in stream:
        last = event
assert last.response.usage.input_tokens == after.usage.input_tokens, last.response.usage

for bad, param in [
    (dict(input=asked, previous_response_id=first.id), "previous_response_id"),
    (dict(input=asked, tools=[{"type": "function"}]), "tools"),
    (dict(input=[{"type": "function_call_output", "output": "x"}]), "input"),
    (dict(input=asked, max_output_tokens=0), "max_output_tokens"),
]:
    try:
        client.responses.create(model=model, **bad)
        raise AssertionError(f"{bad} was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.param == param, (e, e.param)

# Input past the server's -c 512: the code clients compact on, naming `input`.
try:
    client.responses.create(model=model, input="word " * 700, max_output_tokens=16)
    raise AssertionError("input past the context was answered")
except openai.BadRequestError as e:
    assert e.code == "context_length_exceeded" and e.param == "input", (e, e.code, e.param)

print("responses client: ok")
