"""Tensor parallelism's plumbing: the process group every rank joins, and its collectives.

parallel_state   who am I (rank, world size, device), joined once per process
communication    all_reduce / all_gather / broadcast / min over the ranks
one_shot         a one-shot all-reduce over peer-mapped buffers (small messages)
"""
