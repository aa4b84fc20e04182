"""What every text conditioner shares (``components/conditioners/base.py``): prompts tokenized to a fixed length,
and a caption cut to it warned of once (the shapes recipe reads 8 tokens: a user's long captions lost the rest
silently)."""

from transformers import AutoTokenizer

from dit_trainer.components.conditioners import base
from dit_trainer.components.conditioners.base import tokenize

LONG = "a red circle on a grey background beside a blue square"


def test_a_caption_cut_to_max_length_is_warned_of_once(minilm_path, caplog, monkeypatch):
    monkeypatch.setattr(base, "_CUT_WARNED", set())
    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    fitting = tokenize(tokenizer, ["a red circle", "a big blue square on grey"], 8)
    assert fitting["attention_mask"][1].all() and "is cut" not in caplog.text  # the second fills all 8 tokens
    assert tokenize(tokenizer, ["a red circle", LONG], 8)["input_ids"].shape == (2, 8)
    assert caplog.text.count("is cut to its first 8 by BertTokenizer") == 1 and repr(LONG) in caplog.text
    tokenize(tokenizer, [LONG], 8)
    assert caplog.text.count("is cut") == 1
