# CUDA runtime image for clusters: PyTorch with CUDA from the base image, dit-trainer on top.
#   docker build -t dit-trainer .
#   docker run --gpus all -v /data:/data -v $PWD/outputs:/workspace/outputs dit-trainer \
#       +experiment=dit data.path=/data/my_images
# Multi-GPU: override the entrypoint, e.g. `--entrypoint accelerate dit-trainer launch --multi_gpu train.py ...`.
FROM pytorch/pytorch:2.6.0-cuda12.4-cudnn9-runtime

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    HF_HOME=/workspace/.cache/huggingface
WORKDIR /workspace

COPY pyproject.toml README.md ./
COPY dit_trainer ./dit_trainer
COPY configs ./configs
COPY scripts ./scripts
COPY train.py ./
# The base image's torch is kept (scripts/install.sh only installs torch when it finds none of 2.6 or newer).
RUN bash scripts/install.sh

ENTRYPOINT ["python", "train.py"]
CMD ["+experiment=dit"]
