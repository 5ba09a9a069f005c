# fleethealth: one image for the controller (`run`), the node agent (`agent`) and the serving sidecar
# (`sidecar`); deploy/*.yaml refer to it as ghcr.io/fleethealth/fleethealth:0.1.0.
#   docker build -t ghcr.io/fleethealth/fleethealth:0.1.0 .
# Stage 1 builds the wheel of fleethealth and of every dependency; stage 2 installs them into a slim
# Python image without compilers or the source tree and runs as a non-root user (65532, as the manifests'
# runAsUser). tests/test_deploy_image.py performs the same install steps in a clean virtualenv.

FROM python:3.11-slim AS build
WORKDIR /src
RUN python -m pip install --no-cache-dir --upgrade pip wheel
COPY pyproject.toml README.md ./
COPY src ./src
RUN python -m pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
COPY --from=build /wheels /wheels
RUN python -m pip install --no-index --find-links /wheels fleethealth \
 && rm -rf /wheels \
 && fleethealth --help >/dev/null \
 && groupadd --gid 65532 fleethealth \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin fleethealth \
 && mkdir -p /var/lib/fleethealth && chown 65532:65532 /var/lib/fleethealth
USER 65532:65532
WORKDIR /var/lib/fleethealth
EXPOSE 9108 9400 8080
ENTRYPOINT ["fleethealth"]
CMD ["--help"]
