"""`glmstack <command>`: one table of commands, each a thin call into the module that owns the work.

Every entry names `module:function`; the function takes the remaining argv and returns an exit code. Modules
are imported only when their command runs, so `glmstack --help` stays instant. Bad input (a GlmstackError: a
config field, a checkpoint or tokenizer file) ends as one line on stderr and exit code 2, never a traceback.

    glmstack --help
    glmstack speedrun --minutes 20
"""

from __future__ import annotations

import importlib
import sys

# name -> (target "module:function", one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "speedrun": ("glmstack.speedrun:main", "the whole recipe at tiny scale on the embedded corpus, with a report"),
    "data": ("glmstack.data.cli:main", "run the data pipeline into token shards"),
    "tokenizer": ("glmstack.tokenizer:main", "train or inspect a byte-level BPE tokenizer"),
    "pretrain": ("glmstack.train.pretrain:main", "pre-train a GLM MoE with MTP (Muon, loss-free balancing)"),
    "midtrain": ("glmstack.train.midtrain:main", "mid-train: longer context, repo-level code, best-fit packing"),
    "sft": ("glmstack.posttrain.sft:main", "supervised fine-tuning in GLM's chat format (thinking, tool calls)"),
    "sft-data": ("glmstack.posttrain.synthetic:main", "write the synthetic SFT sets (arithmetic, tools, chat)"),
    "rejection-sample": ("glmstack.posttrain.rejection:main", "sample, verify and filter responses into an SFT file"),
    "expert-iteration": ("glmstack.posttrain.expert_iteration:main", "experts -> rejection sampling -> one model"),
    "rl": ("glmstack.posttrain.rl.stage:main", "RL on the one loop: reasoning (GRPO/IcePop), agentic, distillation or VL, as the recipe's config says"),
    "rm": ("glmstack.posttrain.rm.stage:main", "train a Bradley-Terry reward model on preference pairs (an HF folder)"),
    "dpo": ("glmstack.posttrain.dpo.stage:main", "DPO (cDPO, IPO) on preference pairs against a frozen reference"),
    "distill": ("glmstack.posttrain.rl.distill:main", "on-policy cross-stage distillation from earlier stages' teachers"),
    "agentic-rl": ("glmstack.posttrain.agentic.stage:main", "agentic RL: multi-turn tool environments, async rollouts (local or Ray)"),
    "vl-data": ("glmstack.multimodal.vqa:main", "write the synthetic visual QA set (PIL images + train/test chats)"),
    "vl-train": ("glmstack.multimodal.stage:main", "a vision-language stage: ViT pre-training, adapter alignment or full SFT with images"),
    "vl-rl": ("glmstack.multimodal.rl:main", "curriculum RL (GRPO) of a vision-language model with a verifiable reward"),
    "vl-recipe": ("glmstack.multimodal.recipe:main", "the tiny multimodal recipe: vit -> align -> SFT -> RL, with a report"),
    "sft-eval": ("glmstack.posttrain.evaluate:main", "held-out format/thinking/tool-call/task scores of chat models"),
    "generate": ("glmstack.inference.cli:generate_main", "generate text from a checkpoint (MTP speculative decoding)"),
    "chat": ("glmstack.inference.cli:chat_main", "chat with a checkpoint in the terminal (GLM chat format)"),
    "serve": ("glmstack.serve.cli:main", "an OpenAI-compatible server with tools, reasoning, streaming and a chat page"),
    "convert": ("glmstack.model.convert:main", "re-shard a checkpoint and change its dtype"),
    "plan": ("glmstack.train.plan:main", "trainable parameters and per-GPU memory of LoRA / full fine-tuning, computed"),
    "merge": ("glmstack.model.merge:main", "fold a LoRA adapter (PEFT folder) into its base: a plain HF checkpoint"),
    "eval": ("glmstack.eval.cli:main", "score a checkpoint or an endpoint: ppl, HumanEval, FIM, BFCL, math"),
    "sandbox": ("glmstack.sandbox.cli:main", "run a code snippet in the sandbox"),
    "ablate": ("glmstack.ablate.cli:main", "the GLM papers' design claims measured at small scale, with 95% intervals"),
    "bench": ("glmstack.bench_cli:main", "list or run the benchmarks in bench/ (a source checkout only: a wheel has no bench/)"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items())
    return f"usage: glmstack <command> [options]\n\ncommands:\n{rows}\n\n`glmstack <command> --help` for its options."


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from glmstack import __version__

        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"glmstack: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module, func = COMMANDS[name][0].split(":")
    from glmstack.errors import GlmstackError, one_line

    try:
        code = getattr(importlib.import_module(module), func)(rest)
    except GlmstackError as e:
        print(one_line(f"glmstack {name}", e), file=sys.stderr, flush=True)
        return 2
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
