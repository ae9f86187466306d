"""`EnsembleMember` as the writer and every record use it: equal by value, hashable
(its hash made once), frozen, and pickled by value, so that a member unpickled in
another process (a Spark executor, whose string hashes differ) keys dicts there."""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
import sys

import pytest

from pora.meta import EnsembleMember


def test_members_are_equal_and_hash_alike_by_value() -> None:
    one = EnsembleMember("127.0.0.1:3181", "instance-a")
    same = EnsembleMember("127.0.0.1:3181", "instance-a")
    wiped = EnsembleMember("127.0.0.1:3181", "instance-b")
    assert one == same and hash(one) == hash(same)
    assert one != wiped and one != EnsembleMember("127.0.0.1:3182", "instance-a")
    assert one != ("127.0.0.1:3181", "instance-a")  # not a tuple
    assert {one: 1}[same] == 1 and same in frozenset([one]) and wiped not in {one}
    assert repr(one) == "EnsembleMember(address='127.0.0.1:3181', instance_id='instance-a')"
    with pytest.raises(dataclasses.FrozenInstanceError):
        one.address = "elsewhere"  # type: ignore[misc]
    moved = dataclasses.replace(one, address="127.0.0.1:3182")
    assert moved == EnsembleMember("127.0.0.1:3182", "instance-a")
    assert hash(moved) == hash(EnsembleMember("127.0.0.1:3182", "instance-a"))


def test_a_pickled_member_keys_dicts_in_a_process_of_other_string_hashes() -> None:
    member = EnsembleMember("127.0.0.1:3181", "instance-a")
    assert pickle.loads(pickle.dumps(member)) == member
    check = (
        "import pickle, sys\n"
        "from pora.meta import EnsembleMember\n"
        "member = pickle.loads(sys.stdin.buffer.read())\n"
        "print({EnsembleMember('127.0.0.1:3181', 'instance-a'): 'found'}.get(member))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    done = subprocess.run(
        [sys.executable, "-c", check],
        input=pickle.dumps(member),
        capture_output=True,
        env=env,
        check=True,
    )
    assert done.stdout.decode().strip() == "found"
