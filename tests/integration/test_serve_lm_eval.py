"""EleutherAI's lm-evaluation-harness, a client no one here wrote, scores a model through `glmstack serve` (issue 34).

lm-eval's `local-completions` model (the way most people score a served model) runs in a subprocess, offline, on
two tasks written here: a multiple-choice task (log-likelihood requests: `echo` + `logprobs=1`, token-id prompts;
lm-eval reads `max(top_logprobs[i].values())` at every continuation position, which crashed on `null`) and a
`generate_until` task (greedy, a stop string). It tokenises with transformers' AutoTokenizer on the checkpoint's own
tokenizer files, and sends the server's API key from OPENAI_API_KEY. Every choice's log-likelihood must equal the
in-process model's within 1e-3, and every generation the in-process greedy one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval")
transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from serve_fixture import RunningServer

from glmstack.inference import Engine
from glmstack.model import GLM, ModelConfig, load_hf, save_hf
from glmstack.tokenizer import Tokenizer

pytestmark = pytest.mark.slow  # lm-eval's imports and dataset building: ~30 s
KEY = "lm-eval-key"
QUESTIONS = [
    {"question": "The quick brown fox jumps over the", "choices": [" lazy dog", " moon", " fence"], "answer": 0},
    {"question": "def f(x):\n    return", "choices": [" x + 1", " None", " f(x)"], "answer": 0},
    {"question": "Colours: red, green,", "choices": [" blue", " dog", " 42"], "answer": 0},
]
PROMPTS = [{"prompt": "The quick brown", "target": " fox"}, {"prompt": "def f(x):", "target": " return"},
           {"prompt": "the lazy", "target": " dog"}]  # fmt: skip
MC_YAML = """task: glm_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""
GEN_YAML = """task: glm_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{target}}}}"
generation_kwargs:
  until: ["."]
  max_gen_toks: 12
  do_sample: false
metric_list:
  - metric: exact_match
"""


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lmeval") / "tiny"
    cfg = ModelConfig.preset("tiny", num_hidden_layers=2, first_k_dense_replace=2, num_nextn_predict_layers=0,
                             max_position_embeddings=512)  # fmt: skip
    save_hf(GLM(cfg).init_weights(seed=1), folder)
    texts = [q["question"] + c for q in QUESTIONS for c in q["choices"]] + [p["prompt"] for p in PROMPTS]
    Tokenizer.train(texts * 10 + ["the quick brown fox jumps over the lazy dog. " * 20], vocab_size=400).save(folder)
    return str(folder)


def run_lm_eval(tmp_path: Path, url: str, ckpt: str) -> dict[str, list[dict]]:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name, yaml, rows in (("mc", MC_YAML, QUESTIONS), ("gen", GEN_YAML, PROMPTS)):
        data = tasks / f"{name}.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        (tasks / f"glm_{name}.yaml").write_text(yaml.format(data=data))
    out = tmp_path / "out"
    env = os.environ | {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                        "HF_HOME": str(tmp_path / "hf"), "OPENAI_API_KEY": KEY}  # fmt: skip
    args = f"model=tiny,base_url={url}/v1/completions,tokenizer_backend=huggingface,tokenizer={ckpt},max_length=512"
    cmd = [sys.executable, "-m", "lm_eval", "run", "--model", "local-completions", "--model_args", args,
           "--tasks", "glm_mc,glm_gen", "--include_path", str(tasks), "--output_path", str(out), "--log_samples"]  # fmt: skip
    proc = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    samples = {}
    for task in ("glm_mc", "glm_gen"):
        (path,) = out.rglob(f"samples_{task}_*.jsonl")
        samples[task] = [json.loads(line) for line in path.read_text().splitlines()]
    return samples


def test_lm_eval_scores_through_the_server_as_in_process(tmp_path, ckpt):
    srv = RunningServer(ckpt, api_key=KEY)
    try:
        samples = run_lm_eval(tmp_path, srv.url, ckpt)
    finally:
        srv.stop()
    model = load_hf(ckpt, dtype=torch.float32).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(ckpt)
    encode = lambda s: hf_tok(s, add_special_tokens=False).input_ids

    mc = samples["glm_mc"]
    assert len(mc) == len(QUESTIONS) and all(len(s["resps"]) == 3 for s in mc)
    for s in mc:  # samples files hold {"gen_args_k": {"arg_0": context, "arg_1": continuation}} and strings
        for args, resp in zip(s["arguments"].values(), s["resps"]):
            got_ll, got_greedy = float(resp[0][0]), resp[0][1] == "True"
            ctx_ids, cont_ids = _encode_pair(encode, args["arg_0"], args["arg_1"])
            want_ll, want_greedy = _loglikelihood(model, ctx_ids, cont_ids)
            assert abs(got_ll - want_ll) < 1e-3, (args, got_ll, want_ll)
            assert got_greedy == want_greedy

    engine = Engine(model, Tokenizer.load(ckpt))
    gen = samples["glm_gen"]
    assert len(gen) == len(PROMPTS)
    for s in gen:
        prompt = s["arguments"]["gen_args_0"]["arg_0"]
        res = engine.generate([encode(prompt)], 12, temperature=0)
        want = res.text[0].split(".")[0]
        assert s["resps"][0][0] == want, (prompt, s["resps"][0][0], want)


def _encode_pair(encode, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's split: trailing spaces of the context move to the continuation; the continuation's ids are the
    whole text's ids after the context's."""
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    whole, ctx = encode(context + continuation), encode(context)
    return ctx, whole[len(ctx) :]


@torch.no_grad()
def _loglikelihood(model, ctx_ids: list[int], cont_ids: list[int]) -> tuple[float, bool]:
    ids = torch.tensor([ctx_ids + cont_ids])
    logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)[len(ctx_ids) - 1 : -1]
    target = torch.tensor(cont_ids)
    return float(logp.gather(-1, target[:, None]).sum()), bool((logp.argmax(-1) == target).all())
