"""Regional compilation (``trainer.compile``, ``components/compile.py``): every family's repeated blocks are found
through the family, compiled in place (same modules, same state-dict keys, a deep copy runs its own weights), and a
compiled shapes run trains as the eager one does, with one graph for every block."""

import copy
import dataclasses

import pytest
import torch
import torch._inductor.config
from torch._dynamo.utils import counters

from dit_trainer.assemble import build_trainer
from dit_trainer.components.compile import apply_compile, compile_blocks
from dit_trainer.errors import ConfigError

from ..conftest import QUIET, TINY_SHAPES, compose_config, one_paragraph, read_metrics

# family -> the width of its condition
FAMILIES = {
    "pixart_alpha": 12,
    "dit": 10,
    "sd3": 12,
    "flux": 12,
    "sana": 12,
    "z_image": 12,
    "qwen_image": 12,
    "flux2": 12,
    "wan": 12,
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_familys_blocks_are_found(family, tiny_transformer):
    dit = tiny_transformer(family, condition_dim=FAMILIES[family], pooled_dim=12 if family in ("sd3", "flux") else None)
    blocks = dit.blocks()
    config = dit.transformer.config
    if family == "z_image":  # a refiner stack per stream, then the joint blocks
        assert len(blocks) == 2 * config.n_refiner_layers + config.n_layers
    else:
        assert len(blocks) == config.num_layers + config.get("num_single_layers", 0)
    assert len({type(block) for block in blocks}) == (2 if family in ("flux", "flux2") else 1)


def test_compiled_blocks_keep_their_names_and_a_copy_runs_its_own_weights(tiny_transformer):
    """GRPO's frozen KL reference is a deep copy of the compiled DiT: its blocks must call their own weights."""
    dit = tiny_transformer()
    keys = list(dit.state_dict())
    assert compile_blocks(dit) == 2  # lazy: nothing compiles until a forward
    reference = copy.deepcopy(dit)
    assert list(dit.state_dict()) == keys
    for original, copied in zip(dit.blocks(), reference.blocks()):
        assert original.forward.__self__ is original and copied.forward.__self__ is copied
        assert original.forward.__func__ is copied.forward.__func__  # one compiled function, one graph cache


def _losses(run_dir, *overrides: str) -> list[float]:
    build_trainer(compose_config([*TINY_SHAPES, *QUIET, "data.length=64", "trainer.max_steps=4", *overrides]),
                  run_dir).fit()  # fmt: skip
    return [record["loss"] for record in read_metrics(run_dir)]


@pytest.mark.slow
def test_a_compiled_run_trains_as_the_eager_one(tmp_path, monkeypatch):
    """Measured on 2 shared cores: 72 s (59 s of CPU time), nearly all inductor compiling the training graph and the
    final sample grid's no-grad one; largest loss difference 0 over these 4 steps, 2.4e-7 over 6. Two graphs in
    all: the blocks share one, and the first block (given the patch embedding's transposed output) adds none."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    counters.clear()
    # no pool of compile workers on 2 cores, by the config's own patch (monkeypatch's undo deleted the setting, and
    # the next compile in this process failed: "torch._inductor.config.compile_threads does not exist")
    try:
        with torch._inductor.config.patch(compile_threads=1):
            eager = _losses(tmp_path / "eager")
            compiled = _losses(tmp_path / "compiled", "trainer.compile=true")
        graphs = counters["stats"]["unique_graphs"]
    finally:
        torch._dynamo.reset()
    assert len(eager) == 4 and max(abs(a - b) for a, b in zip(eager, compiled)) < 1e-5
    assert graphs == 2  # training, and the final sample grid's no-grad sampling


def test_compile_is_refused_for_a_model_without_the_blocks_its_family_names(tiny_transformer):
    dit = tiny_transformer()
    dit.family = dataclasses.replace(dit.family, blocks=("no_such_blocks",))
    with pytest.raises(ConfigError) as caught:
        apply_compile(dit, enabled=True, bucketed=False)
    assert "no_such_blocks" in one_paragraph(caught.value, "trainer.compile")
