# Both targets create (or reuse) the virtual environment in .venv themselves.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: demo test bench quality clean broker browser

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
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

test: $(VENV)/.installed broker browser
	$(PY) -m pytest -q

bench: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[test,bench]'
	$(PY) -m pytest -q bench -p no:cacheprovider --pin-cpu 0
	$(PY) bench/paired.py --pin-cpu 0 --md bench/results/paired.md --json bench/results/paired.json

quality: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[test,quality]'
	$(PY) bench/quality.py

clean:
	rm -rf $(VENV) build *.egg-info
