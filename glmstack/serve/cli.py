"""`glmstack serve MODEL`: the OpenAI-compatible server (glmstack.serve.app) on uvicorn.

    glmstack serve runs/speedrun/model --port 8000                 # then: OpenAI(base_url="http://127.0.0.1:8000/v1")
    glmstack serve CKPT --speculative mtp                          # one request at a time, MTP speculation
    glmstack serve CKPT --quantize int4                            # weights quantised in place (glmstack.inference.quant)
    glmstack serve CKPT --max-running 16 --max-waiting 256 --time-limit 600
    glmstack serve CKPT --prefix-cache-mb 1024 --prefix-block 16     # reuse the KV of re-sent prefixes (0: off)
    glmstack serve BASE --lora sql=runs/a/sft/model --lora chat=DIR  # LoRA adapters beside the base, unmerged:
                                                                   # a request's "model" picks "sql", "chat" or BASE's

Thinking modes (docs/serve.md): a request's `chat_template_kwargs` {"enable_thinking", "clear_thinking"} are the
official templates' switches; with `clear_thinking: false` (GLM-4.7/5) each turn's prompt extends the last prompt +
completion, which the prefix cache then reuses whole.

The model name clients send is the folder's name unless --served-model-name says otherwise. Open http://HOST:PORT/
for the web chat page.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from glmstack.serve.security import is_loopback

API_KEY_ENV = "GLMSTACK_API_KEY"  # the server's key when --api-key is not given (vLLM reads VLLM_API_KEY alike)


def build(args):
    """(app, scheduler) for the parsed arguments; the scheduler is started by the app's lifespan."""
    from glmstack.inference.cli import _load, _style
    from glmstack.multimodal.serving import VisionEngine, VisionScheduler, is_vl_checkpoint
    from glmstack.serve.app import create_app
    from glmstack.serve.scheduler import Scheduler

    if is_vl_checkpoint(args.checkpoint):  # GLM-4.5V / 4.1V: images and videos in (multimodal/serving.py)
        from glmstack.errors import ConfigError
        from glmstack.model.hf import DTYPES

        if args.quantize or args.speculative != "none" or lora_on(args):
            raise ConfigError(f"{args.checkpoint} is a vision-language checkpoint: --quantize, --speculative and "
                              "--lora are for text models")  # fmt: skip

        engine = VisionEngine.load(args.checkpoint, DTYPES.get(args.dtype), args.device)
        sched = VisionScheduler(engine, args.max_running, args.max_waiting)
        adapters = None
    else:
        # loads, and quantizes with --quantize (glmstack.inference.quant.quantize_); LoRA runs the model's own forward
        engine = _load(args, fast=not lora_on(args))
        adapters = load_adapters(args, engine.model)
        speculative = None if args.speculative == "none" else args.speculative
        completions = not getattr(args, "prefix_prompts_only", False)
        sched = Scheduler(engine, args.max_running, args.max_waiting, speculative, args.draft, _prefix_cache(args),
                          _monitor(args), cache_completions=completions)  # fmt: skip
    name = args.served_model_name or Path(args.checkpoint).name
    app = create_app(engine, name, _style(args, engine), sched, args.time_limit, adapters=adapters,
                     **security_options(args))  # fmt: skip
    return app, sched


def lora_on(args) -> bool:
    return bool(getattr(args, "lora", None) or getattr(args, "enable_lora", False))


def load_adapters(args, model) -> dict | None:
    """{name: (slot, folder)} for --lora NAME=DIR ... put on `model` (model/lora_multi.py); None when LoRA is off.
    What LoRA serving does not cover is refused here, before the server starts."""
    from glmstack.errors import ConfigError
    from glmstack.model.lora_multi import add_adapter

    if not lora_on(args):
        return None
    if args.speculative != "none" or args.quantize:
        raise ConfigError("--lora / --enable-lora: not with --speculative or --quantize (adapters are served over an "
                          "unquantized base with plain decoding)")  # fmt: skip
    adapters = {}
    for item in getattr(args, "lora", None) or []:
        name, sep, folder = item.partition("=")
        if not sep or not name or not folder:
            raise ConfigError(f"--lora {item!r}: write NAME=DIR (the name requests send as their model)")
        if name in adapters or name == (args.served_model_name or Path(args.checkpoint).name):
            raise ConfigError(f"--lora {item!r}: the name {name!r} is already taken")
        add_adapter(model, len(adapters) + 1, folder)
        adapters[name] = (len(adapters) + 1, folder)
    return adapters


