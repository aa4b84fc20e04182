"""Conditioners built from a model family's own frozen encoders (``text_encoder.kind=sd3|flux|sana``), each giving
the ``Condition`` that family's pipeline computes from a prompt, so that an exported pipeline generates what our
sampler does. ``base`` holds what they share: the exact prompt memo and loading each encoder from a pipeline folder.
"""
