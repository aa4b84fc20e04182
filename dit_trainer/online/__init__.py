"""What the online methods (those that train on their own rollouts: GRPO, DiffusionNFT) share, once: the prompt
sampler, the rewards of an epoch's images and their advantages within each prompt's group, and the frozen reference
policy of a KL penalty. Each method's folder holds only what is its own."""