def security_options(args) -> dict:
    """create_app's keywords for who may call the server (security.py) and what one request may ask (limits.py).
    Namespaces built by tests may lack the options: the defaults are the safe ones (no weight updates)."""
    from glmstack.errors import ConfigError
    from glmstack.serve.limits import Limits

    root = getattr(args, "weight_root", None)
    if getattr(args, "enable_weight_updates", False) != bool(root):
        raise ConfigError("--enable-weight-updates and --weight-root DIR go together: weight pushes are read only "
                          "from inside DIR (the folder the trainer writes them to)")  # fmt: skip
    if root and not Path(root).is_dir():
        raise ConfigError(f"--weight-root {root}: no such folder")
    limits = Limits(max_body_bytes=int(getattr(args, "max_body_mb", 4.0) * 2**20),
                    max_prompt_chars=getattr(args, "max_prompt_chars", None),
                    max_loras=max(getattr(args, "max_loras", 8), len(getattr(args, "lora", None) or [])))  # fmt: skip
    key = getattr(args, "api_key", None) or os.environ.get(API_KEY_ENV) or None
    return {"limits": limits, "api_key": key, "bind_host": getattr(args, "host", "127.0.0.1"),
            "allowed_hosts": getattr(args, "allowed_hosts", None), "weight_root": root}  # fmt: skip


def _prefix_cache(args):
    """--prefix-cache-mb > 0: a PrefixCache (argparse namespaces built by tests may lack the options: off)."""
    from glmstack.inference.prefix_cache import PrefixCache

    mb = getattr(args, "prefix_cache_mb", 0)
    if not mb:
        return None
    return PrefixCache(
        getattr(args, "prefix_block", 16),
        int(mb * 2**20),
        getattr(args, "fault_block", None),
        getattr(args, "fault_scale", 1.0),
        getattr(args, "fault_mode", "noise"),
    )


def _monitor(args):
    from glmstack.serve.monitor import MonitorConfig

    return MonitorConfig(action=getattr(args, "monitor", "flag"),
                         min_acceptance_length=getattr(args, "monitor_min_length", 1.4),
                         max_acceptance_rate=getattr(args, "monitor_max_rate", 0.96),
                         min_tokens=getattr(args, "monitor_min_tokens", 128))  # fmt: skip


