# tandem's container image. Three stages:
#   build          compiles the portable release binary (kernels chosen at run time, so the
#                  image runs on any x86-64 CPU, fastest with AVX2/AVX-512)
#   runtime        Debian slim, the binary only, a non-root user; mount your models read-only
#                  at /models and name one with --model (or model.path in a mounted config)
#   default-model  runtime plus the default model (SmolLM2-135M-Instruct), the default target
#
#   docker build -t tandem .                          # with the default model baked in
#   docker build -t tandem:runtime --target runtime . # bring your own model
#   docker run -p 8080:8080 tandem
#   docker run -p 8080:8080 -v /srv/models:/models:ro tandem:runtime \
#       serve --model /models/Llama-3.2-3B-Instruct-Q4_0.gguf
ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY .cargo .cargo
COPY config config
COPY src src
RUN cargo build --release --locked --bin tandem \
    && strip target/release/tandem

FROM python:3.12-slim-${DEBIAN_RELEASE} AS model
COPY scripts/fetch-default-model /usr/local/bin/fetch-default-model
RUN TANDEM_CACHE=/opt/tandem fetch-default-model

FROM debian:${DEBIAN_RELEASE}-slim AS runtime
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/tandem --create-home tandem
COPY --from=build /src/target/release/tandem /usr/local/bin/tandem
# Listen on every interface inside the container; the default model (if any) and the cache
# live under the tandem user's home.
ENV TANDEM_HOST=0.0.0.0 \
    TANDEM_PORT=8080 \
    TANDEM_CACHE=/var/lib/tandem
USER 10001:10001
WORKDIR /var/lib/tandem
EXPOSE 8080
# `tandem health` asks /health (503 while loading and while draining after SIGTERM).
HEALTHCHECK --interval=10s --timeout=5s --start-period=180s --retries=3 CMD ["tandem", "health"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["tandem"]
CMD ["serve"]

FROM runtime AS default-model
COPY --from=model --chown=10001:10001 /opt/tandem/models /var/lib/tandem/models
# The default model's draft head (`--draft-model head`), found under TANDEM_CACHE/heads.
COPY --chown=10001:10001 heads/SmolLM2-135M-Instruct/config.json heads/SmolLM2-135M-Instruct/model.safetensors /var/lib/tandem/heads/SmolLM2-135M-Instruct/
