"""The Lab Streaming Layer bridge (``streamtrace bridge lsl``).

LSL streams matching a name / type / predicate are forwarded to an engine, one engine stream
per LSL stream (its id from the stream's ``source_id`` by default), and each stream's
predictions go back onto LSL as an outlet ``<name>-pred``.

Timestamps: an LSL sample carries the sender's ``local_clock()`` time. The bridge adds the
inlet's ``time_correction()`` (LSL's own clock-offset estimate, refreshed every few seconds)
so the ``ts`` sent to the engine, and the timestamp of the prediction pushed back, is the
sample's time in *this* host's LSL clock. A prediction is pushed with the timestamp of the
sample it was made from: in forecast mode the value stamped t predicts the sample after t.

pylsl is imported only when a bridge runs (the CLI imports this module for every command).
Each LSL stream has a thread of its own with its own engine connection: it waits for the
stream's samples (a blocking pull, so a sample is taken when it arrives), forwards them, and
while answers are due waits on the engine's socket and pushes each prediction as it comes. No
sample or answer passes through a second thread (on a loaded machine every hand-over between
threads costs a scheduler wake-up).
"""
from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zmq

from streamtrace.units import UnitError

from .bridge import (BridgeStats, BridgeThread, apply_flags, engine_target, load_bridge_config, open_link,
                     stop_event, stream_problem)
from .stream_units import Conversion, conform, declared_stream

__all__ = ["LslSettings", "LslBridge", "LslBridgeError", "add_arguments", "run_cli"]

STRING_FORMAT, UNDEFINED_FORMAT = 3, 0      # pylsl.cf_string, pylsl.cf_undefined
CLOCK_REFRESH_S = 5.0                       # LSL re-estimates offsets about this often
SAMPLE_WAIT_S = 0.05                        # a blocking pull returns at the first sample; this bounds stop
ANSWER_WAIT_S = 0.0005                      # while answers are due: how long new samples may wait
INFO_WAIT_S = 5.0                           # at most this long for a new stream's description
ENGINE_SILENT_S = 1.0                       # no answer for this long: wait on the bus, check the engine between


class LslBridgeError(RuntimeError):
    """What the bridge cannot work with: no matching stream, only non-numeric ones, bad settings."""


@dataclass
class LslSettings:
    """``[bridge.lsl]`` of the TOML; the flags of the same names override it."""
    name: str = ""              # the LSL stream name to bridge
    type: str = ""              # the LSL stream type (e.g. "EEG")
    predicate: str = ""         # an LSL (XPath 1.0) predicate, ANDed with name / type
    stream_id: str = "{source_id}"   # engine stream id; fields name, type, source_id (its name when empty), hostname
    wait_s: float = 10.0        # how long to wait for the first matching stream
    rescan_s: float = 2.0       # look for new matching streams this often (0: only at start)
    pred_suffix: str = "-pred"  # prediction outlet: <name><pred_suffix>
    pred_type: str = "Prediction"
    max_chunk: int = 256        # samples pulled at most at once from one inlet

    def predicate_text(self) -> str:
        parts = [f"name={_xpath_literal(self.name)}"] if self.name else []
        parts += [f"type={_xpath_literal(self.type)}"] if self.type else []
        parts += [f"({self.predicate})"] if self.predicate else []
        if not parts:
            raise LslBridgeError("say which LSL stream(s) to bridge: --name, --type or --predicate")
        return " and ".join(parts)

    def validate(self) -> "LslSettings":
        self.predicate_text()
        if not (self.wait_s > 0):
            raise LslBridgeError(f"wait_s must be > 0 seconds; got {self.wait_s}")
        if not (self.rescan_s >= 0):
            raise LslBridgeError(f"rescan_s must be >= 0 seconds; got {self.rescan_s}")
        if self.max_chunk < 1:
            raise LslBridgeError(f"max_chunk must be >= 1; got {self.max_chunk}")
        if not self.pred_suffix:
            raise LslBridgeError("pred_suffix must not be empty (the prediction outlet would take the input's name)")
        try:
            self.stream_id.format(name="n", type="t", source_id="s", hostname="h")
        except (KeyError, IndexError, ValueError) as e:
            raise LslBridgeError(f"stream_id {self.stream_id!r}: use the fields {{name}}, {{type}}, "
                                 f"{{source_id}}, {{hostname}} ({e})") from None
        return self


