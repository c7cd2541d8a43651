#!/usr/bin/env bash
# Makes sure the throughput benchmark's peer can run: installs the Debian packages sshfs and
# openssh-server when either is missing, and creates sshd's privilege separation directory
# (/run/sshd, which the package's service unit would otherwise create). It never starts, stops
# or configures the system's sshd: the benchmark runs a private one with its own config, host
# key and authorized key in a temporary directory, on 127.0.0.1 only.
set -euo pipefail

if ! command -v sshfs >/dev/null || [ ! -x /usr/sbin/sshd ] \
    || [ ! -x /usr/lib/openssh/sftp-server ] || ! command -v ssh-keygen >/dev/null; then
    if [ "$(id -u)" != 0 ]; then
        echo "setup-sshfs: sshfs or openssh-server is missing and installing needs root" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # In a container policy-rc.d keeps the package from starting the system's sshd; on a host
    # with systemd the package starts it as usual. The benchmark uses neither.
    apt-get install -y -qq sshfs openssh-server >/dev/null
fi
# sshd refuses to start without it.
install -d -m 0755 /run/sshd
