# syntax=docker/dockerfile:1
# The perception training image. The CUDA extension is compiled once, in the build stage, for
# L40S (sm_89) and H100/H200 (sm_90); the runtime stage has no nvcc and loads that library.
#
#   docker build --build-arg PERCEPTION_GIT_SHA="$(git rev-parse HEAD)" \
#     -t ghcr.io/perception-platform/perception:"$(git rev-parse --short HEAD)" .
#
# Both stages share one PyTorch release, so the library matches the torch ABI it is loaded into.
ARG PYTORCH_VERSION=2.8.0
ARG CUDA_FLAVOR=cuda12.9-cudnn9

FROM pytorch/pytorch:${PYTORCH_VERSION}-${CUDA_FLAVOR}-devel AS build
ENV TORCH_CUDA_ARCH_LIST="8.9;9.0" \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
COPY pyproject.toml README.md ./
COPY conf ./conf
COPY perception ./perception
# The library and its manifest (torch version, architectures) are checked here, so a failed or
# partial compile fails the build rather than a pod.
RUN python -m perception.ops.build \
 && test -f perception/ops/lib/perception_ops.so \
 && test -f perception/ops/lib/perception_ops.json \
 && pip wheel --no-deps --wheel-dir /wheels .
# model.mamba.ssd=mamba uses only mamba-ssm's Triton kernels: its wheel is built without the CUDA extensions
# (PyPI has no wheel; perception/model/ssd_mamba.py pins the release and says why).
RUN MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE \
    pip wheel --no-deps --no-build-isolation --wheel-dir /wheels "mamba-ssm==2.3.2.post1" \
 && test -f /wheels/mamba_ssm-2.3.2.post1-py3-none-any.whl

FROM pytorch/pytorch:${PYTORCH_VERSION}-${CUDA_FLAVOR}-runtime AS runtime
ARG PERCEPTION_GIT_SHA=unknown
LABEL org.opencontainers.image.title="perception" \
      org.opencontainers.image.source="https://github.com/perception-platform/perception" \
      org.opencontainers.image.revision="${PERCEPTION_GIT_SHA}"
ENV PERCEPTION_GIT_SHA=${PERCEPTION_GIT_SHA} \
    PERCEPTION_HOME=/perception-home \
    HOME=/home/perception \
    MPLBACKEND=Agg \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# uid 1000 is the contract with the cluster (runAsUser 1000); a base image that already has a
# uid-1000 account gives it up.
RUN if getent passwd 1000 > /dev/null; then userdel --remove "$(getent passwd 1000 | cut -d: -f1)"; fi \
 && useradd --uid 1000 --user-group --create-home --home-dir /home/perception --shell /bin/bash perception \
 && mkdir -p /perception-home/cache /perception-home/runs \
 && chown -R 1000:1000 /perception-home
# Triton (the compiled trunk that experiment=production trains with, and fla-core) builds a small C
# launcher per kernel at run time with the host C compiler, and the runtime base image has none; nvcc
# stays out. The base image's Ubuntu release pins the versions.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /wheels /wheels
COPY --from=build /src/perception/ops/lib /opt/perception-ops-lib
# torch stays the base image's (it satisfies torch>=2.4); the gpu extra adds fla-core (Triton SSD
# kernels for model.mamba.ssd=fla) and einops, whose Triton is the one the base image's torch ships; mamba-ssm
# (model.mamba.ssd=mamba) goes in without its dependencies (transformers among them), which its kernels do not use. The library and its manifest go into the
# installed package as one unit, readable by uid 1000 (the build writes the manifest 0600); the
# check after USER repeats the loader's own test (same torch, sm_89 and sm_90 built) as uid
# 1000, so a pod finds a matching library and never needs a compiler.
# The gpu extra's pin (fla-core==0.6.0) lives in pyproject.toml, which hadolint cannot see.
# hadolint ignore=DL3013
RUN wheel="$(echo /wheels/perception-*.whl)" \
 && pip install "${wheel}[gpu]" \
 && pip install --no-deps /wheels/mamba_ssm-*.whl \
 && rm -rf /wheels \
 && lib_dir="$(python -c 'from perception.ops import extension; print(extension.LIB_DIR)')" \
 && install -d -m 0755 "$lib_dir" \
 && install -m 0644 /opt/perception-ops-lib/perception_ops.so /opt/perception-ops-lib/perception_ops.json "$lib_dir"/ \
 && rm -rf /opt/perception-ops-lib \
 && ! command -v nvcc
USER 1000:1000
# experiment=production trains with model.mamba.ssd=mamba and model.vsn.fused_grn: their kernels must import too
# (no GPU needed; without Triton the fused GRN would fall back to its reference, several GB a step more)
RUN python -c "import json, torch; from perception.ops import extension as e; m = json.loads(e.manifest_path().read_text()); assert (e.LIB_DIR / (e.LIB_NAME + '.so')).is_file(), e.LIB_DIR; assert m['torch'] == torch.__version__, (m, torch.__version__); assert {'8.9', '9.0'} <= set(m['archs'].split(';')), m; print('prebuilt kernels:', m)" \
 && python -c "from perception.model.ssd_mamba import require_mamba; require_mamba(); print('mamba_ssm SSD kernels import')" \
 && python -c "from perception.ops.grn import require_grn_kernels; require_grn_kernels(); print('grn Triton kernels import')"
WORKDIR /perception-home
ENTRYPOINT ["perception-train"]
