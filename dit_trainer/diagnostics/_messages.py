"""The doctor's words: one paragraph per finding that says what happened, where, and how to fix it."""

from __future__ import annotations

import torch

from ._trace import Call
from .report import NO_GRAD_FN_ERROR, Finding, quote

# torch/utils/checkpoint.py, check_backward_validity(): the re-entrant variant's only complaint.
CHECKPOINT_WARNING = "None of the inputs have requires_grad=True"


def no_trainable_params(root: str) -> Finding:
    message = (
        f"No parameter of `{root}` requires grad, so there is nothing to train and loss.backward() would raise "
        f"'{NO_GRAD_FN_ERROR}'. Frozen means requires_grad=False, and the whole module is frozen (eval() alone "
        "freezes nothing: it only switches dropout/normalisation behaviour). Unfreeze what you mean to train with "
        "`.requires_grad_(True)` (or add LoRA adapters) and hand those parameters to the optimizer."
    )
    return Finding("no_trainable_params", message, [root])


def loss_not_scalar(loss: torch.Tensor) -> Finding:
    message = (
        f"compute_loss() returned a loss of shape {tuple(loss.shape)}, but backward() needs a scalar. Reduce the "
        "per-sample loss, e.g. `loss.mean()` (or the weighted mean), or, with a DP wrapper that clips per sample "
        "(Opacus), hand it the (B,) per-sample loss instead of calling backward() yourself. The rest of this report "
        "back-propagated loss.mean()."
    )
    return Finding("loss_not_scalar", message, [])


def _where(call: Call) -> str:
    return f"the forward of `{call.parent.name}`" if call.parent is not None else "compute_loss()"


def grad_disabled(islands: dict[Call, list[str]]) -> Finding:
    parts = []
    for island, params in islands.items():
        inference = island.inference_mode or island.ops_inference or any(c.inference_mode for c in island.children)
        mode = "torch.inference_mode()" if inference else "torch.no_grad()"
        if island.grad_enabled:
            where = f"Gradient mode was switched off inside the forward of `{island.name}` ({mode} or a decorator)"
        elif island.parent is None:
            where = f"`{island.name}` was called with gradient mode off ({mode} around the call in compute_loss())"
        else:
            where = f"`{island.name}` was called with gradient mode off ({mode}) from {_where(island)}"
        parts.append(
            f"{where}, so the graph stops there and {len(params)} trainable parameter tensor(s) get no "
            f"gradient ({quote(params, 3)})."
        )
    message = " ".join(parts) + (
        " Remove the no_grad/inference_mode block, the @torch.no_grad() decorator on forward or the "
        "set_grad_enabled(False) around it. Keep no_grad for frozen parts only, and freeze with "
        "requires_grad_(False) (eval() neither freezes nor cuts the graph)."
    )
    return Finding("grad_disabled", message, [island.name for island in islands])


def reentrant_checkpoint(islands: dict[Call, list[str]], warned: bool) -> Finding:
    params = [p for ps in islands.values() for p in ps]
    heard = f" (torch warned: '{CHECKPOINT_WARNING}. Gradients will be None')" if warned else ""
    message = (
        f"{quote([i.name for i in islands])} ran inside torch.utils.checkpoint.checkpoint(..., use_reentrant=True) "
        f"whose tensor inputs do not require grad{heard}. The re-entrant variant back-propagates only into its "
        f"inputs, so the {len(params)} trainable parameter tensor(s) inside get no gradient ({quote(params, 3)}): "
        "the classic LoRA-on-a-frozen-embedding trap. Pass use_reentrant=False (what diffusers' "
        "enable_gradient_checkpointing() does), or make the checkpoint's inputs require grad, e.g. "
        "`inputs.requires_grad_(True)` on the frozen embedding's output, or peft/transformers' "
        "`model.enable_input_require_grads()`."
    )
    return Finding("reentrant_checkpoint", message, [island.name for island in islands])


def detached(cuts: dict[tuple[Call, str], list[str]]) -> Finding:
    parts = []
    for (cut, kind), params in cuts.items():
        if kind == "after":
            what = (
                f"The output of `{cut.name}` still had a grad_fn, but no gradient came back to it: the graph is cut "
                f"after it returns, in {_where(cut)}"
            )
        else:
            what = f"The graph is cut inside the forward of `{cut.name}` (its parameters or values are detached there)"
        parts.append(f"{what}; {len(params)} trainable parameter tensor(s) get nothing ({quote(params, 3)}).")
    message = " ".join(parts) + (
        " Look for .detach(), .data, .item()/.tolist() and .numpy() → torch.from_numpy/torch.tensor round trips, "
        "and keep the computation in torch. To freeze a part on purpose, use requires_grad_(False) instead."
    )
    return Finding("detached", message, list(dict.fromkeys(cut.name for cut, _ in cuts)))


def unused_params(unused: list[tuple[str, str]], has_graph: bool) -> Finding:
    reasons: dict[str, list[str]] = {}
    for pname, reason in unused:
        reasons.setdefault(reason, []).append(pname)
    head = "although the loss has a graph" if has_graph else "(the loss has no graph at all)"
    message = f"{len(unused)} trainable parameter tensor(s) received no gradient {head}: "
    message += "; ".join(f"{quote(ps)} ({reason})" for reason, ps in reasons.items())
    message += (
        ". Use them, delete them, or freeze them with requires_grad_(False): weight decay still moves them, and DDP "
        "needs find_unused_parameters=True otherwise."
    )
    return Finding("unused_params", message, [p for p, _ in unused])


def nonfinite_grad(names: list[str]) -> Finding:
    message = (
        f"{len(names)} parameter tensor(s) got NaN/inf gradients ({quote(names)}). Look for NaN/inf in the loss or "
        "inputs (log/sqrt/division near 0, fp16 overflow: prefer bf16 or a GradScaler), lower the learning rate, "
        "and clip gradients."
    )
    return Finding("nonfinite_grad", message, names)


def inference_tensors(calls: list[Call], root: str, err: RuntimeError) -> Finding:
    inference = [c for c in calls if c.island is c and c.inference_mode]
    fed = [c for c in calls if c.grad_enabled and c.inference_inputs]
    names = [c.name for c in inference] or [c.name for c in fed[:1]] or [root]
    message = (
        f"The forward failed with '{str(err).splitlines()[0]}': {quote(names)} ran under torch.inference_mode() (or "
        "was fed its outputs), and inference tensors can never join a graph. Use torch.no_grad() for frozen parts "
        "whose outputs feed trainable modules (or .clone() those outputs), and never wrap the trained part."
    )
    return Finding("grad_disabled", message, names)
