# kfca-llm on a CUDA GPU: federated LoRA/DoRA fine-tuning with KFCA rewards (4-bit bitsandbytes needs CUDA).
#   docker build -t kfca-llm .
#   docker run --rm --gpus all -v "$HOME/.cache/huggingface:/hf-cache" -v "$PWD/runs:/work/runs" \
#       kfca-llm simulate --recipe recipes/finance.toml
# The official PyTorch runtime image brings CUDA, cuDNN and a CUDA build of torch, so `pip install .` keeps
# that torch (pyproject asks torch>=2.4) instead of pulling the CPU wheel.
FROM pytorch/pytorch:2.9.0-cuda12.8-cudnn9-runtime

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/hf-cache

# Only what the package needs (the build context may hold a virtual environment and run outputs).
WORKDIR /opt/kfca-llm
COPY pyproject.toml README.md ./
COPY kfca_llm ./kfca_llm
COPY kernels ./kernels
RUN pip install . && rm -rf /opt/kfca-llm/build

# Non-root user; models and data sets download into the mounted Hugging Face cache, runs into /work.
# Build with --build-arg UID=$(id -u) so the user owns what it writes into mounted host folders.
ARG UID=1000
RUN useradd --create-home --non-unique --uid "${UID}" kfca \
    && mkdir -p /hf-cache /work \
    && chown kfca:kfca /hf-cache /work
COPY --chown=kfca:kfca recipes /work/recipes
USER kfca
WORKDIR /work
VOLUME ["/hf-cache"]

ENTRYPOINT ["kfca-llm"]
CMD ["--help"]
