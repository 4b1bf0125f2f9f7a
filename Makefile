# Both targets create (or reuse) the virtual environment in .venv themselves.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: demo test bench quality clean broker

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

demo: $(VENV)/.installed
	$(PY) -m streamtrace demo

# The MQTT bridge tests need a real broker: Debian's mosquitto (installed here when missing, as
# CI's root can), else amqtt from PyPI in the venv; without either those tests fail and say why.
broker: $(VENV)/.installed
	@command -v mosquitto >/dev/null 2>&1 || test -x /usr/sbin/mosquitto || \
	  (DEBIAN_FRONTEND=noninteractive apt-get install -y -q mosquitto || \
	   (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q mosquitto)) || \
	  test -x $(VENV)/bin/amqtt || \
	  (echo "*** mosquitto could not be installed (apt-get needs root): installing amqtt from PyPI as the" \
	        "MQTT test broker ***" >&2 && $(PY) -m pip install --quiet 'amqtt>=0.11,<0.13') || \
	  echo "*** no MQTT broker (neither mosquitto nor amqtt): the MQTT bridge tests will fail ***" >&2

test: $(VENV)/.installed broker
	$(PY) -m pytest -q

bench: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[test,bench]'
	$(PY) -m pytest -q bench -p no:cacheprovider --pin-cpu 0

quality: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[test,quality]'
	$(PY) bench/quality.py

clean:
	rm -rf $(VENV) build *.egg-info
