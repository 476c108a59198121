"""The values the client hands back: plain frozen dataclasses and string enums.

They mirror the protocol's messages (``proto/corral.proto``) without exposing protobuf objects, so
user code never depends on the generated module. Enum members are ``str`` subclasses, so
``done.stop_reason == "cancelled"`` works as well as ``done.stop_reason is StopReason.CANCELLED``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Mapping, Optional, Tuple, Union


class _StrEnum(str, enum.Enum):
    """A string-valued enum that prints as its value."""

    def __str__(self) -> str:
        return str(self.value)


class Priority(_StrEnum):
    """Scheduling class of a generation. A higher class preempts lower ones at the next token."""

    BACKGROUND = "background"
    """Summaries, indexing: runs when nothing else wants the CPU."""
    INTERACTIVE = "interactive"
    """Chat, editor completions (the default unless the model's config says otherwise)."""
    REALTIME = "realtime"
    """Voice commands: cuts in front of everything else (only for apps allowed to)."""


class StopReason(_StrEnum):
    """Why a generation ended (:attr:`Done.stop_reason`)."""

    UNSPECIFIED = "unspecified"
    """The daemon did not say (or sent a reason this client does not know)."""
    EOG = "eog"
    """The model produced an end-of-generation token."""
    MAX_TOKENS = "max_tokens"
    """``max_tokens`` tokens were generated."""
    STOP_STRING = "stop_string"
    """A stop string appeared (it is not part of the text)."""
    CONTEXT_FULL = "context_full"
    """The model's (or the session's) context is full."""
    CONSTRAINT = "constraint"
    """The output constraint (``regex``) can accept nothing more."""
    CANCELLED = "cancelled"
    """The client cancelled the request (or disconnected)."""


class ModelState(_StrEnum):
    """A model's residency in the daemon."""

    UNSPECIFIED = "unspecified"
    """The daemon did not say (or sent a state this client does not know)."""
    UNLOADED = "unloaded"
    """Configured, not in memory."""
    LOADING = "loading"
    """Being mapped and prepared."""
    RESIDENT = "resident"
    """In memory, ready."""
    SWAPPED = "swapped"
    """Written to the swap directory; comes back by mmap on the next request."""
    BROKEN = "broken"
    """Its file failed under it (truncated, changed in place, unreadable): the requests it was
    serving ended with an error; the next request loads it afresh (``ModelStatus.error``)."""


#: One chat message: ``{"role": "user", "content": "Hi"}`` or ``("user", "Hi")``. Roles are
#: ``"system"``, ``"user"`` and ``"assistant"`` (the daemon checks them).
ChatMessage = Union[Mapping[str, str], Tuple[str, str]]


@dataclass(frozen=True)
class Pong:
    """The daemon's answer to a ping."""

    version: str
    """corral's version, e.g. ``"0.1.0"``."""
    protocol_version: int
    """The daemon's protocol revision."""
    uptime_ms: int
    """Milliseconds since the daemon started."""
    pid: int = 0
    """The daemon's process id (0 from older daemons)."""
    config_path: str = ""
    """The configuration file the daemon reads, absolute; empty on built-in defaults."""


@dataclass(frozen=True)
class Chunk:
    """A piece of a generation's output, in order."""

    text: str
    """UTF-8 text (complete characters only; may be empty while a character is incomplete)."""
    token_ids: Tuple[int, ...]
    """The tokens this piece comes from."""
    index: int
    """0, 1, 2, ... within the request."""


class ProgressPhase(_StrEnum):
    """What a request waits on while the daemon reports :class:`Progress`."""

    UNSPECIFIED = "unspecified"
    """The daemon did not say (or sent a phase this client does not know)."""
    PREFILL = "prefill"
    """The prompt runs through the model (``done``/``total`` in tokens)."""
    LOADING = "loading"
    """The model is being loaded (``total`` 0: no fraction)."""
    MERGING = "merging"
    """A variant's LoRA adapters are merged into its base (tensors)."""
    REPACKING = "repacking"
    """The weights are rearranged for the kernels and cached, once per file (tensors)."""
    QUANTIZING = "quantizing"
    """A quantized variant (a model's ``quantize:``) is made and cached, once (tensors)."""


@dataclass(frozen=True)
class Progress:
    """How far long work a request waits on got: its prompt's prefill, or its model's load."""

    prefilled_tokens: int
    """Prefill only (0 otherwise): prompt tokens run so far."""
    total_tokens: int
    """Prefill only: prompt tokens to run."""
    phase: ProgressPhase = ProgressPhase.PREFILL
    """What is going on."""
    done: int = 0
    """Units of the phase done so far (tokens, tensors)."""
    total: int = 0
    """Units of the phase in all; 0 when the phase has no fraction."""
    model: str = ""
    """The model the work is for."""

    @property
    def fraction(self) -> Optional[float]:
        """``done / total``, or None when the phase has no fraction."""
        return self.done / self.total if self.total else None


@dataclass(frozen=True)
class Timings:
    """Where the time of one generation went, in microseconds."""

    queue_us: int
    """From receipt to the first compute step."""
    load_us: int
    """Loading (or swapping in) the model for this request."""
    prefill_us: int
    """Running the prompt through the model."""
    decode_us: int
    """Generating tokens."""
    total_us: int
    """From receipt to the end."""


@dataclass(frozen=True)
class Done:
    """How a generation ended: the daemon's final message for it."""

    stop_reason: StopReason
    """Why it ended."""
    prompt_tokens: int
    """Tokens of the whole prompt (or rendered chat) as the model sees it."""
    prefilled_tokens: int
    """Of those, the ones run for this request (the rest came from the session's cache)."""
    generated_tokens: int
    """Tokens generated."""
    timings: Timings
    """Where the time went."""
    model: str
    """The model that served the request."""
    sanitizer_report: str = ""
    """What the input sanitizers did, one ``step=verdict(details)`` per step; empty when the
    request ran under no sanitizer profile."""
    queue_steps: int = 0
    """Forward passes of other requests begun between its receipt and its own first step."""
    dropped_messages: int = 0
    """Chat messages left out because the conversation outgrew the model's context: its oldest
    turns after the leading system messages (the model's ``context_overflow: truncate_oldest``)."""


@dataclass(frozen=True)
class Result:
    """A finished generation: ``generate(..., return_done=True)`` returns one."""

    text: str
    """The generated text (without the prompt)."""
    done: Done
    """How it ended: stop reason, token counts, timings."""


@dataclass(frozen=True)
class Tokens:
    """What :meth:`Client.tokenize <corral.Client.tokenize>` returns."""

    ids: Tuple[int, ...]
    """Token ids."""
    pieces: Tuple[str, ...]
    """The vocabulary piece of each id."""

    def __len__(self) -> int:
        """The number of tokens."""
        return len(self.ids)


@dataclass(frozen=True)
class AdapterInfo:
    """A LoRA adapter merged into a variant's base weights."""

    path: str
    """The adapter file (GGUF) or PEFT directory."""
    scale: float
    """Its strength (1.0: as trained)."""


@dataclass(frozen=True)
class ModelInfo:
    """A configured model, as :meth:`Client.list_models <corral.Client.list_models>` lists it."""

    name: str
    """The configured name (what ``generate`` takes)."""
    path: str
    """The GGUF file."""
    arch: str
    """Architecture (``"llama"``); empty until the model was first loaded."""
    context: int
    """Configured context length in tokens."""
    chat_template: str
    """Chat template name; ``"none"`` for raw completion."""
    state: ModelState
    """Residency."""
    pinned: bool
    """Whether the model is pinned (never unloaded or swapped out to make room)."""
    adapters: tuple[AdapterInfo, ...] = ()
    """For a variant (``path`` is its base): the adapters merged in, in order."""
    context_overflow: str = ""
    """What a chat that outgrows the context does: ``"truncate_oldest"`` or ``"error"``."""


@dataclass(frozen=True)
class ModelStatus:
    """One model's runtime state (:attr:`StatusReply.models`)."""

    name: str
    """The configured name."""
    state: ModelState
    """Residency."""
    bytes: int
    """Memory held: weights, KV caches, scratch. A swapped-out model keeps its tokenizer and
    scratch (a few MiB) until memory runs short, so it may hold some."""
    last_used_ms: int
    """Unix time in ms of the last request; 0 if never used."""
    queue_depth: int
    """Requests waiting."""
    active: int
    """Requests being computed."""
    requests_served: int
    """Requests finished so far."""
    pinned: bool
    """Whether the model is pinned."""
    sessions: int
    """Sessions holding state for this model."""
    swap_ins: int
    """Times the model came back after being swapped out."""
    swap_outs: int
    """Times the model was swapped out (its weights unmapped) to make room."""
    preload: bool = False
    """Whether the config loads it at start."""
    ttl_ms: int = 0
    """The config's keep-alive: unloaded after this long unused (0: kept)."""
    base_path: str = ""
    """A variant's base model file; empty for a plain model."""
    adapters: tuple[AdapterInfo, ...] = ()
    """A variant's adapters, in order."""
    merges: int = 0
    """Times its adapters were merged (0 while the merged-image cache served every load)."""
    last_load_ms: int = 0
    """How long its last load or swap-in took."""
    loads: int = 0
    """Loads and swap-ins started for it (a burst of requests for an unloaded model starts one)."""
    steps: int = 0
    """Batch steps (forward passes) run for it."""
    step_sequences: int = 0
    """Sequences in those steps, summed: divided by ``steps``, the mean batch."""
    error: str = ""
    """When BROKEN: what failed (the file, the byte, its size then and now), or why its last load
    was refused; ``""`` otherwise."""


@dataclass(frozen=True)
class DaemonStatus:
    """The daemon's overall state (:attr:`StatusReply.daemon`)."""

    version: str
    """corral's version."""
    uptime_ms: int
    """Milliseconds since the daemon started."""
    total_bytes: int
    """Memory held by all models."""
    limit_bytes: int
    """The memory budget (0: none)."""
    active: int
    """Requests being computed."""
    queued: int
    """Requests waiting."""
    requests_served: int
    """Requests finished so far."""
    sessions: int
    """Sessions alive."""
    threads: int
    """Compute threads."""
    allocated_bytes: int = 0
    """Bytes allocated so far by the core's threads (cumulative; 0 without jemalloc)."""
    front_allocated_bytes: int = 0
    """Bytes allocated so far by the front ends' threads (their transport's copies included)."""


@dataclass(frozen=True)
class StatusReply:
    """What :meth:`Client.status <corral.Client.status>` returns."""

    models: Tuple[ModelStatus, ...]
    """Every model asked about (all of them when no model was named)."""
    daemon: DaemonStatus
    """The daemon as a whole."""

    def model(self, name: str) -> ModelStatus:
        """The status of model ``name``; raises :class:`KeyError` if it is not in the reply."""
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(name)
