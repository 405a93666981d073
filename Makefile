# edgesched: the two commands a newcomer needs are `make demo` (the main job) and `make test`.
# Both set up everything from nothing: a virtual environment in .venv with the project and
# its dev tools installed from pyproject.toml.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup demo sim test lint typecheck unit bench bundle clean

# System packages the tests run for real, as command:package: Mosquitto (the MQTT broker),
# sysbench and fio (node qualification), Chromium (the dashboard's browser test; Playwright
# drives /usr/bin/chromium, it never downloads a browser), ip and nft (real partitions in
# network namespaces), etcd (central replicas' shard leases) and NATS server (the clustered
# MQTT broker tier), node and npm (the reference Yjs, npm yjs@13, referees the update decoder),
# tcpdump (bench/pcap_mqtt.py reads real captures), promtool (Prometheus checks /metrics and
# docs/alerts.yml). Installed with apt when running as root
# (CI, a fresh gateway);
# otherwise we say what is missing.
SYSTEM_DEPS := mosquitto:mosquitto sysbench:sysbench fio:fio chromium:chromium ip:iproute2 nft:nftables etcd:etcd-server etcdctl:etcd-client nats-server:nats-server node:nodejs npm:npm tcpdump:tcpdump promtool:prometheus
.PHONY: system-deps
system-deps:
	@missing=""; for pair in $(SYSTEM_DEPS); do c=$${pair%%:*}; p=$${pair##*:}; command -v $$c >/dev/null 2>&1 || [ -x /usr/sbin/$$c ] || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing:$$missing"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "missing system packages:$$missing (install them with apt-get as root)"; exit 1; fi; \
	fi

$(STAMP): pyproject.toml $(shell find core edge sync central policies fieldtest rest app -name '*.py' -newer pyproject.toml 2>/dev/null)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# strict editable mode: a link tree that maps core/ -> edgesched.core etc., which mypy follows
	$(BIN)/python -m pip install -q -e '.[dev]' --config-settings editable_mode=strict
	touch $(STAMP)

setup: system-deps $(STAMP)

## The main job: a broker, central and four simulated edge nodes run a campus day here at
## x720 (about 2.5 minutes); one node is cut off and healed; what happened is printed.
demo: setup
	$(BIN)/edgesched demo

## Simulate the campus day with every strategy, print the table, write a plot.
sim: setup
	$(BIN)/edgesched sim --scenario campus --plot out/campus-day.png --output out/campus-day.json \
		--markdown out/campus-day.md

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup
	# -p checks the package through the editable link tree, so each module has one name
	cd $(VENV) && bin/mypy --config-file ../pyproject.toml -p edgesched
	$(BIN)/mypy tests bench

unit: setup
	$(BIN)/pytest

## Everything CI checks.
test: lint typecheck unit

## An offline install bundle (tarball in out/bundle/) for ARCH (x86_64 or aarch64) and PY;
## see "Offline bundle, upgrade and rollback" in the README.
ARCH ?= $(shell uname -m)
PY   ?= 3.11
bundle: setup
	$(BIN)/edgesched bundle --arch $(ARCH) --python $(PY) --out out/bundle --tar

bench: setup
	$(BIN)/python bench/bench_placement.py
	$(BIN)/python bench/bench_simulator.py
	cd /tmp && $(CURDIR)/$(BIN)/python $(CURDIR)/bench/bench_edge_latency.py
	cd /tmp && $(CURDIR)/$(BIN)/python $(CURDIR)/bench/bench_edge_footprint.py
	cd /tmp && $(CURDIR)/$(BIN)/python $(CURDIR)/bench/bench_edge_transactions.py
	cd /tmp && $(CURDIR)/$(BIN)/python $(CURDIR)/bench/bench_edge_history.py
	cd /tmp && $(CURDIR)/$(BIN)/python $(CURDIR)/bench/bench_sync.py
	cd /tmp && $(CURDIR)/$(BIN)/python $(CURDIR)/bench/bench_broker_cluster.py
	$(BIN)/python bench/bench_schema.py
	cd /tmp && $(CURDIR)/$(BIN)/python $(CURDIR)/bench/bench_policies.py
	cd /tmp && $(CURDIR)/$(BIN)/python $(CURDIR)/bench/bench_central_scale.py
	# 10,000 nodes needs ~20 GB: --nodes 100,1000,10000 (docs/benchmarks.md)
	cd /tmp && $(CURDIR)/$(BIN)/python $(CURDIR)/bench/bench_control_step.py --nodes 100,1000
	cd /tmp && $(CURDIR)/$(BIN)/python $(CURDIR)/bench/bench_central_fanin.py --nodes 100,1000
	cd /tmp && $(CURDIR)/$(BIN)/python $(CURDIR)/bench/bench_task_views.py --nodes 100,1000
	cd /tmp && $(CURDIR)/$(BIN)/python $(CURDIR)/bench/bench_dashboard.py --nodes 100,1000

clean:
	rm -rf $(VENV) build out .pytest_cache .mypy_cache .ruff_cache .hypothesis
