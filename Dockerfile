# drain-router: one image for the router sidecar and the controller.
# Build: docker build -t drain-router . (or buildah bud). Python is PID 1 and installs its own
# SIGTERM/SIGINT handlers first thing, so the kubelet's SIGTERM starts the drain directly.

FROM python:3.11.14-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY router ./router
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[controller]'

FROM python:3.11.14-slim-bookworm
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links=/wheels 'drain-router[controller]==0.1.0' \
    && rm -rf /wheels \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin drainrouter
USER 10001:10001
EXPOSE 8080 9091
STOPSIGNAL SIGTERM
ENTRYPOINT ["drain-router"]
CMD ["serve", "--upstream", "http://127.0.0.1:8000"]
