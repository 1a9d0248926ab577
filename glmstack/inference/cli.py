"""`glmstack generate` and `glmstack chat`: the engine on a checkpoint folder, from the terminal.

Both load any glmstack or released GLM checkpoint folder (config.json + safetensors + tokenizer.json) with
`Tokenizer.load` and `load_hf` (in that order: a missing tokenizer fails before a large model is read). `generate` continues raw prompts (or, with --chat, answers them as a user turn);
`chat` keeps a conversation in GLM's chat format (glmstack.chat.render with add_generation_prompt), streams the
reply through StreamParser, shows reasoning dimmed and apart, and tool calls parsed.

    glmstack generate CKPT --prompt "def fib(n):" --max-new-tokens 64 --speculative mtp --draft 3
    glmstack generate CKPT --prompt "a" --prompt "b" --temperature 0.7 --top-p 0.9 --seed 0 --stats
    glmstack chat CKPT [--system "..."] [--tools tools.json] [--no-think]      # /reset, /exit, /think on|off
    glmstack chat CKPT --keep-thinking       # preserved thinking (GLM-4.7/5): earlier replies keep their reasoning
    glmstack chat VL_CKPT --image shape.png --no-think     # a GLM-4.5V / 4.1V folder; /image FILE attaches another
    glmstack chat VL_CKPT --video frames/ --no-think       # a folder of frames (2 fps) or an animated GIF/WebP/PNG
    glmstack generate CKPT --quantize int4 --prompt "..."    # or fp8 (glmstack.inference.quant)
    echo "Use Python to reverse the word rocket." | glmstack chat CKPT --tools builtin --run-tools --temperature 0
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from glmstack.errors import ConfigError, GlmstackError
from glmstack.model.hf import DTYPES

DIM, RESET = "\x1b[2m", "\x1b[0m"


def _common(ap: argparse.ArgumentParser, temperature: float, top_p: float, max_new: int) -> None:
    ap.add_argument("checkpoint", help="checkpoint folder (config.json, *.safetensors, tokenizer.json)")
    ap.add_argument("--max-new-tokens", type=int, default=max_new)
    ap.add_argument("--temperature", type=float, default=temperature, help="0 = greedy")
    ap.add_argument("--top-p", type=float, default=top_p)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument(
        "--seed",
        type=int,
        default=None,
        help="sampling seed (default: random); with several --prompt the b-th samples with SEED + b, so each output "
        "depends only on its prompt, its seed and the sampling options, not on the other prompts",
    )
    ap.add_argument("--speculative", choices=["none", "mtp"], default="none", help="MTP speculative decoding")
    ap.add_argument("--draft", type=int, default=2, help="draft tokens per verify step with --speculative mtp")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: the checkpoint's")
    ap.add_argument(
        "--quantize", choices=["int4", "fp8"], default=None,
        help="weights to group-wise INT4 or block-wise FP8 after loading (glmstack.inference.quant.quantize_)",
    )
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--style", choices=["auto", "glm-4.5", "glm-4.7"], default="auto", help="chat format")


def _load(args, fast: bool = True):
    """Tokenizer first (a missing tokenizer.json fails in a second, not after loading a large model), then the model;
    a checkpoint without its MTP layer (written by transformers) loads without MTP, with a warning. Bad files raise
    a GlmstackError that `glmstack` prints as one line."""
    from glmstack.inference import Engine
    from glmstack.inference.quant import quantize_
    from glmstack.model import load_hf
    from glmstack.tokenizer import Tokenizer

    tokenizer = Tokenizer.load(args.checkpoint)
    model = load_hf(args.checkpoint, dtype=DTYPES.get(args.dtype), device=args.device, missing_mtp="drop")
    if args.quantize:  # a model it cannot quantize raises QuantError, a GlmstackError: one line from `glmstack`
        quantize_(model, args.quantize)
    return Engine(model, tokenizer, fast=fast)


def _gen_kwargs(args) -> dict:
    return {
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "seed": args.seed,
        "draft_k": args.draft,
        "speculative": None if args.speculative == "none" else args.speculative,
    }


def _style(args, engine) -> str:
    """--style, else the checkpoint's own chat template (GLM-4.7/5's has clear_thinking), else the model type."""
    if args.style != "auto":
        return args.style
    template = (getattr(engine.tokenizer, "_config", None) or {}).get("chat_template") or ""
    if template:
        return "glm-4.7" if "clear_thinking" in template else "glm-4.5"
    return "glm-4.7" if engine.cfg.model_type in ("glm_moe_dsa", "glm4_moe_lite") else "glm-4.5"  # GLM-5, 4.7-Flash


def _print_stats(stats: dict) -> None:
    keys = ("new_tokens", "tokens_per_s", "prefill_s", "mean_accepted_length", "acceptance_per_depth")
    shown = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in stats.items() if k in keys}
    print(json.dumps(shown), file=sys.stderr)


# ---------------------------------------------------------------- generate
def generate_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="glmstack generate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    _common(ap, temperature=0.0, top_p=1.0, max_new=256)
    ap.add_argument("--prompt", action="append", help="repeat for a batch; default: read stdin")
    ap.add_argument("--chat", action="store_true", help="wrap each prompt as a user turn in the chat format")
    ap.add_argument("--stats", action="store_true", help="print speed/acceptance stats to stderr")
    args = ap.parse_args(argv)
    engine = _load(args)
    prompts = args.prompt or [sys.stdin.read()]
    if args.chat:
        from glmstack.chat import render

        prompts = [
            render([{"role": "user", "content": p}], style=_style(args, engine), add_generation_prompt=True)
            for p in prompts
        ]
    try:
        if len(prompts) == 1:  # stream a single prompt as it is generated
            stats: dict = {}
            for delta in engine.stream(prompts[0], stats=stats, **_gen_kwargs(args)):
                print(delta.text, end="", flush=True)
            print()
        else:
            res = engine.generate(prompts, **_gen_kwargs(args))
            stats = res.stats
            for i, text in enumerate(res.text):
                print(f"=== {i} ({res.finish_reason[i]})\n{text}")
    except ValueError as e:
        print(f"glmstack generate: {e}", file=sys.stderr)
        return 2
    if args.stats:
        _print_stats(stats)
    return 0


# ---------------------------------------------------------------- chat
def _show(delta: dict, tty: bool, state: dict) -> None:
    """Print one StreamParser delta: reasoning dimmed, content plain, a finished tool call as name(args)."""
    if "reasoning_content" in delta:
        text = delta["reasoning_content"]
        print(f"{DIM}{text}{RESET}" if tty else text, end="", flush=True)
        state["reasoning"] = True
    if "content" in delta:
        if state.pop("reasoning", False):
            print("\n")  # reasoning ends: keep the answer apart
        print(delta["content"], end="", flush=True)
    for call in delta.get("tool_calls", []):
        fn = call.get("function", {})
        if "name" in fn:
            print(f"{')' if state.get('call_open') else ''}\n[tool call] {fn['name']}(", end="", flush=True)
            state["call_open"] = True
        print(fn.get("arguments", ""), end="", flush=True)


MAX_TOOL_ROUNDS = 4  # assistant turns per user line with --run-tools


def _chat_turn(engine, messages, tools, style, args, tty) -> dict | None:
    """Generate, stream and parse one assistant turn; None when the prompt no longer fits."""
    from glmstack.chat import StreamParser, accumulate, render

    kw = {"enable_thinking": not args.no_think, "clear_thinking": not args.keep_thinking}
    if hasattr(engine, "render_prompt"):  # a vision-language checkpoint: ids + pixels (glmstack.multimodal.serving)
        prompt = engine.render_prompt(messages, tools, style, **kw)
    else:
        prompt = render(messages, tools, style=style, add_generation_prompt=True, **kw)
    parser, deltas, state, stats = StreamParser(tools, style), [], {}, {}
    try:
        for piece in engine.stream(prompt, stats=stats, **_gen_kwargs(args)):
            for d in parser.feed(piece.text):
                deltas.append(d)
                _show(d, tty, state)
    except ValueError as e:
        print(f"\nglmstack chat: {e}", file=sys.stderr)
        return None
    for d in parser.finish():
        deltas.append(d)
        _show(d, tty, state)
    print(")" if state.get("call_open") else "")
    reply = accumulate(deltas)
    if not reply["tool_calls"]:
        del reply["tool_calls"]
    if args.stats:
        _print_stats(stats)
    return reply


def _run_tools(calls: list[dict]) -> list[dict]:
    """Run the calls of the built-in tools (the python tool in the sandbox) and show each result."""
    from glmstack.posttrain.tools import execute

    out = []
    for call in calls:
        result = execute(call["function"]["name"], call["function"]["arguments"])
        print(f"[tool result] {result}", flush=True)
        out.append({"role": "tool", "content": result})
    return out


def _tools(spec: str | None):
    if spec == "builtin":
        from glmstack.posttrain.tools import TOOLS

        return TOOLS
    if not spec:
        return None
    try:
        return json.loads(Path(spec).read_text())
    except (OSError, ValueError) as e:  # a missing file, or not JSON: one line naming it
        raise ConfigError(f"--tools {spec}: not a readable JSON file of tool definitions ({e})") from None


def _load_chat(args):
    """(engine, the first message's media parts): a text Engine, or for a vision-language folder its VisionEngine;
    --image / --video need the latter, and every image and video is read (readable, not remote) before the
    conversation starts: one error line, never a traceback."""
    from glmstack.multimodal.serving import VisionEngine, is_vl_checkpoint

    if not is_vl_checkpoint(args.checkpoint):
        if args.image or args.video:
            raise ConfigError(f"--{'image' if args.image else 'video'}: {args.checkpoint} is a text model; images "
                              "and videos need a vision-language checkpoint (glm4v_moe / glm4v)")  # fmt: skip
        return _load(args), []
    if args.quantize or args.speculative != "none":
        raise ConfigError(f"{args.checkpoint} is a vision-language checkpoint: --quantize and --speculative are "
                          "for text models")  # fmt: skip
    engine = VisionEngine.load(args.checkpoint, DTYPES.get(args.dtype), args.device)
    return engine, [_media_part(k, p, engine) for k, paths in (("image", args.image), ("video", args.video))
                    for p in paths]  # fmt: skip


def _media_part(kind: str, path: str, engine) -> dict:
    """A user-turn content part for `--image FILE` / `--video PATH` (and /image, /video): the file is read now, so a
    missing or unreadable one is one ImageError line; a video is decoded once (a Clip) and kept in the part."""
    from glmstack.multimodal.images import load_image
    from glmstack.multimodal.video import load_clip

    if not hasattr(engine, "render_prompt"):
        raise ConfigError(f"/{kind}: this is a text model; images and videos need a vision-language checkpoint")
    if not path:
        raise ConfigError(f"/{kind}: give a path")
    if kind == "video":
        return {"type": "video", "video": load_clip(path, what=f"--video {path}")}
    load_image(path, what=f"--image {path}")
    return {"type": "image", "image": path}


def chat_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="glmstack chat", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    _common(ap, temperature=0.6, top_p=0.95, max_new=1024)
    ap.add_argument("--system", default=None, help="system message")
    ap.add_argument(
        "--tools", default=None, help="JSON file with OpenAI-style tool definitions, or 'builtin' (calculator + python)"
    )
    ap.add_argument(
        "--run-tools",
        action="store_true",
        help="execute calls of the builtin tools (python runs in the "
        "sandbox) and let the model answer from the results",
    )
    ap.add_argument("--no-think", action="store_true",
                    help="disable thinking (enable_thinking=False); `/think off` and `/think on` switch it per turn")
    ap.add_argument("--keep-thinking", action="store_true",
                    help="preserved thinking: earlier turns keep their reasoning (clear_thinking=False; GLM-4.7/5 "
                    "templates), so each prompt extends the last prompt + reply")
    ap.add_argument("--stats", action="store_true", help="print speed/acceptance stats after each reply")
    ap.add_argument("--image", action="append", default=[], metavar="FILE",
                    help="an image for the first message (repeatable; a GLM-4.5V / 4.1V checkpoint); "
                    "in the conversation, `/image FILE` attaches one to the next message")  # fmt: skip
    ap.add_argument("--video", action="append", default=[], metavar="PATH",
                    help="a short video for the first message: a folder of frames (taken at 2 fps) or an animated "
                    "GIF / WebP / PNG (repeatable; `/video PATH` attaches one to the next message)")  # fmt: skip
    args = ap.parse_args(argv)
    engine, media = _load_chat(args)
    style, tty = _style(args, engine), sys.stdout.isatty()
    tools = _tools(args.tools)
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(system)
    print(f"chatting with {args.checkpoint} ({style}); /reset clears the conversation, /exit quits", file=sys.stderr)
    if args.keep_thinking and style == "glm-4.5":
        print("glmstack chat: --keep-thinking has no effect in the glm-4.5 style (its template has no clear_thinking)",
              file=sys.stderr)  # fmt: skip
    while True:
        try:
            line = input("\n> " if tty else "")
        except EOFError:
            return 0
        if line.strip() in ("/exit", "/quit"):
            return 0
        if line.strip() == "/reset":
            messages = list(system)
            continue
        if line.strip() in ("/think on", "/think off"):  # turn-level thinking: the template's per-request switch
            args.no_think = line.strip() == "/think off"
            print(f"thinking {'off' if args.no_think else 'on'}", file=sys.stderr)
            continue
        if line.startswith(("/image ", "/video ")):
            kind, path = line[1:].split(" ", 1)
            try:
                media.append(_media_part(kind, path.strip(), engine))
            except GlmstackError as e:  # a missing or unreadable file: say so and keep the conversation
                print(f"glmstack chat: {e}", file=sys.stderr)
            continue
        before = len(messages)
        messages.append({"role": "user", "content": [*media, {"type": "text", "text": line}] if media else line})
        media = []
        for _ in range(MAX_TOOL_ROUNDS if args.run_tools else 1):
            reply = _chat_turn(engine, messages, tools, style, args, tty)
            if reply is None:  # the conversation outgrew the context: forget this exchange
                del messages[before:]
                break
            messages.append(reply)
            if not (args.run_tools and reply.get("tool_calls")):
                break
            messages += _run_tools(reply["tool_calls"])
