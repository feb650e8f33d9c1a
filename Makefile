# One command each: `make demo`, `make test`. Both run `setup` first; repeat runs
# reuse .venv and the jar cache (in the user's cache directory) and need no network.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
JARS := .cache/spark-jars.stamp
# The checkout's own modules compiled to bytecode before the tests (only what changed since), for the same reason
# as the install's --compile-bytecode: every test's subprocess would compile them again.
COMPILE_CHECKOUT = $(PY) -m compileall -q -j 0 coordinator tables support bench tests jobs > /dev/null

.PHONY: setup lock demo test test-bench test-under-load system-packages s3-server azurite chaos cluster bench peers clean

setup: $(INSTALLED) $(JARS)

# The exact versions requirements.lock pins (hash-checked), then this package in editable mode. Compiled to
# bytecode at install, as pip does and uv does not by default: where PYTHONDONTWRITEBYTECODE is set (this build
# machine's environment) no process would cache its imports, and every one compiled pyspark, pyarrow and pandas
# again (docs/performance-log.md#the-test-suite).
# uv installs as pip would, downloading and unpacking in parallel (a third of pip's time). It installs from its
# cache alone first (--offline; the lock's hashes are checked all the same), then from the index if the cache
# lacks something: where the index's replies cannot be cached (this build machine's), uv asks again for each
# one and downloads and builds pyspark's source distribution again at every install, keeping each copy; the
# prune drops the copies no install refers to, and never fails the setup (docs/performance-log.md#the-test-suite).
$(INSTALLED): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q uv==0.13.9
	$(call uv-cache-first,pip install -q --compile-bytecode --python $(PY) -r requirements.lock)
	$(call uv-cache-first,pip install -q --python $(PY) --no-deps -e .)
	-$(PY) -m uv cache prune -q
	touch $@

# $(call uv-cache-first,ARGS): `uv ARGS` from uv's cache alone, or, failing that, with the index.
uv-cache-first = $(PY) -m uv $(1) --offline 2>/dev/null || $(PY) -m uv $(1)

# The jars coordinator/spark/spark-jars.lock pins, downloaded at once and checked into the user's
# cache (the first Spark session would fetch them otherwise): after this, no run needs the network.
$(JARS): $(INSTALLED) coordinator/spark/spark-jars.lock
	$(PY) -m coordinator spark-setup > /dev/null
	mkdir -p $(@D) && touch $@

# Re-pin requirements.lock after changing pyproject.toml's dependencies (versions already pinned
# stay unless a range excludes them; `make lock UPGRADE=--upgrade` takes the newest allowed).
lock:
	$(PY) -m uv pip compile -q pyproject.toml --extra dev --python-version 3.11 --generate-hashes $(UPGRADE) \
		--custom-compile-command "make lock" -o requirements.lock

demo: setup
	$(PY) -m coordinator demo

# The product's tests (tests/). The S3 server of the object-storage tests is built from source once per machine
# (cached in txcoord's cache, ~/.cache/txcoord/s3: about a minute and a half of both cores), and Azurite, the
# Azure Storage emulator, installed from npm once (~/.cache/txcoord/azurite: about half a minute), both from the
# start (the scripts need only Python's stdlib); then the tests in two lanes at once (scripts/test_lanes.sh),
# each lane's time and its slowest tests printed. CI runs `make test-bench` after it.
test: system-packages
	@mkdir -p .cache; start=$$(date +%s); \
	$(PYTHON) -m coordinator.conformance.versitygw build > .cache/s3-build.log 2>&1 & build=$$!; \
	$(PYTHON) -m scripts.azurite install > .cache/azurite-install.log 2>&1 & azurite=$$!; \
	( $(JAVA_CLIENT_BUILD) ) > .cache/java-build.log 2>&1 & java=$$!; \
	$(MAKE) --no-print-directory setup || { kill $$build $$azurite $$java 2>/dev/null; exit 1; }; \
	$(COMPILE_CHECKOUT); \
	echo "--- setup took $$(( $$(date +%s) - start )) s"; \
	bash scripts/test_lanes.sh tests; status=$$?; \
	wait $$build || { echo "--- the S3 server's build failed:"; cat .cache/s3-build.log; status=1; }; \
	wait $$azurite || { echo "--- Azurite's install failed:"; cat .cache/azurite-install.log; status=1; }; \
	if wait $$java; then echo "--- the Java client (clients/java): $$(grep -a 'Tests run:' .cache/java-build.log | tail -1 \
	  | sed 's/.*Tests run/Tests run/') (.cache/java-build.log)"; \
	else echo "--- the Java client's build or its JUnit tests failed:"; tail -n 80 .cache/java-build.log; status=1; fi; \
	echo "--- make test took $$(( $$(date +%s) - start )) s"; exit $$status

# The Java client (clients/java): its jar, runtime jars (target/lib) and JUnit tests, with Maven, under the lock
# tests/test_java_client.py takes too (support/java_client.py), so that the two never build at once. Maven's
# repository is cached per machine (~/.m2, downloaded once); a warm build and its tests run in the background
# of the Python tests (their time: docs/performance-log.md#java-client).
JAVA_CLIENT_BUILD = if command -v mvn > /dev/null; then cd clients/java && flock target.lock mvn -B -ntp package; \
	else echo "Tests run: none, Maven is missing (sudo apt-get install maven)"; fi

