# spanserve container images.
#
# The build steps are the ones CI proves on a fresh Debian machine (.ci/run):
# install make and build-essential, run deploy/deps.sh (the -dev packages),
# then `make`. The final images hold only the binaries, the default model and
# the runtime libraries.
#
#   docker build -t spanserve:0.1.0 .                  # CUDA image (default target)
#   docker build -t spanserve:0.1.0-cpu --target cpu . # CPU-only image, debian:12
#   docker run --gpus all -p 8080:8080 -v spanserve-state:/var/lib/spanserve/state \
#       --stop-timeout 60 spanserve:0.1.0
#
# Arguments after the image name are added to the serve flags (for example
# `--api-key-file /run/secrets/api-keys --session-memory 8G`). docs/OPERATIONS.md
# is the operator's guide.
#
# Package versions are not pinned (hadolint DL3008 is ignored on purpose): the
# images take the distribution's current security fixes when rebuilt.

ARG CUDA_VERSION=13.0.2
ARG UBUNTU_VERSION=24.04
ARG DEBIAN_VERSION=12

# ---------------------------------------------------------------- CPU build
FROM debian:${DEBIAN_VERSION} AS build-cpu
ENV DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update -qq \
    && apt-get install -y -qq --no-install-recommends make build-essential
WORKDIR /src
# deps.sh alone first, so the packages stay cached while the sources change.
COPY deploy/deps.sh deploy/deps.sh
RUN sh deploy/deps.sh
COPY . .
RUN make clean && make && bin/spanserve version

# ---------------------------------------------------------------- CPU image
FROM debian:${DEBIAN_VERSION} AS cpu
ENV DEBIAN_FRONTEND=noninteractive
# The runtime libraries of bin/spanserve and bin/spanctl (jansson, OpenBLAS,
# libmicrohttpd, libcurl, SentencePiece), CA certificates for model downloads by URL, curl
# for the health check.
# hadolint ignore=DL3008
RUN apt-get update -qq \
    && apt-get install -y -qq --no-install-recommends \
        libjansson4 libopenblas0 libmicrohttpd12 libcurl4 libsentencepiece0 ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 spanserve \
    && useradd --system --no-log-init --uid 10001 --gid spanserve --home-dir /var/lib/spanserve --shell /usr/sbin/nologin spanserve \
    && mkdir -p /var/lib/spanserve/state /var/lib/spanserve/models \
    && chown -R spanserve:spanserve /var/lib/spanserve
COPY --from=build-cpu /src/bin/spanserve /src/bin/spanctl /usr/local/bin/
COPY --from=build-cpu /src/deploy/models/aspan-shakespeare.safetensors /usr/share/spanserve/models/
USER 10001:10001
WORKDIR /var/lib/spanserve
VOLUME ["/var/lib/spanserve/state", "/var/lib/spanserve/models"]
EXPOSE 8080
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["sh", "-c", "curl -fsS --max-time 4 http://127.0.0.1:8080/healthz || exit 1"]
ENTRYPOINT ["spanserve", "serve", "--listen", "0.0.0.0:8080", \
            "--model", "default=/usr/share/spanserve/models/aspan-shakespeare.safetensors", \
            "--state-dir", "/var/lib/spanserve/state", "--model-dir", "/var/lib/spanserve/models"]
CMD []

# ---------------------------------------------------------------- CUDA build
# nvcc is on the PATH of the devel image, so `make` also builds kernels/*.cu
# (the CUDA core, for sm_90: H100 and H200) and links cudart, cuBLAS and cublasLt.
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION} AS build-cuda
ENV DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update -qq \
    && apt-get install -y -qq --no-install-recommends make build-essential
WORKDIR /src
COPY deploy/deps.sh deploy/deps.sh
RUN sh deploy/deps.sh
COPY . .
RUN make clean && make && bin/spanserve version

# ---------------------------------------------------------------- CUDA image
# The runtime image carries cudart and the math libraries (cuBLAS); the
# driver comes from the host (--gpus all, or the NVIDIA device plugin).
FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu${UBUNTU_VERSION} AS cuda
ENV DEBIAN_FRONTEND=noninteractive
# Ubuntu 24.04's names of the same runtime libraries (the 64-bit time_t
# transition renamed libcurl4 and libmicrohttpd12).
# hadolint ignore=DL3008
RUN apt-get update -qq \
    && apt-get install -y -qq --no-install-recommends \
        libjansson4 libopenblas0 libmicrohttpd12t64 libcurl4t64 libsentencepiece0 ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 spanserve \
    && useradd --system --no-log-init --uid 10001 --gid spanserve --home-dir /var/lib/spanserve --shell /usr/sbin/nologin spanserve \
    && mkdir -p /var/lib/spanserve/state /var/lib/spanserve/models \
    && chown -R spanserve:spanserve /var/lib/spanserve
COPY --from=build-cuda /src/bin/spanserve /src/bin/spanctl /usr/local/bin/
COPY --from=build-cuda /src/deploy/models/aspan-shakespeare.safetensors /usr/share/spanserve/models/
USER 10001:10001
WORKDIR /var/lib/spanserve
VOLUME ["/var/lib/spanserve/state", "/var/lib/spanserve/models"]
EXPOSE 8080
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["sh", "-c", "curl -fsS --max-time 4 http://127.0.0.1:8080/healthz || exit 1"]
ENTRYPOINT ["spanserve", "serve", "--listen", "0.0.0.0:8080", \
            "--model", "default=/usr/share/spanserve/models/aspan-shakespeare.safetensors", \
            "--state-dir", "/var/lib/spanserve/state", "--model-dir", "/var/lib/spanserve/models"]
CMD []
