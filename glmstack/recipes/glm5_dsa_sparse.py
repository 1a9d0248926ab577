"""GLM-5 DSA sparse adaptation as a `midtrain` stage: `glmstack midtrain glm5_dsa_sparse` (see glm5_dsa.py)."""

from glmstack.recipes.glm5_dsa import sparse as midtrain

__all__ = ["midtrain"]
