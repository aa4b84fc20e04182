"""The gradient-flow doctor: run one forward/backward with hooks and explain why parameters get no gradient.

``RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn`` says *that* the graph is
missing, never *why*. The usual causes are a forward (or part of it) under ``torch.no_grad``/``inference_mode``, a
``.detach()`` or numpy round trip, re-entrant checkpointing over inputs that need no grad, or parameters that are
simply unused. Folklore blames ``eval()``; it cuts nothing (frozen means ``requires_grad=False``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from dit_trainer.sharding import reshard

from . import _messages as say
from ._trace import Call, Recorder, preserved_state
from .report import Finding, GradientReport


def diagnose_gradient_flow(module: nn.Module, compute_loss: Callable[[], torch.Tensor]) -> GradientReport:
    """Call ``compute_loss()`` and back-propagate once, then report what kept gradient from ``module``'s parameters.

    Nothing is left behind: parameters' ``.grad``, buffers (e.g. BatchNorm running statistics), train/eval
    modes and the torch/CUDA/Python/NumPy RNG states are restored, and warnings other than the checkpoint one
    this diagnoses are re-emitted. Side effects outside ``module`` (hooks on parameters that step an optimizer,
    counters in ``compute_loss``) are not undone. ``compute_loss`` runs with grad mode enabled.
    """
    root = type(module).__name__
    # An FSDP2 unit left gathered (the root stays so after a forward without backward, e.g. a no_grad sampling pass)
    # registers whole plain tensors, but backward reduces the gradient into its sharded parameters and frees the
    # whole ones' gradients: resharded, the parameters read (and cleared, and restored) here are those that keep it.
    reshard(module)
    names: dict[int, str] = {}
    for name, sub in module.named_modules():
        names.setdefault(id(sub), name or root)
    trainable = {name: p for name, p in module.named_parameters() if p.requires_grad}
    if not trainable:
        return GradientReport(root, [say.no_trainable_params(root)])

    recorder = Recorder(module, names, {id(p): name for name, p in trainable.items()})
    try:
        return _diagnose(module, compute_loss, trainable, recorder, GradientReport(root, num_trainable=len(trainable)))
    finally:
        recorder.release()


def _diagnose(
    module: nn.Module,
    compute_loss: Callable[[], torch.Tensor],
    trainable: dict[str, nn.Parameter],
    recorder: Recorder,
    report: GradientReport,
) -> GradientReport:
    """The recorded forward and backward, and the report on them."""
    root = report.module_name
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with preserved_state(module), recorder, torch.enable_grad():
            try:
                loss = compute_loss()
            except RuntimeError as err:
                if "Inference tensors cannot be saved for backward" not in str(err):
                    raise
                report.findings = [say.inference_tensors(recorder.calls, root, err)]
                loss = None
            if loss is not None:
                _check_loss(loss, report)
                if loss.numel() != 1:
                    loss = loss.float().mean()
                if loss.requires_grad:
                    recorder.phase = "backward"
                    try:
                        loss.backward()
                    except torch.cuda.OutOfMemoryError:  # torch.OutOfMemoryError only from 2.5
                        raise
                    except RuntimeError as err:  # e.g. a re-entrant checkpoint whose re-run output has no graph
                        report.backward_error = str(err).splitlines()[0]
                received = {name: p.grad is not None for name, p in trainable.items()}
                nonfinite = [n for n, p in trainable.items() if p.grad is not None and not p.grad.isfinite().all()]
    warned = any(say.CHECKPOINT_WARNING in str(w.message) for w in caught)
    for w in caught:
        if say.CHECKPOINT_WARNING not in str(w.message):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    if loss is None:  # the forward itself failed; its finding says why
        return report

    report.num_with_grad = sum(received.values())
    starved = [name for name, got in received.items() if not got]
    report.findings += _explain_starved(starved, module, recorder, warned, bool(report.loss_has_graph))
    if nonfinite:
        report.findings.append(say.nonfinite_grad(nonfinite))
    return report


def _check_loss(loss: Any, report: GradientReport) -> None:
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"compute_loss() must return a Tensor, got {type(loss).__name__}")
    report.loss_shape = tuple(loss.shape)
    report.loss_has_graph = loss.requires_grad
    if loss.numel() != 1:
        report.findings.append(say.loss_not_scalar(loss))


def _explain_starved(
    starved: list[str],
    module: nn.Module,
    recorder: Recorder,
    warned: bool,
    has_graph: bool,
) -> list[Finding]:
    """Sort the parameters that got no gradient by cause; each cause becomes one finding."""
    modules = dict(module.named_modules())
    forward = [c for c in recorder.calls if c.phase == "forward"]
    rerun_calls = [c for c in recorder.calls if c.phase == "backward"]
    rerun = {id(c.module) for c in rerun_calls}
    islands = [c for c in forward if c.island is c]
    unreached = [c for c in forward if c.island is None and c.out_requires_grad and not c.reached]
    graphs: dict[Call, set[str]] = {}

    def healthy_checkpoint(island: Call) -> bool:
        if id(island.module) in rerun:  # a working re-entrant checkpoint re-runs its forward during backward
            return True
        needs_grad = island.checkpoint_inputs_require_grad
        return needs_grad is True or (needs_grad is None and not warned)

    grad_off: dict[Call, list[str]] = {}
    cuts: dict[tuple[Call, str], list[str]] = {}
    unused: list[tuple[str, str]] = []
    for pname in starved:
        owner = modules.get(pname.rpartition(".")[0])
        own_calls = [c for c in forward if c.module is owner]
        normal = [c for c in own_calls if c.island is None]
        island = next((c.island for c in own_calls if c.island is not None), None)
        if not own_calls:  # it never ran itself: was it inside a module that ran with grad mode off?
            island = next((i for i in islands if i.module is module or pname.startswith(i.name + ".")), None)
        # Its own forward ran ops with grad mode off (a decorator or a no_grad block), and never used it with grad on.
        switched_off = next((c for c in normal if c.ops_grad_off and pname not in recorder.touched), None)
        # The latest module output whose graph holds this parameter but that backward never reached.
        cut = max((c for c in unreached if pname in _graph_params(c, graphs, recorder)), key=_end, default=None)

        if island is not None and not normal:
            if not (island.checkpoint and healthy_checkpoint(island)):
                grad_off.setdefault(_outermost(island), []).append(pname)
            elif (off := _grad_off_in(owner, rerun_calls)) is not None:  # seen when the checkpoint re-ran
                grad_off.setdefault(off, []).append(pname)
            else:
                unused.append((pname, CHECKPOINTED))
        elif switched_off is not None:
            grad_off.setdefault(switched_off, []).append(pname)
        elif cut is not None:
            cutter = _grad_off_after(cut, recorder.calls)
            if cutter is not None:  # a module run with grad mode off on inputs that need grad cut the graph
                grad_off.setdefault(cutter, []).append(pname)
            else:
                cuts.setdefault((cut, "after"), []).append(pname)
        elif not own_calls:
            unused.append((pname, "its module never ran"))
        elif pname in recorder.touched or any(c.inputs_require_grad and not c.out_requires_grad for c in normal):
            cuts.setdefault((normal[-1], "inside"), []).append(pname)  # used, but no graph left its module
        else:
            unused.append((pname, "its module ran, but its forward never uses it"))

    findings = []
    if nograd := {i: p for i, p in grad_off.items() if not i.checkpoint}:
        findings.append(say.grad_disabled(nograd))
    if ckpt := {i: p for i, p in grad_off.items() if i.checkpoint}:
        findings.append(say.reentrant_checkpoint(ckpt, warned))
    if cuts:
        findings.append(say.detached(cuts))
    if unused:
        findings.append(say.unused_params(unused, has_graph))
    return findings


CHECKPOINTED = (
    "it sits in a re-entrant checkpoint, whose inner graph is rebuilt during backward: unused there, or the block's "
    "output never reached the loss, or cut inside the block; diagnose with use_reentrant=False to tell which"
)


def _end(call: Call) -> int:
    return call.end


def _graph_params(call: Call, cache: dict[Call, set[str]], recorder: Recorder) -> set[str]:
    """Names of the trainable parameters that backward from ``call``'s outputs would reach."""
    if call not in cache:
        found: set[str] = set()
        seen: set[Any] = set()
        stack = list(call.graph_roots)
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if isinstance(node, torch.Tensor):  # a leaf returned as is
                found.add(recorder.param_names.get(id(node), ""))
            elif (variable := getattr(node, "variable", None)) is not None:  # AccumulateGrad
                found.add(recorder.param_names.get(id(variable), ""))
            else:
                stack.extend(next_node for next_node, _ in getattr(node, "next_functions", ()))
        cache[call] = found
    return cache[call]


