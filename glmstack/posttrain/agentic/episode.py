"""Run a group of episodes on the inference engine, all turns batched: generate, parse, step the environments.

    trajs = run_group(engine, tokenizer, specs, opts, env_opts, seeds, version=lambda: 3, task_id=0)

Per turn every live episode's ids go to `Engine.generate(..., logprobs=True)` with its own seed (a pure function
of the episode's seed and the turn), and each completion is appended as sampled (trajectory.py). Then:
  - a completion cut by the token budget, or a prompt with no room left, ends the episode `truncated`;
  - a tool call that does not parse (markup left in the text) or that is not ended by `<|observation|>` is a
    malformed call: the episode ends with reward 0 (GLM-4.5 §3.3);
  - otherwise the environment steps; its reply is appended as context, or the episode is done.
Before each turn the trajectory's view applies `opts.context` (context.py: keep-last-k tool results, a token
budget that stubs, discards or has the policy summarise the oldest results — the summaries of every view over budget
sampled in one batch first); a fold starts a new segment, and the sampler gets the folded view. With `mask_error_turns` a turn whose
tool call came back as an error ("Error: ...") stays in the context but leaves the loss (GLM-5: error segments are
masked).
`version()` is asked before each turn: a worker that received new weights between turns reports them, so a
trajectory records every weight version it was generated with (GLM-5's staleness rule reads the first). With
`routing_replay` record / replay each turn also returns the experts the engine routed every token of its context to;
the trajectory keeps the latest turn's (it covers all earlier tokens: their routing at the latest weights).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from glmstack.chat import parse
from glmstack.posttrain.agentic.context import Context, ContextOptions
from glmstack.posttrain.agentic.env import EnvCrash, EnvOptions
from glmstack.posttrain.agentic.envs import make_env
from glmstack.posttrain.agentic.trajectory import Summary, Trajectory
from glmstack.posttrain.rl.rollouts import stable_seed


@dataclass(kw_only=True)
class EpisodeOptions:
    max_turns: int = 3  # assistant turns per episode
    max_new_tokens: int = 48  # per assistant turn
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    thinking: bool = False  # enable_thinking of the prompts
    chat_style: str = "glm-4.5"
    min_room: int = 8  # fewer free context positions than this before a turn: the episode is truncated
    # routing replay (rl/replay.py): off | record | replay; record / replay ask every turn for the experts the engine
    # routed the whole context to (the latest turn's record covers every earlier token)
    routing_replay: Literal["off", "record", "replay"] = "off"
    context: ContextOptions = field(default_factory=ContextOptions)  # context management (context.py); off
    mask_error_turns: bool = False  # a turn whose tool call returned "Error: ..." stays in context, out of the loss


def _malformed(text: str, message: dict, last: int | None, observation_id: int) -> bool:
    leftover = any(t in (message.get("content") or "") for t in ("<tool_call>", "</tool_call>", "<arg_key>"))
    return leftover or (bool(message.get("tool_calls")) and last != observation_id)


def run_group(engine, tokenizer, specs: list[dict], opts: EpisodeOptions, env_opts: EnvOptions, seeds: list[int], *,
              version=lambda: 0, task_id: int = 0) -> list[Trajectory]:  # fmt: skip
    """One episode per spec (a group repeats one spec); returns finished trajectories with rewards."""
    envs, trajs = [], []
    for j, (spec, seed) in enumerate(zip(specs, seeds)):
        env = make_env(spec["env"], env_opts, seed=stable_seed(seeds[0] if env_opts.group_faults else seed, "env"))
        messages, tools = env.reset(spec)
        view = Context(tokenizer, tokenizer.encode(_prompt_text(messages, tools, opts)), opts.context,
                       style=opts.chat_style, thinking=opts.thinking)  # fmt: skip
        envs.append(env)
        trajs.append(Trajectory(task_id=task_id, index=j, spec=spec, messages=list(messages), tools=tools,
                                ids=view.ids, view=view))  # fmt: skip
    ctx = engine.cfg.max_position_embeddings
    observation = tokenizer.token_id("<|observation|>")
    live = list(range(len(trajs)))
    for turn in range(opts.max_turns):
        summaries = _summaries(engine, tokenizer, [trajs[i] for i in live], [seeds[i] for i in live], turn, opts,
                               version)  # fmt: skip
        for i in live:
            trajs[i].manage(summaries.get(id(trajs[i])))
        for i in [i for i in live if ctx - len(trajs[i].context) < opts.min_room]:
            envs[i].abort("truncated")
        live = [i for i in live if envs[i].status == "running"]
        if not live:
            break
        v = version()
        budget = min(opts.max_new_tokens, min(ctx - len(trajs[i].context) for i in live))
        routes = {"return_routes": True} if opts.routing_replay != "off" else {}
        res = engine.generate([trajs[i].context for i in live], max_new_tokens=budget, temperature=opts.temperature,
                              top_p=opts.top_p, top_k=opts.top_k, logprobs=True,
                              seeds=[stable_seed(seeds[i], "turn", turn) for i in live], **routes)  # fmt: skip
        # each turn records the version the sampler reports for it (a server: the weights that generated it)
        versions = [w if isinstance(w, int) else v for w in (res.weight_versions or [v] * len(live))]
        for j, (i, toks, lps, finish, w) in enumerate(zip(live, res.tokens, res.logprobs, res.finish_reason, versions)):
            if res.routes is not None:  # this turn's prefill re-routed the whole context: its record replaces the last
                trajs[i].routes = res.routes[j]
            _advance(trajs[i], envs[i], toks, lps, finish, w, tokenizer, opts, observation)
    for t, env in zip(trajs, envs):
        if env.status == "running":  # out of turns while still calling tools
            env.abort("truncated")
        r = env.reward()
        t.status, t.reward, t.success, t.parts = env.status, r.value, r.success, r.parts
    return trajs


def _summaries(engine, tokenizer, trajs: list[Trajectory], seeds: list[int], turn: int, opts: EpisodeOptions,
               version) -> dict[int, Summary]:  # fmt: skip
    """budget_action=summarize: the policy's summary for every view over its budget, sampled in one batch at the
    rollout temperature -> {id(trajectory): Summary}."""
    asks = [(t, s, t.view.summary_request()) for t, s in zip(trajs, seeds) if t.view is not None]
    asks = [(t, s, p) for t, s, p in asks if p is not None]
    if not asks:
        return {}
    v = version()
    res = engine.generate([p for _, _, p in asks], max_new_tokens=opts.context.summary_tokens,
                          temperature=opts.temperature, top_p=opts.top_p, top_k=opts.top_k, logprobs=True,
                          seeds=[stable_seed(s, "summary", turn) for _, s, _ in asks])  # fmt: skip
    versions = [w if isinstance(w, int) else v for w in (res.weight_versions or [v] * len(asks))]
    out = {}
    for (t, _, prompt), toks, lps, w in zip(asks, res.tokens, res.logprobs, versions):
        text = parse(tokenizer.decode(toks), None, style=opts.chat_style).get("content") or ""
        out[id(t)] = Summary(prompt, list(toks), list(lps), w, text)
    return out


def _advance(t: Trajectory, env, toks, lps, finish, v, tokenizer, opts: EpisodeOptions, observation: int) -> None:
    t.add_model(list(toks), list(lps), v)
    text = tokenizer.decode(toks)
    message = parse(text, t.tools, style=opts.chat_style, in_reasoning=opts.chat_style == "glm-4.7" and opts.thinking)
    message = {k: val for k, val in message.items() if val}  # drop empty content / reasoning / calls
    t.messages.append(message | {"role": "assistant"})
    if finish != "stop":
        env.abort("truncated")
        return
    if _malformed(text, message, toks[-1] if toks else None, observation):
        env.abort("malformed")
        return
    try:
        step = env.step(message)
    except EnvCrash:
        env.abort("env_error")
        return
    if opts.mask_error_turns and any(str(m.get("content") or "").startswith("Error") for m in step.messages
                                     if m["role"] == "tool"):  # fmt: skip
        t.mask_last_turn()
    if not step.done:
        t.messages += step.messages
        t.add_env(step.messages, after=toks[-1])


def _prompt_text(messages, tools, opts: EpisodeOptions) -> str:
    from glmstack.chat import render

    return render(messages, tools or None, style=opts.chat_style, enable_thinking=opts.thinking,
                  add_generation_prompt=True)  # fmt: skip
