# The streamapp image: the `streamapp` command and the Faust workers (`faust -A streamapp.app`).
# Built by docker-compose.yml; Kafka itself runs from the official apache/kafka image.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

COPY pyproject.toml README.md constraints.txt /src/
COPY streamapp /src/streamapp
COPY agents /src/agents
COPY tables /src/tables
RUN pip install -c /src/constraints.txt /src && rm -rf /src

# Workers keep their RocksDB tables in /data and the sink writes to /out (volumes in compose).
RUN useradd --create-home --uid 1000 streamapp \
    && mkdir -p /data /out \
    && chown streamapp:streamapp /data /out
USER streamapp
# Not the source tree: the installed package is the one imported.
WORKDIR /data
ENV STREAMAPP_DATA_DIR=/data \
    STREAMAPP_OUT_DIR=/out

CMD ["streamapp", "--help"]
