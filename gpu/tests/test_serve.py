"""kiln_gpu.serve over HTTP on the tiny Qwen3 checkpoint (docs/serve.md)."""

import json
import threading
import urllib.error
import urllib.request

import pytest
import torch

from kiln_gpu.serve import Engine, serve
from kiln_gpu.tiny import build


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    eng = Engine(str(tiny_checkpoint), served_name="tiny", seed=0)
    httpd = serve(eng, "127.0.0.1", 0)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", eng
    httpd.shutdown()


def call(base, path, body=None, method=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method or ("POST" if body is not None else "GET"),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            raw = r.read()
            return r.status, (json.loads(raw) if raw else None), dict(r.headers)
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, (json.loads(raw) if raw else None), dict(e.headers)


GPU_DIR = str(__import__("pathlib").Path(__file__).resolve().parents[1])

PROMPT = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]


def gen(base, prompt=PROMPT, **sp):
    sp.setdefault("max_tokens", 8)
    sp.setdefault("logprobs", 1)
    st, body, hdr = call(base, "/inference/v1/generate", {"token_ids": prompt, "sampling_params": sp})
    assert st == 200, body
    return body


def full_forward_logprobs(eng, prompt, out, temperature):
    ids = torch.tensor([prompt + out])
    with torch.no_grad():
        logits = eng.model(input_ids=ids).logits[0].float()
    t = 1.0 if temperature < 1e-5 else temperature
    lp = torch.log_softmax(logits / t, dim=-1)
    n = len(prompt)
    return [float(lp[n - 1 + i, tok]) for i, tok in enumerate(out)]


def test_health_version_models(server):
    base, _ = server
    assert call(base, "/health")[0] == 200
    st, v, _ = call(base, "/version")
    assert st == 200 and v["version"].startswith("kiln-serve")
    st, m, hdr = call(base, "/v1/models")
    assert st == 200
    d = m["data"][0]
    assert d["id"] == "tiny" and d["parent"] is None and d["max_model_len"] == 4096 and d["weight_version"] == 0
    assert hdr["x-kiln-weight-version"] == "0"
    assert call(base, "/nope")[0] == 404