def _xpath_literal(text: str) -> str:
    if "'" not in text:
        return f"'{text}'"
    if '"' not in text:
        return f'"{text}"'
    raise LslBridgeError(f"{text!r}: a name or type with both ' and \" cannot be matched; use --predicate")


def _describe(info) -> str:
    return (f"LSL stream {info.name()!r} (type {info.type()!r}, source_id {info.source_id()!r}, "
            f"host {info.hostname()!r})")


@dataclass
class _Stream:
    """One bridged LSL stream: the thread serving it and its prediction outlet."""
    id: str
    info: object                     # the resolved pylsl.StreamInfo
    thread: threading.Thread | None = None
    offset_s: float | None = None    # the last time_correction() applied
    received: int = 0
    outlet: object = None            # pylsl.StreamOutlet, made at the first prediction
    outlet_name: str = ""
    alive: bool = True
    opened: threading.Event = field(default_factory=threading.Event)   # its inlet is open
    error: str = ""
    units: Conversion = field(default_factory=Conversion)   # its rate and units, and into the declared ones
    labels: list = field(default_factory=list)              # its channels' labels, when it has them
    reported: set = field(default_factory=set)   # engine refusal codes / clashing uids already printed

    def summary(self) -> dict:
        return {"lsl_name": self.info.name(), "lsl_type": self.info.type(), "source_id": self.info.source_id(),
                "channels": self.info.channel_count(), "clock_offset_s": self.offset_s, "received": self.received,
                "rate_hz": self.units.rate_hz or None, "units": self.units.source_units,
                "forwarded_units": self.units.units,
                "prediction_outlet": self.outlet_name or None, "alive": self.alive,
                **({"error": self.error} if self.error else {})}


