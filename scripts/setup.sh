#!/usr/bin/env bash
# Set up everything the demo and the tests need, on a fresh Debian machine:
# Debian's Chromium (Playwright's own browser download is not used), a virtual
# environment in .venv, texelfit installed into it (editable, with test extras), and the npm
# dev dependencies of package.json.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x /usr/bin/chromium ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  echo "setup: installing Debian's chromium" >&2
  $sudo apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q chromium >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv" >&2
  "${PYTHON:-python3}" -m venv .venv
fi
echo "setup: installing texelfit and its dependencies into .venv (torch==2.13.0, CPU)" >&2
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]' 2>&1 | { grep -v '^WARNING: Location' || true; } >&2

echo "setup: installing the JS dev tools (typescript for the .d.ts check, TF.js for bench/)" >&2
npm install --no-audit --no-fund --loglevel=error >&2
