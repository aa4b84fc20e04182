"""DiffusionNFT reward fine-tuning (``trainer.method=nft``): rollouts of the old policy with a deterministic sampler,
rewards turned into optimality probabilities, and the denoising loss of the implicit positive and negative policies
on fresh noise, plugged into the same training loop (checkpoints, resume, monitors, LoRA, DDP)."""