class LslBridge(BridgeThread):
    """Bridges matching LSL streams to the engine at ``endpoint`` (or a cluster through NATS: a
    :class:`~streamtrace.adapters.bridge.NatsTarget`) until ``stop`` is set.

    ``run(stop)`` in the calling thread, or ``start()`` / ``stop()`` in a thread of its own.
    ``stats`` (:class:`BridgeStats`) and ``streams`` (engine id -> its LSL side) are live."""

    def __init__(self, settings: LslSettings, endpoint, *, log=None, ctx: zmq.Context | None = None,
                 declared=None):
        self.settings = settings.validate()
        self.declared = declared           # the serve config's [stream] (a StreamConfig), or None
        self.endpoint = endpoint
        self.log = log or sys.stderr
        self.ctx = ctx or zmq.Context.instance()
        self.stats = BridgeStats()
        self.streams: dict[str, _Stream] = {}
        self.refused_streams: dict[str, str] = {}     # LSL uid -> why it is not bridged
        self._own_uids: set[str] = set()              # our prediction outlets are never inputs
        self._lock = threading.Lock()                 # stats are counted by every stream's thread
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.ready = threading.Event()                # set once the first inlet is open

    # ---- thread API (BridgeThread's start / stop) ----------------------------------------------
    thread_name = "lsl-bridge"

    def failed(self):
        self.ready.set()

    def result(self) -> BridgeStats:
        return self.stats

    # ---- the loop --------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> BridgeStats:
        """Resolve, then bridge until ``stop`` is set; each stream runs in a thread of its own,
        this one looks for new matching streams."""
        import pylsl
        self._stop = stop
        try:
            resolver = pylsl.ContinuousResolver(pred=self.settings.predicate_text())
        except RuntimeError:                     # liblsl logs its parser's words on stderr
            raise LslBridgeError(f"not a valid LSL (XPath 1.0) predicate: {self.settings.predicate_text()}") from None
        try:
            self._wait_for_streams(resolver, stop)
            rescan = self.settings.rescan_s
            while not stop.wait(rescan or 0.5):
                if rescan:
                    self._attach(resolver.results())
        finally:
            stop.set()                           # the stream threads end within their pull timeout
            for st in list(self.streams.values()):
                if st.thread is not None:
                    st.thread.join(5.0)
            del resolver
        return self.stats

    def _wait_for_streams(self, resolver, stop):
        end = time.monotonic() + self.settings.wait_s
        while not stop.is_set():
            found = resolver.results()
            self._attach(found)
            if self.streams:
                return
            if found and all(i.uid() in self.refused_streams or i.uid() in self._own_uids for i in found):
                raise LslBridgeError("; ".join(self.refused_streams[i.uid()] for i in found
                                               if i.uid() in self.refused_streams) or "only prediction outlets match")
            if time.monotonic() >= end:
                import pylsl
                seen = sorted({f"{i.name()!r} (type {i.type()!r})" for i in pylsl.resolve_streams(0.5)})
                raise LslBridgeError(f"no LSL stream matching {self.settings.predicate_text()} within "
                                     f"{self.settings.wait_s:g} s; streams visible: {', '.join(seen) or 'none'}")
            time.sleep(0.02)

    def _attach(self, infos):
        for info in infos:
            uid = info.uid()
            if uid in self._own_uids or uid in self.refused_streams:
                continue
            if info.type() == self.settings.pred_type and info.name().endswith(self.settings.pred_suffix):
                continue                         # another bridge's prediction outlet: no feedback loops
            if info.channel_format() in (STRING_FORMAT, UNDEFINED_FORMAT):
                kind = "strings" if info.channel_format() == STRING_FORMAT else "an undefined format"
                why = f"{_describe(info)} carries {kind}; the bridge forwards numeric channels only"
                self.refused_streams[uid] = why
                self.stats.bad_payload("non-numeric stream")
                print(f"lsl bridge: refused {why}", file=self.log)
                continue
            sid = self._stream_id(info)
            problem = stream_problem(self.endpoint, sid)
            if problem:
                why = f"{_describe(info)} gives the engine stream id {sid!r}: {problem}; choose another with stream_id"
                self.refused_streams[uid] = why
                self.stats.bad_payload("bad stream id")
                print(f"lsl bridge: refused {why}", file=self.log)
                continue
            full = self._full_info(info)      # the inlet below is opened from the header info
            try:
                conversion = self._units(full)
            except UnitError as e:
                self.refused_streams[uid] = why = str(e)
                self.stats.bad_payload("units")
                print(f"lsl bridge: refused {why}", file=self.log)
                continue
            known = self.streams.get(sid)
            if known is not None and known.alive:
                if known.info.uid() != uid and uid not in known.reported:
                    known.reported.add(uid)      # e.g. two outlets without source_id of one name
                    print(f"lsl bridge: {_describe(info)} maps to engine stream {sid!r}, which "
                          f"{_describe(known.info)} already feeds; not bridged (set stream_id)", file=self.log)
                continue
            st = _Stream(sid, info, units=conversion, labels=_channel_values(full, "label"))
            st.thread = threading.Thread(target=self._serve_stream, args=(st,), name=f"lsl-{sid}", daemon=True)
            self.streams[sid] = st
            st.thread.start()
            print(f"lsl bridge: {_describe(info)} -> engine stream {sid!r}{_units_note(conversion)}", file=self.log)

    def _units(self, info) -> Conversion:
        """The stream's nominal rate and channel units against the config's [stream]."""
        d = self.declared
        return conform(info.nominal_srate(), _channel_values(info, "unit"), declared_rate=d.rate if d else 0.0,
                       declared_units=d.units if d else [], what=_describe(info))

    def _full_info(self, info):
        """The stream's info with its description (channel labels and units): a resolver gives
        only the header; the outlet sends the rest to an inlet (the header alone if it does not)."""
        import pylsl
        try:
            inlet = pylsl.StreamInlet(info, max_buflen=1)
            try:
                return inlet.info(min(self.settings.wait_s, INFO_WAIT_S))
            finally:
                inlet.close_stream()
        except _lsl_errors():
            return info

    def _stream_id(self, info) -> str:
        source = info.source_id() or info.name()
        sid = self.settings.stream_id.format(name=info.name(), type=info.type(), source_id=source,
                                             hostname=info.hostname())
        return sid or info.name()

    # ---- one stream (its own thread) ------------------------------------------------------------------
    def _serve_stream(self, st: _Stream):
        """Samples of one inlet to the engine and its answers back to the stream's outlet, both in
        this thread: a sample is taken when it arrives (a blocking pull) and sent at once, and
        while answers are due the thread waits on the engine's socket instead, so neither way
        goes through another thread."""
        import pylsl
        try:
            link = open_link(self.endpoint, self.ctx)
        except ConnectionError as e:            # a NATS server that refused the bridge or is not there
            st.alive, st.error = False, str(e)
            print(f"lsl bridge: stream {st.id!r} stopped: {st.error}", file=self.log)
            return
        try:
            inlet = pylsl.StreamInlet(st.info, max_buflen=360, recover=True)
            inlet.open_stream(self.settings.wait_s)
            st.opened.set()                      # samples pushed from now on reach the bridge
            self.ready.set()
            next_clock, busy_since = 0.0, None   # busy_since: answers due, and the last progress
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= next_clock:
                    try:      # the first estimate takes LSL some probes; later ones are cached
                        st.offset_s = inlet.time_correction(self.settings.wait_s if st.offset_s is None else 0.1)
                    except _lsl_errors()[0]:
                        pass
                    next_clock = now + CLOCK_REFRESH_S
                pull_wait = SAMPLE_WAIT_S
                if link.in_flight:
                    busy_since = busy_since or now
                    silent = now - busy_since >= ENGINE_SILENT_S   # then the bus sets the pace again
                    answers = link.poll(0.0 if silent else ANSWER_WAIT_S)
                    if answers:
                        busy_since = time.monotonic()
                        self._publish(st, answers)
                    pull_wait = SAMPLE_WAIT_S if silent else 0.0
                else:
                    busy_since = None
                x, ts = self._pull(inlet, pull_wait)
                if len(ts):
                    self._forward(st, link, x, np.asarray(ts, np.float64) + (st.offset_s or 0.0))
            end = time.monotonic() + 1.0         # stopping: publish the answers still coming
            while link.in_flight and time.monotonic() < end:
                self._publish(st, link.poll(0.05))
        except _lsl_errors()[1]:
            st.error = "the LSL source was lost"
        except Exception as e:  # noqa: BLE001 - one stream's failure must not stop the others
            st.error = f"{type(e).__name__}: {e}"
        finally:
            st.alive = False
            link.close()
            if st.error:
                print(f"lsl bridge: stream {st.id!r} stopped: {st.error}", file=self.log)

    def _pull(self, inlet, wait: float):
        """The samples waiting in ``inlet``, waiting up to ``wait`` for the first. One sample (the
        usual case at sensor rates) is taken with the cheaper single-sample call."""
        if wait and not inlet.samples_available():
            x, t = inlet.pull_sample(timeout=wait)
            if t is None:
                return (), ()
            if self.settings.max_chunk == 1 or not inlet.samples_available():
                return [x], [t]
            more, more_t = inlet.pull_chunk(timeout=0.0, max_samples=self.settings.max_chunk - 1)
            return [x] + more, [t] + more_t
        return inlet.pull_chunk(timeout=0.0, max_samples=self.settings.max_chunk)

    def _forward(self, st: _Stream, link, x, ts):
        sent = bad = dropped = 0
        x = st.units.apply(x)
        for row, t in zip(x, ts):
            try:
                if link.send(st.id, row, ts=float(t)) is None:   # the engine is not taking messages
                    dropped += 1
                else:
                    sent += 1
            except ValueError:                   # NaN / Inf: never reaches the learner
                bad += 1
        st.received += len(ts)
        with self._lock:
            self.stats.received += len(ts)
            self.stats.forwarded += sent
            self.stats.not_sent += dropped
            if bad:
                self.stats.bad["not finite"] += bad

    def _publish(self, st: _Stream, answers):
        for a in answers:
            if a.error is not None:
                if a.error not in st.reported:   # the first of each kind, with the engine's words
                    st.reported.add(a.error)
                    print(f"lsl bridge: engine refused a sample of {st.id!r}: {a.error}: {a.message}",
                          file=self.log)
            else:
                pred = np.asarray(a.pred, np.float64).ravel()
                if st.outlet is None:
                    st.outlet = self._outlet(st, pred.size)
                st.outlet.push_sample(pred.tolist(), a.ts or 0.0)   # 0.0: LSL stamps it now
            with self._lock:
                self.stats.answer(a)
                self.stats.published += a.error is None

    def _outlet(self, st: _Stream, channels: int):
        import pylsl
        s, info = self.settings, st.info
        name = info.name() + s.pred_suffix
        out = pylsl.StreamInfo(name, s.pred_type, channels, info.nominal_srate(), pylsl.cf_float32,
                               (info.source_id() or info.name()) + s.pred_suffix)
        desc = out.desc()
        desc.append_child_value("streamtrace_stream", st.id)
        desc.append_child_value("input", info.name())
        desc.append_child_value("timestamps", "the input sample's timestamp in this host's LSL clock "
                                              "(time_correction applied); forecast mode: predicts the next sample")
        labels, units = st.labels, st.units.units
        if len(labels) == channels or len(units) == channels:
            chans = desc.append_child("channels")
            for i in range(channels):
                ch = chans.append_child("channel")
                if len(labels) == channels:
                    ch.append_child_value("label", labels[i])
                if len(units) == channels and units[i]:
                    ch.append_child_value("unit", units[i])
        outlet = pylsl.StreamOutlet(out, chunk_size=1)
        self._own_uids.add(outlet.get_info().uid())
        st.outlet_name = name
        print(f"lsl bridge: predictions of {st.id!r} on LSL outlet {name!r} ({channels} channels)", file=self.log)
        return outlet
    def summary(self) -> dict:
        return {**self.stats.summary(), "streams": {sid: st.summary() for sid, st in self.streams.items()},
                "refused_streams": list(self.refused_streams.values())}