def test_tokenize_chat_with_tools_matches_template(server):
    base, eng = server
    msgs = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "List files."},
        {"role": "assistant", "content": "", "reasoning_content": "use ls",
         "tool_calls": [{"type": "function", "function": {"name": "shell", "arguments": "{\"cmd\": \"ls\"}"}}]},
        {"role": "tool", "content": "a.txt"},
    ]
    tools = [{"type": "function", "function": {"name": "shell", "description": "run", "parameters": {
        "type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}}]
    st, r, _ = call(base, "/tokenize", {"messages": msgs, "tools": tools, "add_generation_prompt": True,
                                         "chat_template_kwargs": {"enable_thinking": False}})
    assert st == 200, r
    want_msgs = [dict(m) for m in msgs]
    want_msgs[2] = dict(msgs[2], tool_calls=[{"type": "function", "function": {"name": "shell", "arguments": {"cmd": "ls"}}}])
    text = eng.tokenizer.apply_chat_template(want_msgs, tools=tools, tokenize=False, add_generation_prompt=True,
                                             enable_thinking=False)
    assert '"cmd": "ls"' in text and "<tools>" in text and text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert r["tokens"] == eng.tokenizer.encode(text, add_special_tokens=False)
    assert r["count"] == len(r["tokens"]) and r["max_model_len"] == 4096
    # detokenize round trip: byte-identical text
    st, d, _ = call(base, "/detokenize", {"tokens": r["tokens"]})
    assert st == 200 and d["prompt"] == text


def test_tokenize_prompt_form(server):
    base, eng = server
    st, r, _ = call(base, "/tokenize", {"prompt": "hello world", "add_special_tokens": True})
    assert st == 200 and r["tokens"] == eng.tokenizer.encode("hello world")


@pytest.mark.parametrize("temperature,top_p,top_k", [(0.0, 1.0, 0), (1.0, 1.0, 0), (0.7, 0.9, 50), (1.3, 1.0, 5)])
def test_logprobs_equal_full_forward(server, temperature, top_p, top_k):
    base, eng = server
    r = gen(base, max_tokens=24, temperature=temperature, top_p=top_p, top_k=top_k, seed=3, ignore_eos=True)
    ch = r["choices"][0]
    out = ch["token_ids"]
    assert len(out) == 24 and ch["finish_reason"] == "length"
    got = [e["logprob"] for e in ch["logprobs"]["content"]]
    assert [e["token_id"] for e in ch["logprobs"]["content"]] == out
    want = full_forward_logprobs(eng, PROMPT, out, temperature)
    diff = max(abs(a - b) for a, b in zip(got, want))
    assert diff <= 1e-5, diff
    assert r["usage"]["completion_tokens"] == 24 and r["usage"]["prompt_tokens"] == len(PROMPT)


def test_greedy_is_argmax(server):
    base, eng = server
    out = gen(base, max_tokens=6, temperature=0.0, ignore_eos=True)["choices"][0]["token_ids"]
    seq = list(PROMPT)
    with torch.no_grad():
        for t in out:
            assert int(eng.model(input_ids=torch.tensor([seq])).logits[0, -1].argmax()) == t
            seq.append(t)


def test_seeded_determinism(server):
    base, _ = server
    a = gen(base, max_tokens=16, temperature=1.0, seed=11, ignore_eos=True)["choices"][0]
    b = gen(base, max_tokens=16, temperature=1.0, seed=11, ignore_eos=True)["choices"][0]
    c = gen(base, max_tokens=16, temperature=1.0, seed=12, ignore_eos=True)["choices"][0]
    assert a["token_ids"] == b["token_ids"] and a["logprobs"] == b["logprobs"]
    assert a["token_ids"] != c["token_ids"]


def test_sampling_masks_top_k_top_p(server):
    base, eng = server
    r = gen(base, max_tokens=12, temperature=1.0, top_k=7, seed=5, ignore_eos=True, return_sampling_mask=True,
            return_sampling_mask_logprobs=True)["choices"][0]
    for t, row, lps in zip(r["token_ids"], r["sampling_mask"], r["sampling_mask_logprobs"]):
        assert len(row) == 7 and t in row and len(lps) == 7
        assert lps == sorted(lps, reverse=True)
    r = gen(base, max_tokens=12, temperature=1.0, top_p=0.5, seed=5, ignore_eos=True, return_sampling_mask=True,
            return_sampling_mask_logprobs=True)["choices"][0]
    for t, row, lps in zip(r["token_ids"], r["sampling_mask"], r["sampling_mask_logprobs"]):
        p = torch.tensor(lps, dtype=torch.float64).exp()
        assert t in row
        assert p.sum() >= 0.5 - 1e-6 and p[:-1].sum() < 0.5 + 1e-6  # smallest prefix reaching top_p (float sums)
    # the masks' logprobs are the reported processed logprobs of those ids
    seq = PROMPT + r["token_ids"]
    with torch.no_grad():
        lp = torch.log_softmax(eng.model(input_ids=torch.tensor([seq])).logits[0].float(), -1)
    for i, (row, lps) in enumerate(zip(r["sampling_mask"], r["sampling_mask_logprobs"])):
        assert max(abs(float(lp[len(PROMPT) - 1 + i, a]) - b) for a, b in zip(row, lps)) <= 1e-5


def test_top_logprobs_rows(server):
    base, _ = server
    ch = gen(base, max_tokens=5, temperature=1.0, seed=1, logprobs=3, ignore_eos=True)["choices"][0]
    for t, e in zip(ch["token_ids"], ch["logprobs"]["content"]):
        row = e["top_logprobs"]
        ids = [x["token_id"] for x in row]
        assert ids[0] == t and len(set(ids)) == len(ids) and len(row) in (3, 4)
        rest = [x["logprob"] for x in row[1:]]
        assert rest == sorted(rest, reverse=True)


def test_stop_token_ids_and_max_tokens(server):
    base, _ = server
    first = gen(base, max_tokens=1, temperature=0.0)["choices"][0]
    assert first["finish_reason"] == "length" and len(first["token_ids"]) == 1
    t0 = first["token_ids"][0]
    ch = gen(base, max_tokens=10, temperature=0.0, stop_token_ids=[t0])["choices"][0]
    assert ch["token_ids"] == [t0] and ch["finish_reason"] == "stop" and ch["stop_reason"] == t0
    # min_tokens keeps the stop id out of the first draw
    ch = gen(base, max_tokens=10, temperature=0.0, stop_token_ids=[t0], min_tokens=2)["choices"][0]
    assert ch["token_ids"][0] != t0 and len(ch["token_ids"]) >= 2


def test_eos_stops(server, tiny_checkpoint):
    base, eng = server
    assert 151645 in eng.eos_ids
    # a prompt whose greedy continuation hits EOS is model-dependent; check the rule on the stop set instead
    ch = gen(base, max_tokens=3, temperature=0.0, ignore_eos=True)["choices"][0]
    assert len(ch["token_ids"]) == 3


def test_completions_token_prompt(server):
    base, eng = server
    st, r, _ = call(base, "/v1/completions", {"model": "tiny", "prompt": PROMPT, "max_tokens": 6, "temperature": 0.8,
                                               "seed": 4, "logprobs": 1, "ignore_eos": True,
                                               "return_tokens_as_token_ids": True, "return_token_ids": True})
    assert st == 200, r
    ch = r["choices"][0]
    g = gen(base, max_tokens=6, temperature=0.8, seed=4, ignore_eos=True)["choices"][0]
    assert ch["token_ids"] == g["token_ids"]
    assert ch["logprobs"]["tokens"] == [f"token_id:{t}" for t in g["token_ids"]]
    assert ch["logprobs"]["token_logprobs"] == [e["logprob"] for e in g["logprobs"]["content"]]
    assert ch["text"] == eng.tokenizer.decode(g["token_ids"])


def test_concurrent_equals_sequential(server):
    base, _ = server
    reqs = [dict(max_tokens=10, temperature=1.0, seed=100 + i, ignore_eos=True, top_p=0.9) for i in range(8)]
    seq = [gen(base, **r)["choices"][0] for r in reqs]
    par = [None] * len(reqs)

    def run(i):
        par[i] = gen(base, **reqs[i])["choices"][0]

    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(reqs))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for a, b in zip(seq, par):
        # batched rows differ from a request alone by float rounding only
        # (docs/serve.md §5): the same ids, logprobs within 1e-5
        assert a["token_ids"] == b["token_ids"]
        got = [e["logprob"] for e in b["logprobs"]["content"]]
        want = [e["logprob"] for e in a["logprobs"]["content"]]
        assert max(abs(x - y) for x, y in zip(got, want)) <= 1e-5


# prompts of different lengths (left padding), samplers of every kind, and
# lengths that make rows leave the batch mid-flight
BATCH_CASES = [
    (PROMPT, dict(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=2)),
    ([151644, 872, 198, 40, 151645, 198], dict(max_tokens=30, temperature=1.0, seed=5, ignore_eos=True, logprobs=3)),
    (PROMPT + [9707, 11, 1879, 0, 151645, 198, 151644, 77091, 198, 40, 1079, 264],
     dict(max_tokens=7, temperature=0.7, top_p=0.9, top_k=50, seed=6, ignore_eos=True, return_sampling_mask=True,
          return_sampling_mask_logprobs=True)),
    ([151644, 872, 198], dict(max_tokens=20, temperature=1.3, top_k=5, seed=7, ignore_eos=True,
                              return_sampling_mask=True)),
    (PROMPT[:5], dict(max_tokens=25, temperature=1.0, min_p=0.2, seed=8, ignore_eos=True)),
    (PROMPT + PROMPT, dict(max_tokens=3, temperature=1.0, seed=9, ignore_eos=True)),
]


def engine_job(eng, prompt, sp):
    from kiln_gpu.serve import Job, Sampling

    return Job(list(prompt), Sampling(dict(sp), eng.max_model_len, len(prompt)), sp.get("seed", 0))


def assert_same_result(alone, batched):
    assert batched["out"] == alone["out"] and batched["finish"] == alone["finish"]
    assert max(abs(a - b) for a, b in zip(alone["lps"], batched["lps"])) <= 1e-5
    assert [[t for t, _ in row] for row in batched["tops"]] == [[t for t, _ in row] for row in alone["tops"]]
    # masks of top-k cuts (a whole-vocabulary top-p nucleus of the flat tiny
    # model orders ~10⁵ near-equal ids, which rounding may swap)
    assert batched["masks"] == alone["masks"]


def test_batched_rows_equal_alone(server):
    """Requests admitted together, and others joining mid-flight, decode as
    one batch (the engine's widest forward says so) and each gets the ids
    and logprobs it gets alone, which equal a full forward's."""
    import time

    _, eng = server
    cases = BATCH_CASES + [(p + [40], dict(sp, seed=sp.get("seed", 0) + 100)) for p, sp in BATCH_CASES[1:4]]
    alone = [eng.submit(engine_job(eng, p, sp)) for p, sp in cases]
    first, late = cases[:len(BATCH_CASES)], cases[len(BATCH_CASES):]
    eng.widest = 0
    eng.pause("keep")
    jobs = [engine_job(eng, p, sp) for p, sp in first]
    for j in jobs:
        eng.queue.put(j)  # all queued before any is admitted
    eng.resume()
    while eng.running == 0 or not any(j.done.is_set() for j in jobs):
        time.sleep(0.005)  # late ones join while the long rows run
    late_jobs = [engine_job(eng, p, sp) for p, sp in late]
    for j in late_jobs:
        eng.queue.put(j)
    for j in jobs + late_jobs:
        assert j.done.wait(120) and j.error is None, j.error
    assert eng.widest >= len(first), eng.widest
    for (p, sp), a, j in zip(cases, alone, jobs + late_jobs):
        assert_same_result(a, j.result)
        want = full_forward_logprobs(eng, p, j.result["out"], sp["temperature"])
        assert max(abs(x - y) for x, y in zip(j.result["lps"], want)) <= 1e-5


def reference_nucleus(logp, s):
    """The nucleus of docs/serve.md §3 by a full stable sort (the old
    sampler): ids by descending probability, top-k, min-p, top-p."""
    sorted_lp, order = torch.sort(logp, descending=True, stable=True)
    n = sorted_lp.numel()
    if s.top_k > 0:
        n = min(n, s.top_k)
    probs = sorted_lp[:n].exp()
    if s.min_p > 0:
        n = int((probs >= s.min_p * probs[0]).sum().item())
        probs = probs[:n]
    if s.top_p < 1:
        before = torch.cumsum(probs / probs.sum(), dim=0) - probs / probs.sum()
        n = max(1, int((before < s.top_p).sum().item()))
    return order[:n]


@pytest.mark.parametrize("top_k,top_p,min_p", [(0, 1.0, 0.0), (5, 1.0, 0.0), (0, 0.9, 0.0), (0, 0.999, 0.0),
                                               (50, 0.9, 0.0), (0, 1.0, 0.05), (20, 0.5, 0.01), (0, 0.3, 0.001)])
def test_nucleus_without_sorting_equals_sorted(top_k, top_p, min_p):
    from kiln_gpu.serve import Sampling, nucleus, ranked

    g = torch.Generator().manual_seed(top_k * 1000 + int(top_p * 100))
    s = Sampling({"top_k": top_k, "top_p": top_p, "min_p": min_p, "temperature": 1.0}, 100, 1)
    for scale in (0.5, 3.0, 10.0):  # flat to peaked
        logp = torch.log_softmax(torch.randn(151936, generator=g) * scale, dim=-1)
        got = nucleus(logp, s)
        want = reference_nucleus(logp, s)
        if got is None:
            assert want.numel() == logp.numel()
            continue
        # the same ranked prefix; a top-p cut through ~10⁵ near-equal ids
        # may end one id apart (its mass is summed in another order), at an
        # id tied with the reference's (torch.topk breaks ties its own way)
        n = min(got.numel(), want.numel())
        assert abs(got.numel() - want.numel()) <= (1 if top_p < 1 else 0)
        r = ranked(logp, got)
        assert r[:n - 1].tolist() == want[:n - 1].tolist()
        assert logp[r[n - 1]] == logp[want[n - 1]]


def test_draw_is_a_function_of_seed_and_position():
    """A request's n-th sampled token races on the n-th block of V uniforms
    of its own generator (docs/serve.md §3): the same seed gives the same
    ids whatever rows it shares a step with; the race is logp − log(−log u)."""
    from kiln_gpu.serve import Sampling, Stepper, choose_rows, draw, nucleus

    s = Sampling({"temperature": 1.0, "top_p": 0.95}, 100, 1)
    g = torch.Generator().manual_seed(1)
    rows = [torch.log_softmax(torch.randn(1000, generator=g) * 3, dim=-1) for _ in range(20)]
    u = torch.Generator().manual_seed(42)
    want = [draw(r, nucleus(r, s), torch.rand(1000, generator=u)) for r in rows]
    c = Stepper(s, 42)
    assert [c.choose(r, [])[0] for r in rows] == want
    assert len(set(want)) > 5
    # batched with other rows (another seed, greedy), the same ids
    a, other, greedy = Stepper(s, 42), Stepper(s, 7), Stepper(Sampling({"temperature": 0.0}, 100, 1), 0)
    got = [choose_rows(torch.stack([rows[i - 1], r, r]), [other, a, greedy], [[], [], []])[1][0]
           for i, r in enumerate(rows)]
    assert got == want
    lp = torch.log(torch.tensor([0.1, 0.0, 0.6, 0.3]))
    assert draw(lp, None, torch.full((4,), 0.5)) == 2
    assert draw(lp, None, torch.tensor([0.9999, 0.9999999, 0.5, 0.5])) == 0  # p = 0 never wins
    assert draw(lp, torch.tensor([0, 3]), torch.full((4,), 0.5)) == 3


def test_request_seed_from_server_seed_and_request_id():
    """A request without a seed but with a request_id draws from a seed of
    (--seed, request_id) alone (docs/serve.md §3)."""
    import hashlib

    from kiln_gpu.serve import request_seed

    want = int.from_bytes(hashlib.blake2b(b"3:req-1", digest_size=8).digest(), "little") >> 1
    assert request_seed(3, "req-1") == want < 2**63
    assert request_seed(3, "req-2") != want and request_seed(4, "req-1") != want


@pytest.mark.parametrize("body,status,needle", [
    ({"token_ids": [], "sampling_params": {"max_tokens": 2}}, 400, "token_ids"),
    ({"token_ids": [1, -2], "sampling_params": {"max_tokens": 2}}, 400, "token_ids[1]"),
    ({"token_ids": [1], "sampling_params": {"max_tokens": 0}}, 400, "max_tokens"),
    ({"token_ids": [1], "sampling_params": {"max_tokens": 2, "temperature": 3}}, 400, "temperature"),
    ({"token_ids": [1], "sampling_params": {"max_tokens": 2, "top_p": 0}}, 400, "top_p"),
    ({"token_ids": [1], "sampling_params": {"max_tokens": 5000}}, 400, "maximum context length"),
    ({"token_ids": [10**7], "sampling_params": {"max_tokens": 2}}, 400, "out of vocabulary"),
    ({"token_ids": [1], "sampling_params": {"max_tokens": 2, "repetition_penalty": 1.5}}, 400, "repetition_penalty"),
    ({"model": "other", "token_ids": [1], "sampling_params": {"max_tokens": 2}}, 404, "does not exist"),
])
def test_bad_requests(server, body, status, needle):
    base, _ = server
    st, r, _ = call(base, "/inference/v1/generate", body)
    assert st == status, r
    assert r["error"]["code"] == status and needle in r["error"]["message"] and r["error"]["type"]


def test_bad_json_and_tokenize(server):
    base, _ = server
    req = urllib.request.Request(base + "/tokenize", data=b"{nope", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 400 and "not JSON" in json.loads(e.value.read())["error"]["message"]
    assert call(base, "/tokenize", {})[0] == 400
    st, r, _ = call(base, "/collective_rpc", {"method": "sleep"})
    assert st == 400 and "reload_weights" in r["error"]["message"]


def test_pause_keep_holds_new_requests(server):
    base, _ = server
    assert call(base, "/pause?mode=keep", {})[0] == 200
    assert call(base, "/is_paused")[1] == {"is_paused": True}
    got = {}
    t = threading.Thread(target=lambda: got.update(r=gen(base, max_tokens=2, temperature=0.0)))
    t.start()
    t.join(1.0)
    assert t.is_alive() and not got  # queued behind the pause
    assert call(base, "/resume", {})[0] == 200
    t.join(60)
    assert got["r"]["choices"][0]["finish_reason"] == "length"


def test_pause_abort_finishes_in_flight(server):
    base, eng = server
    got = {}
    t = threading.Thread(target=lambda: got.update(r=gen(base, max_tokens=3000, temperature=0.0, ignore_eos=True)))
    t.start()
    import time
    while eng.running == 0:
        time.sleep(0.01)
    assert call(base, "/pause?mode=abort", {})[0] == 200
    t.join(60)
    ch = got["r"]["choices"][0]
    assert ch["finish_reason"] == "abort" and 1 <= len(ch["token_ids"]) < 3000
    assert len(ch["logprobs"]["content"]) == len(ch["token_ids"])
    call(base, "/resume", {})


def test_reload_changes_outputs_and_version(server, qwen3_tokenizer_dir, tmp_path):
    base, eng = server
    before = gen(base, max_tokens=8, temperature=0.0, ignore_eos=True)
    other = build(tmp_path / "seed1", qwen3_tokenizer_dir, seed=1)
    assert call(base, "/pause?mode=wait", {})[0] == 200
    st, r, _ = call(base, "/collective_rpc", {"method": "reload_weights",
                                              "kwargs": {"weights_path": str(other), "is_checkpoint_format": True}})
    assert st == 200 and r["weight_version"] == 1, r
    assert call(base, "/resume", {})[0] == 200
    after = gen(base, max_tokens=8, temperature=0.0, ignore_eos=True)
    # random tiny models with tied embeddings often repeat greedily: compare the logprobs too
    assert after["choices"][0]["logprobs"] != before["choices"][0]["logprobs"]
    s_before = gen(base, max_tokens=8, temperature=1.0, seed=9, ignore_eos=True)  # new weights, seeded
    assert after["weight_version"] == 1 and after["choices"][0]["weight_versions"] == [1] * 8
    st, m, hdr = call(base, "/v1/models")
    assert m["data"][0]["weight_version"] == 1 and m["data"][0]["weights_path"] == str(other)
    assert hdr["x-kiln-weight-version"] == "1"
    # logprob identity holds on the new weights
    ch = after["choices"][0]
    want = full_forward_logprobs(eng, PROMPT, ch["token_ids"], 0.0)
    assert max(abs(e["logprob"] - w) for e, w in zip(ch["logprobs"]["content"], want)) <= 1e-5
    st, r, _ = call(base, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path / "none")}})
    assert st == 400 and eng.weight_version == 1
    # back to the original weights, with an explicit version
    st, r, _ = call(base, "/collective_rpc", {"method": "reload_weights",
                                              "kwargs": {"weights_path": eng.model_dir, "weight_version": 7}})
    assert st == 200 and r["weight_version"] == 7
    back = gen(base, max_tokens=8, temperature=0.0, ignore_eos=True)
    assert back["choices"][0] == dict(before["choices"][0], weight_versions=[7] * 8)
    assert gen(base, max_tokens=8, temperature=1.0, seed=9, ignore_eos=True)["choices"][0]["logprobs"] != s_before["choices"][0]["logprobs"]


def test_cli_bad_model_dir(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "kiln_gpu.serve", "--model", str(tmp_path / "missing")],
                       capture_output=True, text=True, timeout=120, cwd=GPU_DIR)
    assert r.returncode == 2 and "is not a directory" in r.stderr
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    r = subprocess.run([sys.executable, "-m", "kiln_gpu.serve", "--model", str(tmp_path / "m")],
                       capture_output=True, text=True, timeout=120, cwd=GPU_DIR)
    assert r.returncode == 2 and "has no tokenizer" in r.stderr


