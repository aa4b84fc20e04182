"""The gradient-flow doctor (``diagnostics/gradient_flow.py``): one deliberately broken module per finding code,
healthy cases, and restoration."""

from __future__ import annotations

import warnings
from functools import partial

import pytest
import torch
from torch import distributed, nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

from dit_trainer.diagnostics import CODES, GradientReport, diagnose_gradient_flow


class Net(nn.Module):
    """embed -> body -> head, with the body's call broken in one of several ways chosen by ``mode``."""

    def __init__(self, mode: str = "healthy") -> None:
        super().__init__()
        self.mode = mode
        self.embed = nn.Linear(4, 8)
        self.body = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        if self.mode == "no_grad":
            with torch.no_grad():
                h = self.body(h)
        elif self.mode == "detach":
            h = self.body(h).detach()
        elif self.mode == "data":
            h = self.body(h).data
        elif self.mode == "numpy":
            h = torch.from_numpy(self.body(h).detach().cpu().numpy())
        elif self.mode == "reentrant":
            h = checkpoint(self.body, h, use_reentrant=True)
        elif self.mode == "non_reentrant":
            h = checkpoint(self.body, h, use_reentrant=False)
        else:
            h = self.body(h)
        return self.head(h)


class NoGradBlock(nn.Linear):
    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)


class WeightDetached(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight.detach(), self.bias.detach())


class WithUnusedScale(nn.Linear):
    def __init__(self, *args: int) -> None:
        super().__init__(*args)
        self.scale = nn.Parameter(torch.ones(()))  # never used by forward


X = torch.randn(3, 4)


def diagnose(net: nn.Module, loss_fn=None) -> GradientReport:
    return diagnose_gradient_flow(net, loss_fn or (lambda: net(X).pow(2).mean()))


def assert_only(report: GradientReport, code: str, names: list[str]) -> None:
    assert report.codes == [code], str(report)
    assert report.findings[0].names == names, str(report)
    assert not report.ok


# --- healthy --------------------------------------------------------------------------------------------------


def test_healthy_model_is_ok():
    report = diagnose(Net())
    assert report.ok and report.findings == [] and report.codes == []
    assert report.num_trainable == report.num_with_grad == 8
    assert "OK" in str(report) and "Net" in str(report)


def test_frozen_base_in_eval_mode_with_trainable_head_is_ok():
    net = Net()
    for part in (net.embed, net.body):
        part.requires_grad_(False).eval()
    report = diagnose(net)
    assert report.ok, str(report)
    assert report.num_trainable == report.num_with_grad == 2


def test_frozen_part_under_no_grad_at_the_start_is_ok():
    """The recommended pattern (frozen encoder under no_grad feeding the trained part) raises no alarm."""
    net = Net()
    net.embed.requires_grad_(False)

    def loss():
        with torch.no_grad():
            h = net.embed(X)
        return net.head(net.body(h)).pow(2).mean()

    assert diagnose(net, loss).ok


@pytest.mark.parametrize("mode", ["reentrant", "non_reentrant"])
def test_checkpointing_with_inputs_that_require_grad_is_ok(mode):
    """Healthy re-entrant checkpointing runs its first forward under no_grad: that must not read as grad_disabled."""
    report = diagnose(Net(mode))
    assert report.ok, str(report)
    assert report.num_with_grad == 8


def test_non_reentrant_checkpoint_with_frozen_embedding_is_ok():
    net = Net("non_reentrant")
    net.embed.requires_grad_(False)
    assert diagnose(net).ok


# --- one broken module per code ------------------------------------------------------------------------------


def test_no_trainable_params():
    net = Net()
    net.requires_grad_(False)
    report = diagnose(net, lambda: pytest.fail("compute_loss must not run"))
    assert_only(report, "no_trainable_params", ["Net"])
    assert "requires_grad" in str(report)


def test_loss_not_scalar_names_the_shape_and_still_diagnoses_the_rest():
    net = Net()
    report = diagnose(net, lambda: net(X).pow(2).mean(dim=1))
    assert report.codes == ["loss_not_scalar"]
    assert "(3,)" in report.findings[0].message and ".mean()" in report.findings[0].message
    assert report.num_with_grad == 8  # the mean was back-propagated

    net.body = WithUnusedScale(8, 8)
    assert diagnose(net, lambda: net(X).pow(2).mean(dim=1)).codes == ["loss_not_scalar", "unused_params"]


def test_grad_disabled_inside_forward_names_the_module_not_the_upstream_cut():
    report = diagnose(Net("no_grad"))
    assert_only(report, "grad_disabled", ["body"])  # embed's starvation is explained by body, not 'detached'
    assert report.num_with_grad == 2  # only the head
    assert "`body`" in str(report) and "torch.no_grad()" in str(report)


