# Two entry points for a fresh machine (see README):  make speedrun   |   make test
# Each creates .venv if needed and installs what it needs; the CPU torch pin keeps pip off the CUDA build.
PY      ?= python3
VENV    ?= .venv
BIN      = $(VENV)/bin
TORCH    = torch==2.13.0

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e ".[data,semdedup,eval,serve,dev]"
	$(BIN)/pip install -q --no-deps bfcl-eval  # its pins would downgrade numpy; its data files need none of them
	-@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get update -qq && apt-get install -y -qq bubblewrap) >/dev/null 2>&1 || echo "note: bubblewrap not installed; the sandbox runs weaker (see docs/sandbox.md)"; }
	-@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  echo "installing Debian's chromium (apt-get install -y chromium) for the web chat page test" && \
	  (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null 2>&1 || echo "note: chromium not installed; the browser test of glmstack serve is skipped"; }
	touch $@

install: $(BIN)/.installed

test: $(BIN)/.installed
	$(BIN)/python -m pytest -n 2 --dist loadfile -q

speedrun: $(BIN)/.installed
	$(BIN)/glmstack speedrun --out runs/speedrun

.PHONY: install test speedrun
