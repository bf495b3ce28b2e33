"""The estimator's memo helpers: a bounded memo by value and the quick frozen-dataclass __init__."""

from __future__ import annotations

import dataclasses
import pickle
import threading

import pytest

from services.estimator.memo import Memo, quick_init
from services.estimator.memory import ModelStates, peak_memory
from services.estimator.resolved import resolve_plan
from tests.conftest import make_plan


@quick_init
@dataclasses.dataclass(frozen=True)
class _Point:
    x: float
    y: float = 2.0


def test_quick_init_keeps_the_dataclass_contract() -> None:
    p = _Point(1.0)
    assert (p.x, p.y) == (1.0, 2.0)
    assert p == _Point(x=1.0, y=2.0) and hash(p) == hash(_Point(1.0, 2.0))
    assert repr(p) == "_Point(x=1.0, y=2.0)"
    assert dataclasses.replace(p, y=3.0) == _Point(1.0, 3.0)
    assert pickle.loads(pickle.dumps(p)) == p
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 5.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        _Point()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _Point(1.0, 2.0, 3.0)  # type: ignore[call-arg]


def test_quick_init_refuses_fields_it_cannot_fill() -> None:
    with pytest.raises(TypeError, match="needs the dataclass's own __init__"):

        @quick_init
        @dataclasses.dataclass(frozen=True)
        class _Listed:
            items: list[int] = dataclasses.field(default_factory=list)


def test_quick_init_applied_twice_is_refused() -> None:
    with pytest.raises(TypeError, match="has its quick __init__ already"):

        @quick_init
        @quick_init
        @dataclasses.dataclass(frozen=True)
        class _Twice:
            x: float


def test_an_estimate_result_is_still_frozen() -> None:
    resolved = resolve_plan(make_plan())
    states = peak_memory(resolved.plan, resolved.architecture, resolved.recipe).states
    assert isinstance(states, ModelStates)
    with pytest.raises(dataclasses.FrozenInstanceError):
        states.weights = 0.0  # type: ignore[misc]


def test_the_memo_drops_the_oldest_beyond_its_size_and_computes_a_key_once() -> None:
    memo: Memo[int] = Memo(2)
    calls: list[str] = []

    def compute(key: str) -> int:
        calls.append(key)
        return len(calls)

    assert memo.get("a", lambda: compute("a")) == 1
    assert memo.get("a", lambda: compute("a")) == 1  # a hit
    memo.get("b", lambda: compute("b"))
    memo.get("c", lambda: compute("c"))  # "a", the oldest, goes
    assert memo.get("a", lambda: compute("a")) == 4
    assert calls == ["a", "b", "c", "a"]


def test_the_memo_is_safe_across_threads() -> None:
    memo: Memo[int] = Memo(8)
    errors: list[BaseException] = []

    def work(offset: int) -> None:
        try:
            for i in range(2000):
                key = (offset + i) % 24
                assert memo.get(key, lambda key=key: key * 10) == key * 10
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(memo._items) <= 8
