# The broker's container image: `broker serve` from the wheel built from this checkout, as uid 10001 (the user the
# terraform modules write the PEM files for; their `command = ["broker", "serve"]` matches CMD below).
#
#   docker build -t hybrid-broker:0.1.0 .
#   docker run -p 8080:8080 -e BROKER_ADMIN_TOKEN=... hybrid-broker:0.1.0
#
# EXTRAS picks the optional dependencies: the server is required; aws and azure add the cloud SDKs.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
RUN pip install --no-cache-dir build
COPY pyproject.toml README.md ./
COPY broker broker
COPY providers providers
COPY edge edge
COPY pricing pricing
COPY policies policies
RUN python -m build --wheel --outdir /dist

FROM ${PYTHON_IMAGE}
ARG EXTRAS=server,aws,azure
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/broker broker \
    && install -d -o 10001 -g 10001 /var/lib/hybrid-broker
COPY --from=wheel /dist/ /tmp/dist/
RUN pip install --no-cache-dir "$(ls /tmp/dist/hybrid_broker-*.whl)[${EXTRAS}]" && rm -rf /tmp/dist
ENV BROKER_HOST=0.0.0.0 \
    BROKER_PORT=8080 \
    BROKER_DATA_DIR=/var/lib/hybrid-broker \
    MPLCONFIGDIR=/tmp/matplotlib \
    PYTHONUNBUFFERED=1
USER 10001
WORKDIR /home/broker
VOLUME ["/var/lib/hybrid-broker"]
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('BROKER_PORT', '8080'), timeout=3)"]
CMD ["broker", "serve"]
