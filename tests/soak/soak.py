#!/usr/bin/python3
"""soak.py — many well-behaved and hostile clients on one real corrald for a while, and checks that
nothing is lost, nobody waits unboundedly, and the daemon ends where it started.

    soak.py [--seconds 60] [--clients 12] [--seed 1] [--max-wait 30] [--json]

Environment: CORRALD (the daemon, default build/daemon/corrald), CORRAL (the CLI, for `corral
synth`), CORRAL_SHARED_DIR (the shared test data, default ../shared), PYTHONPATH covering the
build's generated protocol module (corral_pb2).

The daemon serves three synthetic models of one shape under a memory limit that holds two of them
(so requests keep swapping models out and in), a tiny model with a 4096-position context (long
streams for little compute), and at most four sessions in memory (the others are swapped to disk).
For --seconds, --clients threads each repeat a behaviour picked at random (seeded):

  plain      a request to a random model and priority, streamed or whole, read to its end
  session    a turn of one of a few shared conversations
  cancel     a stream cancelled after a few chunks
  deadline   a request with a deadline too short for it
  disconnect a stream whose client goes away after its first chunk (a fresh connection)
  unread     four long streams on a connection that pings but never reads (they pause, then the
             stall timeout cancels them), then the connection is closed
  oversized  a message larger than limits.max_message_bytes
  malformed  bytes that are not a Request
  regex      a constraint whose automaton would explode (refused by the compile budget)
  admin      load, unload, pin or unpin of a random model

and a probe client sends a short realtime request every half second, timing it from send to Done.

Checked, the run failing on any miss: every request that a client read to its end got exactly one
final message (Done or Error), nothing after it, and chunks numbered 0, 1, 2, ... (0 lost);
every Error has a code the request can produce; the probe's requests all finished within
--max-wait seconds; Status never showed the models' memory above the limit, and corrald's
resident memory stayed within the limit plus a fixed allowance; at the end, with every model
unloaded, the daemon's threads and open files are what they were before the first request, and
nothing is left active or queued. The report gives throughput, latency percentiles and counts.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

import zmq

import corral_pb2 as pb

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIB = 1 << 20
PROMPT = "Once upon a time"
#: A constraint that no text of 4096 positions satisfies and that admits no end-of-generation
#: token before: a stream under it runs until its context or max_tokens ends it.
ENDLESS = "(?:[ -~]{1000}){8}"
#: Compiling this would take minutes and gigabytes without the compile budget.
HOSTILE_REGEX = "((a|b){0,12}){0,1000}"
MODELS = ("A", "B", "C")
SESSIONS = 6
#: Resident memory corrald may hold beyond memory.limit: its own code, threads' stacks, the
#: tokenizers and ZeroMQ's buffers.
RSS_ALLOWANCE = 160 * MIB
BEHAVIOURS = ("plain", "plain", "plain", "session", "session", "cancel", "deadline",
              "disconnect", "unread", "oversized", "malformed", "regex", "admin")
#: Error codes each behaviour may legitimately get (anything else is a failure).
ALLOWED_ERRORS = {
    "plain": {"RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"},
    "session": {"RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"},
    "cancel": {"CANCELLED", "RESOURCE_EXHAUSTED"},
    "cancel-ack": {"NOT_FOUND"},
    "deadline": {"DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"},
    "oversized": {"INVALID_ARGUMENT", "PROTOCOL"},
    "malformed": {"PROTOCOL"},
    "regex": {"RESOURCE_EXHAUSTED", "INVALID_ARGUMENT"},
    "admin": {"RESOURCE_EXHAUSTED", "FAILED_PRECONDITION"},
    "probe": set(),
}


def fail(msg: str) -> None:
    print(f"soak: {msg}", file=sys.stderr)
    sys.exit(2)


def shared(rel: str) -> str:
    base = os.environ.get("CORRAL_SHARED_DIR") or os.path.join(ROOT, "..", "shared")
    path = os.path.abspath(os.path.join(base, rel))
    if not os.path.exists(path):
        fail(f"missing {path} (set CORRAL_SHARED_DIR)")
    return path


def tool(env: str, rel: str) -> str:
    path = os.environ.get(env) or os.path.join(ROOT, rel)
    if not os.access(path, os.X_OK):
        fail(f"{path} is not there (build it, or set {env})")
    return path


def synth(path: str, shape: str, seed: int) -> str:
    subprocess.run([tool("CORRAL", "build/clients/cli/corral"), "synth", *shape.split(),
                    "--seed", str(seed), "-o", path], check=True, capture_output=True, timeout=300)
    return path


def error_name(code: int) -> str:
    return pb.ErrorCode.Name(code) if code in pb.ErrorCode.values() else str(code)


# ---- the daemon ----------------------------------------------------------------------------------

class Daemon:
    def __init__(self, work: str, body: str) -> None:
        self.work = work
        self.endpoint = f"ipc://{work}/corral.sock"
        self.log_path = f"{work}/corrald.log"
        with open(f"{work}/corral.yaml", "w") as f:
            f.write(f'listen: ["{self.endpoint}"]\n{body}')
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([tool("CORRALD", "build/daemon/corrald"), "-c",
                                      f"{work}/corral.yaml"], stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 60
        while not os.path.exists(f"{work}/corral.sock"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                fail(f"corrald did not start:\n{open(self.log_path).read()}")
            time.sleep(0.01)

    def proc_count(self, what: str) -> int:
        """Threads ("task") or open files ("fd"): the least of five looks over a second, so that
        a file a loader or writer has open for a moment does not count."""
        counts = []
        for _ in range(5):
            counts.append(len(os.listdir(f"/proc/{self.proc.pid}/{what}")))
            time.sleep(0.2)
        return min(counts)

    def rss(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            return int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1)) * 1024

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -1
        finally:
            self.log.close()


# ---- a raw client: every message of every request accounted for ----------------------------------

_ids = itertools.count(1)
_ids_lock = threading.Lock()


def next_id() -> int:
    with _ids_lock:
        return next(_ids)


@dataclass
class Totals:
    lock: threading.Lock = field(default_factory=threading.Lock)
    started: dict = field(default_factory=dict)     # behaviour -> requests sent
    finished: dict = field(default_factory=dict)    # behaviour -> requests read to their end
    errors: dict = field(default_factory=dict)      # "behaviour CODE" -> count
    problems: list = field(default_factory=list)    # what went wrong, for the report
    tokens: int = 0
    latencies: list = field(default_factory=list)   # plain/session: send to final, seconds
    probe: list = field(default_factory=list)       # probe: send to Done, seconds

    def count(self, table: dict, key: str, n: int = 1) -> None:
        with self.lock:
            table[key] = table.get(key, 0) + n

    def problem(self, text: str) -> None:
        with self.lock:
            if len(self.problems) < 200:
                self.problems.append(text)


class Raw:
    """A DEALER connection that sends Requests and checks what comes back, per request id."""

    def __init__(self, ctx: zmq.Context, endpoint: str, totals: Totals, rcvhwm: int = 0) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if rcvhwm:
            self.sock.setsockopt(zmq.RCVHWM, rcvhwm)
        self.sock.connect(endpoint)
        self.totals = totals
        self.open: dict[int, dict] = {}  # id -> {"what", "chunks", "sent"}
        self.closed: set[int] = set()

    def close(self) -> None:
        self.sock.close(0)

    def send(self, what: str, app: str = "", **fields) -> int:
        rid = next_id()
        req = pb.Request(id=rid, protocol_version=1, app=app, **fields)
        self.sock.send(req.SerializeToString())
        self.open[rid] = {"what": what, "chunks": 0, "sent": time.monotonic()}
        self.totals.count(self.totals.started, what)
        return rid

    def ping(self) -> None:
        self.sock.send(pb.Request(id=0, protocol_version=1, ping=pb.Ping()).SerializeToString())

    def receive(self, timeout_s: float):
        """One message, checked against the requests it belongs to; None on timeout."""
        if not self.sock.poll(int(timeout_s * 1000)):
            return None
        resp = pb.Response()
        resp.ParseFromString(self.sock.recv())
        kind = resp.WhichOneof("body")
        if kind == "pong":
            return resp
        if resp.id in self.closed:
            self.totals.problem(f"request {resp.id}: a {kind} after its final message")
            return resp
        st = self.open.get(resp.id)
        if st is None:
            if kind != "error" or resp.id != 0:  # id 0: an Error about a message with no id
                self.totals.problem(f"request {resp.id}: a {kind} for no request of this client")
            return resp
        if kind == "chunk":
            if resp.chunk.index != st["chunks"]:
                self.totals.problem(f"request {resp.id}: chunk {resp.chunk.index} after "
                                    f"{st['chunks']} chunks")
            st["chunks"] += 1
            with self.totals.lock:
                self.totals.tokens += len(resp.chunk.token_ids)
        elif kind in ("done", "error", "ack", "status", "models", "tokenize"):
            self.closed.add(resp.id)
            del self.open[resp.id]
            st["final"] = resp
            st["elapsed"] = time.monotonic() - st["sent"]
            self.totals.count(self.totals.finished, st["what"])
            if kind == "error":
                code = error_name(resp.error.code)
                self.totals.count(self.totals.errors, f"{st['what']} {code}")
                if code not in ALLOWED_ERRORS.get(st["what"], set()):
                    self.totals.problem(f"request {resp.id} ({st['what']}): {code}: "
                                        f"{resp.error.message}")
            self.last_final = st
        return resp

    def final(self, rid: int, timeout_s: float, keepalive: bool = True):
        """Read until request rid's final message; its state, or None (a lost request)."""
        deadline = time.monotonic() + timeout_s
        while rid in self.open:
            left = deadline - time.monotonic()
            if left <= 0:
                what = self.open[rid]["what"]
                self.totals.problem(f"request {rid} ({what}): no final message in {timeout_s} s")
                return None
            if self.receive(min(left, 1.0)) is None and keepalive:
                self.ping()
        return self.last_final if getattr(self, "last_final", None) else None


