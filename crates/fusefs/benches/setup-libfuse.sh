#!/usr/bin/env bash
# Makes sure the floor benchmark can build its libfuse server: installs the Debian packages
# libfuse3-dev (libfuse's headers and pkg-config file), pkg-config and a C compiler when any is
# missing. It installs nothing else and starts nothing.
set -euo pipefail

if ! pkg-config --exists fuse3 2>/dev/null || ! command -v cc >/dev/null; then
    if [ "$(id -u)" != 0 ]; then
        echo "setup-libfuse: libfuse3-dev or a C compiler is missing and installing needs root" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq libfuse3-dev pkg-config gcc libc6-dev >/dev/null
fi