def _grad_off_in(owner: nn.Module | None, calls: list[Call]) -> Call | None:
    """The call of ``owner`` (or the module around it) that ran with grad mode off, if any."""
    for call in calls:
        if call.module is owner and call.island is not None:
            return _outermost(call.island)
        if call.module is owner and call.ops_grad_off:
            return call
    return None


def _grad_off_after(cut: Call, calls: list[Call]) -> Call | None:
    """A module that ran with grad mode off on inputs that need grad after ``cut``: it, not a detach, cut the graph.

    ``calls`` include re-entrant checkpoints' re-runs during backward, where a no_grad block inside shows up.
    """
    for call in calls:
        if call.start < cut.end or not call.inputs_require_grad:
            continue
        if call.island is call and not call.checkpoint:  # called with grad mode off
            return _outermost(call)
        if call.island is None and call.ops_grad_off and not call.reached:  # switched it off inside its forward
            return call
    parent = cut.parent
    return parent if parent is not None and parent.island is None and parent.ops_grad_off else None


def _outermost(island: Call) -> Call:
    """Climb to the caller when every module it called ran with grad mode off: the switch is in *its* forward."""
    while (
        (parent := island.parent) is not None
        and parent.island is None
        and not parent.ops_grad_on
        and all(c.island is c and not c.checkpoint for c in parent.children)
    ):
        island = parent
    return island
