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
# The wheel carries perception/ops/lib/*.so (package data); the checks fail the build when the
# compile produced no library or the wheel left it out.
RUN python -m perception.ops.build \
 && ls perception/ops/lib/*.so \
 && pip wheel --no-deps --wheel-dir /wheels . \
 && python -m zipfile -l /wheels/perception-*.whl | grep -E "perception/ops/lib/.+\.so"

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
COPY --from=build /wheels /wheels
# torch stays the base image's (it satisfies torch>=2.4); the import check proves the library
# landed beside the installed package, so no pod ever needs a compiler.
RUN pip install /wheels/perception-*.whl \
 && rm -rf /wheels \
 && python -c "import perception.ops.extension as e, sys; libs = sorted(e.LIB_DIR.glob('*.so')); print(libs); sys.exit(0 if libs else 1)" \
 && ! command -v nvcc
USER 1000:1000
WORKDIR /perception-home
ENTRYPOINT ["perception-train"]
