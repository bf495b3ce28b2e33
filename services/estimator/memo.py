"""A bounded memo keyed by value, for work an estimate repeats on the same plan shape (pure: no I/O)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import MISSING, fields
from typing import Any, Generic, TypeVar

V = TypeVar("V")
T = TypeVar("T")


class Memo(Generic[V]):
    """Results by a hashable key of plain values (and frozen objects that hash by value), the oldest dropped
    beyond ``maxsize``. For a function whose arguments are not all hashable (a pydantic plan): the caller puts
    every field the work reads into the key. Safe across the API's threads: a hit is one dict read (atomic
    under the GIL), only an insertion takes the lock."""

    def __init__(self, maxsize: int) -> None:
        self._maxsize = maxsize
        self._items: dict[Hashable, V] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable, compute: Callable[[], V]) -> V:
        found = self._items.get(key)
        if found is not None:
            return found
        value = compute()  # outside the lock; two threads may both compute one key, with the same result
        with self._lock:
            self._items[key] = value
            while len(self._items) > self._maxsize:
                del self._items[next(iter(self._items))]  # dicts keep insertion order: the oldest first
        return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


class Canonical(Generic[V]):
    """One instance per distinct value (frozen dataclasses that hash by value): interning what a parse or a
    resolution builds afresh lets the memos above find their keys by identity instead of comparing them field
    by field. Bounded like ``Memo``; a value beyond the bound is simply not interned."""

    def __init__(self, maxsize: int) -> None:
        self._memo: Memo[V] = Memo(maxsize)

    def __call__(self, value: V) -> V:
        return self._memo.get(value, lambda: value)

    def clear(self) -> None:
        self._memo.clear()


def value_hash_once(self: Any) -> int:
    """A frozen dataclass's hash by value, as the generated one, computed once: set ``__hash__ = value_hash_once``
    (and ``__getstate__ = state_without_hash``) in the class body, where the dataclass decorator keeps it."""
    state = self.__dict__
    found: int | None = state.get("_value_hash")
    if found is None:
        found = hash(tuple(map(state.__getitem__, _field_names(type(self)))))
        state["_value_hash"] = found
    return found


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    """A dataclass's field names in order, kept per class (``dataclasses.fields`` builds them anew on every call)."""
    found = _FIELD_NAMES.get(cls)
    if found is None:
        found = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    return found


def state_without_hash(self: Any) -> dict[str, object]:
    """The pickled state without the kept hash: a str hash differs between processes (PYTHONHASHSEED)."""
    return {k: v for k, v in self.__dict__.items() if k != "_value_hash"}


def quick_init(cls: type[T]) -> type[T]:
    """A frozen dataclass's ``__init__`` that fills the instance's ``__dict__`` at once instead of one
    ``object.__setattr__`` per field (the generated one): about half the cost for the results an estimate builds
    thousands of times in a plan. Same signature and defaults; the instance stays frozen. Apply above
    ``@dataclass(frozen=True)``; fields with a default factory or ``init=False`` are refused."""
    if getattr(cls.__init__, "_quick_init", False):
        raise TypeError(f"quick_init: {cls.__name__} has its quick __init__ already")
    params, names, env = [], [], {}
    for f in fields(cls):  # type: ignore[arg-type]
        if not f.init or f.default_factory is not MISSING:
            raise TypeError(f"quick_init: {cls.__name__}.{f.name} needs the dataclass's own __init__")
        names.append(f.name)
        if f.default is MISSING:
            params.append(f.name)
        else:
            env[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
    body = ", ".join(f"{name!r}: {name}" for name in names)
    source = f"def __init__(self, {', '.join(params)}):\n    _set(self, '__dict__', {{{body}}})\n"
    env["_set"] = object.__setattr__
    exec(source, env)  # generated from the class's own field names, as dataclasses does
    init = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init._quick_init = True
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