def _lsl_errors() -> tuple:
    """pylsl's (TimeoutError, LostError): in pylsl.util since 1.17, at the top before."""
    import pylsl
    where = getattr(pylsl, "util", pylsl)
    return getattr(where, "TimeoutError", TimeoutError), getattr(where, "LostError", ConnectionError)


def _channel_values(info, name: str) -> list[str]:
    """The input's channel ``name`` metadata (desc/channels/channel/<name>: "label", "unit"), one
    per channel ("" where a channel has none), or [] when no channel declares it."""
    try:
        ch = info.desc().child("channels").child("channel")
        values = []
        while not ch.empty():
            values.append(ch.child_value(name))
            ch = ch.next_sibling()
    except Exception:  # noqa: BLE001 - metadata are a courtesy
        return []
    if name == "label":
        return values if all(values) else []
    return values if any(values) else []


def _units_note(c: Conversion) -> str:
    rate = f"{c.rate_hz:g} Hz" if c.rate_hz else "irregular rate"
    said = f", units {', '.join(u or '-' for u in c.source_units)}" if c.source_units else ""
    into = f" (converted into {', '.join(u or '-' for u in c.units)})" if c.factors is not None else ""
    return f" ({rate}{said}){into}"


# ---- the command line ------------------------------------------------------------------------------
def add_arguments(parser):
    """Flags of ``streamtrace bridge lsl`` beyond --config and --endpoint; unset flags keep the
    config's ``[bridge.lsl]`` values."""
    d = LslSettings()
    parser.add_argument("--name", default=None, help="LSL stream name to bridge")
    parser.add_argument("--type", default=None, help="LSL stream type to bridge (e.g. EEG)")
    parser.add_argument("--predicate", default=None,
                        help="LSL predicate (XPath 1.0, e.g. \"starts-with(name,'imu')\"), ANDed with --name/--type")
    parser.add_argument("--stream-id", dest="stream_id", default=None,
                        help=f"engine stream id per LSL stream (default {d.stream_id!r}; fields {{name}}, {{type}}, "
                             "{source_id} (the name when empty), {hostname})")
    from streamtrace.arguments import nonnegative_float, output_file
    parser.add_argument("--wait", dest="wait_s", type=nonnegative_float, default=None,
                        help=f"seconds to wait for a matching stream (default {d.wait_s:g})")
    parser.add_argument("--rescan", dest="rescan_s", type=nonnegative_float, default=None,
                        help=f"look for new matching streams every so many seconds, 0: never (default {d.rescan_s:g})")
    parser.add_argument("--stats-json", type=output_file, default=None, metavar="FILE",
                        help="write the bridge's counters here at exit (default: none)")


