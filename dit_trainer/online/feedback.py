"""Between an online method's rollouts and its updates: the rewards of the epoch's final latents (decoded), their
means over every process with the images' statistics (``image_stats``), and the advantages of each image within its
prompt's group of ``group_size`` (statistics gathered over processes: groups never span processes, so only the
global std needs them). The prompt sampler learns each group's reward spread here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from accelerate import Accelerator
from torch import nn

from dit_trainer.online.image_stats import brightness_and_saturation, group_diversity, thumbnails
from dit_trainer.online.prompts import PromptSampler
from dit_trainer.rewards.base import WeightedReward
from dit_trainer.rewards.groups import group_statistics


@dataclass(frozen=True)
class Advantages:
    """This process's advantages (N,), clamped; which of its images belong to a group whose rewards are all equal;
    and the share of such groups over all processes."""

    values: torch.Tensor
    zero_std: torch.Tensor
    zero_std_fraction: float


class GroupFeedback:
    """Rewards and group advantages of an epoch's images. ``advantage_std``: ``group`` divides by each group's std,
    ``global`` by all rewards'; advantages are clamped to +- ``adv_clip_max``."""

    def __init__(
        self,
        accelerator: Accelerator,
        vae: nn.Module,
        reward: WeightedReward,
        prompt_sampler: PromptSampler,
        *,
        group_size: int,
        eps: float,
        advantage_std: str,
        adv_clip_max: float,
        batch_size: int,
    ) -> None:
        self.accelerator = accelerator
        self.vae = vae
        self.reward = reward
        self.prompt_sampler = prompt_sampler
        self.group_size = group_size
        self.eps = eps
        self.advantage_std = advantage_std
        self.adv_clip_max = adv_clip_max
        self.batch_size = batch_size

    @torch.no_grad()
    def score(self, final_latents: torch.Tensor, prompts: Sequence[str]) -> tuple[torch.Tensor, dict[str, float]]:
        """(N,) rewards of the decoded ``final_latents``, and their means over all processes per reward term."""
        scores: dict[str, list[torch.Tensor]] = {}
        looks: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        for rows in torch.arange(len(prompts)).split(self.batch_size):
            images = ((self.vae.decode(final_latents[rows.to(final_latents.device)]) + 1) / 2).float()
            for name, values in self.reward.scores(images, [prompts[i] for i in rows.tolist()]).items():
                scores.setdefault(name, []).append(values)
            looks.append((*brightness_and_saturation(images), thumbnails(images)))
        per_term = {name: torch.cat(values) for name, values in scores.items()}
        rewards = self.reward.combine(per_term).float()
        everywhere = self.accelerator.gather(torch.stack([rewards, *per_term.values()]))
        metrics = {"rollout/reward_mean": everywhere[0].mean().item(), "rollout/reward_std": everywhere[0].std().item()}
        metrics |= {f"rollout/{name}": row.mean().item() for name, row in zip(per_term, everywhere[1:])}
        return rewards, metrics | self._image_statistics(*(torch.cat(parts) for parts in zip(*looks)))

    def _image_statistics(self, brightness: torch.Tensor, saturation: torch.Tensor, thumbs: torch.Tensor) -> dict:
        """The rollout images' mean brightness and saturation, and the mean distance within their groups, over
        every process (``image_stats``): what a gamed reward changes first."""
        local = torch.stack([brightness.mean(), saturation.mean(), group_diversity(thumbs, self.group_size).mean()])
        means = self.accelerator.reduce(local, reduction="mean")
        return dict(zip(("rollout/brightness", "rollout/saturation", "rollout/group_diversity"), means.tolist()))

    def advantages(self, rewards: torch.Tensor, prompt_indices: list[int]) -> Advantages:
        """The advantages of this process's ``rewards`` (its prompts ``prompt_indices``, ``group_size`` each)."""
        everywhere = self.accelerator.gather(rewards)
        stats = group_statistics(everywhere, self.group_size, self.eps)
        indices = torch.tensor(prompt_indices, device=rewards.device)
        self.prompt_sampler.observe(self.accelerator.gather(indices).cpu(), stats.std.cpu())
        chosen = stats.advantages if self.advantage_std == "group" else stats.advantages_global_std
        rank, count = self.accelerator.process_index, len(rewards)
        values = chosen[rank * count : (rank + 1) * count].clamp(-self.adv_clip_max, self.adv_clip_max)
        zero_std = (stats.std == 0).repeat_interleave(self.group_size)[rank * count : (rank + 1) * count]
        return Advantages(values, zero_std, stats.zero_std_fraction)
