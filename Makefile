# The two commands of the README. Each sets up .venv itself (scripts/setup_env.sh) when it is
# missing or older than its inputs.
VENV := .venv
SETUP_STAMP := $(VENV)/.setup-complete
PROFILE ?= cpu
# Where the slow builds are cached, outside the checkout, so fresh clones reuse them.
CACHE_DIR ?= $(or $(DT_CACHE_DIR),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/distributed-training)

.PHONY: demo test lint setup gpu-wheel image bench azure-check

HOROVOD_PATCHES := $(wildcard scripts/horovod-patches/*.patch)

$(SETUP_STAMP): pyproject.toml scripts/setup_env.sh scripts/build_horovod.sh \
		$(HOROVOD_PATCHES) scripts/build_jpeg_region.sh trainer/data/jpeg_region.c
	bash scripts/setup_env.sh "$(CACHE_DIR)"
	touch $@

setup: $(SETUP_STAMP)

# The image's Horovod (NCCL GPU operations), built here without a GPU the way the image's builder
# stage builds it, so tests/docker checks on every change what the image will run. Cached by its
# inputs outside the checkout: minutes and about 5 GB of downloads the first time only.
GPU_WHEEL_STAMP := $(VENV)/.gpu-wheel
$(GPU_WHEEL_STAMP): $(SETUP_STAMP) scripts/build_gpu_wheel.sh scripts/build_horovod.sh \
		$(HOROVOD_PATCHES)
	bash scripts/build_gpu_wheel.sh "$(CACHE_DIR)" > $@.tmp
	mv $@.tmp $@

gpu-wheel: $(GPU_WHEEL_STAMP)

# The trainer image, built here from docker/Dockerfile as ACR Tasks builds it for a stack, its
# smoke test included (scripts/build_image.sh: buildah and a Debian base made with mmdebstrap, no
# Docker engine; as root). Layers and the base are cached outside the checkout; an image of
# this checkout's inputs (its content tag) is not built again. make test builds it first: the
# emulated nodes and tests/docker run the payloads inside it.
image: $(SETUP_STAMP)
	bash scripts/build_image.sh "$(CACHE_DIR)"

demo: $(SETUP_STAMP)
	bash scripts/demo.sh

# Style and types: ruff, and pyright over the Azure program and the policy pack against the
# installed azure-native types (pyproject's [tool.pyright]).
lint: $(SETUP_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/pyright

# All at once (scripts/run_tests.sh says how and why): the tests marked `processes` (real
# multi-process runs) one at a time at normal priority, and beside them, at the lowest CPU
# priority, lint and then the tests that start no multi-process run, on the cores the runs leave
# idle. tests/ci/test_workflows.py checks that the two passes run every test once. The trainer
# image first (make image): the payloads of tests/docker and of some emulated nodes run in it.
test: $(SETUP_STAMP) $(GPU_WHEEL_STAMP) image
	bash scripts/run_tests.sh

# Benchmarks print figures and save bench/results/*.json and *.png (about an hour here).
bench: $(SETUP_STAMP)
	DT_CACHE_DIR="$(CACHE_DIR)" $(VENV)/bin/python -m bench.run_all

# Prove the stack on your subscription (Pulumi CLI and az login needed; creates, checks and
# destroys a throwaway stack; see README): make azure-check [PROFILE=cpu|gpu] [ARGS=--dry-run]
azure-check: $(SETUP_STAMP)
	$(VENV)/bin/python -m dt_commands.acceptance --profile $(PROFILE) $(ARGS)