def test_grad_disabled_by_a_decorator_on_forward():
    net = Net()
    net.body[2] = NoGradBlock(8, 8)
    report = diagnose(net)
    assert_only(report, "grad_disabled", ["body.2"])


def test_grad_disabled_around_the_whole_forward_names_the_top_module():
    net = Net()

    def loss():
        with torch.no_grad():
            return net(X).pow(2).mean()

    report = diagnose(net, loss)
    assert_only(report, "grad_disabled", ["Net"])
    assert report.loss_has_graph is False
    assert "does not require grad" in str(report)


def test_grad_disabled_by_inference_mode_whole_forward():
    net = Net()

    def loss():
        with torch.inference_mode():
            return net(X).pow(2).mean(dim=1)  # inference tensors: the non-scalar reduction must still work

    report = diagnose(net, loss)
    assert report.codes == ["loss_not_scalar", "grad_disabled"]
    assert report.findings[1].names == ["Net"]
    assert "inference_mode" in str(report)


def test_grad_disabled_by_inference_mode_part_of_forward_reports_instead_of_raising():
    """Feeding an inference tensor to a trainable layer fails *in the forward*; the doctor explains it."""
    net = Net()

    def loss():
        h = net.embed(X)
        with torch.inference_mode():
            h = net.body(h)
        return net.head(h).pow(2).mean()

    with pytest.raises(RuntimeError, match="Inference tensors"):
        loss()
    report = diagnose(net, loss)
    assert_only(report, "grad_disabled", ["body"])


def test_grad_disabled_by_a_decorator_on_a_container_names_the_container():
    class NoGradSequential(nn.Sequential):
        @torch.no_grad()
        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return super().forward(h)

    net = Net()
    net.body = NoGradSequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))
    report = diagnose(net)
    assert_only(report, "grad_disabled", ["body"])
    assert "inside the forward of `body`" in str(report)


