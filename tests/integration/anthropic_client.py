"""Drive `bmoe serve --api-key KEY` with the official Anthropic Python client
(run by the integration test `serve::the_anthropic_python_client_works`):
/v1/messages whole and streamed, usage counts, stop reasons, a system prompt,
a tool conversation, and errors raised as the client's own types (a wrong
key, bad requests). Exits non-zero on failure."""

import json
import re
import sys
import urllib.request

import anthropic

base_url, key = sys.argv[1], sys.argv[2]
client = anthropic.Anthropic(base_url=base_url, api_key=key, max_retries=0, timeout=120)
model = "bmoe"
story = [{"role": "user", "content": "Tell me a story."}]


def openai_chat(messages, max_tokens):
    """The same server's /v1/chat/completions reply, parsed."""
    body = json.dumps({"messages": messages, "max_tokens": max_tokens}).encode()
    req = urllib.request.Request(
        base_url + "/v1/chat/completions",
        data=body,
        headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


# The server's default sampling is greedy; newer clients take sampling
# settings only as extra body fields.
msg = client.messages.create(
    model=model, max_tokens=12, messages=story, extra_body={"temperature": 0, "top_k": 1}
)


def prompt_tokens(usage):
    """The whole prompt: input_tokens is only the part not read from a cache."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0)


assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_"), msg
text = msg.content[0].text
assert msg.content[0].type == "text" and text, msg
assert msg.usage.output_tokens == 12 and msg.usage.input_tokens > 0, msg.usage
assert msg.stop_reason == "max_tokens" and msg.stop_sequence is None, msg

with client.messages.stream(model=model, max_tokens=12, messages=story) as stream:
    pieces = list(stream.text_stream)
    final = stream.get_final_message()
assert "".join(pieces) == text, ("".join(pieces), text)
assert final.content[0].text == text, final
assert final.usage.output_tokens == 12, final.usage
assert prompt_tokens(final.usage) == prompt_tokens(msg.usage), final.usage
assert final.stop_reason == "max_tokens", final

word = text.split()[1]
cut = client.messages.create(
    model=model, max_tokens=12, messages=story, stop_sequences=["\u2603", word]
)
assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == word, cut
assert cut.content[0].text == text[: text.find(word)], (cut, text)

pirate = "You are a pirate. Answer in one sentence."
told = client.messages.create(
    model=model, max_tokens=8, system=pirate, messages=story
)
# The same conversation through the OpenAI route, the system prompt as a
# system message, renders the same prompt and so gives the same reply.
same = openai_chat([{"role": "system", "content": pirate}] + story, 8)
assert prompt_tokens(told.usage) == same["usage"]["prompt_tokens"], (told.usage, same)
assert told.content[0].text == same["choices"][0]["message"]["content"], (told, same)
assert prompt_tokens(told.usage) != prompt_tokens(msg.usage), (told.usage, msg.usage)
blocks = client.messages.create(
    model=model,
    max_tokens=8,
        system=[{"type": "text", "text": pirate}],
    messages=story,
)
assert blocks.content[0].text == told.content[0].text, (blocks, told)
assert prompt_tokens(blocks.usage) == prompt_tokens(told.usage), (blocks.usage, told.usage)

weather = {
    "name": "weather",
    "description": "The weather in a city now.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
tool_turns = [
    {"role": "user", "content": "What is the weather in Oslo?"},
    {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}}
        ],
    },
    {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Rain, 8 C."}],
    },
]
answered = client.messages.create(
    model=model, max_tokens=6, tools=[weather], messages=tool_turns
)
assert prompt_tokens(answered.usage) > prompt_tokens(msg.usage) and answered.content, answered

# A forced call (tool_choice any) streams as it is written: the tool_use
# block opens with its name, its input comes as input_json_delta pieces that
# the client's own stream puts together into the whole reply's input.
short = dict(weather, input_schema={
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
    "required": ["city"]})
forced = dict(model=model, max_tokens=64, tools=[short],
              tool_choice={"type": "any"}, messages=tool_turns[:1])
whole = client.messages.create(**forced)
assert whole.stop_reason == "tool_use", whole
input_pieces = 0
with client.messages.stream(**forced) as s:
    for event in s:
        input_pieces += event.type == "input_json"
    final = s.get_final_message()
assert input_pieces >= 2, input_pieces
used = [b for b in final.content if b.type == "tool_use"]
want = [b for b in whole.content if b.type == "tool_use"]
assert [(b.name, b.input) for b in used] == [(b.name, b.input) for b in want], (used, want)
assert final.stop_reason == "tool_use", final

try:
    anthropic.Anthropic(base_url=base_url, api_key="wrong", max_retries=0).messages.create(
        model=model, max_tokens=2, messages=story
    )
    raise AssertionError("a wrong key was accepted")
except anthropic.AuthenticationError as e:
    assert e.status_code == 401 and e.body["error"]["type"] == "authentication_error", e.body

for bad, field in [
    ({"max_tokens": 0, "messages": story}, "max_tokens"),
    ({"max_tokens": 4, "messages": []}, "messages"),
    (
        {
            "max_tokens": 4,
            "messages": [
                {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}
            ],
        },
        "image",
    ),
]:
    try:
        client.messages.create(model=model, **bad)
        raise AssertionError(f"{bad} was accepted")
    except anthropic.BadRequestError as e:
        assert e.status_code == 400 and field in str(e), e
        assert e.body == {"type": "error", "error": e.body["error"]}, e.body
        assert e.body["error"]["type"] == "invalid_request_error", e.body

counted = client.messages.count_tokens(model=model, messages=story)
assert counted.input_tokens > 3, counted

try:
    client.messages.batches.list()
    raise AssertionError("the batches API answered")
except anthropic.NotFoundError as e:
    assert e.body["type"] == "error" and e.body["error"]["type"] == "not_found_error", e.body

# A conversation past the server's -c 512: Anthropic's own words for it.
try:
    client.messages.create(
        model=model, max_tokens=2, messages=[{"role": "user", "content": "word " * 700}]
    )
    raise AssertionError("a prompt past the context was answered")
except anthropic.BadRequestError as e:
    assert e.body["error"]["type"] == "invalid_request_error", e.body
    assert re.match(r"prompt is too long: \d+ tokens > \d+ maximum", e.body["error"]["message"]), e.body

print("anthropic client: ok")
