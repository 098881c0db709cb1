# blendserve: slim, non-root, healthcheck on /health.
#   docker build -t blendserve .                          # in front of vLLM / any OpenAI upstream
#   docker build -t blendserve-cpu --build-arg EXTRAS=embedded .   # + embedded llama.cpp (CPU)
ARG PYTHON=3.11

FROM python:${PYTHON}-slim AS build
ARG EXTRAS=""
# A C/C++ toolchain only for the embedded extra (llama-cpp-python builds llama.cpp).
RUN if [ -n "$EXTRAS" ]; then \
      apt-get update && apt-get install -y --no-install-recommends build-essential cmake \
      && rm -rf /var/lib/apt/lists/*; \
    fi
# llama.cpp for any x86-64 host with AVX2, not only the build machine's CPU (docs/engines.md).
ENV CMAKE_ARGS=-DGGML_NATIVE=OFF
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY server ./server
COPY client ./client
RUN python -m venv /opt/blendserve \
    && /opt/blendserve/bin/pip install --no-cache-dir -c constraints.txt ./client ".${EXTRAS:+[$EXTRAS]}"

FROM python:${PYTHON}-slim
RUN useradd --create-home --uid 10001 blendserve
COPY --from=build /opt/blendserve /opt/blendserve
ENV PATH=/opt/blendserve/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    BLENDSERVE_HOST=0.0.0.0 \
    BLENDSERVE_PORT=8000 \
    BLENDSERVE_MODEL_CACHE_DIR=/home/blendserve/.cache/blendserve/models \
    NUMBA_CACHE_DIR=/home/blendserve/.cache/numba
USER blendserve
# Blend-ASC's kernels compiled now, as the image's user, into numba's cache in the image.
# The code's own __pycache__ is root's, so numba would cache in the user's home, empty in
# every new container: each would compile them again at its first job. A host whose CPU
# differs from the build machine's compiles them once more, into the same cache.
RUN python -c "from blendserve.core.policies.blend import warm_up; warm_up()"
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
  CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2).status != 200)"
ENTRYPOINT ["blendserve", "serve"]
