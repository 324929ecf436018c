# The front door. `make` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PY := .venv/bin/python
ENV_FILE := .local/env

.PHONY: help bootstrap up down status migrate schema demo traces test test-unit test-repeat lint chaos soak soak-load hunt

help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {name[++n] = $$1; text[n] = $$2; \
	  if (length($$1) > w) w = length($$1)} \
	  END {for (i = 1; i <= n; i++) printf "  make %-*s  %s\n", w, name[i], text[i]}' $(MAKEFILE_LIST)

bootstrap: ## Install what the demo uses, once (Java, Maven, PostgreSQL, .venv, Kafka's jars, Mailpit); output in .local/logs/
	@bash deploy/local/bootstrap.sh

up: bootstrap ## Start Kafka (KRaft) and PostgreSQL as local processes; writes .local/env (`KAFKA_BROKERS=3`: a cluster)
	@AGENTLEDGER_KAFKA_BROKERS=$(or $(KAFKA_BROKERS),$(AGENTLEDGER_KAFKA_BROKERS)) bash deploy/local/stack.sh up

down: ## Stop the demo's services, then the local Kafka and PostgreSQL
	@if [ -x .venv/bin/agentledger ]; then .venv/bin/agentledger down; \
	  else bash deploy/local/stack.sh down; fi

status: ## Show the demo's services and whether Kafka and PostgreSQL answer
	@if [ -x .venv/bin/agentledger ]; then .venv/bin/agentledger status; \
	  else bash deploy/local/stack.sh status; fi

migrate: up ## Apply database migrations to the running stack
	@. $(ENV_FILE) && .venv/bin/agentledger migrate

schema: up ## Regenerate migrations/schema.sql from a fresh migration run (commit it)
	@. $(ENV_FILE) && $(PY) -m agentledger.migrations dump-schema

# The demo starts Kafka and PostgreSQL itself, quietly (their output in .local/demo/logs/).
demo: bootstrap ## Start every service as real processes and play the narrated scenarios
	@.venv/bin/agentledger demo

traces: bootstrap up ## Start a real Jaeger (built once, ~7 min), play the demo exporting to it; explain prints trace links
	@bash deploy/local/jaeger.sh start
	@. $(ENV_FILE) && set -a && eval "$$(bash deploy/local/jaeger.sh env)" && set +a && .venv/bin/agentledger demo
	@echo "traces: $$(bash deploy/local/jaeger.sh env | sed -n 's/^AGENTLEDGER_TRACES_URL=//p')  (stop: bash deploy/local/jaeger.sh stop)"

test: ## Run the test suite against real Kafka and PostgreSQL (installs its tools once; starts the stack if needed)
	@bash deploy/local/bootstrap.sh test
	@$(PY) -m pytest

test-unit: ## Only the tests without I/O
	@bash deploy/local/bootstrap.sh dev
	@$(PY) -m pytest tests/unit

TIERS ?= tests/integration tests/e2e tests/chaos
test-repeat: ## Flake finder: run TIERS N times on one stack, tally each test (`make test-repeat N=5`)
	@bash deploy/local/bootstrap.sh test
	@$(PY) -m tests.repeat --runs $(or $(N),5) $(TIERS)

.PHONY: bench
bench: ## Benchmark vs pgbench and DBOS in one run (~8 min) → bench/results/latest.*
	@AGENTLEDGER_EXTRAS=bench bash deploy/local/bootstrap.sh dev
	@if [ -f $(ENV_FILE) ]; then . $(ENV_FILE); fi; $(PY) -m bench

lint: ## ruff + mypy (strict)
	@bash deploy/local/bootstrap.sh dev
	@.venv/bin/ruff check libs services tests bench demo
	@.venv/bin/mypy

chaos: ## Kill real services at every fault point N times (default 20), on 1 broker and on 3 + a sync standby
	@bash deploy/local/bootstrap.sh dev
	@AGENTLEDGER_CHAOS_N=$(or $(N),20) AGENTLEDGER_CHAOS_SHAPES=single,production AGENTLEDGER_CHAOS_LONG=1 AGENTLEDGER_CHAOS_FULL=1 $(PY) -m pytest tests/chaos -p no:cacheprovider --timeout=7200

hunt: ## The lost-record hunt: restart a private broker under the relay RUNS times (default 500) → reports/lost-record/
	@bash deploy/local/bootstrap.sh dev
	@$(PY) -m tests.lost_record --runs $(or $(RUNS),500)

soak: ## Mixed load on 3 brokers + a sync standby while faults strike; checks the whole history (`make soak MINUTES=5`) → reports/soak.*
	@AGENTLEDGER_EXTRAS=bench bash deploy/local/bootstrap.sh dev
	@$(PY) -m tests.soak --minutes $(or $(MINUTES),5) $(if $(SEED),--seed $(SEED))

soak-load: ## The soak at half the box's measured capacity for 30 min (issue 41) → docs/evidence/soak-load.json
	@AGENTLEDGER_EXTRAS=bench bash deploy/local/bootstrap.sh dev
	@$(PY) -m tests.soak --minutes $(or $(MINUTES),30) --load-share $(or $(SHARE),0.5) $(if $(SEED),--seed $(SEED)) --evidence docs/evidence/soak-load.json
