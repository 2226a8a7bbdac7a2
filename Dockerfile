# minibroker: one image for the controller, the brokers and the CLI.
#   docker build -t minibroker .
#   docker compose up -d        (see docker-compose.yml)
# It installs minibroker without the audit extra and has no Java: `minibroker export` and `minibroker audit`
# (pyarrow, PySpark on a JVM) are not in the image; run them from a host checkout (bash scripts/setup.sh).
# .dockerignore keeps the venv, git and caches out of the build context.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/minibroker
COPY pyproject.toml README.md ./
COPY common ./common
COPY storage ./storage
COPY broker ./broker
COPY fetcher ./fetcher
COPY controller ./controller
COPY client ./client
COPY cli ./cli
COPY audit ./audit
# The compose file's named volumes mount at /data/<service>. Docker fills a new named volume from the image's
# directory at its mount point, owner included; a mount point the image lacks would be created owned by root,
# and the processes (not root) could not write their data dirs. So each exists here, owned by the user.
RUN pip install . && useradd --system --uid 1000 --home-dir /data minibroker \
    && mkdir -p /data/controller /data/broker-1 /data/broker-2 /data/broker-3 \
    && chown -R minibroker /data

USER minibroker
VOLUME ["/data"]
EXPOSE 9090 9091 9092 9093
ENTRYPOINT ["minibroker"]
CMD ["--help"]
