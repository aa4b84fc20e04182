"""Encoded data kept between runs: the on-disk latent and text-embedding cache (``cache``, ``latent_cache``), the
fingerprint that keeps a cache to the settings and data it was made with (``fingerprint``) and the prompts whose
embeddings it holds (``cached_prompts``). ``dit_trainer.apps.precompute`` writes it."""
