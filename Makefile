# Both targets create (or reuse) the virtual environment in .venv themselves.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: demo test bench quality clean broker browser arm iproute

$(VENV)/.installed: pyproject.toml runner/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ./runner -e '.[test]'
	touch $@

demo: $(VENV)/.installed
	$(PY) -m streamtrace demo

# The MQTT bridge tests need a real broker: Debian's mosquitto, else amqtt already in the venv,
# else mosquitto installed here (as CI's root can), else amqtt from PyPI; without either those
# tests fail and say why. apt-get is bounded: a stuck mirror or dpkg lock falls through to amqtt
# instead of holding CI.
APT = DEBIAN_FRONTEND=noninteractive timeout 120 apt-get -o DPkg::Lock::Timeout=30 -o Acquire::Retries=1
broker: $(VENV)/.installed
	@command -v mosquitto >/dev/null 2>&1 || test -x /usr/sbin/mosquitto || test -x $(VENV)/bin/amqtt || \
	  ($(APT) install -y -q mosquitto || ($(APT) update -q && $(APT) install -y -q mosquitto)) || \
	  (echo "*** mosquitto could not be installed (apt-get needs root and a reachable mirror): installing" \
	        "amqtt from PyPI as the MQTT test broker ***" >&2 && $(PY) -m pip install --quiet 'amqtt>=0.11,<0.13') || \
	  echo "*** no MQTT broker (neither mosquitto nor amqtt): the MQTT bridge tests will fail ***" >&2

# The dashboard's browser test drives Debian's chromium + chromium-driver (never a downloaded
# browser); installed here when missing, bounded like the broker; without them that test fails
# and says why.
APT_BIG = DEBIAN_FRONTEND=noninteractive timeout 400 apt-get -o DPkg::Lock::Timeout=30 -o Acquire::Retries=1
browser:
	@{ command -v chromium >/dev/null 2>&1 || test -x /usr/bin/chromium; } && \
	  { command -v chromedriver >/dev/null 2>&1 || test -x /usr/bin/chromedriver; } || \
	  { echo "*** installing chromium and chromium-driver for the dashboard's browser test ***" >&2; \
	    $(APT_BIG) install -y -q chromium chromium-driver || ($(APT) update -q && $(APT_BIG) install -y -q chromium chromium-driver); } || \
	  echo "*** chromium / chromium-driver could not be installed (apt-get needs root and a reachable mirror): the" \
	       "dashboard's browser test will fail ***" >&2

# The cluster's network-partition test cuts a worker off in a network namespace with Debian's
# iproute2 (`ip netns`, a veth pair; needs root); installed here when missing, bounded like the
# broker; without it (or without root) that test is skipped and says why.
iproute:
	@command -v ip >/dev/null 2>&1 || test -x /usr/sbin/ip || \
	  ($(APT) install -y -q iproute2 || ($(APT) update -q && $(APT) install -y -q iproute2)) || \
	  echo "*** iproute2 could not be installed (apt-get needs root and a reachable mirror): the cluster's" \
	       "network-partition test will be skipped ***" >&2

# The aarch64 export test runs an exported learner under Debian's qemu-user, with the
# arm64 C and C++ runtimes, and iree-run-module from IREE's aarch64 runtime wheel, fetched
# here (never at test time) into .cache/iree-aarch64-<version>, the venv's iree-base-runtime
# version (the module and the tool must be of one release); apt-get bounded like the broker.
# Without them that test is skipped and says why.
IREE_VERSION = $$($(PY) -c 'import importlib.metadata as m; print(m.version("iree-base-runtime"))')
arm: $(VENV)/.installed
	@{ command -v qemu-aarch64 >/dev/null 2>&1 && test -e /usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1 && \
	   test -e /usr/aarch64-linux-gnu/lib/libstdc++.so.6; } || \
	  { echo "*** installing qemu-user, libc6-arm64-cross, libstdc++6-arm64-cross for the aarch64 export test ***" >&2; \
	    $(APT_BIG) install -y -q qemu-user libc6-arm64-cross libstdc++6-arm64-cross || \
	    ($(APT) update -q && $(APT_BIG) install -y -q qemu-user libc6-arm64-cross libstdc++6-arm64-cross); } || \
	  echo "*** qemu-user / the arm64 runtimes could not be installed (apt-get needs root and a reachable mirror):" \
	       "the aarch64 export test will be skipped ***" >&2
	@v=$(IREE_VERSION); dir=.cache/iree-aarch64-$$v; tool=$$dir/iree/_runtime_libs/iree-run-module; \
	test -x $$tool || { rm -rf $$dir && mkdir -p $$dir && \
	  $(PY) -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux_2_28_aarch64 \
	    --python-version 3.11 -d $$dir "iree-base-runtime==$$v" && \
	  $(PY) -m zipfile -e $$dir/iree_base_runtime-$$v-*.whl $$dir && chmod +x $$tool; } || \
	  echo "*** IREE's aarch64 runtime wheel could not be fetched: the aarch64 export test will be skipped ***" >&2

test: $(VENV)/.installed broker browser arm iproute
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[test,bench]'
	$(PY) -m pytest -q bench -p no:cacheprovider --pin-cpu 0
	$(PY) bench/paired.py --pin-cpu 0 --md bench/results/paired.md --json bench/results/paired.json

quality: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[test,quality]'
	$(PY) bench/quality.py
	$(PY) bench/short_seasons.py
	$(PY) bench/short_seasons.py --held-out --configs default
	$(PY) bench/lead_rows.py

clean:
	rm -rf $(VENV) build *.egg-info .cache
