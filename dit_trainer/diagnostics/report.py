"""What the gradient-flow doctor hands back: findings with a code, the names involved, and a readable text."""

from __future__ import annotations

from dataclasses import dataclass, field

#: Every code a :class:`Finding` can carry, in the order the report lists them.
CODES = (
    "no_trainable_params",
    "loss_not_scalar",
    "grad_disabled",
    "reentrant_checkpoint",
    "detached",
    "unused_params",
    "nonfinite_grad",
)

# What ``loss.backward()`` says when nothing trainable reaches the loss; quoted so users can match their traceback.
NO_GRAD_FN_ERROR = "element 0 of tensors does not require grad and does not have a grad_fn"


@dataclass(frozen=True)
class Finding:
    """One cause of missing or bad gradients.

    ``names`` are the modules or parameters involved, spelled as ``named_modules()`` / ``named_parameters()``
    spell them (the root module is called by its class name), so they can be looked up programmatically.
    """

    code: str
    message: str
    names: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


@dataclass
class GradientReport:
    """The doctor's answer: ``ok`` when every trainable parameter got a finite gradient from one backward."""

    module_name: str
    findings: list[Finding] = field(default_factory=list)
    num_trainable: int = 0
    num_with_grad: int = 0
    loss_shape: tuple[int, ...] | None = None
    loss_has_graph: bool | None = None
    backward_error: str | None = None  # what loss.backward() raised, if it did; the findings then are partial

    @property
    def ok(self) -> bool:
        return not self.findings and self.backward_error is None

    @property
    def codes(self) -> list[str]:
        return [finding.code for finding in self.findings]

    def headline(self) -> str:
        received = f"{self.num_with_grad}/{self.num_trainable} trainable parameter tensors received gradients"
        if self.ok:
            return f"Gradient flow through {self.module_name}: OK ({received}, all finite)."
        count = len(self.findings)
        text = (
            f"Gradient flow through {self.module_name}: {count} problem{'s' if count != 1 else ''} found ({received})."
        )
        if self.backward_error is not None:
            text += f" loss.backward() raised '{self.backward_error}'; the findings below may be partial."
        if self.loss_has_graph is False and self.num_trainable:
            text += f" The loss has no grad_fn, so loss.backward() would raise '{NO_GRAD_FN_ERROR}'."
        return text

    def __str__(self) -> str:
        paragraphs = [self.headline()]
        # One line per paragraph: logs stay greppable for a name, and terminals wrap anyway.
        paragraphs += [str(finding) for finding in self.findings]
        return "\n\n".join(paragraphs)


def quote(names: list[str], limit: int = 6) -> str:
    """``a``, ``b`` and 3 more: names for a sentence, short enough to read."""
    shown = ", ".join(f"`{name}`" for name in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