def generate(model: str, **kw) -> dict:
    g = pb.Generate(model=model, prompt=kw.pop("prompt", PROMPT))
    for name in ("max_tokens",):
        if name in kw:
            getattr(g, name).value = kw.pop(name)
    if "temperature" in kw:
        g.temperature.value = kw.pop("temperature")
    for k, v in kw.items():
        setattr(g, k, v)
    return {"generate": g}


# ---- behaviours ---------------------------------------------------------------------------------

class Soak:
    def __init__(self, args, daemon: Daemon, limit: int) -> None:
        self.args, self.d, self.limit = args, daemon, limit
        self.ctx = zmq.Context()
        self.totals = Totals()
        self.stop = threading.Event()
        self.max_total = self.max_rss = 0
        self.over = ""  # the models when Status first showed them over the limit
        self.session_locks = [threading.Lock() for _ in range(SESSIONS)]

    def wait_final(self, raw: Raw, rid: int, what: str) -> None:
        st = raw.final(rid, self.args.max_wait + 120)
        if st and what in ("plain", "session") and st["final"].WhichOneof("body") == "done":
            with self.totals.lock:
                self.totals.latencies.append(st["elapsed"])

    def act(self, raw: Raw, rng: random.Random, what: str) -> None:
        model = rng.choice(MODELS)
        prio = rng.choice([pb.PRIORITY_BACKGROUND, pb.PRIORITY_INTERACTIVE])
        if what == "plain":
            rid = raw.send(what, **generate(model, max_tokens=rng.randint(1, 48),
                                            temperature=rng.choice([0.0, 0.8]),
                                            stream=rng.random() < 0.5, priority=prio))
            self.wait_final(raw, rid, what)
        elif what == "session":
            k = rng.randrange(SESSIONS)
            with self.session_locks[k]:  # one turn of a conversation at a time, as an app does
                rid = raw.send(what, **generate(MODELS[k % len(MODELS)], session=f"soak-{k}",
                                                prompt=" and then", max_tokens=16, stream=True,
                                                temperature=0.8))
                self.wait_final(raw, rid, what)
        elif what == "cancel":
            rid = raw.send(what, **generate(model, max_tokens=400, stream=True,
                                            temperature=1.0, constraint=ENDLESS))
            deadline = time.monotonic() + self.args.max_wait + 60
            while rid in raw.open and raw.open[rid]["chunks"] < 3 and time.monotonic() < deadline:
                raw.receive(0.5)
            if rid in raw.open:
                # Ack, or NOT_FOUND when the stream ended first.
                ack = raw.send("cancel-ack", cancel=pb.Cancel(request_id=rid))
                self.wait_final(raw, ack, "cancel-ack")
            self.wait_final(raw, rid, what)
        elif what == "deadline":
            rid = raw.send(what, **generate(model, max_tokens=400, temperature=1.0,
                                            constraint=ENDLESS, deadline_ms=rng.randint(1, 50)))
            self.wait_final(raw, rid, what)
        elif what == "disconnect":
            r = Raw(self.ctx, self.d.endpoint, self.totals)
            rid = r.send(what, **generate(model, max_tokens=400, stream=True, temperature=1.0,
                                          constraint=ENDLESS))
            # Wait for the first chunk as a live client does, pinging: on a busy machine it can
            # take longer than limits.peer_timeout_ms, and a silent client is rightly cancelled.
            until = time.monotonic() + 30
            while rid in r.open and r.open[rid]["chunks"] == 0 and time.monotonic() < until:
                if r.receive(1.0) is None:
                    r.ping()
            r.close()
        elif what == "unread":
            r = Raw(self.ctx, self.d.endpoint, self.totals, rcvhwm=1)
            for _ in range(4):
                r.send(what, **generate("tiny", max_tokens=4000, stream=True, temperature=1.0,
                                        constraint=ENDLESS))
            end = time.monotonic() + 1.5
            while time.monotonic() < end and not self.stop.is_set():
                try:
                    r.sock.send(pb.Request(id=0, protocol_version=1, ping=pb.Ping())
                                .SerializeToString(), zmq.NOBLOCK)
                except zmq.Again:
                    pass
                time.sleep(0.25)
            r.close()
        elif what == "oversized":
            rid = raw.send(what, **generate(model, prompt="x" * (80 * 1024), max_tokens=1))
            self.wait_final(raw, rid, what)
        elif what == "malformed":
            # Random bytes after a first tag of wire type 7, which no protobuf parser accepts: the
            # message can never parse as a request by chance (a 30-minute run once sent bytes
            # that did, with the id of another client's request, and was answered for that id).
            tag = (rng.randint(1, 15) << 3) | 7
            raw.sock.send(bytes([tag]) + bytes(rng.getrandbits(8)
                                               for _ in range(rng.randint(0, 63))))
            # The answer is an Error with id 0: read it off so it is not mistaken later.
            raw.receive(0.2)
        elif what == "regex":
            rid = raw.send(what, **generate(model, max_tokens=4, constraint=HOSTILE_REGEX))
            self.wait_final(raw, rid, what)
        elif what == "admin":
            op = rng.choice(["load", "unload", "pin", "unpin"])
            body = {"load": pb.Load, "unload": pb.Unload, "pin": pb.Pin, "unpin": pb.Unpin}[op]
            rid = raw.send(what, **{op: body(model=model)})
            self.wait_final(raw, rid, what)

    def client(self, index: int) -> None:
        rng = random.Random(self.args.seed * 1000 + index)
        raw = Raw(self.ctx, self.d.endpoint, self.totals)
        try:
            while not self.stop.is_set():
                self.act(raw, rng, rng.choice(BEHAVIOURS))
        except Exception as e:  # a failure of the soak itself is a failed run, with its cause
            self.totals.problem(f"client {index}: {type(e).__name__}: {e}")
        finally:
            raw.close()

    def probe(self) -> None:
        raw = Raw(self.ctx, self.d.endpoint, self.totals)
        while not self.stop.is_set():
            rid = raw.send("probe", app="speaker", **generate(MODELS[0],
                                                              prompt="Turn on the lights.",
                                               max_tokens=4, temperature=0.0, stream=True,
                                               priority=pb.PRIORITY_REALTIME))
            st = raw.final(rid, self.args.max_wait + 60)
            if st:
                with self.totals.lock:
                    self.totals.probe.append(st["elapsed"])
            self.stop.wait(0.5)
        raw.close()

    def sampler(self) -> None:
        raw = Raw(self.ctx, self.d.endpoint, Totals())
        while not self.stop.is_set():
            rid = raw.send("status", status=pb.Status())
            st = raw.final(rid, 60)
            if st and st["final"].WhichOneof("body") == "status":
                status = st["final"].status
                if status.daemon.total_bytes > self.limit and not self.over:
                    self.over = time.strftime("%H:%M:%S", time.gmtime()) + f" total {status.daemon.total_bytes} limit {status.daemon.limit_bytes} " + ", ".join(
                        f"{m.name} {pb.ModelState.Name(m.state)} {m.bytes} B"
                        f"{' pinned' if m.pinned else ''} active {m.active}"
                        for m in status.models)
                self.max_total = max(self.max_total, status.daemon.total_bytes)
            self.max_rss = max(self.max_rss, self.d.rss())
            self.stop.wait(0.1)
        raw.close()

    def status(self) -> pb.StatusReply:
        raw = Raw(self.ctx, self.d.endpoint, Totals())
        rid = raw.send("status", status=pb.Status())
        st = raw.final(rid, 60)
        raw.close()
        if not st:
            fail("no answer to Status")
        return st["final"].status

    def unload_all(self) -> None:
        raw = Raw(self.ctx, self.d.endpoint, Totals())
        for m in (*MODELS, "tiny"):
            raw.final(raw.send("admin", unpin=pb.Unpin(model=m)), 60)
            raw.final(raw.send("admin", unload=pb.Unload(model=m)), 60)
        raw.close()


