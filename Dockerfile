# syntax=docker/dockerfile:1
# tghost and chosen plugins, installed from wheels, run as a non-root user.
#
#   docker build -t tghost .                                    # the README's example plugins
#   docker build --build-arg PLUGINS="tghost-weather plugins/tghost-joke" -t tghost .
#
# PLUGINS lists plugins as pip takes them: folders in this repository or PyPI names. To add
# plugins to a built image instead, build FROM it:
#
#   FROM ghcr.io/example/tghost:0.1.0
#   RUN pip install --no-cache-dir --user tghost-weather
#
# The entry point is `tghost`, the command `run`: `docker run IMAGE mcp --transport http` runs
# another tghost command. deploy/kubernetes/ runs it with a read-only root filesystem.

ARG PYTHON=3.11

FROM python:${PYTHON}-slim AS build
# The plugins the README's set-up installs next to tghost.
ARG PLUGINS="plugins/tghost-joke plugins/tghost-calculator plugins/tghost-knowledge"
WORKDIR /src
COPY . .
# One resolution for tghost and the plugins, so their "tghost" requirement is this checkout; tghost
# with its mcp extra, as the README's set-up installs it (deploy/kubernetes/mcp.yaml runs tghost mcp).
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[mcp]' ${PLUGINS}

FROM python:${PYTHON}-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index /wheels/*.whl
RUN groupadd --gid 10001 tghost \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/tghost tghost
USER 10001
WORKDIR /home/tghost
# tghost run --metrics-port 9464: /metrics and /health.
EXPOSE 9464
ENTRYPOINT ["tghost"]
CMD ["run"]