def _serve_replicas(args, argv: list[str]) -> int:
    """--replicas N: N engine processes on private ports, the router (glmstack.serve.router) on --host/--port."""
    import uvicorn

    from glmstack.serve.router import create_router, launch_replicas

    guard = security_options(args)
    if guard["api_key"]:  # to the replicas through the environment: a command line is readable by every local user
        os.environ[API_KEY_ENV] = guard["api_key"]
    rest, skip = [], False
    for a in argv:  # the replicas get every option but these four
        if skip:
            skip = False
        elif a in ("--replicas", "--port", "--host", "--api-key"):
            skip = True
        elif not a.startswith(("--replicas=", "--port=", "--host=", "--api-key=")):
            rest.append(a)
    try:
        procs, urls = launch_replicas(rest, args.replicas)
    except RuntimeError as e:
        print(f"glmstack serve: {e}", file=sys.stderr)
        return 2
    print(f"glmstack serve: router on http://{args.host}:{args.port}/ over {', '.join(urls)}", file=sys.stderr)
    try:
        router = create_router(urls, guard["api_key"], guard["bind_host"], guard["allowed_hosts"],
                               guard["limits"].max_body_bytes)  # fmt: skip
        uvicorn.run(router, host=args.host, port=args.port, log_level="warning")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="glmstack serve", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("checkpoint", help="checkpoint folder (config.json, *.safetensors, tokenizer.json)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--served-model-name", default=None, help="the model id clients send (default: folder name)")
    ap.add_argument("--speculative", choices=["none", "mtp"], default="none")
    ap.add_argument("--draft", type=int, default=2, help="draft tokens per verify step with --speculative mtp")
    ap.add_argument("--quantize", choices=["int4", "fp8"], default=None, help="weight-only quantisation")
    ap.add_argument("--max-running", type=int, default=16, help="requests decoded together (batch rows)")
    ap.add_argument("--max-waiting", type=int, default=256, help="queued requests beyond which the server answers 429")
    ap.add_argument("--time-limit", type=float, default=600.0, help="seconds a request may run before it is aborted")
    ap.add_argument(
        "--dtype", choices=["float32", "bfloat16", "float16"], default=None, help="default: the checkpoint's"
    )
    ap.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument(
        "--prefix-cache-mb",
        type=float,
        default=1024.0,
        help="memory for cached prompt-prefix KV blocks, reused across requests (0: off)",
    )
    ap.add_argument("--prefix-block", type=int, default=16, help="tokens per prefix-cache block")
    ap.add_argument("--prefix-prompts-only", action="store_true",
                    help="cache prompts only, not a finished request's prompt + completion (what the next turn of "
                    "a conversation re-sends; continuous batching, not --speculative)")  # fmt: skip
    ap.add_argument(
        "--fault-block",
        type=int,
        default=None,
        help="testing only: corrupt the N-th cached block (shows the stress harness and monitor catch it)",
    )
    ap.add_argument(
        "--fault-scale", type=float, default=1.0, help="testing only: the corruption's noise, x the block's std"
    )
    ap.add_argument("--fault-mode", choices=["noise", "swap"], default="noise",
                    help="testing only: noise, or the block holds another request's KV (swap)")  # fmt: skip
    ap.add_argument(
        "--monitor",
        choices=["flag", "abort", "off"],
        default="flag",
        help="--speculative mtp: what an acceptance anomaly does (glmstack.serve.monitor)",
    )
    ap.add_argument("--monitor-min-length", type=float, default=1.4, help="acceptance length below: corrupted context")
    ap.add_argument("--monitor-max-rate", type=float, default=0.96, help="acceptance rate above: degenerate repetition")
    ap.add_argument("--monitor-min-tokens", type=int, default=128, help="the rules apply after this many tokens")
    ap.add_argument("--style", choices=["auto", "glm-4.5", "glm-4.7"], default="auto", help="chat format")
    ap.add_argument("--lora", "--lora-modules", nargs="+", action="extend", default=None, metavar="NAME=DIR",
                    help="serve PEFT adapter folders beside the base, unmerged; a request's model field picks one")
    ap.add_argument("--enable-lora", action="store_true",
                    help="LoRA serving without adapters at start (POST /v1/load_lora_adapter adds them)")
    ap.add_argument("--max-loras", type=int, default=8,
                    help="LoRA adapters held at once; /v1/load_lora_adapter refuses more")  # fmt: skip
    sec = ap.add_argument_group("security and limits (docs/serve.md, Security)")
    sec.add_argument("--api-key", default=None,
                     help=f"require 'Authorization: Bearer KEY' on every route but /health (default: ${API_KEY_ENV})")
    sec.add_argument("--allowed-hosts", nargs="+", default=None, metavar="NAME",
                     help="Host names accepted (default: loopback names when bound to loopback; '*': any)")
    sec.add_argument("--enable-weight-updates", action="store_true",
                     help="accept POST /update_weights_from_disk (an RL trainer's push), reading only under --weight-root")
    sec.add_argument("--weight-root", default=None, metavar="DIR", help="the folder weight pushes are read from")
    sec.add_argument("--max-body-mb", type=float, default=4.0, help="request body size limit (413 beyond)")
    sec.add_argument("--max-prompt-chars", type=int, default=None,
                     help="characters of prompt text per request (default: 16 x the context)")  # fmt: skip
    ap.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="engine processes behind one router, conversations pinned by consistent hashing (router.py)",
    )
    args = ap.parse_args(argv)
    if args.replicas > 1:
        return _serve_replicas(args, sys.argv[1:] if argv is None else argv)
    import torch
    import uvicorn

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        app, sched = build(args)
    except (ValueError, OSError, KeyError) as e:  # ConfigError is a ValueError
        print(f"glmstack serve: {e}", file=sys.stderr)
        return 2
    sched.start()
    print(f"glmstack serve: {app.state.server.model_name} on http://{args.host}:{args.port}/", file=sys.stderr)
    guard = security_options(args)
    if not guard["api_key"] and not is_loopback(args.host):
        print(f"glmstack serve: WARNING: bound to {args.host} without --api-key: anyone who can reach this address "
              "can use the server (docs/serve.md, Security)", file=sys.stderr)  # fmt: skip
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        sched.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
