"""`glmstack sft` end to end on a tiny model: the exported folder renders like transformers, a resumed run equals
an uninterrupted one bit for bit, metrics and plots are written, and bad input is one clear line."""

import json

import pytest
import torch
from safetensors.torch import load_file

from glmstack.chat import encode, render
from glmstack.model import load_hf
from glmstack.posttrain import sft
from glmstack.posttrain.synthetic import generate
from glmstack.posttrain.tools import TOOLS
from glmstack.recipes import load_config
from glmstack.tokenizer import Tokenizer

pytestmark = pytest.mark.slow


def overrides(base_dir, out, steps=4, **extra):
    sets = json.dumps(["synthetic:arithmetic", "synthetic:chat"])
    kv = {"init_from": str(base_dir), "out_dir": str(out), "steps": steps, "seq_len": 128, "micro_batch_size": 4,
          "sft.data": sets, "sft.val_data": sets, "sft.synthetic_n": 40, "ckpt.every": 2, "log.every": 1,
          "log.val_every": 2, "log.progress": False, "schedule.warmup_steps": 1} | extra  # fmt: skip
    return [f"{k}={v}" for k, v in kv.items()]


def weights(folder):
    return load_file(str(folder / "model.safetensors"))


def test_sft_exports_renders_like_transformers_and_resumes_exactly(base_dir, tmp_path):
    cfg = load_config("sft_speedrun", "sft", overrides(base_dir, tmp_path / "a"))
    result = sft.run_sft(cfg)
    stage = tmp_path / "a" / "speedrun" / "sft"
    assert result["stopped"] == "done" and (stage / "metrics.jsonl").exists() and list((stage / "plots").glob("*.png"))
    rows = [json.loads(x) for x in (stage / "metrics.jsonl").read_text().splitlines()]
    assert 0 < rows[-1]["trained_frac"] < 1 and "val_loss" in rows[-1]

    # resumed: stop at step 2, then a new process-equivalent run continues to 4
    cfg_b = load_config("sft_speedrun", "sft", overrides(base_dir, tmp_path / "b"))
    assert sft.run_sft(cfg_b, stop_at=2)["stopped"] == "stop_at"
    sft.run_sft(load_config("sft_speedrun", "sft", overrides(base_dir, tmp_path / "b")))
    a, b = weights(stage / "model"), weights(tmp_path / "b" / "speedrun" / "sft" / "model")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    # the model folder: loads, and transformers renders prompts as glmstack.chat does
    transformers = pytest.importorskip("transformers")
    load_hf(stage / "model")
    hf = transformers.AutoTokenizer.from_pretrained(str(stage / "model"))
    tok = Tokenizer.load(stage / "model")
    conv = generate("tools", 1)[0]["messages"]
    for msgs, prompt in [(conv, False), (conv[:1], True)]:
        ours, _ = encode(tok, msgs, TOOLS, "glm-4.5", add_generation_prompt=prompt, close_last_turn=False)
        theirs = hf.apply_chat_template(msgs, tools=TOOLS, tokenize=True, add_generation_prompt=prompt,
                                        return_dict=False)  # fmt: skip
        assert list(theirs) == ours == tok.encode(render(msgs, TOOLS, "glm-4.5", add_generation_prompt=prompt))

    # another style's export carries that style's template
    folder = sft.export(stage / "step_0000004", tmp_path / "m47", tok, "glm-4.7")
    hf47 = transformers.AutoTokenizer.from_pretrained(str(folder))
    want, _ = encode(tok, conv[:1], TOOLS, "glm-4.7", add_generation_prompt=True)
    assert list(hf47.apply_chat_template(conv[:1], tools=TOOLS, add_generation_prompt=True, return_dict=False)) == want


@pytest.mark.parametrize(("extra", "message"), [
    (["--set", "init_from="], "init_from is required"),
    (["--set", "init_from=no/such/run"], "init_from='no/such/run': no HF checkpoint folder"),
    (["--set", "sft.bogus=1"], "unknown override key 'sft.bogus'"),
    (["--set", "sft.chat_style=glm-9"], "sft.chat_style: unknown chat style 'glm-9'"),
    (["--set", 'sft.data=["synthetic:poetry"]'], "sft.data: unknown synthetic set 'poetry'"),
])  # fmt: skip
def test_bad_input_is_one_clear_line(base_dir, tmp_path, capsys, extra, message):
    argv = ["sft_speedrun", "--set", f"init_from={base_dir}", "--set", f"out_dir={tmp_path}", *extra]
    assert sft.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()  # errors go to stderr, one line
    assert err[-1].startswith("glmstack sft: ") and message in err[-1]


def test_file_without_valid_records_is_one_clear_line(base_dir, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "no answer"}]}\n')
    argv = ["sft_speedrun", "--set", f"init_from={base_dir}", "--set", f"out_dir={tmp_path}",
            "--set", f'sft.data=["{bad}"]', "--set", "log.val_every=0"]  # fmt: skip
    assert sft.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out.strip().splitlines()[-1] == f"skipped {bad}:1: no trained assistant turn"
    assert captured.err.strip() == f"glmstack sft: {bad}: no valid conversation in the file (1 skipped so far)"
