#!/usr/bin/env bash
# Installs the Debian 12 packages that kvstash's build, tests and benchmarks need.
# Idempotent: when every package is already present it exits at once, without
# touching the network. apt-get update runs at most once per invocation.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config make git
  libgrpc-dev grpc-proto                      # gRPC C core + health.proto
  protobuf-c-compiler libprotobuf-c-dev       # protoc-c + runtime
  protobuf-compiler                           # protoc, for the Python interop test
  libucx-dev ucx-utils                        # data plane + ucx_perftest
  libcunit1-dev                               # unit tests
  libinih-dev                                 # config file parser
  libmicrohttpd-dev                           # /metrics
  libssl-dev                                  # SHA-256 (libcrypto)
  openssl                                     # the CLI that tls_test makes certificates with
  libxxhash-dev                               # tile checksums (XXH3)
  libseccomp-dev libcap-ng-dev                # kvstash-xferd's sandbox
  libjson-c-dev                               # trace replay (kvstash-sim)
  python3 python3-grpcio python3-protobuf     # independent gRPC client in tests
  clang libclang-rt-14-dev                    # libFuzzer targets
  redis-server                                # benchmark baseline
  libhiredis-dev                              # Redis client of service_bench
  python3-prometheus-client                   # independent parser of /metrics in tests
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done" >&2
