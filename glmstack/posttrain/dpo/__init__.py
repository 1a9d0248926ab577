"""Direct Preference Optimization (`glmstack dpo`): loss.py (the objective on sequence log-probs), data.py (preference
pairs with assistant-only masks), reference.py (the frozen reference and its log-probs), stage.py (the stage on the
one loop). ChatGLM-RLHF (the GLM-4 report) aligned the family with PPO and DPO on human preferences."""
