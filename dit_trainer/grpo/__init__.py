"""GRPO reward fine-tuning: rollouts of a stochastic sampler with exact log-probabilities, group advantages, and
the PPO-clipped policy update, plugged into the same training loop (checkpoints, resume, monitors, LoRA, DDP)."""
