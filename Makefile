# The front door. `make` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PY := .venv/bin/python
ENV_FILE := .local/env

.PHONY: help bootstrap up down status migrate schema demo traces test test-unit test-repeat lint chaos soak hunt

help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

bootstrap: ## Install system packages (Java, Maven, PostgreSQL) and the Python env (.venv)
	@bash deploy/local/bootstrap.sh

up: bootstrap ## Start Kafka (KRaft) and PostgreSQL as local processes; writes .local/env (`make up KAFKA_BROKERS=3`: a 3-broker cluster)
	@AGENTLEDGER_KAFKA_BROKERS=$(or $(KAFKA_BROKERS),$(AGENTLEDGER_KAFKA_BROKERS)) bash deploy/local/stack.sh up

down: ## Stop the demo's services, then the local Kafka and PostgreSQL
	@if [ -x .venv/bin/agentledger ]; then .venv/bin/agentledger down; \
	  else bash deploy/local/stack.sh down; fi

status: ## Show whether Kafka and PostgreSQL answer
	@bash deploy/local/stack.sh status

migrate: up ## Apply database migrations to the running stack
	@. $(ENV_FILE) && .venv/bin/agentledger migrate

schema: up ## Regenerate migrations/schema.sql from a fresh migration run (commit it)
	@. $(ENV_FILE) && $(PY) -m agentledger.migrations dump-schema

demo: bootstrap up ## Start every service as real processes and play the narrated scenarios
	@. $(ENV_FILE) && .venv/bin/agentledger demo

traces: bootstrap up ## Start a real Jaeger (in memory, OTLP in), play the demo exporting to it; each explain prints its trace link
	@bash deploy/local/jaeger.sh start
	@. $(ENV_FILE) && set -a && eval "$$(bash deploy/local/jaeger.sh env)" && set +a && .venv/bin/agentledger demo
	@echo "traces: $$(bash deploy/local/jaeger.sh env | sed -n 's/^AGENTLEDGER_TRACES_URL=//p')  (stop: bash deploy/local/jaeger.sh stop)"

test: bootstrap ## Run the test suite against real Kafka and PostgreSQL (started if needed)
	@$(PY) -m pytest

test-unit: bootstrap ## Only the tests without I/O
	@$(PY) -m pytest tests/unit

TIERS ?= tests/integration tests/e2e tests/chaos
test-repeat: bootstrap ## Flake finder: run TIERS N times on one stack, tally each test (`make test-repeat N=5`)
	@$(PY) -m tests.repeat --runs $(or $(N),5) $(TIERS)

.PHONY: bench
bench: ## Benchmark vs pgbench and DBOS in one run (~8 min) → bench/results/latest.*
	@AGENTLEDGER_EXTRAS=dev,bench bash deploy/local/bootstrap.sh
	@if [ -f $(ENV_FILE) ]; then . $(ENV_FILE); fi; $(PY) -m bench

lint: bootstrap ## ruff + mypy (strict)
	@.venv/bin/ruff check libs services tests bench demo
	@.venv/bin/mypy

chaos: bootstrap ## Kill real services at every fault point N times each (default 20; `make chaos N=200`) on the shared stack and on 3 brokers + a synchronous standby, plus the long standby, failover and 3-broker cases
	@AGENTLEDGER_CHAOS_N=$(or $(N),20) AGENTLEDGER_CHAOS_SHAPES=single,production AGENTLEDGER_CHAOS_LONG=1 AGENTLEDGER_CHAOS_FULL=1 $(PY) -m pytest tests/chaos -p no:cacheprovider --timeout=7200

hunt: bootstrap ## The lost-record hunt: restart a private broker under the relay RUNS times (default 500), check every record after each → reports/lost-record/
	@$(PY) -m tests.lost_record --runs $(or $(RUNS),500)

soak: ## Mixed load on a private 3-broker cluster + synchronous standby while faults strike; a checker over the whole history (`make soak MINUTES=5 [SEED=1]`) → reports/soak.*
	@AGENTLEDGER_EXTRAS=dev,bench bash deploy/local/bootstrap.sh
	@$(PY) -m tests.soak --minutes $(or $(MINUTES),5) $(if $(SEED),--seed $(SEED))
