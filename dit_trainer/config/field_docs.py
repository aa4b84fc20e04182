"""Each schema field's description, read from the comments beside it in the source, and the config written out with
them: what ``python train.py --help`` shows (``${config_help:}`` in ``configs/train.yaml``'s help template).

The comments next to the dataclass fields (``schema.py``, ``grpo.py``) stay the one place a setting is explained: a
field gets the comment lines right above it and the comments on its own lines, read with ``ast`` (where each field
starts and ends) and ``tokenize`` (the comments), so that a field added with a comment is documented with no more
work. A section's description is the first paragraph of its class docstring.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import textwrap
import tokenize
import typing
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dit_trainer.config.fields import CHECK
from dit_trainer.config.schema import TrainConfig

WIDTH = 118  # the help's lines, comments included
DIRECTIVES = ("fmt:", "noqa", "type:")  # comments for tools, not readers


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """``{field: description}`` of the dataclass ``cls``: its comments (a field declared in a base dataclass, with
    the base's), then the rule its check holds it to (fields with neither are left out)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is not object and dataclasses.is_dataclass(klass):
            docs |= _commented_fields(klass)
    for spec in dataclasses.fields(cls):  # the rule of a field's check (`at_least`, `one_of`, ...) follows
        if CHECK in spec.metadata:
            rule = spec.metadata[CHECK].accepted().removeprefix("it ")
            docs[spec.name] = f"{docs[spec.name]}; {rule}" if spec.name in docs else rule
    return docs


def _commented_fields(cls: type) -> dict[str, str]:
    """The comments beside the fields ``cls`` itself declares."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    comments = {
        token.start[0]: token.string.lstrip("#").strip()
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT and not token.string.lstrip("# ").startswith(DIRECTIVES)
    }
    docs = {}
    for statement in typing.cast(ast.ClassDef, ast.parse(source).body[0]).body:
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
            continue
        above, line = [], statement.lineno - 1
        while line in comments and lines[line - 1].lstrip().startswith("#"):
            above.insert(0, comments[line])
            line -= 1
        own = [comments[n] for n in range(statement.lineno, (statement.end_lineno or statement.lineno) + 1)
               if n in comments]  # fmt: skip
        if above or own:
            docs[statement.target.id] = " ".join(above + own)
    return docs


def section_doc(cls: type) -> str | None:
    """The first paragraph of ``cls``'s docstring, on one line (None for a dataclass without one)."""
    doc = cls.__doc__ or ""
    if not doc or doc.startswith(f"{cls.__name__}("):  # the signature dataclasses writes in a missing docstring's place
        return None
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split()).replace("``", "`")


def _comment(text: str, pad: str) -> list[str]:
    return textwrap.wrap(text, WIDTH - len(pad) - 2, initial_indent=f"{pad}# ", subsequent_indent=f"{pad}# ")


def documented_yaml(values: Mapping[str, Any], cls: type | None = TrainConfig, indent: int = 0) -> str:
    """``values`` (a config as plain containers, a section of ``cls``) as YAML with each field's description: on its
    line when it fits there, else above it; each section's above the section."""
    docs, hints = (field_docs(cls), typing.get_type_hints(cls)) if cls is not None else ({}, {})
    pad, out = " " * indent, []
    for key, value in values.items():
        section = hints.get(key)
        if dataclasses.is_dataclass(section) and isinstance(value, Mapping):
            if indent == 0 and out:
                out.append("")
            out += _comment(doc, pad) if (doc := section_doc(section)) else []
            out += [f"{pad}{key}:", documented_yaml(value, section, indent + 2)]
            continue
        text = [f"{pad}{line}" for line in OmegaConf.to_yaml({key: value}).rstrip("\n").splitlines()]
        doc = docs.get(key)
        if doc and len(text) == 1 and len(f"{text[0]}  # {doc}") <= WIDTH:
            text[0] += f"  # {doc}"
        elif doc:
            text = _comment(doc, pad) + text
        out += text
    return "\n".join(out)


def config_help(*, _root_: DictConfig) -> str:
    """``${config_help:}``: the composed config (``_root_``, Hydra's settings left out) with its descriptions, for the
    help template (``$`` doubled: Hydra fills the template in with ``string.Template``)."""
    values = OmegaConf.to_container(_root_, resolve=False)
    return documented_yaml({key: value for key, value in values.items() if key != "hydra"}).replace("$", "$$")
