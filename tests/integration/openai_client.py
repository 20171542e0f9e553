"""Drive `bmoe serve` with the official OpenAI Python client (run by the
integration test `serve::the_openai_python_client_works`): chat and text
completions, streamed and whole, usage counts, stop strings, seeded sampling
and a 400 raised as the client's own error type. Exits non-zero on failure."""

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

try:
    client.chat.completions.create(model=model, messages=[], max_tokens=2)
    raise AssertionError("an empty conversation was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400 and "messages" in str(e), e

print("openai client: ok")
