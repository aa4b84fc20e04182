"""Record one forward/backward through module hooks, and put the module back exactly as it was afterwards."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils.checkpoint import CheckpointFunction

# The frame that opens a re-entrant checkpoint: it runs the wrapped function under torch.no_grad().
_REENTRANT_FORWARD = getattr(getattr(CheckpointFunction, "forward", None), "__code__", None)
_MAX_TENSORS = 64  # per call; module outputs with whole hidden-state stacks need not all be hooked


def iter_tensors(obj: Any, depth: int = 4) -> Iterator[torch.Tensor]:
    """Tensors inside nested tuples, lists and dicts (diffusers' ``BaseOutput`` is a dict)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth > 0 and isinstance(obj, dict):
        for value in obj.values():
            yield from iter_tensors(value, depth - 1)
    elif depth > 0 and isinstance(obj, (list, tuple)):
        for value in obj:
            yield from iter_tensors(value, depth - 1)


@dataclass(eq=False)
class Call:
    """One call of one module: the grad mode it saw, and whether backward reached its output."""

    module: nn.Module
    name: str
    start: int
    parent: Call | None
    phase: str  # "forward", or "backward" for checkpoint recomputation (no tensor hooks then)
    grad_enabled: bool
    inference_mode: bool
    inputs_require_grad: bool
    inference_inputs: bool
    # The outermost call of a stretch that ran with grad mode off (this call or an ancestor), if any.
    island: Call | None = None
    # Set on islands opened by a re-entrant checkpoint: whether that checkpoint's tensor inputs require grad.
    checkpoint: bool = False
    checkpoint_inputs_require_grad: bool | None = None
    # Whether this module's own code (not its children's) ran torch ops with grad mode off / on: a
    # @torch.no_grad() decorator or a no_grad block inside a leaf's forward is invisible to forward pre-hooks.
    ops_grad_off: bool = False
    ops_grad_on: bool = False
    ops_inference: bool = False
    end: int = -1
    out_requires_grad: bool = False
    reached: bool = False
    # Where backward would start from this call's outputs: their grad_fn nodes, or leaf tensors themselves.
    graph_roots: list[Any] = field(default_factory=list)
    children: list[Call] = field(default_factory=list)


class Recorder:
    """Forward hooks on every submodule that build a call tree, and tensor hooks that see what backward reached."""

    def __init__(self, module: nn.Module, names: dict[int, str], param_names: dict[int, str]) -> None:
        self.module, self.names, self.param_names = module, names, param_names
        # A wrapper may register other parameter objects for the forward than those named before it (FSDP2 gathers
        # its slices into whole tensors): each call learns the ones its module holds then, by name.
        self._trainable = set(param_names.values())
        self._prefixes = {id(sub): f"{name}." if name else "" for name, sub in module.named_modules()}
        self._forward_params: list[nn.Parameter] = []  # alive, so their ids stay theirs
        self.touched: set[str] = set()  # trainable parameters some op used with grad mode on
        self.phase = "forward"
        self.calls: list[Call] = []
        self._stack: list[Call] = []
        self._handles: list[Any] = []
        self._tensor_hooks: list[Any] = []  # on the outputs' graph: removed by ``release``
        self._clock = 0
        self._busy = False  # inside a module's hooks: their tensor calls are not the module's ops
        self._rerun_probes: dict[Call, _GradModeProbe] = {}

    def __enter__(self) -> Recorder:
        for sub in self.module.modules():
            # Around every hook of the module, not only ours: others' ops (FSDP2 gathers and frees the parameters
            # with grad mode off) would otherwise count as its parent's code switching grad mode off.
            self._handles += [
                sub.register_forward_pre_hook(self._hooks_begin, prepend=True),
                sub.register_forward_pre_hook(self._pre_hook, with_kwargs=True),
                sub.register_forward_hook(self._post_hook, prepend=True, always_call=True),
                sub.register_forward_hook(self._hooks_end, always_call=True),
            ]
        self._probe = _GradModeProbe(self)
        self._probe.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._probe.__exit__(*exc)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._busy = False

    def release(self) -> None:
        """Drop what the recording holds once it has been read. A call's tensor hook lives on a graph node and
        holds the call, and the call holds that node and its module: a cycle through autograd's C++ nodes, which
        the garbage collector cannot see, so without this the diagnosed model (a whole DiT on the GPU) outlived
        the trainer that ran the check."""
        for handle in self._tensor_hooks:
            handle.remove()
        self._tensor_hooks.clear()
        for call in self.calls:
            call.graph_roots.clear()
        self.calls.clear()
        self._stack.clear()
        self._forward_params.clear()
        self._rerun_probes.clear()

    def saw_op(self, func: Any, args: tuple, kwargs: dict | None) -> None:
        """Called for every torch function during the forward: note grad mode and which parameters it touched."""
        name = getattr(func, "__name__", "")
        if self._busy or name == "_set_grad_enabled":
            return
        forward = self.phase == "forward"
        if name in ("__get__", "__set__"):  # attribute access is not computation, except `.data`
            if forward and name == "__get__" and getattr(getattr(func, "__self__", None), "__name__", "") == "data":
                self._touch(args)
            return
        if forward and torch.is_grad_enabled():
            self._touch((*args, *(kwargs or {}).values()))
        if not self._stack:
            return
        if torch.is_grad_enabled():
            self._stack[-1].ops_grad_on = True
        else:
            self._stack[-1].ops_grad_off = True
            self._stack[-1].ops_inference |= torch.is_inference_mode_enabled()

    def _touch(self, args: tuple) -> None:
        for arg in args:
            for item in arg if isinstance(arg, (list, tuple)) else (arg,):
                if isinstance(item, nn.Parameter) and id(item) in self.param_names and torch.is_grad_enabled():
                    self.touched.add(self.param_names[id(item)])

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _hooks_begin(self, module: nn.Module, args: tuple) -> None:
        self._busy = True

    def _pre_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """The module's last pre-hook: its own code starts after it."""
        try:
            self._enter(module, args, kwargs)
        finally:
            self._busy = False

    def _post_hook(self, module: nn.Module, args: tuple, output: Any) -> None:
        """The module's first post-hook: its own code ended before it."""
        self._busy = True
        self._leave(module, output)

    def _hooks_end(self, module: nn.Module, args: tuple, output: Any) -> None:
        self._busy = False

    def _enter(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._learn_parameters(module)
        parent = self._stack[-1] if self._stack else None
        inputs = list(iter_tensors((args, kwargs)))
        grad_enabled = torch.is_grad_enabled()
        call = Call(
            module=module,
            name=self.names.get(id(module), type(module).__name__),
            start=self._tick(),
            parent=parent,
            phase=self.phase,
            grad_enabled=grad_enabled,
            inference_mode=torch.is_inference_mode_enabled(),
            inputs_require_grad=any(t.requires_grad for t in inputs),
            inference_inputs=any(t.is_inference() for t in inputs),
        )
        # Outside any recorded module the grad mode is the one the doctor set: enabled.
        parent_enabled = parent.grad_enabled if parent is not None else True
        if parent is not None and parent.island is not None:
            call.island = parent.island
        elif not grad_enabled and parent_enabled:
            call.island = call
            call.checkpoint, call.checkpoint_inputs_require_grad = _reentrant_checkpoint_inputs()
        if parent is not None:
            parent.children.append(call)
        elif self.phase == "backward":
            # A re-entrant checkpoint re-runs its forward inside the autograd engine, where torch-function
            # modes entered before backward() are not active: watch this re-run with a probe of its own.
            self._rerun_probes[call] = probe = _GradModeProbe(self)
            probe.__enter__()
        self.calls.append(call)
        self._stack.append(call)

    def _learn_parameters(self, module: nn.Module) -> None:
        prefix = self._prefixes.get(id(module), "")
        for name, parameter in module.named_parameters(recurse=False):
            if prefix + name in self._trainable and id(parameter) not in self.param_names:
                self.param_names[id(parameter)] = prefix + name
                self._forward_params.append(parameter)

    def _leave(self, module: nn.Module, output: Any) -> None:
        # Pop back to this module's call; always_call=True keeps the stack right when a forward raises.
        while self._stack:
            call = self._stack.pop()
            if call.module is module:
                break
        else:
            return
        call.end = self._tick()
        if (probe := self._rerun_probes.pop(call, None)) is not None:
            probe.__exit__(None, None, None)
        if self.phase != "forward":
            return  # recomputation during backward: its outputs are not ours to hook
        for tensor in list(iter_tensors(output))[:_MAX_TENSORS]:
            if tensor.requires_grad:
                call.out_requires_grad = True
                call.graph_roots.append(tensor.grad_fn if tensor.grad_fn is not None else tensor)
                with suppress(RuntimeError):  # e.g. a tensor some custom Function marked non-differentiable
                    self._tensor_hooks.append(tensor.register_hook(partial(_mark_reached, call)))


def _mark_reached(call: Call, grad: torch.Tensor | None) -> None:
    # The engine may still run a node whose incoming gradient is undefined (a re-entrant checkpoint returns None
    # for inputs its re-run cannot reach): that is not a gradient arriving.
    if grad is not None:
        call.reached = True


class _GradModeProbe(TorchFunctionMode):
    """Sees every torch call, so grad mode switched off *inside* a module's own forward is noticed."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.recorder.saw_op(func, args, kwargs)
        return func(*args, **(kwargs or {}))


def _reentrant_checkpoint_inputs() -> tuple[bool, bool | None]:
    """Whether this call runs inside ``CheckpointFunction.forward``, and if so whether its tensor inputs need grad."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code is _REENTRANT_FORWARD:
            args = frame.f_locals.get("args")
            if not isinstance(args, tuple):
                return True, None
            return True, any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
        frame = frame.f_back
    return False, None


@contextmanager
def preserved_state(module: nn.Module) -> Iterator[None]:
    """Clear ``.grad`` for the run; afterwards restore grads, buffers, train/eval modes and every global RNG."""
    params = list(module.parameters())
    grads = [p.grad for p in params]
    buffers = [
        (owner, name, buf, buf.detach().clone())
        for owner in module.modules()
        for name, buf in owner._buffers.items()
        if buf is not None
    ]
    modes = [(m, m.training) for m in module.modules()]
    cuda = sorted({t.device.index or 0 for t in [*params, *(b for *_, b, _ in buffers)] if t.device.type == "cuda"})
    py_state = random.getstate()
    np_state = _numpy_random().get_state() if _numpy_random() else None
    with torch.random.fork_rng(devices=cuda, device_type="cuda"):
        try:
            for p in params:
                p.grad = None
            yield
        finally:
            for p, grad in zip(params, grads):
                p.grad = grad
            for owner, name, buf, saved in buffers:
                owner._buffers[name] = buf
                with torch.inference_mode(buf.is_inference()), torch.no_grad():
                    buf.copy_(saved)
            for m, training in modes:
                m.training = training
            random.setstate(py_state)
            if np_state is not None:
                _numpy_random().set_state(np_state)


def _numpy_random() -> Any:
    numpy = sys.modules.get("numpy")
    return getattr(numpy, "random", None)
