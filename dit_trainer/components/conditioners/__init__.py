"""What a DiT is conditioned on, one module per kind ``conditioner.kind`` names: a transformers text encoder
(``text_encoder``: T5, MiniLM, ...), class labels (``class_labels``), and the conditioners built from a model family's
own frozen encoders (``sd3``, ``flux``, ``sana``), each giving the ``Condition`` that family's pipeline computes from
a prompt, so that an exported pipeline generates what our sampler does. ``base`` holds what they share: the exact
prompt memo and loading each encoder from a pipeline folder.
"""
