"""Reinforcement learning after SFT (GLM-5 §3.2–3.5): objectives in losses.py."""