def settings_from(args):
    """``[bridge.lsl]`` of --config with the flags given, and the engine endpoint (with --nats: a
    ``NatsTarget``)."""
    settings, router = load_bridge_config(getattr(args, "config", None), "lsl", LslSettings())
    apply_flags(settings, args, ("name", "type", "predicate", "stream_id", "wait_s", "rescan_s"))
    return settings.validate(), engine_target(args, router)


def run_cli(args) -> int:
    from streamtrace.engine.config import ConfigError
    stop = stop_event()
    try:
        settings, endpoint = settings_from(args)
        bridge = LslBridge(settings, endpoint, declared=declared_stream(getattr(args, "config", None)))
        if not isinstance(endpoint, str):     # a cluster: a refused connection is said now, not per stream
            open_link(endpoint).close()
    except (LslBridgeError, ConfigError, ConnectionError) as e:
        print(f"bridge lsl: {e}", file=sys.stderr)
        return 2
    print(f"lsl bridge: {settings.predicate_text()} -> engine {endpoint}", file=sys.stderr)
    try:
        bridge.run(stop)
    except LslBridgeError as e:
        print(f"bridge lsl: {e}", file=sys.stderr)
        return 2
    finally:
        bridge.stats.print("lsl")
        if args.stats_json:
            Path(args.stats_json).write_text(json.dumps(bridge.summary()) + "\n")
    return 0
