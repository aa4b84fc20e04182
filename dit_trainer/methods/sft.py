"""``trainer.method=sft``, the default: noise (or velocity) prediction on the data set's batches
(``training.supervised.SupervisedStep`` with the diffusion loss)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dit_trainer.methods.base import Method

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from dit_trainer.components.build import Components
    from dit_trainer.config import DataConfig, DiffusionConfig
    from dit_trainer.data.bad_files import BadFileCounter
    from dit_trainer.training.step import StepParts, TrainingStep


class SupervisedMethod(Method):
    name = "sft"

    def describe(self) -> str:
        return "supervised denoising (`sft`)"

    def build_step(
        self,
        data: DataConfig,
        diffusion: DiffusionConfig,
        loop: StepParts,
        parts: Components,
        dataloader: DataLoader,
        bad_files: BadFileCounter,
    ) -> TrainingStep:
        from dit_trainer.data.captions import tag_augmentation
        from dit_trainer.diffusion.loss import DiffusionLoss
        from dit_trainer.training.supervised import SupervisedStep

        return SupervisedStep(
            loop,
            loss_fn=DiffusionLoss(
                parts.vae,
                parts.text_encoder,
                parts.schedule,
                data.caption_dropout,
                diffusion.noise_offset,
                tag_augmentation(data),
            ),
            dataloader=dataloader,
            bad_files=bad_files,
            num_train_timesteps=parts.schedule.num_train_timesteps,
            data_path=data.path,
        )


SFT = SupervisedMethod()
