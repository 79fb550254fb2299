#!/bin/sh
# Headless Chromium + chromedriver for the dashboard's browser tests (tests/ui), from Debian.
# Idempotent: does nothing when both are already installed.
set -e
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -q
$SUDO apt-get install -y -q chromium chromium-driver
