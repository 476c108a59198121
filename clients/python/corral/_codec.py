"""Between Python values and protocol messages: shared by the sync and the asyncio client.

Building: ``None`` means "not set", so an optional parameter becomes a wrapper message only when
it is given (``temperature=0.0`` is present and means greedy). Ranges are the daemon's to check:
the client only refuses values it cannot encode at all (a negative ``max_tokens`` does not fit a
uint32), with :class:`~corral.errors.InvalidArgument` naming the parameter.

Decoding: protobuf objects become the dataclasses of :mod:`corral.types`; an Error body becomes the
exception of its code.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any, Iterable, Mapping, NoReturn, Optional, Sequence, Union

from ._proto import pb
from .errors import (
    CorralError,
    DeadlineExceeded,
    InvalidArgument,
    ProtocolError,
    Unavailable,
    error_for_code,
)
from .types import (
    AdapterInfo,
    ChatMessage,
    Chunk,
    DaemonStatus,
    Done,
    ModelInfo,
    ModelState,
    ModelStatus,
    Pong,
    Priority,
    Progress,
    ProgressPhase,
    StatusReply,
    StopReason,
    Timings,
    Tokens,
)

#: The most a waiting client stays quiet: the protocol's liveness rule asks for a ping at least
#: every peer_timeout / 3 (10 s by default); 5 s leaves a margin.
PING_INTERVAL_S = 5.0

#: Shortest keepalive interval, so that tiny timeouts do not turn into a flood of pings.
MIN_PING_INTERVAL_S = 0.02

_UINT32_MAX = 2**32 - 1
_UINT64_MAX = 2**64 - 1
_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1

PriorityLike = Union[Priority, str, int]
# A JSON Schema: a dict (or True), sent as its JSON text, or that text itself.
JsonSchemaLike = Union[str, Mapping[str, Any], bool]


def ping_interval(limit: float) -> float:
    """How often a caller waiting up to ``limit`` seconds of silence pings the daemon: every 5 s,
    or a third of the limit when that is shorter (so a live daemon always answers in time)."""
    if math.isinf(limit):
        return PING_INTERVAL_S
    return max(MIN_PING_INTERVAL_S, min(PING_INTERVAL_S, limit / 3.0))


def resolve_timeout(call_timeout: Optional[float], default: float) -> float:
    """The timeout of one call: the call's own, else the client's; must be positive."""
    limit = default if call_timeout is None else float(call_timeout)
    if not limit > 0:  # also refuses NaN
        raise InvalidArgument(f"timeout must be a positive number of seconds (got {limit!r})")
    return limit


#: A call fails with Unavailable when nothing accepted the connection this long after the client's
#: first call began: a daemon that is not running is reported at once, not after the timeout.
CONNECT_TIMEOUT_S = 1.0


def not_running_error(endpoint: str) -> Unavailable:
    """The Unavailable raised when no daemon accepted the connection (the CLI's words)."""
    return Unavailable(
        f"no answer from corrald at {endpoint} (is it running? start it with `make run` or "
        f"corrald -c FILE): nothing accepted a connection within {CONNECT_TIMEOUT_S:g} s"
    )


def silence_error(endpoint: str, limit: float) -> DeadlineExceeded:
    """The DeadlineExceeded raised when the daemon said nothing for ``limit`` seconds."""
    return DeadlineExceeded(
        f"no answer from corrald at {endpoint} within {limit:g} s (is it running?)"
    )


def monitor_event(frames: Sequence[bytes]) -> int:
    """The event number of a ZeroMQ socket-monitor message (its first frame starts with the
    event as a native-endian uint16). Parsed here because ``zmq.utils.monitor`` imports asyncio,
    which would double the import time of the synchronous client."""
    if not frames or len(frames[0]) < 2:
        return 0
    return int(struct.unpack_from("=H", frames[0])[0])


def error_response(request_id: int, code: int, message: str) -> Any:
    """A Response carrying an Error, made up by the client (lost requests, bad frames)."""
    resp = pb.Response(id=request_id)
    resp.error.code = code
    resp.error.message = message
    return resp


def new_request(request_id: int, app: str, **body: Any) -> Any:
    """A serialisable Request with one body field set."""
    return pb.Request(
        id=request_id, app=app, protocol_version=pb.PROTOCOL_VERSION_CURRENT, **body
    )


def check_int(name: str, value: Any, lo: int, hi: int) -> int:
    """``value`` if it is an int in lo..hi; TypeError or InvalidArgument naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int (got {type(value).__name__})")
    if not lo <= value <= hi:
        raise InvalidArgument(f"{name} must be in {lo}..{hi} (got {value})")
    return value


def check_float(name: str, value: Any) -> float:
    """``value`` as a float if it is a real number; TypeError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number (got {type(value).__name__})")
    return float(value)


def check_str(name: str, value: Any) -> str:
    """``value`` if it is a str; TypeError naming ``name`` otherwise."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str (got {type(value).__name__})")
    return value


def priority_value(priority: Optional[PriorityLike]) -> int:
    """The wire value of a priority: None (the model's default), a :class:`Priority`, its name
    (``"realtime"``, case-insensitive) or the protocol's enum number."""
    if priority is None:
        return int(pb.PRIORITY_UNSPECIFIED)
    if isinstance(priority, Priority):
        return int(pb.Priority.Value("PRIORITY_" + priority.name))
    if isinstance(priority, str):
        try:
            return int(pb.Priority.Value("PRIORITY_" + Priority(priority.lower()).name))
        except ValueError:
            names = ", ".join(p.value for p in Priority)
            raise InvalidArgument(
                f"priority must be one of {names} (got {priority!r})"
            ) from None
    if isinstance(priority, int) and not isinstance(priority, bool):
        if priority not in pb.Priority.values():
            raise InvalidArgument(f"priority {priority} is not a corral.v1.Priority value")
        return priority
    raise TypeError(f"priority must be a Priority, str or int (got {type(priority).__name__})")


def chat_messages(messages: Iterable[ChatMessage]) -> list[Any]:
    """Protocol ChatMessages from dicts ``{"role", "content"}`` or ``(role, content)`` pairs."""
    if isinstance(messages, (str, bytes)) or isinstance(messages, Mapping):
        raise TypeError("messages must be a sequence of messages, not a single one")
    out = []
    for i, m in enumerate(messages):
        if isinstance(m, Mapping):
            if "role" not in m or "content" not in m:
                raise TypeError(f"messages[{i}] needs the keys 'role' and 'content'")
            role, content = m["role"], m["content"]
        elif isinstance(m, tuple) and len(m) == 2:
            role, content = m
        else:
            raise TypeError(
                f"messages[{i}] must be a dict with 'role' and 'content' or a (role, content) "
                f"tuple (got {type(m).__name__})"
            )
        out.append(
            pb.ChatMessage(
                role=check_str(f"messages[{i}] role", role),
                content=check_str(f"messages[{i}] content", content),
            )
        )
    return out


_FLOAT_OPTIONS = (
    "temperature",
    "top_p",
    "min_p",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
)
_INT_OPTIONS = {
    "max_tokens": (0, _UINT32_MAX),
    "top_k": (_INT32_MIN, _INT32_MAX),
    "penalty_last_n": (_INT32_MIN, _INT32_MAX),
    "seed": (0, _UINT64_MAX),
}


def make_generate(
    model: str,
    prompt: Optional[str],
    messages: Optional[Iterable[ChatMessage]],
    *,
    stream: bool,
    priority: Optional[PriorityLike],
    session: Optional[str],
    deadline_ms: Optional[int],
    regex: Optional[str],
    sanitizer: Optional[str],
    json_schema: Optional[JsonSchemaLike] = None,
    template: Optional[str],
    stop: Union[str, Sequence[str], None],
    **options: Union[int, float, None],
) -> Any:
    """A Generate body from ``generate()``'s arguments; ``options`` are the sampling parameters
    and ``max_tokens`` (each None or a number)."""
    gen = pb.Generate(model=check_str("model", model), stream=bool(stream))
    if prompt is not None:
        gen.prompt = check_str("prompt", prompt)
    if messages is not None:
        gen.messages.extend(chat_messages(messages))
    for name, value in options.items():
        if value is None:
            continue
        field = getattr(gen, name)
        if name in _FLOAT_OPTIONS:
            field.value = check_float(name, value)
        elif name in _INT_OPTIONS:
            lo, hi = _INT_OPTIONS[name]
            field.value = check_int(name, value, lo, hi)
        else:  # pragma: no cover - a programming error in this package
            raise AssertionError(f"unknown option {name}")
        # Presence is what "set" means: a zero value still counts (temperature=0 is greedy).
        field.SetInParent()
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else list(stop)
        gen.stop.extend(check_str("stop", s) for s in stops)
    gen.priority = priority_value(priority)
    if session is not None:
        gen.session = check_str("session", session)
    if deadline_ms is not None:
        gen.deadline_ms = check_int("deadline_ms", deadline_ms, 0, _UINT32_MAX)
    if regex is not None:
        gen.constraint = check_str("regex", regex)
    if json_schema is not None:
        gen.json_schema = json_schema_text(json_schema)
    if sanitizer is not None:
        gen.sanitizer = check_str("sanitizer", sanitizer)
    if template is not None:
        gen.template = check_str("template", template)
    return gen


def json_schema_text(schema: JsonSchemaLike) -> str:
    """The JSON text of a schema given as a dict (or True) or as text."""
    if isinstance(schema, str):
        return check_str("json_schema", schema)
    if isinstance(schema, (bool, Mapping)):
        try:
            return json.dumps(schema, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise TypeError(f"json_schema is not JSON: {e}") from None
    kind = type(schema).__name__
    raise TypeError(f"json_schema must be a dict, True or a JSON string, not {kind}")


def body_of(resp: Any) -> str:
    """The name of the body field a Response carries (``"chunk"``, ``"error"``, ...)."""
    return str(resp.WhichOneof("body"))


def error_of(code: int, message: str) -> CorralError:
    """The exception of a wire error code and its message."""
    name = pb.ErrorCode.Name(code) if code in pb.ErrorCode.values() else f"ERROR_{code}"
    return error_for_code(name, message)


def raise_error(resp: Any) -> NoReturn:
    """Raise the exception of an Error response."""
    raise error_of(resp.error.code, resp.error.message)


def expect(resp: Any, body: str, what: str) -> Any:
    """The ``body`` message of a Response; an Error raises its exception, any other body
    raises ProtocolError."""
    got = body_of(resp)
    if got == body:
        return getattr(resp, body)
    if got == "error":
        raise_error(resp)
    raise ProtocolError(f"unexpected answer to {what}: {got}")


def _enum(enum_type: Any, prefix: str, value: int, cls: Any) -> Any:
    try:
        name = enum_type.Name(value)
    except ValueError:  # a value from a newer protocol
        return cls.UNSPECIFIED
    return cls(name[len(prefix) :].lower())


def decode_pong(msg: Any) -> Pong:
    """A Pong dataclass from its message."""
    return Pong(msg.version, msg.protocol_version, msg.uptime_ms, msg.pid, msg.config_path)


def decode_chunk(msg: Any) -> Chunk:
    """A Chunk dataclass from its message."""
    return Chunk(msg.text, tuple(msg.token_ids), msg.index)


def decode_progress(msg: Any) -> Progress:
    """A Progress dataclass from its message (one of a daemon from before phases is prefill)."""
    phase = _enum(pb.ProgressPhase, "PROGRESS_PHASE_", msg.phase, ProgressPhase)
    done, total = msg.done, msg.total
    if phase is ProgressPhase.UNSPECIFIED and (msg.prefilled_tokens or msg.total_tokens):
        phase, done, total = ProgressPhase.PREFILL, msg.prefilled_tokens, msg.total_tokens
    return Progress(msg.prefilled_tokens, msg.total_tokens, phase, done, total, msg.model)


def _adapters(msgs: Any) -> tuple[AdapterInfo, ...]:
    return tuple(AdapterInfo(a.path, a.scale) for a in msgs)


def decode_done(msg: Any) -> Done:
    """A Done dataclass from its message."""
    t = msg.timings
    return Done(
        stop_reason=_enum(pb.StopReason, "STOP_REASON_", msg.stop_reason, StopReason),
        prompt_tokens=msg.prompt_tokens,
        prefilled_tokens=msg.prefilled_tokens,
        generated_tokens=msg.generated_tokens,
        timings=Timings(t.queue_us, t.load_us, t.prefill_us, t.decode_us, t.total_us),
        model=msg.model,
        sanitizer_report=msg.sanitizer_report,
        queue_steps=msg.queue_steps,
        dropped_messages=msg.dropped_messages,
    )


def decode_tokens(msg: Any) -> Tokens:
    """A Tokens dataclass from a TokenizeReply."""
    return Tokens(tuple(msg.ids), tuple(msg.pieces))


def decode_models(msg: Any) -> list[ModelInfo]:
    """ModelInfo dataclasses from a ModelList."""
    return [
        ModelInfo(
            name=m.name,
            path=m.path,
            arch=m.arch,
            context=m.context,
            chat_template=m.chat_template,
            state=_enum(pb.ModelState, "MODEL_STATE_", m.state, ModelState),
            pinned=m.pinned,
            adapters=_adapters(m.adapters),
            context_overflow=m.context_overflow,
        )
        for m in msg.models
    ]


def decode_status(msg: Any) -> StatusReply:
    """A StatusReply dataclass from its message."""
    d = msg.daemon
    return StatusReply(
        models=tuple(
            ModelStatus(
                name=m.name,
                state=_enum(pb.ModelState, "MODEL_STATE_", m.state, ModelState),
                bytes=m.bytes,
                last_used_ms=m.last_used_ms,
                queue_depth=m.queue_depth,
                active=m.active,
                requests_served=m.requests_served,
                pinned=m.pinned,
                sessions=m.sessions,
                swap_ins=m.swap_ins,
                swap_outs=m.swap_outs,
                preload=m.preload,
                ttl_ms=m.ttl_ms,
                base_path=m.base_path,
                adapters=_adapters(m.adapters),
                merges=m.merges,
                last_load_ms=m.last_load_ms,
                loads=m.loads,
                steps=m.steps,
                step_sequences=m.step_sequences,
                error=m.error,
            )
            for m in msg.models
        ),
        daemon=DaemonStatus(
            version=d.version,
            uptime_ms=d.uptime_ms,
            total_bytes=d.total_bytes,
            limit_bytes=d.limit_bytes,
            active=d.active,
            queued=d.queued,
            requests_served=d.requests_served,
            sessions=d.sessions,
            threads=d.threads,
            allocated_bytes=d.allocated_bytes,
            front_allocated_bytes=d.front_allocated_bytes,
        ),
    )
