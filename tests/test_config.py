"""Sizes read the same way offline and on the command line: `LLM(kv_cache_memory="512MiB")`
is `--kv-cache-memory 512MiB`, and a size that is not one is a clear error."""

import pytest

from cadence.config import EngineConfig, parse_size


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("2147483648", 2**31),
        ("2GiB", 2**31),
        ("512MiB", 2**29),
        ("1.5G", 1_500_000_000),
        (4096, 4096),
    ],
)
def test_sizes_in_bytes_or_with_units(text, size):
    assert parse_size(text) == size


def test_the_offline_engine_takes_a_size_string():
    assert EngineConfig.from_kwargs(kv_cache_memory="128MiB").cache.kv_cache_memory == 2**27
    assert EngineConfig.from_kwargs(kv_cache_memory=2**20).cache.kv_cache_memory == 2**20


@pytest.mark.parametrize("text", ["lots", "12 parsecs", "-1GiB"])
def test_a_size_that_is_not_one_is_refused(text):
    with pytest.raises(ValueError, match="is not a size"):
        EngineConfig.from_kwargs(kv_cache_memory=text)
