"""Drive `bmoe serve` with the official OpenAI Python client (run by the
integration test `serve::the_openai_python_client_works`): chat and text
completions, streamed and whole, usage counts, stop strings, seeded sampling,
tools (whole and streamed, with tool_choice and a conversation holding a call
and its result) and a 400 raised as the client's own error type. Exits
non-zero on failure."""

import sys

import openai

base_url, prompt = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
model = client.models.list().data[0].id

chat = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=12
)
text = chat.choices[0].message.content
assert text, chat
assert chat.usage.completion_tokens == 12 and chat.usage.total_tokens > 12, chat.usage
assert chat.choices[0].finish_reason == "length", chat

pieces, usage = [], None
for chunk in client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Tell me a story."}],
    max_tokens=12,
    stream=True,
    stream_options={"include_usage": True},
):
    if chunk.choices and chunk.choices[0].delta.content:
        pieces.append(chunk.choices[0].delta.content)
    if chunk.usage:
        usage = chunk.usage
assert "".join(pieces) == text, ("".join(pieces), text)
assert usage is not None and usage.completion_tokens == 12, usage

done = client.completions.create(model=model, prompt=prompt, max_tokens=8)
assert done.usage.completion_tokens == 8 and done.choices[0].text, done
word = done.choices[0].text.split()[1]
cut = client.completions.create(model=model, prompt=prompt, max_tokens=8, stop=[word])
assert cut.choices[0].finish_reason == "stop", cut
assert cut.choices[0].text == done.choices[0].text[: done.choices[0].text.find(word)], cut

seeded = [
    client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=1.0, seed=3)
    .choices[0]
    .text
    for _ in range(2)
]
assert seeded[0] == seeded[1], seeded

# Tools: the fixture's template takes none, so the server describes them in
# the system message; the prompt grows by the schema. The tiny model writes
# no real calls: parsing calls is covered by chat::tool_calls's unit tests.
tools = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
asked = [{"role": "user", "content": "What is the weather in Paris?"}]
plain = client.chat.completions.create(model=model, messages=asked, max_tokens=12)
with_tools = client.chat.completions.create(
    model=model, messages=asked, tools=tools, tool_choice="auto", max_tokens=12
)
assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 20, (plain.usage, with_tools.usage)
reply = with_tools.choices[0]
assert reply.finish_reason in ("length", "stop", "tool_calls"), reply
assert reply.message.tool_calls is None or reply.message.tool_calls[0].function.name, reply
no_tools = client.chat.completions.create(
    model=model, messages=asked, tools=tools, tool_choice="none", max_tokens=2
)
assert no_tools.usage.prompt_tokens == plain.usage.prompt_tokens, no_tools.usage

called = asked + [
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18C and sunny"},
]
after = client.chat.completions.create(
    model=model,
    messages=called,
    tools=tools,
    tool_choice={"type": "function", "function": {"name": "get_weather"}},
    max_tokens=2,
)
assert after.usage.prompt_tokens > with_tools.usage.prompt_tokens + 10, after.usage

pieces, calls, finish, usage = [], [], None, None
for chunk in client.chat.completions.create(
    model=model,
    messages=asked,
    tools=tools,
    max_tokens=12,
    stream=True,
    stream_options={"include_usage": True},
):
    if chunk.choices:
        delta = chunk.choices[0].delta
        pieces.append(delta.content or "")
        calls.extend(delta.tool_calls or [])
        finish = chunk.choices[0].finish_reason or finish
    if chunk.usage:
        usage = chunk.usage
assert "".join(pieces) == (reply.message.content or ""), ("".join(pieces), reply)
assert len(calls) == len(reply.message.tool_calls or []), calls
assert finish == reply.finish_reason, finish
assert usage is not None and usage.prompt_tokens == with_tools.usage.prompt_tokens, usage

# A forced call streams as it is written (a grammar holds it to the format):
# its name first, then its arguments in pieces, which the client's own
# stream helper puts together into the whole reply's call.
short = [dict(tools[0], function=dict(tools[0]["function"], parameters={
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
    "required": ["city"]}))]
forced = dict(model=model, messages=asked, tools=short, tool_choice="required",
              max_tokens=64, temperature=0)
whole = client.chat.completions.create(**forced).choices[0]
assert whole.finish_reason == "tool_calls", whole
argument_pieces = 0
with client.chat.completions.stream(**forced) as s:
    for event in s:
        argument_pieces += event.type == "tool_calls.function.arguments.delta"
    final = s.get_final_completion().choices[0]
assert argument_pieces >= 2, argument_pieces
got, want = final.message.tool_calls[0].function, whole.message.tool_calls[0].function
assert (got.name, got.arguments) == (want.name, want.arguments), (got, want)
assert final.finish_reason == "tool_calls", final

try:
    client.chat.completions.create(
        model=model, messages=asked, tools=[{"type": "function"}], max_tokens=2
    )
    raise AssertionError("a tool without a function was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400 and "tools" in str(e), e

try:
    client.chat.completions.create(model=model, messages=[], max_tokens=2)
    raise AssertionError("an empty conversation was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400 and "messages" in str(e), e

# A conversation past the server's -c 512: the code clients compact on.
try:
    client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "word " * 700}], max_tokens=2
    )
    raise AssertionError("a prompt past the context was answered")
except openai.BadRequestError as e:
    assert e.code == "context_length_exceeded" and e.param == "messages", (e, e.code)
    assert "prompt is too long" in str(e), e

print("openai client: ok")