def test_reload_rejects_dir_without_tokenizer(server, tmp_path):
    base, eng = server
    (tmp_path / "config.json").write_text("{}")
    v = eng.weight_version
    st, r, _ = call(base, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path)}})
    assert st == 400 and "has no tokenizer" in r["error"]["message"] and eng.weight_version == v


def test_pause_wait_lets_in_flight_finish(server):
    import time

    base, eng = server
    got = {}
    t = threading.Thread(target=lambda: got.update(r=gen(base, max_tokens=200, temperature=0.0, ignore_eos=True)))
    t.start()
    while eng.running == 0:
        time.sleep(0.01)
    assert call(base, "/pause?mode=wait", {})[0] == 200
    assert eng.running == 0  # the pause returned after the request finished
    t.join(60)
    ch = got["r"]["choices"][0]
    assert ch["finish_reason"] == "length" and len(ch["token_ids"]) == 200
    assert call(base, "/resume", {})[0] == 200


# ------------------------------------------------ --tokenizer-only (docs/serve.md §9)


def weightless_copy(ckpt, dst):
    """The checkpoint's tokenizer, chat template and config without any
    weights file: what a replay renderer is given."""
    import shutil

    shutil.copytree(ckpt, dst)
    for f in list(dst.iterdir()):
        if f.suffix in (".safetensors", ".bin", ".pt") or f.name.endswith(".index.json"):
            f.unlink()
    assert not any(f.suffix == ".safetensors" for f in dst.iterdir())
    return dst


