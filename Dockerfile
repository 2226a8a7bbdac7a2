# minibroker: one image for the controller, the brokers and the CLI.
#   docker build -t minibroker .
#   docker compose up -d        (see docker-compose.yml)
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
RUN pip install . && useradd --system --uid 1000 --home-dir /data minibroker \
    && mkdir -p /data && chown minibroker /data

USER minibroker
VOLUME ["/data"]
EXPOSE 9090 9091 9092 9093
ENTRYPOINT ["minibroker"]
CMD ["--help"]
