#!/usr/bin/env bash
# Installs the end-to-end test client (the official openai npm package, pinned by
# tests/e2e/package-lock.json) into tests/e2e/node_modules, as scripts/setup-oracle.sh does for
# the tokenizer oracle. Idempotent: nothing is done when node_modules was installed from the same
# lock file (its hash is kept beside it), so after the first run it works offline.
set -euo pipefail
cd "$(dirname "$0")/../tests/e2e"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup-e2e: installing nodejs and npm"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends nodejs npm
fi

# The openai client supports Node.js 20 and later (its README says so); Debian bookworm ships 18.
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
  echo "setup-e2e: expected Node.js 20 or later, found $(node --version)" >&2
  exit 1
fi

stamp=node_modules/.dsv41-lock-sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "setup-e2e: node_modules up to date"
  exit 0
fi
echo "setup-e2e: npm ci"
npm ci --no-audit --no-fund --loglevel=error
echo "$want" > "$stamp"
