#!/usr/bin/env bash
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# Install and start what the embedded lab needs on a Debian/Ubuntu machine: Docker Engine (Debian's docker.io),
# mmdebstrap (the lab's base image), and with --test what the test suite adds (git, Chromium and a font for the
# benchmark report's screenshot). `make site` runs it without --test, .ci/run with it.
# As root it installs the missing packages and starts dockerd; otherwise it prints the exact commands and stops.
set -euo pipefail
packages=(docker.io mmdebstrap make)
[[ ${1:-} == --test ]] && packages+=(git chromium fonts-dejavu-core)

missing=()
for pkg in "${packages[@]}"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
if ((${#missing[@]})); then
  if ((EUID != 0)); then
    echo "lab-prereqs: missing packages: ${missing[*]}. Install them, then run this again:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  echo "lab-prereqs: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  if [[ -d /run/systemd/system ]]; then
    start=(systemctl start docker)
  else
    # No systemd (CI machines, containers): dockerd in the background, its log beside the other system logs.
    start=(sh -c 'nohup dockerd >/var/log/dockerd-lab.log 2>&1 &')
  fi
  if ((EUID != 0)); then
    echo "lab-prereqs: Docker is not running. Start it, then run this again:" >&2
    echo "  sudo ${start[*]@Q}" >&2
    [[ -S /var/run/docker.sock ]] && echo "  (or, if it runs: sudo usermod -aG docker $USER, then log in again)" >&2
    exit 1
  fi
  echo "lab-prereqs: starting Docker (${start[*]})"
  "${start[@]}"
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  if ! docker info >/dev/null 2>&1; then
    echo "lab-prereqs: dockerd did not start in 60 s; its log:" >&2
    tail -20 /var/log/dockerd-lab.log 2>/dev/null >&2 || journalctl -u docker --no-pager -n 20 >&2 || true
    exit 1
  fi
fi
echo "lab-prereqs: Docker $(docker info -f '{{.ServerVersion}}') running; mmdebstrap $(mmdebstrap --version | cut -d' ' -f2)"
