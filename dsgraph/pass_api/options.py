"""User options of the dsgraph backend and their validation.

torch hands ``options`` to a backend only when it compiles, so ``torch.compile`` cannot
reject a bad key early; ``validate_options`` is called at the first compile (and can be
called by users up front). Every mistake is a ``ValueError`` naming the key and what is
accepted; an option whose feature is registered but not built yet is a ``NotBuiltError``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from .. import compat
from ..errors import NotBuiltError, did_you_mean
from ..units import parse_bytes

FALLBACKS = ("inductor", "error")
COMPRESS = ("none", "bf16")


@dataclass(frozen=True)
class Options:
    pipeline: str | None = None
    inductor: bool = True
    fallback: str = "inductor"
    memory_budget: int | None = None
    # "auto": chunked loss when memory_budget is set; True / an int (chunks): always; False: never
    chunk_loss: Any = "auto"
    grad_pool: bool | None = None  # None: on exactly when data_parallel is set
    arena: bool = False
    data_parallel: Any = False  # bool or a torch.distributed ProcessGroup
    bucket_mb: float | None = None
    compress: str = "none"
    lower_triton: bool = False
    dump_dir: str | None = None
    debug: bool = False
    # the backward compiled in a subprocess while the forward compiles (compile/ahead.py)
    compile_ahead: bool = False
    # Keys the user actually passed: precedence rules only compare explicit choices.
    explicit: frozenset = frozenset()

    @property
    def grad_pool_enabled(self) -> bool:
        if self.grad_pool is not None:
            return self.grad_pool
        return bool(self.data_parallel)

    def describe(self) -> dict:
        """The explicit options as plain values, for reports and dumps."""
        out = {}
        for key in sorted(self.explicit):
            value = getattr(self, key)
            if key == "data_parallel" and not isinstance(value, bool):
                # a ProcessGroup by the name every rank and every run give it (its repr holds an
                # address, which would make each process's cache keys differ)
                out[key] = f"ProcessGroup({compat.group_name(value)})"
                continue
            out[key] = value if isinstance(value, (bool, int, float, str, type(None))) else repr(value)
        return out


OPTION_HELP = {
    "pipeline": "str: comma-separated pass names with optional {key=value} arguments",
    "inductor": "bool: compile the rewritten graphs with Inductor (True) or run them as FX code",
    "fallback": f"one of {FALLBACKS}: what to do when a pass fails",
    "memory_budget": "int bytes or a string with a unit ('6GiB', '800MiB')",
    "chunk_loss": "'auto' (on with memory_budget), 'faster' (with memory_budget: chunked or not, whichever the "
                  "checkpoint planner predicts to recompute less; one or two more compiles), True, False, or an "
                  "int >= 1 (chunks): output projection + cross-entropy over chunks of tokens",
    "grad_pool": "bool: gradients in one flat buffer per (device, dtype)",
    "arena": "bool: intermediates packed into one buffer per graph",
    "data_parallel": "bool or torch.distributed ProcessGroup",
    "bucket_mb": "float > 0: all-reduce bucket size in MB",
    "compress": f"one of {COMPRESS}: gradient compression for the all-reduce",
    "lower_triton": "bool: lower fused regions to dsgraph's Triton kernels",
    "dump_dir": "str: folder for per-pass graph dumps",
    "debug": "bool: lint after every pass, poison freed memory",
    "compile_ahead": "bool: compile the backward in Inductor's worker process while the forward compiles",
}

# Options whose feature is registered in the design but not built yet. When a feature
# lands, its entry leaves this table (and the default pipeline picks it up).
NOT_BUILT: dict[str, str] = {}  # every option's feature is built today


def _bool(key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"dsgraph option '{key}' must be a bool (True or False), got {value!r}")
    return value


def _choice(key: str, value: object, accepted: tuple[str, ...]) -> str:
    if value not in accepted:
        raise ValueError(f"dsgraph option '{key}' must be one of {list(accepted)}, got {value!r}")
    return value  # type: ignore[return-value]


def _data_parallel(value: object) -> object:
    if isinstance(value, bool):
        return value
    import torch.distributed as dist

    if dist.is_available() and isinstance(value, dist.ProcessGroup):
        return value
    raise ValueError(
        f"dsgraph option 'data_parallel' must be a bool or a torch.distributed ProcessGroup, got {value!r}"
    )


def _bucket_mb(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:  # NaN too
        raise ValueError(f"dsgraph option 'bucket_mb' must be a number > 0 (MB), got {value!r}")
    return float(value)


def _chunk_loss(value: object) -> object:
    if value in ("auto", "faster") or isinstance(value, bool) or (isinstance(value, int) and value >= 1):
        return value
    raise ValueError(f"dsgraph option 'chunk_loss' must be 'auto', 'faster', True, False or an int >= 1 (chunks), "
                     f"got {value!r}")


def _optional_str(key: str, value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"dsgraph option '{key}' must be a str, got {value!r}")
    return value


_VALIDATORS = {
    "pipeline": lambda v: _optional_str("pipeline", v),
    "inductor": lambda v: _bool("inductor", v),
    "fallback": lambda v: _choice("fallback", v, FALLBACKS),
    "memory_budget": lambda v: None if v is None else parse_bytes(v, "dsgraph option 'memory_budget'"),
    "chunk_loss": _chunk_loss,
    "grad_pool": lambda v: _bool("grad_pool", v),
    "arena": lambda v: _bool("arena", v),
    "data_parallel": _data_parallel,
    "bucket_mb": _bucket_mb,
    "compress": lambda v: _choice("compress", v, COMPRESS),
    "lower_triton": lambda v: _bool("lower_triton", v),
    "dump_dir": lambda v: _optional_str("dump_dir", v),
    "debug": lambda v: _bool("debug", v),
    "compile_ahead": lambda v: _bool("compile_ahead", v),
}

assert set(_VALIDATORS) == set(OPTION_HELP)


def _is_default(key: str, value: object) -> bool:
    default = Options.__dataclass_fields__[key].default
    return value is default or (value == default and type(value) is type(default))


def validate_options(options: Mapping[str, object] | Options | None) -> Options:
    """Check a dict of dsgraph options and return them as an ``Options``.

    Raises ``ValueError`` naming the key and what is accepted for an unknown key or a bad
    value, and ``NotImplementedError`` for an option whose feature is not built yet.
    """
    if options is None:
        return Options()
    if isinstance(options, Options):
        return options
    if not isinstance(options, Mapping):
        raise ValueError(f"dsgraph options must be a dict, got {type(options).__name__}")
    values: dict[str, object] = {}
    for key, raw in options.items():
        if key not in _VALIDATORS:
            accepted = "\n".join(f"  {k}: {h}" for k, h in OPTION_HELP.items())
            raise ValueError(f"unknown dsgraph option {key!r}{did_you_mean(str(key), _VALIDATORS)}; "
                             f"accepted options:\n{accepted}")
        values[key] = _VALIDATORS[key](raw)
    for key, value in values.items():
        if key in NOT_BUILT and not _is_default(key, value) and value not in (False, None):
            raise NotBuiltError(
                f"dsgraph option '{key}' is not implemented yet: {NOT_BUILT[key]} is planned but not built"
            )
    return dataclasses.replace(Options(), explicit=frozenset(values), **values)
