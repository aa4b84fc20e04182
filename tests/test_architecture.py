"""The shape of the package, checked from its source: imports flow one way (no cycle, counting imports inside
functions and under TYPE_CHECKING), ``config/`` is the ground, registries name their entries without importing
torch, every entry is of its registry's kind, a method's config section is read by its own modules only, and no
file grows past 400 lines."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

from .conftest import REPO, run_script

PACKAGE = REPO / "dit_trainer"
REGISTRIES = {
    "dit_trainer.components.families:FAMILIES": "dit_trainer.components.families.base:Family",
    "dit_trainer.components:VAE_KINDS": "dit_trainer.components.kinds:VAEKind",
    "dit_trainer.components:CONDITIONER_KINDS": "dit_trainer.components.kinds:ConditionerKind",
    "dit_trainer.data:SOURCES": "dit_trainer.data.sources.source:Source",
    "dit_trainer.diffusion:OBJECTIVES": "dit_trainer.diffusion.schedule:NoiseSchedule",
    "dit_trainer.rewards:REWARDS": "dit_trainer.rewards.base:Reward",
    "dit_trainer.methods:METHODS": "dit_trainer.methods.base:Method",
}


def _object(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imported_modules(path: Path) -> set[str]:
    """Every module of the package that ``path`` imports anywhere: at the top, inside functions, under
    TYPE_CHECKING. ``from package import name`` counts as importing ``package.name`` when that is a module."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names}
    return {module for module in found if module in MODULES and module != name}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (as the list of its modules), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_import_graph_has_no_cycle():
    graph = {name: imported_modules(path) for name, path in MODULES.items()}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_config_imports_nothing_of_the_package_but_errors():
    for name, path in MODULES.items():
        if name.startswith("dit_trainer.config"):
            outside = {m for m in imported_modules(path) if not m.startswith("dit_trainer.config")}
            assert outside <= {"dit_trainer.errors"}, f"{name} imports {sorted(outside)}"


def test_the_data_imports_nothing_of_the_models():
    """The data knows images, captions and batches; what the models require of them (the sizes a latent cuts into
    whole patches) is handed in by the composition root (``components.geometry``), not asked for."""
    for name, path in MODULES.items():
        if name.startswith("dit_trainer.data"):
            models = sorted(m for m in imported_modules(path) if m.startswith("dit_trainer.components"))
            assert not models, f"{name} imports {models}"


# Modules that take the whole run config where a section would do (issue 42's goal: only the loader, the checks,
# the composition root and the scripts' entry points). The ceiling only goes down: lower it when a module stops.
ROOT_CONFIG_READERS_AT_MOST = 9
# The parts a config names (families, conditioners, methods, sources, rewards, objectives): each reads the sections its
# hooks' parameters name (`config.call_with_sections`), never the whole run config.
PARTS = ("dit_trainer.components.families.", "dit_trainer.components.conditioners.", "dit_trainer.methods.",
         "dit_trainer.grpo.", "dit_trainer.nft.", "dit_trainer.online.", "dit_trainer.data.", "dit_trainer.rewards.",
         "dit_trainer.diffusion.")  # fmt: skip


def _root_config_readers() -> list[str]:
    return sorted(
        name for name, path in MODULES.items()
        if not name.startswith("dit_trainer.config") and "TrainConfig" in path.read_text(encoding="utf-8")
    )  # fmt: skip


def test_the_whole_run_config_reaches_no_more_modules():
    readers = _root_config_readers()
    assert len(readers) <= ROOT_CONFIG_READERS_AT_MOST, f"{len(readers)} modules name TrainConfig: {readers}"


def test_the_parts_read_only_the_sections_they_name():
    readers = [name for name in _root_config_readers() if name.startswith(PARTS)]
    assert not readers, f"these parts name the whole run config: {readers}"


def test_config_and_the_registries_load_without_torch():
    """The schema, the loader's field checks and every registry's names, with neither torch nor diffusers."""
    code = (
        "import sys, importlib\n"
        "import dit_trainer.config, dit_trainer.run_config\n"
        f"names = [list(getattr(importlib.import_module(m), n)) for m, n in "
        f"{[path.split(':') for path in REGISTRIES] + [['dit_trainer.diffusion', 'SAMPLERS']]!r}]\n"
        "assert all(names), names\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'diffusers', 'transformers')))\n"
    )
    result = run_script(["-c", code], timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr


@pytest.mark.parametrize("registry", sorted(REGISTRIES))
def test_every_registry_entry_is_of_its_kind(registry):
    registry_object, kind = _object(registry), _object(REGISTRIES[registry])
    for name in registry_object:
        entry = registry_object.get(name)
        assert isinstance(entry, kind) or (inspect.isclass(entry) and issubclass(entry, kind)), (name, entry)


def test_each_sampler_belongs_to_the_schedule_family_that_offers_it():
    from dit_trainer.diffusion import OBJECTIVES, SAMPLERS

    families = {OBJECTIVES.get(name) for name in OBJECTIVES}
    offered = {sampler: family for family in families for sampler in family.samplers}
    assert {name: SAMPLERS.get(name) for name in SAMPLERS} == offered


def reads_section(source: str, section: str) -> bool:
    """Whether ``source`` reads the top-level config section ``section`` (``cfg.grpo``, ``recorded.grpo.beta``),
    as opposed to a monitor's section of the same name (``cfg.monitor.grpo``)."""
    return any(
        isinstance(node, ast.Attribute)
        and node.attr == section
        and not (isinstance(node.value, ast.Attribute) and node.value.attr == "monitor")
        for node in ast.walk(ast.parse(source))
    )


def test_the_section_reader_finds_a_read_and_only_a_read():
    assert reads_section("beta = cfg.grpo.beta", "grpo") and reads_section("g = structured.grpo", "grpo")
    assert not reads_section("m = cfg.monitor.grpo.enabled\nfrom dit_trainer.grpo.loss import x", "grpo")


def test_no_module_outside_a_method_reads_its_config_section():
    """A method owns its section: its checks, defaults and reports are its own modules', so a second method never
    adds a branch elsewhere. (``config/`` declares the sections, and reads their renamed keys.)"""
    from dit_trainer.methods import METHODS

    for name in METHODS:
        method = METHODS.get(name)
        if method.section is None:
            continue
        owner = type(method).__module__.rpartition(".")[0]  # the method's folder
        readers = {m for m, path in MODULES.items() if reads_section(path.read_text(encoding="utf-8"), method.section)}
        outside = sorted(m for m in readers if not m.startswith((f"{owner}.", "dit_trainer.config.")))
        assert not outside, f"`{method.section}` ({name}'s section) is read outside {owner}: {outside}"


def test_no_file_is_longer_than_400_lines():
    files = [*PACKAGE.rglob("*.py"), *(REPO / "scripts").rglob("*.py"), REPO / "train.py"]
    long = {str(path.relative_to(REPO)): n for path in files if (n := len(path.read_text().splitlines())) > 400}
    assert not long, long
