# Two entry points for a fresh machine (see README):  make speedrun   |   make test
# Each creates .venv if needed and installs what it needs (the speedrun: a subset of the tests' packages). torch:
# one already in .venv (e.g. a CUDA build you installed) is kept; otherwise the CPU build comes from PyTorch's CPU
# wheel index (plain PyPI would pull the multi-GB CUDA build on Linux). `make torch DRY=echo` prints which path it
# takes without installing.
PY      ?= python3
VENV    ?= .venv
BIN      = $(VENV)/bin
TORCH_VERSION ?= 2.13.0
TORCH_INDEX   ?= https://download.pytorch.org/whl/cpu
DRY     ?=

# the speedrun's packages (the `speedrun` extra, bfcl-eval, bubblewrap for the sandbox that runs the model's python)
$(BIN)/.speedrun-installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(MAKE) --no-print-directory torch
	$(BIN)/pip install -q -e ".[speedrun]"
	$(BIN)/pip install -q --no-deps bfcl-eval  # its pins would downgrade numpy; its data files need none of them
	-@if command -v bwrap >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "sandbox: bwrap not found; running as root, so installing Debian's bubblewrap: apt-get update && apt-get install -y bubblewrap"; \
	  (apt-get update -qq && apt-get install -y -qq bubblewrap) >/dev/null 2>&1 || echo "note: installing bubblewrap failed; the sandbox runs weaker (see docs/sandbox.md)"; \
	else echo "note: bubblewrap not installed (install it: sudo apt-get install bubblewrap); the sandbox runs weaker (see docs/sandbox.md)"; fi
	touch $@

# everything: the speedrun's packages, every extra the tests use, Debian's chromium for the web page test
$(BIN)/.installed: $(BIN)/.speedrun-installed
	$(BIN)/pip install -q -e ".[data,semdedup,eval,serve,dev,ray,tracking]"
	-@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  echo "installing Debian's chromium (apt-get install -y chromium) for the web chat page test" && \
	  (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null 2>&1 || echo "note: chromium not installed; the browser test of glmstack serve is skipped"; }
	touch $@

install: $(BIN)/.installed

torch:
	@if [ -x $(BIN)/python ] && $(BIN)/python -c "import torch" 2>/dev/null; then \
	  echo "torch: keeping the installed $$($(BIN)/python -c 'import torch; print(torch.__version__)') in $(VENV)"; \
	else \
	  echo "torch: none in $(VENV); installing the CPU build from $(TORCH_INDEX)"; \
	  $(DRY) $(BIN)/pip install -q --retries 1 torch==$(TORCH_VERSION) --index-url $(TORCH_INDEX); \
	fi

test: $(BIN)/.installed
	$(BIN)/python -m pytest -n 2 --dist loadfile -q

speedrun: $(BIN)/.speedrun-installed
	$(BIN)/glmstack speedrun --out runs/speedrun

.PHONY: install torch test speedrun
