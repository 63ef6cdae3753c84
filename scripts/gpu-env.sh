# Source this on the GPU machine, from the repository root, before configuring the full build or
# running the node tests there:   source scripts/gpu-env.sh [prefix]   (default /tmp/gpu-prefix)
#
# Why: the GPU machine (Ubuntu 24.04, no network) has CUDA, GoogleTest, Google Benchmark, CLI11,
# fmt and nlohmann-json, but not the Debian libraries of the full build (PCRE2, utf8proc, xxHash,
# cpp-httplib; docs/cuda.md) nor node. The ignored folder .gpu, carried with the working tree,
# holds them; this unpacks them into the prefix (never into /) and points the environment at it:
#   .gpu/debs/*.deb      Debian 12 packages of those libraries (and OpenSSL, zlib and Brotli, whose
#                        headers and .pc files cpp-httplib's need), pkg-config and xz
#   .gpu/node.xz         the dev machine's /usr/bin/node (needs only glibc and libstdc++); optional
#   .gpu/openai.tar.xz   tests/e2e/node_modules (the openai client), without types and source maps
# Idempotent: once unpacked, a second run only sets the variables again.

gpu_env() {
  local p=${1:-/tmp/gpu-prefix} repo=$PWD deb
  local lib=$p/usr/lib/x86_64-linux-gnu sys=/usr/local/lib/x86_64-linux-gnu/pkgconfig:/usr/local/lib/pkgconfig:/usr/local/share/pkgconfig:/usr/lib/x86_64-linux-gnu/pkgconfig:/usr/lib/pkgconfig:/usr/share/pkgconfig
  case $p in /*) ;; *) echo "gpu-env: the prefix must be an absolute path" >&2; return 1 ;; esac
  case $p in /|/usr|/usr/*|/lib*|/bin|/etc) echo "gpu-env: refusing prefix $p" >&2; return 1 ;; esac
  [ -d "$repo/.gpu/debs" ] || { echo "gpu-env: no .gpu/debs here; source this from the repo root" >&2; return 1; }

  local want; want=$(cd "$repo/.gpu/debs" && ls -- *.deb)
  if [ "$(cat "$p/.gpu-env-debs" 2>/dev/null)" != "$want" ]; then
    mkdir -p "$p/bin" || return 1
    local have; have=$(PATH=$PATH:/sbin:/usr/sbin ldconfig -p 2>/dev/null)
    for deb in "$repo"/.gpu/debs/*.deb; do
      case ${deb##*/} in  # fallbacks: left out where the system has its own, rather than shadow it
        libssl3_*) grep -q 'libssl\.so\.3 ' <<<"$have" && continue ;;
        libbrotli1_*) grep -q 'libbrotlidec\.so\.1 ' <<<"$have" && continue ;;
        xz-utils_*) command -v xz >/dev/null && continue ;;
        pkgconf*|pkg-config_*|libpkgconf3_*) command -v pkg-config >/dev/null && continue ;;
      esac
      dpkg -x "$deb" "$p" || return 1
    done
    # The .pc files say prefix=/usr: make them say the prefix. OpenSSL keeps two headers in the
    # multiarch folder, which the compiler searches only under /usr: put them beside the others.
    sed -i -E "s#^([a-z_]+)=/usr(/|\$)#\1=$p/usr\2#" "$lib"/pkgconfig/*.pc
    [ ! -d "$p/usr/include/x86_64-linux-gnu" ] || cp -a "$p/usr/include/x86_64-linux-gnu/." "$p/usr/include/"
    echo "$want" > "$p/.gpu-env-debs"
  fi

  # Prefix first; each only once, however often this is sourced.
  local v d
  for v in PATH:$p/usr/bin PATH:$p/bin LD_LIBRARY_PATH:$lib PKG_CONFIG_PATH:$p/usr/share/pkgconfig \
           PKG_CONFIG_PATH:$lib/pkgconfig CMAKE_PREFIX_PATH:$p/usr; do
    d=${v#*:} v=${v%%:*}
    case ":${!v:-}:" in *":$d:"*) ;; *) export "$v=$d${!v:+:${!v}}" ;; esac
  done
  export PKG_CONFIG_LIBDIR=$lib/pkgconfig:$p/usr/share/pkgconfig:$sys

  # node and the openai client only where packed (gpu-pack.sh NODE=0 leaves them out: the serving
  # benchmark and the C++ tests need neither, and the tree's copy to the GPU machine is limited).
  if [ ! -f "$repo/.gpu/node.xz" ]; then
    echo "gpu-env: libraries and pkg-config from $p; no node in .gpu (the openai client tests cannot run)"
    return 0
  fi
  if [ ! -x "$p/bin/node" ]; then
    xz -dc "$repo/.gpu/node.xz" > "$p/bin/node.part" && chmod +x "$p/bin/node.part" &&
      mv "$p/bin/node.part" "$p/bin/node" || return 1
  fi
  if [ ! -d "$repo/tests/e2e/node_modules/openai" ]; then
    tar -C "$repo/tests/e2e" -xJf "$repo/.gpu/openai.tar.xz" || return 1
  fi
  echo "gpu-env: libraries, pkg-config and node $("$p/bin/node" --version) from $p; openai in tests/e2e/node_modules"
}
gpu_env "$@"
unset -f gpu_env
