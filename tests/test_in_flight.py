"""``in_flight.InFlight``: entries finish in the order they were added, only once their copy has landed.

The copies are stand-ins (``tests.helpers.deferred_copy.HeldEvent`` behind a real ``transfer.HostCopy`` of CPU
tensors), so the order and waiting rules run here as they would with CUDA events."""

from __future__ import annotations

import torch

from sorl_monitor.write import transfer
from sorl_monitor.write.in_flight import InFlight
from tests.helpers.deferred_copy import HeldEvent


def held_copy(value: float) -> tuple[transfer.HostCopy, HeldEvent]:
    event = HeldEvent()
    return transfer.HostCopy(torch.tensor([value]), event, [("x", torch.Size([1]))]), event


def test_entries_finish_in_order_once_landed_and_a_failure_does_not_stop_the_rest():
    done, errors = [], []
    queue = InFlight(errors.append, limit=8)
    first, first_event = held_copy(1.0)
    second, second_event = held_copy(2.0)
    queue.add(first, lambda host: done.append(float(host["x"][0])))
    queue.then(lambda: done.append("scalars"))  # logged after the first update: waits behind it
    queue.add(second, lambda host: 1 / 0)
    second_event.land()
    queue.drain()
    assert done == [] and len(queue) == 3  # the second landed, but the first has not
    first_event.land()
    queue.drain()
    assert done == [1.0, "scalars"] and len(queue) == 0
    assert [type(e) for e in errors] == [ZeroDivisionError]
    queue.then(lambda: done.append("now"))  # nothing in flight: runs at once
    assert done[-1] == "now"


def test_drain_waits_only_down_to_keep_and_the_bound_waits_for_the_oldest():
    done = []
    queue = InFlight(lambda error: None, limit=2)
    events = []
    for value in (1.0, 2.0, 3.0):
        copy, event = held_copy(value)
        events.append(event)
        queue.add(copy, lambda host: done.append(float(host["x"][0])))
    assert done == [1.0] and events[0].waited == 1  # a third entry over the bound of 2: the oldest waited
    queue.drain(keep=1)
    assert done == [1.0, 2.0] and events[2].waited == 0
    queue.drain(keep=0)
    assert done == [1.0, 2.0, 3.0]
