"""harp.init() under a Slurm step without MASTER_ADDR: Slurm's hostlist syntax and the derived address.

The end-to-end check (a real srun on the arena's hosts, HARP_ADDR and MASTER_* removed) is
tests/test_cluster.py::test_slurm_step_without_an_address; this file checks the parser against
generated node lists (hypothesis) and the errors a malformed variable gets.
"""
import os
import re
import sys

import pytest
from hypothesis import given, settings, strategies as st

HERE = os.path.dirname(os.path.abspath(__file__))
try:  # the installed package (CI, users), else the checkout
    import harp  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import harp  # noqa: E402
from harp import _slurm  # noqa: E402
from harp.errors import InvalidArgumentError  # noqa: E402


def _compress(prefix, nums, width):
    """Slurm's own notation for prefix + numbers: runs of consecutive numbers become a-b."""
    nums = sorted(set(nums))
    parts, i = [], 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        lo, hi = str(nums[i]).zfill(width), str(nums[j]).zfill(width)
        parts.append(lo if i == j else f"{lo}-{hi}")
        i = j + 1
    return f"{prefix}[{','.join(parts)}]", [prefix + str(n).zfill(width) for n in nums]


prefixes = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=8).filter(lambda p: not p[-1].isdigit())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(prefixes, st.lists(st.integers(0, 5000), min_size=1, max_size=30), st.integers(0, 4)),
                min_size=1, max_size=5))
def test_expansion_inverts_slurm_compression(groups):
    text, want = [], []
    for prefix, nums, width in groups:
        t, hosts = _compress(prefix, nums, width)
        text.append(t)
        want += hosts
    assert _slurm.expand_hostlist(",".join(text)) == want


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="ab0123456789[]-,", max_size=40))
def test_arbitrary_text_expands_or_raises_a_named_error(s):
    try:
        hosts = _slurm.expand_hostlist(s)
    except InvalidArgumentError as e:
        assert "Slurm node list" in str(e)
    else:
        assert hosts and all(h and "[" not in h and "]" not in h for h in hosts)


@pytest.mark.parametrize("bad,why", [("n[1-", "unbalanced '['"), ("n]", "unbalanced ']'"), ("n[3-1]", "backwards"),
                                     ("n[x]", "bad range"), ("", "empty"), ("n[0-9999999]", "more than")])
def test_malformed_lists_are_named(bad, why):
    with pytest.raises(InvalidArgumentError, match=re.escape(why)):
        _slurm.expand_hostlist(bad)


def test_step_address_is_the_first_node_and_differs_per_step():
    env = {"SLURM_PROCID": "3", "SLURM_STEP_NODELIST": "gpu[07-09],cpu1", "SLURM_JOB_ID": "4711", "SLURM_STEP_ID": "0"}
    a0 = _slurm.step_address(env)
    assert a0.startswith("gpu07:")
    a1 = _slurm.step_address(dict(env, SLURM_STEP_ID="1"))
    assert a1.startswith("gpu07:") and a1 != a0
    assert _slurm.step_address(dict(env, HARP_PORT="31337")) == "gpu07:31337"
    assert _slurm.step_address({"SLURM_PROCID": "0"}) is None  # no node list: not a Slurm step
    with pytest.raises(InvalidArgumentError, match="HARP_PORT"):
        _slurm.step_address(dict(env, HARP_PORT="70000"))


def test_init_names_the_missing_secret_under_slurm():
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_STEP_NODELIST": "h[0-1]", "SLURM_JOB_ID": "9"}
    with pytest.raises(InvalidArgumentError, match=r"rendezvous at h0:\d+ needs a job secret.*HARP_SECRET"):
        harp.init(env=env)
