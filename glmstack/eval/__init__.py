"""Evaluation: perplexity by position, HumanEval, HumanEval-infilling, BFCL and math, for a checkpoint or an
endpoint (`glmstack eval`, see cli.py and docs/eval.md).

    from glmstack.eval import loss_by_position, perplexity_by_position, position_buckets

The perplexity helpers are imported on first use, so endpoint evaluation does not load torch.
"""

__all__ = ["loss_by_position", "perplexity_by_position", "position_buckets"]


def __getattr__(name: str):
    if name in __all__:
        from glmstack.eval import perplexity

        return getattr(perplexity, name)
    raise AttributeError(f"module 'glmstack.eval' has no attribute {name!r}")
