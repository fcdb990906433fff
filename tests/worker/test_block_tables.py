"""BlockTables: persistent per-request rows, changed by diffs, read by a gather."""

from __future__ import annotations

import pytest
import torch

from cadence.worker.block_tables import BlockTables

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_rows_follow_their_requests_through_diffs(device):
    t = BlockTables(num_rows=2, max_blocks=8, device=torch.device(device))
    a = t.add([3, 4])
    b = t.add([7])
    t.extend(a, [5])
    t.extend(b, [])
    t.sync()
    rows = torch.tensor([b, a], device=device)
    assert t.gather(rows, 3).tolist() == [[7, 0, 0], [3, 4, 5]]
    assert t.host[a, : t.num_blocks[a]].tolist() == [3, 4, 5]

    # back from preemption: a new table replaces the old one
    t.replace(a, [9])
    t.sync()
    assert t.gather(torch.tensor([a], device=device), 1).tolist() == [[9]]
    assert t.host[a, : t.num_blocks[a]].tolist() == [9]


@pytest.mark.parametrize("device", DEVICES)
def test_freed_rows_are_reused_and_the_table_grows_when_full(device):
    t = BlockTables(num_rows=2, max_blocks=4, device=torch.device(device))
    a, b = t.add([1]), t.add([2])
    t.remove(a)
    c = t.add([3, 4])
    assert c == a  # the freed row, its old contents overwritten
    d = t.add([5])  # a third request: the table doubles
    assert t.num_rows == 4 and d not in (b, c)
    t.sync()
    got = t.gather(torch.tensor([b, c, d], device=device), 2).tolist()
    assert [r[: len(ids)] for r, ids in zip(got, ([2], [3, 4], [5]))] == [[2], [3, 4], [5]]


def test_a_row_longer_than_the_table_is_refused():
    t = BlockTables(num_rows=1, max_blocks=2, device=torch.device("cpu"))
    row = t.add([1, 2])
    with pytest.raises(ValueError, match="3 blocks"):
        t.extend(row, [3])
