"""The math of diffusion in one place: noise schedules by family (``ddpm``: epsilon / v-prediction, ``flow``: flow
matching), the training loss (``loss``), the samplers with classifier-free guidance (``sampler``) and the
stochastic policy steps GRPO needs (``policy``).

``OBJECTIVES`` names the schedule family that trains each ``diffusion.objective``, ``SAMPLERS`` the family each
``diffusion.sampler`` samples; both are registries, imported on first use. A schedule family checks its own
``diffusion.*`` settings (``NoiseSchedule.check_config``).
"""

from dit_trainer.registry import Registry

DDPM = "dit_trainer.diffusion.ddpm:DDPMSchedule"
FLOW = "dit_trainer.diffusion.flow:FlowSchedule"

OBJECTIVES = Registry("diffusion.objective", {"epsilon": DDPM, "v_prediction": DDPM, "flow_matching": FLOW})
SAMPLERS = Registry("diffusion.sampler", {"ddim": DDPM, "dpmsolver++": DDPM, "euler": FLOW})
