import pytest

import dsgraph
from dsgraph.errors import NotBuiltError
from dsgraph.units import format_bytes, parse_bytes


def test_defaults():
    opts = dsgraph.validate_options({})
    assert opts.inductor is True and opts.fallback == "inductor" and opts.memory_budget is None
    assert opts.grad_pool_enabled is False and opts.explicit == frozenset()


@pytest.mark.parametrize(
    "text, expected",
    [("6GiB", 6 * 2**30), ("800MiB", 800 * 2**20), ("1.5GB", 1_500_000_000), ("4096", 4096),
     ("12 KiB", 12 * 1024), ("7b", 7)],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


def test_parse_bytes_int_passthrough():
    assert parse_bytes(123) == 123


@pytest.mark.parametrize("bad", ["0.5", "6 GiBs", "lots", "-3", True, None])
def test_parse_bytes_rejects(bad):
    with pytest.raises(ValueError):
        parse_bytes(bad)


def test_float_budget_is_refused_with_a_message_asking_for_bytes():
    with pytest.raises(ValueError, match="bytes") as info:
        dsgraph.validate_options({"memory_budget": 0.5})
    assert "memory_budget" in str(info.value) and "6GiB" in str(info.value)


def test_unknown_key_names_it_and_lists_accepted():
    with pytest.raises(ValueError) as info:
        dsgraph.validate_options({"memory_budgett": "1GiB"})
    msg = str(info.value)
    assert "memory_budgett" in msg and "memory_budget" in msg and "lower_triton" in msg


@pytest.mark.parametrize(
    "options, key",
    [({"inductor": 1}, "inductor"), ({"fallback": "eager"}, "fallback"), ({"debug": "yes"}, "debug"),
     ({"compress": "fp8"}, "compress"), ({"bucket_mb": 0}, "bucket_mb"), ({"dump_dir": 3}, "dump_dir"),
     ({"pipeline": ["lifetimes"]}, "pipeline"), ({"data_parallel": "nccl"}, "data_parallel")],
)
def test_bad_values_name_the_key(options, key):
    with pytest.raises(ValueError, match=key):
        dsgraph.validate_options(options)


def test_options_of_unbuilt_features_say_not_implemented(monkeypatch):
    """Every option's feature is built today; the mechanism stays for the next one."""
    from dsgraph.pass_api import options as options_module

    monkeypatch.setitem(options_module.NOT_BUILT, "lower_triton", "a feature being rebuilt")
    with pytest.raises(NotBuiltError, match="'lower_triton' is not implemented yet: a feature being rebuilt"):
        dsgraph.validate_options({"lower_triton": True})
    opts = dsgraph.validate_options({"arena": False, "lower_triton": False, "compress": "none"})
    assert opts.explicit == {"arena", "lower_triton", "compress"}  # switched off: accepted


def test_memory_budget_is_built_and_parsed_to_bytes():
    assert dsgraph.validate_options({"memory_budget": "1GiB"}).memory_budget == 1 << 30
    assert dsgraph.validate_options({"memory_budget": 800 << 20}).memory_budget == 800 << 20


def test_arena_is_built():
    assert dsgraph.validate_options({"arena": True}).arena is True


def test_not_a_dict():
    with pytest.raises(ValueError, match="dict"):
        dsgraph.validate_options(["inductor"])


def test_format_bytes():
    assert format_bytes(1288490188) == "1.20 GiB"
    assert format_bytes(640) == "640 B"
    assert format_bytes(3 * 2**20) == "3.00 MiB"