@pytest.fixture(scope="module")
def renderer(tiny_checkpoint, tmp_path_factory):
    from kiln_gpu.serve import Renderer

    r = Renderer(str(weightless_copy(tiny_checkpoint, tmp_path_factory.mktemp("weightless") / "tiny")), served_name="tiny")
    assert not hasattr(r, "model")
    httpd = serve(r, "127.0.0.1", 0)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", r
    httpd.shutdown()


TOOLS = [{"type": "function", "function": {"name": "shell", "description": "run", "parameters": {
    "type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}},
    {"type": "function", "function": {"name": "done"}}]
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": [{"type": "text", "text": "List files"}, {"type": "text", "text": "<b>é</b>"}]},
    {"role": "assistant", "content": "", "reasoning": "use ls",
     "tool_calls": [{"type": "function", "function": {"name": "shell", "arguments": "{\"cmd\": \"ls\"}"}},
                    {"type": "function", "function": {"name": "done", "arguments": ""}}]},
    {"role": "tool", "content": "a.txt"},
    {"role": "tool", "content": ""},
]

# Same requests to both servers, same replies (status and body): the
# rendering code path is one.
RENDER_REQUESTS = [
    ("/tokenize", {"messages": CONVERSATION, "tools": TOOLS}),
    ("/tokenize", {"messages": CONVERSATION, "tools": TOOLS, "chat_template_kwargs": {"enable_thinking": False}}),
    ("/tokenize", {"model": "tiny", "messages": CONVERSATION[:2], "add_generation_prompt": False}),
    ("/tokenize", {"messages": CONVERSATION[:2] + [{"role": "assistant", "content": "<think>\nhm\n</think>\n\npart"}],
                   "add_generation_prompt": False, "continue_final_message": True}),
    ("/tokenize", {"messages": CONVERSATION[:2] + [{"role": "assistant", "content": "ok", "tool_calls": []}],
                   "add_generation_prompt": False, "add_special_tokens": True}),
    ("/tokenize", {"messages": CONVERSATION[:1], "chat_template": "{{ messages[0].content }}!"}),
    ("/tokenize", {"prompt": "hello <|im_start|> world é", "add_special_tokens": True}),
    ("/tokenize", {"prompt": ""}),
    ("/detokenize", {"tokens": [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]}),
    ("/detokenize", {"tokens": [151667, 198, 1, 2, 3, 151668]}),
    ("/detokenize", {"tokens": []}),
    # errors, same status and envelope
    ("/tokenize", {}),
    ("/tokenize", {"messages": []}),
    ("/tokenize", {"messages": CONVERSATION, "tools": {"not": "a list"}}),
    ("/tokenize", {"messages": CONVERSATION[:1], "chat_template": "{% if %}"}),
    ("/tokenize", {"model": "other", "prompt": "x"}),
    ("/detokenize", {"tokens": [10**7]}),
    ("/detokenize", {"tokens": [1, -1]}),
    ("/nope", {}),
]


@pytest.mark.parametrize("path,body", RENDER_REQUESTS, ids=[f"{i}{p}" for i, (p, _) in enumerate(RENDER_REQUESTS)])
def test_tokenizer_only_renders_as_full_server(server, renderer, path, body):
    want_st, want, _ = call(server[0], path, body)
    got_st, got, _ = call(renderer[0], path, body)
    assert (got_st, got) == (want_st, want)
    if path == "/tokenize" and want_st == 200 and body.get("prompt") != "":
        assert got["tokens"] and got["count"] == len(got["tokens"])


def test_tokenizer_only_gets_as_full_server(server, renderer):
    for path in ("/health", "/version", "/is_paused", "/nope"):
        assert call(renderer[0], path)[:2] == call(server[0], path)[:2], path
    st, got, hdr = call(renderer[0], "/v1/models")
    _, want, _ = call(server[0], "/v1/models")
    assert st == 200 and hdr["x-kiln-weight-version"] == "0"
    g, w = dict(got["data"][0]), dict(want["data"][0])
    # the root and weights path are each server's own checkpoint directory
    assert g["root"] == renderer[1].model_dir and g["weights_path"] == renderer[1].model_dir
    for d in (g, w):
        for k in ("created", "root", "weights_path", "weight_version"):
            d.pop(k)
    assert g == w and g["max_model_len"] == 4096  # config.json's max_position_embeddings


@pytest.mark.parametrize("path", ["/inference/v1/generate", "/v1/completions", "/pause?mode=wait", "/resume",
                                  "/collective_rpc", "/update_weight_version"])
def test_tokenizer_only_refuses_generation(renderer, path):
    base, _ = renderer
    bodies = {"/inference/v1/generate": {"token_ids": PROMPT, "sampling_params": {"max_tokens": 2}},
              "/v1/completions": {"prompt": PROMPT, "max_tokens": 2},
              "/collective_rpc": {"method": "reload_weights", "kwargs": {"weights_path": "/tmp"}},
              "/update_weight_version": {"new_version": "3"}}
    st, r, _ = call(base, path, bodies.get(path.split("?")[0], {}))
    assert st == 503, r
    msg = r["error"]["message"]
    assert "serve.py --tokenizer-only does not generate; it is a replay renderer" in msg
    assert f"POST {path.split('?')[0]}" in msg and r["error"]["type"] == "ServiceUnavailableError"
    assert r["error"]["code"] == 503
    # whatever the body: the mode is the answer, not a parse error; the
    # body is read all the same, so the kept-alive connection serves on
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", int(base.rsplit(":", 1)[1]), timeout=30)
    try:
        conn.request("POST", path, body=b"{nope", headers={"Content-Type": "application/json"})
        r1 = conn.getresponse()
        assert r1.status == 503 and "--tokenizer-only" in json.loads(r1.read())["error"]["message"]
        conn.request("POST", "/tokenize", body=json.dumps({"prompt": "hi"}).encode(),
                     headers={"Content-Type": "application/json"})
        r2 = conn.getresponse()
        assert r2.status == 200 and json.loads(r2.read())["tokens"] == renderer[1].tokenizer.encode("hi")
    finally:
        conn.close()


def test_tokenizer_only_cli_without_weights(server, tiny_checkpoint, tmp_path):
    """The CLI on a checkpoint with no weights file starts within seconds,
    serves the same /tokenize reply as the full server and refuses to
    generate; --max-model-len is what /v1/models and /tokenize report."""
    import subprocess
    import sys
    import time

    ckpt = weightless_copy(tiny_checkpoint, tmp_path / "tiny")
    port_file = tmp_path / "port"
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "kiln_gpu.serve", "--model", str(ckpt), "--tokenizer-only",
                             "--port", "0", "--port-file", str(port_file), "--served-model-name", "tiny",
                             "--max-model-len", "1024"],
                            cwd=GPU_DIR, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        while not port_file.exists():
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() - t0 < 90, "no port file after 90 s"
            time.sleep(0.05)
        startup = time.monotonic() - t0
        base = f"http://127.0.0.1:{int(port_file.read_text())}"
        print(f"--tokenizer-only startup {startup:.2f}s")
        body = {"messages": CONVERSATION, "tools": TOOLS}
        st, got, _ = call(base, "/tokenize", body)
        _, want, _ = call(server[0], "/tokenize", body)
        assert st == 200 and got == dict(want, max_model_len=1024)
        assert call(base, "/v1/models")[1]["data"][0]["max_model_len"] == 1024
        st, r, _ = call(base, "/inference/v1/generate", {"token_ids": PROMPT, "sampling_params": {"max_tokens": 2}})
        assert st == 503 and "--tokenizer-only" in r["error"]["message"]
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert "--tokenizer-only: renders and decodes, never generates" in out
    r = subprocess.run([sys.executable, "-m", "kiln_gpu.serve", "--model", str(ckpt), "--tokenizer-only",
                        "--max-model-len", "0"], capture_output=True, text=True, timeout=120, cwd=GPU_DIR)
    assert r.returncode == 2 and "--max-model-len 0" in r.stderr
    r = subprocess.run([sys.executable, "-m", "kiln_gpu.serve", "--model", str(tmp_path / "missing"), "--tokenizer-only"],
                       capture_output=True, text=True, timeout=120, cwd=GPU_DIR)
    assert r.returncode == 2 and "is not a directory" in r.stderr


def test_update_weight_version_and_weight_info(server):
    """vLLM's RL-router routes (docs/serve.md §6), in kiln-sync's order
    (docs/sync.md §3): pause keep, reload_weights without a version, then
    /update_weight_version sets it; /weight_info, /v1/models, the header and
    every generate reply report it. A non-integer is 400 and changes
    nothing."""
    base, eng = server
    before = eng.weight_version
    try:
        assert call(base, "/pause?mode=keep&clear_cache=false", {})[0] == 200
        st, r, _ = call(base, "/collective_rpc", {"method": "reload_weights",
                                                  "kwargs": {"weights_path": eng.model_dir, "is_checkpoint_format": True}})
        assert st == 200, r
        st, r, hdr = call(base, "/update_weight_version", {"new_version": "41"})
        assert (st, r, hdr["x-kiln-weight-version"]) == (200, {"weight_version": 41}, "41")
        st, r, hdr = call(base, "/weight_info")
        assert (st, r, hdr["x-kiln-weight-version"]) == (200, {"weight_version": 41}, "41")
        assert call(base, "/v1/models")[1]["data"][0]["weight_version"] == 41
        assert call(base, "/resume", {})[0] == 200
        g = gen(base, max_tokens=4, temperature=0.0, ignore_eos=True)
        assert g["weight_version"] == 41 and g["choices"][0]["weight_versions"] == [41] * 4
        # a JSON integer is accepted too
        assert call(base, "/update_weight_version", {"new_version": 42})[:2] == (200, {"weight_version": 42})
        for bad_v in ("abc", "1.5", "", " ", 1.5, None, True, [3], {"v": 3}, "５"):
            st, r, _ = call(base, "/update_weight_version", {"new_version": bad_v})
            assert st == 400, (bad_v, r)
            assert r["error"]["type"] == "BadRequestError" and "new_version must be an integer" in r["error"]["message"]
        st, r, _ = call(base, "/update_weight_version", {})
        assert st == 400, r
        assert call(base, "/weight_info")[1] == {"weight_version": 42}
    finally:
        call(base, "/resume", {})
        eng.set_weight_version(before)


# -- limits on a shared node (docs/serve.md §10): small caps and timeouts
# keep these fast; each server below shares the module's engine.

import socket  # noqa: E402
import time  # noqa: E402

from kiln_gpu.serve import Limits  # noqa: E402


@pytest.fixture
def limited(server):
    """start(**limits) serves the module's engine under Limits(**limits)
    and returns (base URL, port); each is shut down after the test."""
    started = []

    def start(**kw):
        httpd = serve(server[1], "127.0.0.1", 0, Limits(**kw))
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        started.append(httpd)
        port = httpd.server_address[1]
        return f"http://127.0.0.1:{port}", port

    yield start
    for h in started:
        h.shutdown()
        h.server_close()


def connect(port, data=b""):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    if data:
        s.sendall(data)
    return s


def read_until_closed(s, limit=10.0):
    """Everything the server sends until it closes (EOF or reset)."""
    s.settimeout(limit)
    got = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                return got
            got += b
    except ConnectionResetError:
        return got


def status_of(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else 0


def test_logprobs_over_max_logprobs_is_400(server):
    """The audit's logprobs: 1e9 (as an integer) ran the server out of
    memory; vLLM's max_logprobs (20) bounds it."""
    base, _ = server
    for n in (10**9, 21):
        t0 = time.monotonic()
        st, r, _ = call(base, "/inference/v1/generate", {"token_ids": PROMPT, "sampling_params": {
            "max_tokens": 2, "logprobs": n}})
        assert st == 400 and f"Requested sample logprobs of {n}, which is greater than max allowed: 20" in \
            r["error"]["message"], r
        assert time.monotonic() - t0 < 5
    st, r, _ = call(base, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "logprobs": 21})
    assert st == 400 and "max allowed: 20" in r["error"]["message"]
    r = gen(base, max_tokens=2, logprobs=20, temperature=0.0)
    assert len(r["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) >= 20


def test_max_logprobs_flag(limited):
    base, _ = limited(max_logprobs=2)
    st, r, _ = call(base, "/inference/v1/generate", {"token_ids": PROMPT, "sampling_params": {
        "max_tokens": 2, "logprobs": 3}})
    assert st == 400 and "max allowed: 2" in r["error"]["message"]
    assert gen(base, max_tokens=2, logprobs=2)["choices"][0]["token_ids"]


BOMB = '{{ "x" * 6000000000 }}'


def test_request_chat_template_refused_unless_allowed(server, limited):
    """A request's chat_template is code the server runs: the audit's
    6 GB string killed it in 6 s. Refused (400) as vLLM refuses it without
    --trust-request-chat-template, in the body or in chat_template_kwargs."""
    base, _ = server
    msgs = [{"role": "user", "content": "hi"}]
    for body in ({"messages": msgs, "chat_template": BOMB},
                 {"messages": msgs, "chat_template_kwargs": {"chat_template": BOMB}}):
        t0 = time.monotonic()
        st, r, _ = call(base, "/tokenize", body)
        assert st == 400 and "Refused request with untrusted chat template" in r["error"]["message"], r
        assert "--allow-request-chat-template" in r["error"]["message"]
        assert time.monotonic() - t0 < 5
    # the model's own template still renders
    assert call(base, "/tokenize", {"messages": msgs})[0] == 200
    # allowed by the flag, a request's template is used
    base2, _ = limited(allow_request_chat_template=True)
    tpl = "{% for m in messages %}<<{{ m.content }}>>{% endfor %}"
    st, r, _ = call(base2, "/tokenize", {"messages": msgs, "chat_template": tpl})
    assert st == 200 and r["tokens"] == server[1].tokenizer.encode("<<hi>>", add_special_tokens=False)


def test_body_over_max_body_bytes_is_413_unread(server, limited):
    """The audit's 1 GiB body was read whole: a Content-Length over
    --max-body-bytes is 413 at once, the body never read and the
    connection closed."""
    _, port = limited(max_body_bytes=1000)
    for n in (2**30, 1001):
        s = connect(port, b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n" % n + b"{" * 500)
        t0 = time.monotonic()
        reply = read_until_closed(s)
        s.close()
        assert status_of(reply) == 413 and b"--max-body-bytes" in reply, reply
        assert b"Connection: close" in reply and time.monotonic() - t0 < 5
    # the module's server: the default limit (8 MiB) refuses the audit's 1 GiB
    s = connect(int(server[0].rsplit(":", 1)[1]),
                b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % 2**30)
    reply = read_until_closed(s)
    s.close()
    assert status_of(reply) == 413, reply
    # at the limit, the body is read and parsed
    body = json.dumps({"prompt": "a" * 900}).encode()
    assert len(body) <= 1000
    st, r, _ = call(limited(max_body_bytes=1000)[0], "/tokenize", {"prompt": "a" * 900})
    assert st == 200, r


@pytest.mark.parametrize("header,status", [
    (b"Content-Length: -1\r\n", 400),
    (b"Content-Length: nope\r\n", 400),
    (b"Content-Length: 5\r\nContent-Length: 6\r\n", 400),
    (b"Transfer-Encoding: chunked\r\n", 411),
])
def test_bad_content_length_is_answered_and_closed(limited, header, status):
    """The audit's Content-Length: -1 hung a thread until the client
    closed (read to EOF): malformed framing is answered at once and the
    connection closed, without reading on."""
    _, port = limited(request_timeout=30.0)
    s = connect(port, b"POST /tokenize HTTP/1.1\r\nHost: x\r\n" + header + b"\r\n{}")
    t0 = time.monotonic()
    reply = read_until_closed(s)
    s.close()
    assert status_of(reply) == status, reply
    assert time.monotonic() - t0 < 5


def _threads():
    return threading.active_count()


def test_connections_bounded_and_slow_clients_dropped(server, limited):
    """The audit's 3,000 partial-header connections took 3,000 threads and
    /health was unanswered for minutes: connections beyond
    --max-connections are answered 503 with no thread of their own, and
    a client whose request has not arrived within --request-timeout is
    dropped, so /health answers while the clients are still connected. A
    request cut short by the timeout is never acted on (here a /pause)."""
    base, port = limited(max_connections=4, request_timeout=1.0)
    before = _threads()
    partial = [connect(port, b"POST /pause?mode=keep HTTP/1.1\r\nHost: x\r\n") for _ in range(40)]
    try:
        time.sleep(0.3)
        assert _threads() <= before + 4, "a thread per connection beyond --max-connections"
        refused = 0
        for s in partial[4:]:
            reply = read_until_closed(s, 5)
            refused += status_of(reply) == 503 and b"--max-connections" in reply
        assert refused == 36
        t0 = time.monotonic()
        for s in partial[:4]:
            assert read_until_closed(s, 5) == b""  # dropped, no answer
        assert time.monotonic() - t0 < 3
        assert call(base, "/health")[0] == 200
        assert call(base, "/is_paused")[1] == {"is_paused": False}, "a timed-out partial request was acted on"
    finally:
        for s in partial:
            s.close()
        call(server[0], "/resume", {})


def test_request_cut_short_is_never_acted_on(server, limited):
    """Headers trickled a line at a time (each read within the socket
    timeout) are cut off by --request-timeout; the socket's EOF then ends
    the header block, and what looks like a complete POST /pause must not
    pause the engine."""
    base, port = limited(request_timeout=1.0)
    s = connect(port, b"POST /pause?mode=keep HTTP/1.1\r\nHost: x\r\n")
    t0 = time.monotonic()
    closed = False
    try:
        while time.monotonic() - t0 < 6:
            s.sendall(b"X-Pad: 1\r\n")
            time.sleep(0.2)
    except (BrokenPipeError, ConnectionResetError):
        closed = True
    finally:
        s.close()
    try:
        assert closed and time.monotonic() - t0 < 4
        time.sleep(0.3)
        assert call(base, "/is_paused")[1] == {"is_paused": False}, "a request cut short was acted on"
    finally:
        call(server[0], "/resume", {})


def test_slow_body_dropped_after_request_timeout(limited):
    """A body trickled a byte at a time (each read well within the socket
    timeout) or stalled midway is dropped once --request-timeout has passed
    since the request began; so is an idle keep-alive."""
    base, port = limited(request_timeout=1.0)
    s = connect(port, b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
    t0 = time.monotonic()
    closed = False
    try:
        while time.monotonic() - t0 < 6:
            s.sendall(b" ")
            time.sleep(0.2)
    except (BrokenPipeError, ConnectionResetError):
        closed = True
    s.close()
    assert closed and time.monotonic() - t0 < 4
    s = connect(port, b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\"")
    t0 = time.monotonic()
    assert read_until_closed(s) == b"" and time.monotonic() - t0 < 3
    s.close()
    # an idle keep-alive after a served request
    s = connect(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    t0 = time.monotonic()
    reply = read_until_closed(s)
    assert status_of(reply) == 200 and time.monotonic() - t0 < 3
    s.close()
    assert call(base, "/health")[0] == 200


def test_api_key_guards_every_route_but_health(server, limited, tmp_path):
    """--api-key as vLLM's: without "Authorization: Bearer KEY" every
    route but /health is 401 {"error": "Unauthorized"}, the body unread
    and nothing done (no pause, no reload); /health answers regardless."""
    base, port = limited(api_key="sekret")
    eng = server[1]
    v = eng.weight_version

    def authed(path, body=None, key="sekret"):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(base + path, data=data, method="POST" if body is not None else "GET",
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    assert call(base, "/health")[0] == 200
    for path, body in (("/v1/models", None), ("/version", None), ("/is_paused", None), ("/weight_info", None),
                       ("/tokenize", {"prompt": "hi"}), ("/pause?mode=keep", {}), ("/resume", {}),
                       ("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path)}}),
                       ("/update_weight_version", {"new_version": 99}),
                       ("/inference/v1/generate", {"token_ids": PROMPT, "sampling_params": {"max_tokens": 1}})):
        st, r, _ = call(base, path, body)
        assert (st, r) == (401, {"error": "Unauthorized"}), path
        assert authed(path, body, key="wrong")[0] == 401, path
    assert not eng.paused and eng.weight_version == v
    # a 401 reads no body: the connection closes though the body never came
    s = connect(port, b"POST /pause HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
    reply = read_until_closed(s)
    s.close()
    assert status_of(reply) == 401
    assert authed("/v1/models")[0] == 200
    assert authed("/tokenize", {"prompt": "hi"})[1]["tokens"] == eng.tokenizer.encode("hi")
    assert authed("/weight_info") == (200, {"weight_version": v})


def test_cli_refuses_bad_limits(tmp_path):
    from kiln_gpu.serve import main

    for flag, val in (("--max-connections", "0"), ("--max-body-bytes", "-1"), ("--request-timeout", "0"),
                      ("--max-logprobs", "-1")):
        assert main(["--model", str(tmp_path), flag, val]) == 2


# -- forced decoding (docs/serve.md §11)


def _chat_prompt(eng, user, turns=()):
    """The prompt ids of a chat whose user message is user, after the given
    (assistant text, tool result) turns, ending in the generation prompt."""
    msgs = [{"role": "user", "content": user}]
    for text, result in turns:
        msgs += [{"role": "assistant", "content": text}, {"role": "tool", "content": result}]
    return eng.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)


@pytest.fixture(scope="module")
def forced(tiny_checkpoint, tmp_path_factory):
    path = tmp_path_factory.mktemp("demos") / "demonstrations.jsonl"
    demos = [
        {"task_id": "a", "match": "fix the adder", "turns": ["<think>\n\n</think>\n\nfirst A<|im_end|>", "Done A.<|im_end|>"]},
        {"match": "fix the divider", "turns": ["only B"]},  # no <|im_end|>: ends when its tokens do
    ]
    path.write_text("".join(json.dumps(d) + "\n" for d in demos))
    eng = Engine(str(tiny_checkpoint), served_name="tiny", seed=0, demonstrations=str(path))
    httpd = serve(eng, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", eng
    httpd.shutdown()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_forced_decoding_returns_the_turn_with_the_models_logprobs(forced, temperature):
    base, eng = forced
    for turns, want in (((), "<think>\n\n</think>\n\nfirst A<|im_end|>"), ((("first A", "ok"),), "Done A.<|im_end|>")):
        prompt = _chat_prompt(eng, "please fix the adder", turns)
        out = gen(base, prompt, max_tokens=64, temperature=temperature)
        ids = out["choices"][0]["token_ids"]
        assert ids == eng.tokenizer.encode(want, add_special_tokens=False)
        assert out["choices"][0]["finish_reason"] == "stop"
        got = [e["logprob"] for e in out["choices"][0]["logprobs"]["content"]]
        assert got == pytest.approx(full_forward_logprobs(eng, prompt, ids, temperature), abs=1e-5)


def test_forced_decoding_ends_with_the_demonstration_or_max_tokens(forced):
    base, eng = forced
    prompt = _chat_prompt(eng, "fix the divider")
    out = gen(base, prompt, max_tokens=64)["choices"][0]
    assert out["token_ids"] == eng.tokenizer.encode("only B", add_special_tokens=False)
    assert out["finish_reason"] == "stop"
    cut = gen(base, _chat_prompt(eng, "please fix the adder"), max_tokens=3)["choices"][0]
    assert len(cut["token_ids"]) == 3 and cut["finish_reason"] == "length"


def test_forced_decoding_unmatched_sampled_ambiguous_and_past_the_end_refused(server, tiny_checkpoint, tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"match": "fix the adder", "turns": ["A"]}) + "\n"
                    + json.dumps({"match": "adder", "turns": ["B"]}) + "\n"
                    + json.dumps({"match": "subtractor", "turns": ["C<|im_end|>"]}) + "\n")
    eng = Engine(str(tiny_checkpoint), served_name="tiny", seed=0, demonstrations=str(path))
    httpd = serve(eng, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        # no match: sampled as the server without demonstrations samples (same seed, same draw)
        sampled = gen(base, PROMPT, max_tokens=6, seed=3)["choices"][0]["token_ids"]
        assert sampled == gen(server[0], PROMPT, max_tokens=6, seed=3)["choices"][0]["token_ids"]
        st, body, _ = call(base, "/inference/v1/generate",
                           {"token_ids": _chat_prompt(eng, "fix the adder"), "sampling_params": {"max_tokens": 4}})
        assert st == 400 and "2 demonstrations match" in body["error"]["message"], body
        st, body, _ = call(base, "/inference/v1/generate", {
            "token_ids": _chat_prompt(eng, "the subtractor", [("C", "ok")]), "sampling_params": {"max_tokens": 4}})
        assert st == 400 and "has 1 turn(s)" in body["error"]["message"] and "turn 2" in body["error"]["message"], body
    finally:
        httpd.shutdown()


@pytest.mark.parametrize("content, needle", [
    ("", "no demonstrations"),
    ("{not json\n", "line 1: not JSON"),
    ('{"turns": ["x"]}\n', "line 1: match must be"),
    ('{"match": "a", "turns": []}\n', "line 1: turns must be"),
    ('{"match": "a", "turns": ["x"]}\n{"match": "a", "turns": ["y"]}\n', "line 2: match 'a' repeats"),
])
def test_forced_decoding_bad_files_name_the_line(tiny_checkpoint, tmp_path, content, needle):
    path = tmp_path / "d.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=__import__("re").escape(needle)):
        Engine(str(tiny_checkpoint), served_name="tiny", seed=0, demonstrations=str(path))
