"""lm-evaluation-harness, unchanged, against edgeserve: the real `lm_eval` command runs a small
multiple-choice task (written here, no hub access) both ways it talks to a llama.cpp-style
server, and every per-choice log-likelihood it logs must equal the continuation's summed
token log-probabilities from /v1/score/evaluation on the same server.

- `local-completions` with `tokenizer_backend=remote`: tokenizes through /tokenizer_info and
  /tokenize, sends token-id prompts to /v1/completions and sums `token_logprobs[ctxlen:-1]`.
  Its remote tokenizer never adds BOS, so this task's prompts start with the text "<bos>",
  which /tokenize reads as Gemma's BOS: the model sees the same tokens as the score endpoint's
  texts, which get the model's BOS.
- `gguf`: sends text prompts with no `model` field and finds the continuation by
  `text_offset`.

lm_eval runs in a subprocess (its own warnings and logging stay out of this process) while
the test's event loop serves it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from tests.integration.test_edge_http import sample, scrape

ITEMS = [
    {"question": "What is the capital of France?", "choices": ["Paris", "London", "Rome"]},
    {"question": "How many legs does a spider have?", "choices": ["six", "eight", "ten"]},
    {"question": "What colour is the sky on a clear day?", "choices": ["green", "blue", "red"]},
]
TASK = """\
task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{prefix}Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: 0
metric_list:
  - metric: acc
"""
RUNS = {
    "local-completions": ("<bos>", "base_url={root}/v1/completions,tokenizer_backend=remote"),
    "gguf": ("", "base_url={root}"),
}
TIMEOUT_S = 240


def write_task(folder: Path, name: str, prefix: str) -> None:
    data = folder / "items.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in ITEMS))
    (folder / f"{name}.yaml").write_text(TASK.format(name=name, data=data, prefix=prefix))


async def run_lm_eval(folder: Path, model: str, model_args: str, task: str) -> str:
    """Run the lm_eval command; its combined output (it must succeed)."""
    env = {
        **os.environ,
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(folder / "hf"),
        "HF_DATASETS_CACHE": str(folder / "hf" / "datasets"),
    }
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "lm_eval", "--model", model, "--model_args", model_args),
        *("--tasks", task, "--include_path", str(folder), "--log_samples"),
        *("--output_path", str(folder / "out")),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    text = output.decode(errors="replace")
    assert process.returncode == 0, text[-3000:]
    return text


def logged_loglikelihoods(folder: Path, task: str) -> list[tuple[str, str, float]]:
    """(context, continuation, log-likelihood) of every choice lm_eval logged."""
    [samples] = (folder / "out").glob(f"*/samples_{task}_*.jsonl")
    out = []
    for line in samples.read_text().splitlines():
        record = json.loads(line)
        for index, [[loglikelihood, _greedy]] in enumerate(record["resps"]):
            args = record["arguments"][f"gen_args_{index}"]
            out.append((args["arg_0"], args["arg_1"], float(loglikelihood)))
    return out


async def expected_loglikelihoods(client: TestClient, pairs: list[tuple[str, str]]) -> list[float]:
    """The continuations' summed token log-probabilities from /v1/score/evaluation (each text
    scored whole; the continuation is its last tokens, counted with /tokenize)."""
    texts = [context + continuation for context, continuation in pairs]
    resp = await client.post(
        "/v1/score/evaluation",
        json={"model": "m", "messages": texts, "return_token_logprobs": True},
    )
    assert resp.status == 200, await resp.text()
    per_token = (await resp.json())["token_logprobs"]
    sums = []
    for (context, _), text, values in zip(pairs, texts, per_token, strict=True):
        context_ids, ids = [await tokenize(client, t) for t in (context, text)]
        assert ids[: len(context_ids)] == context_ids, "the continuation starts a token"
        sums.append(sum(values[len(context_ids) - len(ids) :]))
    return sums


async def tokenize(client: TestClient, text: str) -> list[int]:
    resp = await client.post("/tokenize", json={"prompt": text, "add_special_tokens": False})
    return (await resp.json())["tokens"]


@pytest.mark.parametrize("model", sorted(RUNS))
async def test_lm_eval_log_likelihoods_match_the_score_endpoint(
    model: str, server: TestServer, aiohttp_client, tmp_path: Path
) -> None:
    root = str(server.make_url("")).rstrip("/")
    prefix, model_args = RUNS[model]
    task = "edgeserve_mc_" + model.replace("-", "_")
    write_task(tmp_path, task, prefix)
    await run_lm_eval(tmp_path, model, model_args.format(root=root), task)
    logged = logged_loglikelihoods(tmp_path, task)
    assert len(logged) == sum(len(item["choices"]) for item in ITEMS)
    pairs = [(context.removeprefix(prefix), continuation) for context, continuation, _ in logged]
    client = await aiohttp_client(server)
    found = await scrape(client)
    counts = {
        route: sample(found, "edgeserve_requests_total", route=route, status="200")
        for route in ("/v1/completions", "/tokenize", "/tokenizer_info")
    }
    assert counts["/v1/completions"] == len(logged)
    if model == "local-completions":  # it tokenized through the server
        assert counts["/tokenizer_info"] and counts["/tokenize"]
    else:
        assert counts["/tokenize"] is None and counts["/tokenizer_info"] is None
    expected = await expected_loglikelihoods(client, pairs)
    got = [loglikelihood for *_, loglikelihood in logged]
    assert got == pytest.approx(expected, abs=1e-4)
