# drain-router: one image for the router sidecar and the controller.
# Build: docker build -t drain-router . (or buildah bud). Python is PID 1 and installs its own
# SIGTERM/SIGINT handlers first thing, so the kubelet's SIGTERM starts the drain directly.
#
# BASE is any Debian bookworm image with python3 (>= 3.11) and its venv module: the official
# python slim image by default, or a plain Debian rootfs with python3 + python3-venv where no
# registry is reachable (scripts/build-image.sh, docs/image.md). Everything is installed into a
# virtualenv, so Debian's "externally managed" system Python never refuses pip.
ARG BASE=python:3.11.14-slim-bookworm
# The release this image is: pyproject.toml's version (tests/cli/test_release.py keeps them equal).
# Both stages declare it again to use it: the pinned install below and the image's version label.
ARG VERSION=0.2.0

FROM ${BASE} AS build
ARG VERSION
RUN python3 -m venv /opt/drain-router
ENV PATH=/opt/drain-router/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY drain_router ./drain_router
# The router and the controller, and the OpenTelemetry SDK that --tracing loads (the otel extra; never
# imported without the flag): no demo, plot or development tools (tests/cli/test_image.py and the
# image smoke run check), at the tested versions (constraints.txt). The whole virtualenv is
# made here and copied: the wheels never become a layer of the image, and pip and setuptools, which
# nothing runs at run time, are removed from it.
RUN pip wheel --no-cache-dir --wheel-dir /wheels -c constraints.txt '.[controller,otel]' \
    && pip install --no-cache-dir --no-index --find-links=/wheels "drain-router[controller,otel]==${VERSION}" \
    && pip uninstall --quiet --yes pip setuptools

FROM ${BASE}
ARG VERSION
LABEL org.opencontainers.image.title="drain-router" \
      org.opencontainers.image.version="${VERSION}"
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PATH=/opt/drain-router/bin:$PATH
# The same base and the same path in both stages, so the virtualenv's interpreter links still hold.
COPY --from=build /opt/drain-router /opt/drain-router
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin drainrouter
USER 10001:10001
EXPOSE 8080 9091
STOPSIGNAL SIGTERM
ENTRYPOINT ["drain-router"]
CMD ["serve", "--upstream", "http://127.0.0.1:8000"]
