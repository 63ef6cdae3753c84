#!/usr/bin/env bash
# Installs every Debian package dsv41 needs to build and test. Idempotent: packages already present
# are not touched, and apt is not called at all when nothing is missing (so it also works offline).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libfmt-dev
  libopenblas-dev
  clang libomp-dev
  libutf8proc-dev libpcre2-dev
  libxxhash-dev
  libpng-dev libjpeg62-turbo-dev  # image decoding (docs/vision.md)
  python3-pil  # Pillow, the image preprocessing's oracle (tests/image_pillow_oracle_test)
  memcached libmemcached-dev
  libcpp-httplib-dev
  libedit-dev
  curl
  chromium  # headless, for the chat page's test (tests/web)
  bible-kjv bible-kjv-text
  # The training corpus (docs/training-data.md): its sources, and zlib to read them
  r-cran-janeaustenr jargon-text dict-devil wordnet-base zlib1g-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
