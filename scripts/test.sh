#!/usr/bin/env bash
# Set up and run the whole test suite on a fresh machine: a virtualenv with the launcher and its
# test tools, the local Slurm cluster (as root), then pytest. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv
.venv/bin/pip install --quiet --upgrade pip
.venv/bin/pip install --quiet 'torch==2.13.0'  # the CPU wheel; Megatron-Core's reader needs torch
.venv/bin/pip install --quiet -e '.[test]'

if [ "$(id -u)" = 0 ]; then
    bash scripts/slurm-local/start.sh
    # the SSH submission tests talk to a local sshd; the image build test runs podman, mksquashfs and busybox
    need=()
    [ -x /usr/sbin/sshd ] || need+=(openssh-server)
    command -v podman >/dev/null || need+=(podman)
    command -v mksquashfs >/dev/null || need+=(squashfs-tools)
    command -v busybox >/dev/null || need+=(busybox-static)
    if [ ${#need[@]} -gt 0 ]; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -q "${need[@]}" >/dev/null 2>&1 ||
            { apt-get update -q >/dev/null && apt-get install -y -q "${need[@]}" >/dev/null; }
    fi
else
    echo "not root: the local Slurm cluster is not started; Slurm tests run only if one is reachable" >&2
fi

export PATH="$PWD/.venv/bin:$PATH"
.venv/bin/ruff check --quiet .  # the lint rules of pyproject.toml [tool.ruff]
# two workers (ULTRA3_TEST_WORKERS): the Slurm tests on one, in turn, everything else shared out
workers=${ULTRA3_TEST_WORKERS:-2}
exec python -m pytest -n "$workers" --dist loadgroup --durations=15 "$@"  # the slowest tests, listed at the end
