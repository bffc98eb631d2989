"""colabkit/checkpoints/rng.py: Python's and NumPy's RNG states as trees and back, as every adapter saves them."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from colabkit.checkpoints import rng
from colabkit.checkpoints.folder import InvalidCheckpoint


def _draws():
    return [random.random(), random.gauss(0, 1), *np.random.standard_normal(3).tolist(),
            int(np.random.randint(1 << 30))]


def test_the_global_states_come_back_and_the_same_numbers_follow():
    random.seed(11)
    np.random.seed(12)
    random.gauss(0, 1)               # Python caches the second gaussian
    np.random.standard_normal()      # and so does NumPy
    saved = rng.global_state()
    want = _draws()
    random.seed(99)
    np.random.seed(99)
    rng.set_global_state(rng.check_global_state(saved))
    assert _draws() == want


def test_the_tree_is_what_every_colabkit_wrote():
    random.seed(1)
    np.random.seed(2)
    tree = rng.global_state()
    assert sorted(tree) == ["numpy", "python"]
    assert tree["python"]["version"] == 3 and len(tree["python"]["internal"]) == 625
    json.dumps(tree["python"])   # JSON as it is
    keys = tree["numpy"]["keys"]
    assert isinstance(keys, np.ndarray) and keys.dtype == np.uint32 and keys.shape == (624,)   # arrays.npz holds it
    assert {k: type(v) for k, v in tree["numpy"].items() if k != "keys"} == {"pos": int, "has_gauss": int,
                                                                              "cached_gaussian": float}


def test_keys_written_as_a_json_list_by_an_early_colabkit_are_read():
    np.random.seed(5)
    tree = rng.global_state()["numpy"]
    want = np.random.rand(3).tolist()
    state = rng.numpy_from_json({**tree, "keys": tree["keys"].tolist()})
    np.random.set_state(state)
    assert np.random.rand(3).tolist() == want


def test_nothing_is_set_when_either_state_is_invalid():
    random.seed(3)
    np.random.seed(4)
    saved = rng.global_state()
    saved["numpy"]["pos"] = 700
    before = (random.getstate(), np.random.get_state()[1].copy())
    with pytest.raises(InvalidCheckpoint, match="position is 700"):
        rng.set_global_state(saved)
    assert random.getstate() == before[0] and np.array_equal(np.random.get_state()[1], before[1])


@pytest.mark.parametrize("edit, message", [
    (lambda t: t["python"].update(version=2), "version is 2, not 3"),
    (lambda t: t["python"].update(version=True), "version is True"),
    (lambda t: t["python"].update(internal=t["python"]["internal"][:100]), "100 numbers"),
    (lambda t: t["python"]["internal"].__setitem__(0, 2 ** 40), "internal state is 1099511627776"),
    (lambda t: t["python"]["internal"].__setitem__(-1, 625), "position is 625"),
    (lambda t: t["python"].update(gauss="x"), "gauss is 'x', not a number"),
    (lambda t: t["numpy"].update(keys=t["numpy"]["keys"][:10]), "keys is an array of shape \\(10,\\)"),
    (lambda t: t["numpy"].update(keys=t["numpy"]["keys"].astype(np.int64)), "not a uint32 vector"),
    (lambda t: t["numpy"].update(keys=[-1] * 624), "624 whole numbers under 2\\*\\*32"),
    (lambda t: t["numpy"].update(has_gauss=2), "has_gauss is 2"),
    (lambda t: t.update(numpy=[1, 2]), "NumPy state is \\[1, 2\\], not a dict"),
    (lambda t: t.pop("python"), "Python state is None, not a dict"),
])
def test_an_invalid_global_state_is_refused_naming_the_field(edit, message):
    tree = rng.global_state()
    edit(tree)
    with pytest.raises(InvalidCheckpoint, match=message):
        rng.check_global_state(tree)


@pytest.mark.parametrize("name", ["PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64"])
def test_a_generator_comes_back_in_its_state(name):
    generator = np.random.Generator(getattr(np.random, name)(8))
    generator.random(5)
    tree = rng.generator_to_json(generator)
    want = generator.random(4).tolist()
    back = rng.generator_from_json(tree)
    assert type(back.bit_generator).__name__ == name and back.random(4).tolist() == want


def test_a_generator_tree_is_a_copy():
    generator = np.random.Generator(np.random.MT19937(1))
    tree = rng.generator_to_json(generator)
    generator.random(10)   # the tree does not follow the live generator
    assert rng.generator_from_json(tree).random() == np.random.Generator(np.random.MT19937(1)).random()