def test_grad_disabled_by_a_no_grad_block_inside_a_leaf_forward():
    class LeafNoGrad(nn.Linear):
        def forward(self, h: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                return super().forward(h)

    net = Net()
    net.body[0] = LeafNoGrad(8, 8)
    report = diagnose(net)
    assert_only(report, "grad_disabled", ["body.0"])  # and embed, upstream, is explained by it too
    assert report.num_with_grad == 4


def test_grad_disabled_for_a_trainable_module_run_under_no_grad_in_compute_loss():
    net = Net()

    def loss():
        with torch.no_grad():
            h = net.embed(X)  # meant to be frozen, but embed still requires grad
        return net.head(net.body(h)).pow(2).mean()

    report = diagnose(net, loss)
    assert_only(report, "grad_disabled", ["embed"])
    assert "compute_loss()" in str(report)


def test_frozen_module_under_inference_mode_feeding_a_trainable_one_is_named():
    """Not a trainable module, but the cause: inference tensors cannot be saved for backward."""
    net = Net()
    net.embed.requires_grad_(False)

    def loss():
        with torch.inference_mode():
            h = net.embed(X)
        return net.head(net.body(h)).pow(2).mean()

    report = diagnose(net, loss)
    assert_only(report, "grad_disabled", ["embed"])
    assert "torch.no_grad()" in str(report)


def test_independent_problems_are_each_reported_once():
    net = Net("no_grad")
    net.extra = nn.Linear(2, 2)
    report = diagnose(net)
    assert report.codes == ["grad_disabled", "unused_params"]
    assert [f.names for f in report.findings] == [["body"], ["extra.weight", "extra.bias"]]


def test_no_grad_inside_a_healthy_reentrant_checkpoint_is_seen_in_its_rerun():
    class LeafNoGrad(nn.Linear):
        def forward(self, h: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                return super().forward(h)

    net = Net("reentrant")
    net.body = nn.Sequential(LeafNoGrad(8, 8), nn.Linear(8, 8))
    report = diagnose(net)
    assert_only(report, "grad_disabled", ["body.0"])


def test_an_error_raised_by_backward_is_reported_not_raised():
    """A re-entrant checkpoint whose re-run output has no graph makes torch raise inside backward."""

    class LeafNoGrad(nn.Linear):
        def forward(self, h: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                return super().forward(h)

    net = Net("reentrant")
    net.body = nn.Sequential(nn.Linear(8, 8), LeafNoGrad(8, 8))
    report = diagnose(net)
    assert not report.ok and "none of output has requires_grad=True" in report.backward_error
    assert "grad_disabled" in report.codes and ["body.1"] in [f.names for f in report.findings]
    assert "may be partial" in str(report)


@pytest.mark.parametrize("mode", ["detach", "data", "numpy"])
def test_detached_partial_cut_names_the_body(mode):
    report = diagnose(Net(mode))
    assert_only(report, "detached", ["body"])
    assert report.num_with_grad == 2 and report.loss_has_graph


def test_detached_full_cut_when_nothing_after_the_cut_trains():
    net = Net("detach")
    net.head.requires_grad_(False)
    report = diagnose(net)
    assert_only(report, "detached", ["body"])
    assert report.loss_has_graph is False


def test_detached_inside_a_container_names_the_last_module_before_the_cut():
    class Body(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first, self.second, self.third = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return self.third(self.second(self.first(h)).detach())

    net = Net()
    net.body = Body()
    report = diagnose(net)
    assert_only(report, "detached", ["body.second"])
    assert "forward of `body`" in report.findings[0].message


def test_detached_inside_a_leaf_module():
    net = Net()
    net.body[2] = WeightDetached(8, 8)
    report = diagnose(net)
    assert_only(report, "detached", ["body.2"])


def test_detached_parameter_of_the_root_module():
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 2)
            self.scale = nn.Parameter(torch.ones(2))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) * self.scale.detach()

    report = diagnose(Scaled())
    assert_only(report, "detached", ["Scaled"])
    assert "inside the forward of `Scaled`" in str(report)


def test_reentrant_checkpoint_over_frozen_embedding_lora_trap():
    net = Net("reentrant")
    net.embed.requires_grad_(False)
    net.head.requires_grad_(False)
    report = diagnose(net)
    assert_only(report, "reentrant_checkpoint", ["body"])
    text = str(report)
    assert "use_reentrant=False" in text and "requires_grad_(True)" in text
    assert "None of the inputs have requires_grad=True" in text


def test_reentrant_checkpoint_with_trainable_head_still_named():
    net = Net("reentrant")
    net.embed.requires_grad_(False)
    report = diagnose(net)
    assert_only(report, "reentrant_checkpoint", ["body"])
    assert report.num_with_grad == 2


def test_unused_params_never_called_module():
    net = Net()
    net.extra = nn.Linear(2, 2)
    report = diagnose(net)
    assert_only(report, "unused_params", ["extra.weight", "extra.bias"])
    assert "never ran" in str(report)


def test_unused_param_of_a_module_that_ran():
    net = Net()
    net.body[0] = WithUnusedScale(8, 8)
    report = diagnose(net)
    assert_only(report, "unused_params", ["body.0.scale"])
    assert "never uses it" in str(report)


def test_nonfinite_grad_names_the_parameter():
    net = Net()
    handle = net.head.weight.register_hook(lambda grad: torch.full_like(grad, float("nan")))
    try:
        report = diagnose(net)
    finally:
        handle.remove()
    assert_only(report, "nonfinite_grad", ["head.weight"])


def test_every_code_is_documented():
    assert set(CODES) == {
        "no_trainable_params",
        "loss_not_scalar",
        "grad_disabled",
        "detached",
        "reentrant_checkpoint",
        "unused_params",
        "nonfinite_grad",
    }


# --- restoration ---------------------------------------------------------------------------------------------


class Normed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 6)
        self.norm = nn.BatchNorm1d(6)
        self.drop = nn.Dropout(0.5)
        self.out = nn.Linear(6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.drop(self.norm(self.lin(x))))


@pytest.mark.parametrize("broken", [False, True])
def test_state_is_restored(broken):
    torch.manual_seed(0)
    net = Normed().train()
    net.out.eval()  # a mixed mode must come back exactly
    net.lin.weight.grad = torch.full_like(net.lin.weight, 3.0)
    kept = net.lin.weight.grad
    net.norm.running_mean.fill_(0.25)
    tracked = net.norm.num_batches_tracked.clone()

    def loss():
        net.train()  # a training step's usual first line; the doctor must undo it
        out = net(torch.randn(5, 4))  # consumes the RNG, updates running stats
        return out.detach().mean() if broken else out.pow(2).mean()

    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    report = diagnose_gradient_flow(net, loss)
    assert report.ok is not broken
    torch.testing.assert_close(torch.rand(4), expected)  # the global RNG sequence is untouched
    assert net.lin.weight.grad is kept and torch.equal(kept, torch.full_like(kept, 3.0))
    assert all(p.grad is None for name, p in net.named_parameters() if name != "lin.weight")
    torch.testing.assert_close(net.norm.running_mean, torch.full((6,), 0.25))
    assert torch.equal(net.norm.num_batches_tracked, tracked)
    assert [m.training for m in net.modules()] == [True, True, True, True, False]


def test_state_is_restored_when_compute_loss_raises():
    net = Normed().train()
    before = net.norm.running_mean.clone()

    def loss():
        net(torch.randn(5, 4))
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        diagnose_gradient_flow(net, loss)
    torch.testing.assert_close(net.norm.running_mean, before)
    assert all(p.grad is None for p in net.parameters())
    assert not net.lin._forward_hooks and not net.lin._forward_pre_hooks  # hooks removed


def test_other_warnings_are_passed_on():
    net = Net()

    def loss():
        warnings.warn("from the user", UserWarning, stacklevel=1)
        return net(X).pow(2).mean()

    with pytest.warns(UserWarning, match="from the user"):
        assert diagnose(net, loss).ok


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_state_is_restored_on_cuda():
    net = Normed().cuda().train()
    net.lin.weight.grad = torch.ones_like(net.lin.weight)
    before = net.norm.running_var.clone()

    def loss():
        return net(torch.randn(5, 4, device="cuda")).pow(2).mean()

    torch.cuda.manual_seed(7)
    expected = torch.rand(3, device="cuda")
    torch.cuda.manual_seed(7)
    assert diagnose_gradient_flow(net, loss).ok
    torch.testing.assert_close(torch.rand(3, device="cuda"), expected)
    torch.testing.assert_close(net.norm.running_var, before)
    assert torch.equal(net.lin.weight.grad, torch.ones_like(net.lin.weight))


# --- a tiny diffusers PixArt ---------------------------------------------------------------------------------


def pixart_loss(model, return_dict=False):
    latents, text = torch.randn(2, 4, 8, 8), torch.randn(2, 5, 16)
    timestep = torch.tensor([10, 500])
    cond = {"resolution": None, "aspect_ratio": None}

    def loss():
        out = model(
            latents, encoder_hidden_states=text, timestep=timestep, added_cond_kwargs=cond, return_dict=return_dict
        )
        return (out.sample if return_dict else out[0]).pow(2).mean()

    return loss


@pytest.mark.parametrize(("checkpointing", "return_dict"), [(False, False), (True, False), (True, True)])
def test_tiny_pixart_is_healthy(checkpointing, return_dict, tiny_transformer):
    model = tiny_transformer().transformer
    if checkpointing:
        model.enable_gradient_checkpointing()  # diffusers: torch.utils.checkpoint.checkpoint(use_reentrant=False)
        assert model.is_gradient_checkpointing
    report = diagnose_gradient_flow(model, pixart_loss(model, return_dict))
    assert report.ok, str(report)
    assert report.num_with_grad == report.num_trainable == len(list(model.parameters()))


def test_tiny_pixart_lora_style_reentrant_checkpoint_trap(tiny_transformer):
    """Only attention weights train, inputs come from frozen embeddings: re-entrant checkpointing starves them."""
    model = tiny_transformer().transformer
    model.requires_grad_(False)
    for block in model.transformer_blocks:
        block.attn1.to_q.requires_grad_(True)
    reentrant = partial(_checkpoint_call, use_reentrant=True)
    model.enable_gradient_checkpointing(reentrant)
    report = diagnose_gradient_flow(model, pixart_loss(model))
    assert_only(report, "reentrant_checkpoint", ["transformer_blocks.0", "transformer_blocks.1"])

    model.enable_gradient_checkpointing(partial(_checkpoint_call, use_reentrant=False))
    assert diagnose_gradient_flow(model, pixart_loss(model)).ok


def _checkpoint_call(module: nn.Module, *args, use_reentrant: bool):
    return checkpoint(module.__call__, *args, use_reentrant=use_reentrant)


# --- FSDP2 ---------------------------------------------------------------------------------------------------


@pytest.fixture
def sharded_net(tmp_path):
    """``Net(mode)`` under FSDP2 on a one-process gloo group, ``body`` its own unit (a transformer block) and the
    rest the root unit, left gathered by a forward without backward (a sampling pass, GRPO's rollout)."""
    distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))

    def build(mode: str = "healthy") -> nn.Module:
        net = Net(mode)
        fully_shard(net.body, mesh=mesh)
        fully_shard(net, mesh=mesh)
        with torch.no_grad():
            net(X)
        assert not isinstance(net.embed.weight, DTensor)  # gathered: a plain tensor stands where the slice was
        return net

    yield build
    distributed.destroy_process_group()


def test_fsdp2_root_left_gathered_is_diagnosed_on_the_parameters_that_get_the_gradient(sharded_net):
    """Backward reduces the gathered tensors' gradient into the sharded parameters (and frees theirs): read on the
    gathered ones, the root's parameters looked starved ("the graph is cut inside the forward of embed")."""
    net = sharded_net()
    report = diagnose(net)
    assert report.ok and report.num_with_grad == report.num_trainable == 8, str(report)
    assert all(p.grad is None for p in net.parameters())  # nothing left on the sharded parameters either


def test_fsdp2_cut_is_explained_as_without_fsdp(sharded_net):
    """The forward runs on other parameter objects than those named before it, and FSDP2's gathers run with grad
    mode off in its hooks: neither may change the explanation."""
    assert_only(diagnose(sharded_net("detach")), "detached", ["body"])
