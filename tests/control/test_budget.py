"""MemoryBudget: concurrent reservations never hold more than the limit; one over it is refused."""

from __future__ import annotations

import copy
import pickle
import threading

import pytest

from datarax.control.budget import MemoryBudget, default_budget, host_memory_bytes, human


def test_threads_never_hold_more_than_the_limit_and_all_finish():
    budget = MemoryBudget(100, "test")
    held, worst, lock = [0], [0], threading.Lock()

    def work(nbytes: int) -> None:
        with budget.reserve(nbytes):
            with lock:
                held[0] += nbytes
                worst[0] = max(worst[0], held[0])
            threading.Event().wait(0.001)
            with lock:
                held[0] -= nbytes

    sizes = [60, 30, 100, 45, 10, 70, 25, 90, 5, 55] * 4
    threads = [threading.Thread(target=work, args=(n,)) for n in sizes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert worst[0] <= 100 and budget.peak <= 100 and held[0] == 0


def test_a_reservation_over_the_whole_limit_is_refused_not_waited_for():
    budget = MemoryBudget(2**20, "DecodeImage")
    assert budget.fits(2**20) and not budget.fits(2**20 + 1)
    with pytest.raises(ValueError, match=r"DecodeImage cannot reserve 1,048,577 bytes of a 1,048,576-byte budget"):
        with budget.reserve(2**20 + 1):
            pass


def test_copies_and_pickles_keep_the_limit_with_a_fresh_lock():
    budget = MemoryBudget(123, "x")
    for other in (copy.deepcopy(budget), pickle.loads(pickle.dumps(budget))):
        assert other.limit == 123 and other.name == "x"
        with other.reserve(100):
            assert other.peak == 100


def test_the_default_is_a_quarter_of_memory_at_most_8_gib():
    assert default_budget() == min(host_memory_bytes() // 4, 8 * 2**30)
    assert human(3 * 2**30) == "3 GiB" and human(512) == "512 bytes"
