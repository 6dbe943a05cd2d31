"""The server with a draft bundle (`serve.py --draft BUNDLE`, issue 41): requests with `num_draft_tokens` (or every
request that can draft, with `--num-draft-tokens`) decode speculatively with it, and their usage reports the drafts
kept and rejected, as the `Generator` counts them; greedy answers are plain greedy's, seeded ones the
`Generator`'s own draws. `llama_stdlib` served with `llama_stdlib_draft` (conftest's `stdlib_draft_bundles`).
"""

import pytest

from tests.export.helpers import bundle_generator
from tests.export.test_serve import Server, _runtime

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow
NEW = 16
CODE = ["import os\nimport sys\n\n\ndef main(", "class Stack:\n    def __init__(self"]


def _details(usage):
    details = usage.completion_tokens_details
    return None if details is None else (details.accepted_prediction_tokens, details.rejected_prediction_tokens)


def test_the_server_drafts_with_its_draft_bundle(stdlib_draft_bundles):
    """Through the openai client: a greedy request with num_draft_tokens=3, one streamed with the server's default
    K=2, a seeded one (temperature 0.8) and a beam search (no drafts, no counts); bad values get a 400 naming the
    field, and the server keeps serving."""
    bundle, draft_bundle = stdlib_draft_bundles["target"][1], stdlib_draft_bundles["draft"][1]
    target, draft = bundle_generator(bundle), bundle_generator(draft_bundle)
    prompts = [target.encode(text) for text in CODE]
    server = Server(bundle, "--draft", str(draft_bundle), "--num-draft-tokens", "2")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        options = dict(model="llama_stdlib", max_tokens=NEW)
        answer = client.completions.create(
            prompt=prompts[0], temperature=0, extra_body={"num_draft_tokens": 3}, **options
        )
        stream = client.completions.create(
            prompt=prompts[1], temperature=0, stream=True, stream_options={"include_usage": True}, **options
        )
        chunks = list(stream)
        seeded = client.completions.create(prompt=prompts[0], temperature=0.8, seed=5, **options)
        beams = client.completions.create(prompt=prompts[0], temperature=0, extra_body={"num_beams": 2}, **options)
        bad = [
            server.post("/v1/completions", {"model": "llama_stdlib", "prompt": "def", **fields})
            for fields in ({"num_draft_tokens": 0}, {"num_draft_tokens": 3, "num_beams": 2})
        ]
        after = server.post("/v1/completions", {"model": "llama_stdlib", "prompt": "def", "max_tokens": 2})
    finally:
        server.stop()
    greedy = target.generate_ids(prompts, NEW)
    texts = [target.tokenizer.decode(row, skip_special_tokens=True) for row in greedy]
    assert [answer.choices[0].text, "".join(c.choices[0].text for c in chunks if c.choices)] == texts
    counts = []
    for row, num_tokens in ((0, 3), (1, 2)):
        target.generate_ids([prompts[row]], NEW, draft=draft, num_draft_tokens=num_tokens)
        drafted, accepted = target.draft_counts[0]
        counts.append((accepted, drafted - accepted))
    assert [_details(answer.usage), _details(chunks[-1].usage)] == counts
    assert counts[0][0] > 0 and counts[0][1] > 0
    drawn = target.generate_ids(
        prompts[:1], NEW, sampler="random", temperature=0.8, seed=5, draft=draft, num_draft_tokens=2
    )
    assert seeded.choices[0].text == target.tokenizer.decode(drawn[0], skip_special_tokens=True)
    assert _details(seeded.usage) == (target.draft_counts[0][1], target.draft_counts[0][0] - target.draft_counts[0][1])
    assert _details(beams.usage) is None
    assert [(status, body["error"]["param"]) for status, body, _ in bad] == [(400, "num_draft_tokens")] * 2
    assert after[0] == 200


def test_num_draft_tokens_needs_a_draft(stdlib_draft_bundles):
    """A server started without --draft answers num_draft_tokens with a 400 naming it; --num-draft-tokens without
    --draft, or a draft of another vocabulary, stops the server before it serves."""
    bundle = stdlib_draft_bundles["target"][1]
    serve = _runtime(bundle, "serve")
    service = serve.Service(bundle)
    with pytest.raises(serve.ApiError, match="--draft BUNDLE") as error:
        service.check_draft({"num_draft_tokens": 3, "num_beams": 1, "max_tokens": 4}, None, [[1, 2]])
    assert error.value.param == "num_draft_tokens"
    with pytest.raises(ValueError, match="--num-draft-tokens needs --draft"):
        serve.Service(bundle, num_draft_tokens=3)