# The benchmarks' and the chaos harness's own tests (bench/tests/): every benchmark's tiny run, the chaos runs
# (local disk, and the S3 server with storage faults), the verdict's and the reports' logic. Same lanes as
# `make test`; CI runs it second (.ci/run).
test-bench: system-packages
	@mkdir -p .cache; start=$$(date +%s); \
	$(MAKE) --no-print-directory setup || exit 1; \
	$(PYTHON) -m coordinator.conformance.versitygw build > .cache/s3-build.log 2>&1 || { echo "--- the S3 server's build failed:"; \
	  cat .cache/s3-build.log; exit 1; }; \
	$(COMPILE_CHECKOUT); \
	bash scripts/test_lanes.sh bench/tests; status=$$?; \
	echo "--- make test-bench took $$(( $$(date +%s) - start )) s"; exit $$status

# Three consecutive fresh-clone CI runs (`CI=true bash .ci/run`) beside two CPU-bound processes
# (stress-ng, installed when missing): the suite must not depend on a quiet machine. About an hour.
test-under-load:
	bash scripts/ci_under_load.sh

# Debian packages the tests use, installed when missing if this runs as root (CI does); otherwise the
# tests that need them are skipped, saying how to install them:
#   Prometheus's server and promtool: tests/test_prometheus.py
#   Chromium, headless, and its driver: tests/test_console_browser.py
#   Node.js and npm, which install and run Azurite: tests/test_object_storage_azure.py
#   a JDK's javac, which compiles txcoord's checkpoint file manager for S3: tests/test_own_classes.py
#   Maven, which builds the Java client: clients/java, tests/test_java_client.py
system-packages:
	@$(call apt-install,default-jdk-headless,javac,txcoord's checkpoint file manager for S3 needs a JDK's javac \
	  (sudo apt-get install default-jdk-headless): the checker uses Spark's own without it)
	@$(call apt-install,maven,mvn,the Java client (clients/java) builds with Maven (sudo apt-get install maven): \
	  its build and tests/test_java_client.py are skipped without it)
	@$(call apt-install,nodejs npm,node npm,tests/test_object_storage_azure.py needs Node.js and npm \
	  (sudo apt-get install nodejs npm): skipped without them)
	@$(call apt-install,prometheus,prometheus promtool,tests/test_prometheus.py needs Prometheus \
	  (sudo apt-get install prometheus): skipped without it)
	@$(call apt-install,chromium chromium-driver,chromium chromedriver,tests/test_console_browser.py needs Chromium \
	  and its driver (sudo apt-get install chromium chromium-driver): skipped without them)
	@$(call apt-install,postgresql,pg_ctlcluster,tests/test_exactly_once.py needs PostgreSQL's server \
	  (sudo apt-get install postgresql): its PostgreSQL tests are skipped without it)

# $(call apt-install,PACKAGES,COMMANDS,MESSAGE): install Debian's PACKAGES unless every one of COMMANDS is
# on the PATH, if root (apt-get update only when the first try fails); else print MESSAGE.
apt-install = missing=; for command in $(2); do command -v $$command >/dev/null || missing=1; done; \
	[ -z "$$missing" ] || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    export DEBIAN_FRONTEND=noninteractive; apt-get install -y -q --no-install-recommends $(1) >/dev/null 2>&1 || \
	      { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends $(1) >/dev/null; }; \
	  else echo "$(strip $(3))"; fi; }

# A real S3-compatible server on loopback (versitygw), built once into ~/.cache/txcoord/s3: the lakehouse of
# `txcoord conformance --object-store` and of the object-storage tests (`python -m coordinator.conformance.versitygw --help`).
s3-server: setup
	$(PY) -m coordinator.conformance.versitygw build

# Azurite, the Azure Storage emulator, installed once into ~/.cache/txcoord/azurite: `python -m scripts.azurite --help`.
azurite: setup
	$(PY) -m scripts.azurite install

# Kill -9 the checker and producers at random and verify every invariant: `python -m bench.chaos --help`.
chaos: setup
	$(PY) -m bench.chaos

# The checker on a Spark standalone cluster on this machine (a master and two workers): five JVMs,
# so not part of `make test`.
cluster: setup
	CLUSTER_TESTS=1 $(PY) -m pytest -q tests/test_cluster.py

# One checker cold start and small versions of the producer, end-to-end, history and batch-cost benchmarks,
# and end to end with the lakehouse on the loopback S3 server at 25 ms a request
# (`python -m bench.run --help` for the full suite).
bench: setup
	$(PY) -m bench.run --quick

# RocketMQ and Kafka transactions side by side with ours (needs a JDK and Maven; `python -m bench.peers.run --help`).
peers: setup
	$(PY) -m bench.peers.run

clean:
	rm -rf $(VENV) .cache demo-lakehouse lakehouse chaos-lakehouse
