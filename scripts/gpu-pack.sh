#!/usr/bin/env bash
# Makes the ignored folder .gpu that travels to the GPU machine (docs/cuda.md, "The full build
# there"), on the Debian 12 dev machine: the Debian packages of the full build's libraries that the
# GPU machine lacks, this machine's node and the openai client. scripts/gpu-env.sh unpacks them
# there. Run from anywhere; OUT (default the repo's .gpu) is replaced. NODE=0 packs the libraries
# only (~8 MB, where node and the client take ~24 more): enough for the serving benchmark and the
# C++ tests, and what fits beside the tracked tree in the device tool's 64 MiB (docs/cuda.md).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-.gpu}
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf "$out"
mkdir -p "$out/debs"
# cpp-httplib's pkg-config file requires OpenSSL's, zlib's and Brotli's: their -dev packages too.
packages=(libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libutf8proc-dev libutf8proc2
  libxxhash-dev libxxhash0 libcpp-httplib-dev libcpp-httplib0.11 libssl-dev libssl3 zlib1g-dev libbrotli-dev
  libbrotli1 pkg-config pkgconf pkgconf-bin libpkgconf3 xz-utils)
(cd "$out/debs" && apt-get download -qq "${packages[@]}")
for f in "$out"/debs/*%3a*; do [ -e "$f" ] && mv "$f" "$(sed 's/_[0-9]*%3a/_/' <<<"$f")"; done  # the epoch out of the name
if [ "${NODE:-1}" = 0 ]; then du -sh "$out"; exit 0; fi
scripts/setup-e2e.sh > /dev/null
xz -T0 -9e -c "$(command -v node)" > "$out/node.xz"
# The client without its types, sources and maps: what node loads.
tar -C tests/e2e -cJf "$out/openai.tar.xz" --exclude='*.map' --exclude='*.d.ts' --exclude='*.d.mts' --exclude='*.d.cts' \
  --exclude='*.md' --exclude='node_modules/openai/src' node_modules
du -sh "$out"