def percentile(values: list, p: float) -> float:
    if not values:
        return 0.0
    v = sorted(values)
    return v[min(len(v) - 1, int(p * len(v)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("SOAK_SECONDS", 60)))
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-wait", type=float, default=30.0,
                    help="the longest the probe's realtime request may take, seconds")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="corral-soak-")
    try:
        shape = ("--arch llama --n-embd 512 --n-layer 4 --n-head 8 --n-head-kv 4 --n-ff 1408 "
                 "--n-vocab 512 --n-ctx 512 --type q8_0")
        paths = {m: synth(f"{work}/{m}.gguf", shape, seed) for seed, m in enumerate(MODELS, 1)}
        tiny = synth(f"{work}/tiny.gguf", "--arch llama --n-embd 64 --n-layer 2 --n-head 4 "
                     "--n-head-kv 4 --n-ff 192 --n-vocab 512 --n-ctx 4096 --type f32", 9)

        def config(limit: str) -> str:
            body = ("limits: {peer_timeout_ms: 5000, stall_timeout_ms: 1000, max_sessions: 4, "
                    "active_per_model: 4, queue_per_model: 64, queue_per_app: 256, "
                    "max_message_bytes: 65536, memory_wait_ms: 20000}\n"
                    f"memory: {{limit: {limit}, high_watermark: 0.9, low_watermark: 0.8, "
                    f"swap_dir: {work}/swap}}\n"
                    f"cache: {{dir: {work}/cache}}\n"
                    "apps:\n  - name: speaker\n    max_priority: realtime\n"
                    "models:\n")
            for m, p in paths.items():
                body += f"  - name: {m}\n    path: {p}\n    context: 512\n"
            return body + f"  - name: tiny\n    path: {tiny}\n    context: 4096\n"

        # The limit: two of the three models resident (and one swapped out) fit, three do not;
        # measured on a calibration daemon as tests/python/test_memory.py does.
        os.makedirs(f"{work}/cal", mode=0o700)
        cal = Daemon(f"{work}/cal", config("1GiB").replace(f"{work}/swap", f"{work}/cal/swap"))
        soak = Soak(args, cal, 0)
        raw = Raw(soak.ctx, cal.endpoint, soak.totals)
        raw.final(raw.send("plain", **generate("A", max_tokens=8, temperature=0.0)), 120)
        raw.close()
        resident = {m.name: m.bytes for m in soak.status().models}["A"]
        cal.stop()
        file = os.path.getsize(paths["A"])
        kept = resident - file
        need, kv = file + 8 * MIB + file // 64, 4 * MIB + 8 * MIB  # tiny's long cache beside
        lo = max((2 * resident + kept + kv) / 0.9, (resident + kept + need + kv) / 0.8)
        hi = (2 * resident + kept + file) / 0.9
        limit = int((lo + hi) / 2) if lo < hi else int(lo * 1.05)

        d = Daemon(work, config(str(limit)))
        soak = Soak(args, d, limit)
        st = soak.status()
        jemalloc = st.daemon.heap_bytes > 0  # not under the sanitizers, whose RSS is their own
        base_threads, base_fds = d.proc_count("task"), d.proc_count("fd")
        t0 = time.monotonic()
        threads = [threading.Thread(target=soak.client, args=(i,)) for i in range(args.clients)]
        threads += [threading.Thread(target=soak.probe), threading.Thread(target=soak.sampler)]
        for t in threads:
            t.start()
        time.sleep(args.seconds)
        soak.stop.set()
        for t in threads:
            t.join(timeout=args.max_wait + 300)
            if t.is_alive():
                soak.totals.problem(f"{t.name} did not finish")
        wall = time.monotonic() - t0
        # Every request answered or cancelled: nothing may stay active or queued.
        deadline = time.monotonic() + 120
        while True:
            st = soak.status()
            if st.daemon.active + st.daemon.queued == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        busy = st.daemon.active + st.daemon.queued
        swaps = sum(m.swap_outs for m in st.models)
        soak.unload_all()
        end_threads, end_fds = d.proc_count("task"), d.proc_count("fd")
        rc = d.stop()
        log = open(d.log_path).read()
    finally:
        if os.environ.get("SOAK_KEEP"):
            print(f"soak: kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)

    t = soak.totals
    checks = {
        "lost or duplicated messages": not any("final" in p or "chunk" in p for p in t.problems),
        f"probe within {args.max_wait:g} s": bool(t.probe) and max(t.probe) <= args.max_wait,
        "nothing active or queued at the end": busy == 0,
        "models within memory.limit": soak.max_total <= limit,
        "RSS within limit + allowance": not jemalloc or soak.max_rss <= limit + RSS_ALLOWANCE,
        "threads back to baseline": end_threads == base_threads,
        "open files back to baseline": end_fds == base_fds,
        "clean exit": rc == 0,
        "models swapped out and back": swaps > 0,
        "no other problem": not t.problems,
        "no crash or assertion in the log": "CORRAL_CHECK" not in log and "panic" not in log,
    }
    report = {
        "seconds": round(wall, 1), "clients": args.clients, "seed": args.seed,
        "requests_started": sum(t.started.values()), "requests_read_to_end": sum(t.finished.values()),
        "requests_per_s": round(sum(t.finished.values()) / wall, 1),
        "tokens_per_s": round(t.tokens / wall, 1),
        "latency_s": {"p50": round(percentile(t.latencies, 0.5), 3),
                      "p99": round(percentile(t.latencies, 0.99), 3)},
        "probe_s": {"n": len(t.probe), "p50": round(percentile(t.probe, 0.5), 3),
                    "p99": round(percentile(t.probe, 0.99), 3),
                    "max": round(max(t.probe or [0]), 3)},
        "started": t.started, "errors": t.errors, "swap_outs": swaps,
        "max_models_bytes": soak.max_total, "limit_bytes": limit, "max_rss_bytes": soak.max_rss,
        "threads": [base_threads, end_threads], "fds": [base_fds, end_fds],
        "checks": checks, "problems": t.problems[:20], "over_limit": soak.over,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"soak: {report['seconds']} s, {args.clients} clients + probe, seed {args.seed}")
        print(f"  requests: {report['requests_started']} sent, {report['requests_read_to_end']} "
              f"read to their end ({report['requests_per_s']}/s), {report['tokens_per_s']} tok/s")
        print(f"  latency (plain, session): p50 {report['latency_s']['p50']} s, "
              f"p99 {report['latency_s']['p99']} s")
        print(f"  realtime probe: {len(t.probe)} requests, p50 {report['probe_s']['p50']} s, "
              f"p99 {report['probe_s']['p99']} s, max {report['probe_s']['max']} s")
        print(f"  by behaviour: {dict(sorted(t.started.items()))}")
        print(f"  errors: {dict(sorted(t.errors.items()))}")
        print(f"  memory: models at most {soak.max_total / MIB:.1f} MiB of {limit / MIB:.1f} MiB, "
              f"RSS at most {soak.max_rss / MIB:.1f} MiB; {swaps} swap-outs")
        print(f"  threads {base_threads} -> {end_threads}, open files {base_fds} -> {end_fds}")
        for name, ok in checks.items():
            print(f"  {'ok  ' if ok else 'FAIL'} {name}")
        if soak.over:
            print(f"  over the limit: {soak.over}")
        for p in t.problems[:20]:
            print(f"  problem: {p}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
