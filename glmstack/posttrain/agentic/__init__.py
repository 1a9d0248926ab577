"""Agentic RL (GLM-5 §3.3 / GLM-4.5 §3.3, research/rl-recipe.md §1.3): multi-turn tool environments and the
asynchronous rollout runner (local or on Ray), trained with direct double-sided importance sampling on the one loop.

env.py (the interface, fault injection, penalties, process rewards), envs/ (the environments), trajectory.py
(tokens in, tokens out), episode.py (a group of episodes on the engine), groups.py (failure rules, advantages,
staleness), worker.py (a rollout worker), runner.py (the scheduler; local and Ray pools), data.py (the loop's data),
stage.py (`glmstack agentic-rl <recipe>`). docs/agentic.md says how to run it and what was measured.
"""
