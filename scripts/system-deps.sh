#!/usr/bin/env bash
# Install the Debian packages corral's multi-host tests need, when missing.
# Needs root (CI runs as root); elsewhere it only says what is missing.
set -euo pipefail
need=()
command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null 2>&1 || need+=(openssh-client)
command -v ssh-keygen >/dev/null 2>&1 || need+=(openssh-client)
command -v rsync >/dev/null 2>&1 || need+=(rsync)
command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || need+=(iproute2)
command -v pdsh >/dev/null 2>&1 || need+=(pdsh)
command -v unshare >/dev/null 2>&1 || need+=(util-linux)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
# the store tests start a throwaway PostgreSQL server (initdb + pg_ctl)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
# the web page's tests drive Debian's chromium with Playwright (no browser download);
# its headless shell, when there, spends a quarter of the CPU per page (tests/webkit.py)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromium-headless-shell >/dev/null 2>&1 || need+=(chromium-headless-shell)
# the Slurm test starts its own munged + slurmctld + two slurmd (tests/slurmcluster.py)
command -v slurmctld >/dev/null 2>&1 || [ -x /usr/sbin/slurmctld ] || need+=(slurmctld)
command -v slurmd >/dev/null 2>&1 || [ -x /usr/sbin/slurmd ] || need+=(slurmd)
command -v sbatch >/dev/null 2>&1 || need+=(slurm-client)
command -v munged >/dev/null 2>&1 || [ -x /usr/sbin/munged ] || need+=(munge)
[ ${#need[@]} -eq 0 ] && exit 0
mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "corral: missing system packages: ${need[*]}" >&2
  echo "corral: install them with: sudo apt-get install -y ${need[*]}" >&2
  echo "corral: (the multi-host tests need them; CI installs them itself)" >&2
  exit 0
fi
echo "corral: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${need[@]}" >/dev/null
