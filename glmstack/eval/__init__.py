"""Evaluation: perplexity by token position (more to come: HumanEval, BFCL, math).

from glmstack.eval import loss_by_position, perplexity_by_position
"""

from glmstack.eval.perplexity import loss_by_position, perplexity_by_position, position_buckets

__all__ = ["loss_by_position", "perplexity_by_position", "position_buckets"]
