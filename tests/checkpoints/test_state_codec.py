"""The state codec (colabkit/checkpoints/codec.py): its registry of type handlers, each kind's round trip through
real checkpoint files, and what it refuses to read."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from colabkit.checkpoints import codec, state
from colabkit.checkpoints.folder import InvalidCheckpoint

VALUE = codec.VALUE_TAG


def through_files(value, tmp_path, name="ckpt"):
    """``value`` as an adapter saves it and gets it back: the adapters' pass, the store's pass, the files
    (state.json and arrays.npz, written and read back), the store's pass back, the adapters' pass back."""
    tree = codec.encode({"value": value}, tags=codec.VALUE_TAGS)
    folder = tmp_path / name
    folder.mkdir()
    state.write_data(state.snapshot(tree), folder)
    json.loads((folder / state.STATE).read_text())   # plain JSON
    return codec.decode(state.read(folder), tags=codec.VALUE_TAGS)["value"]


# -- the registry -------------------------------------------------------------------------------------------------

def test_an_unknown_kind_is_refused_naming_where_it_is():
    with pytest.raises(InvalidCheckpoint, match=r"ar.state\['x'\]\[1\] is tagged 'module', which colabkit does not "
                                                r"write"):
        codec.decode({"x": [0, {VALUE: "module", "name": "os"}]}, tags=codec.VALUE_TAGS, where="ar.state")


@pytest.mark.parametrize("kind", [None, 3, ["tuple"], {"a": 1}])
def test_a_kind_that_is_not_a_name_is_refused(kind):
    with pytest.raises(InvalidCheckpoint, match="the name of a kind"):
        codec.decode({VALUE: kind, "items": []}, tags=codec.VALUE_TAGS)


def test_the_store_leaves_the_adapters_kinds_alone_and_refuses_none_of_them():
    tree = {"t": {VALUE: "no such kind", "items": [1]}, "a": {codec.ARRAY_TAG: "a0"}}

    class Arrays(codec.Source):
        def array(self, key, where):
            return np.zeros(1)

    decoded = codec.decode(tree, tags=codec.STORE_TAGS, source=Arrays())
    assert decoded["t"] == {VALUE: "no such kind", "items": [1]}
    np.testing.assert_array_equal(decoded["a"], np.zeros(1))


def test_a_handler_of_its_own_takes_a_type_before_the_core_ones_and_round_trips():
    registry = codec.Codec()
    for handler in codec.CODEC.handlers()[::-1]:
        registry.register(handler)

    class Point(tuple):
        pass

    def encode(value, encoding, where):
        return {VALUE: "test.Point", "xy": [encoding.encode(v, where / i) for i, v in enumerate(value)]}

    registry.register(codec.TypeHandler(VALUE, "test.Point", lambda v: isinstance(v, Point), encode,
                                        lambda obj, decoding, where: Point(obj["xy"])))
    tree = registry.encode({"p": Point((1, 2)), "t": (1, 2)}, tags=codec.VALUE_TAGS)
    assert tree == {"p": {VALUE: "test.Point", "xy": [1, 2]}, "t": {VALUE: "tuple", "items": [1, 2]}}
    back = registry.decode(json.loads(json.dumps(tree)), tags=codec.VALUE_TAGS)
    assert type(back["p"]) is Point and back["p"] == (1, 2) and type(back["t"]) is tuple
    with pytest.raises(InvalidCheckpoint, match="'test.Point'"):   # the shared registry has no such kind
        codec.decode(tree, tags=codec.VALUE_TAGS)


def test_a_kind_taken_by_another_module_is_refused_and_a_marker_is_kinded_or_not():
    registry = codec.Codec()
    registry.register(codec.CODEC.handler(VALUE, "tuple"))
    mine = codec.TypeHandler(VALUE, "tuple", lambda v: False, lambda v, e, w: None, lambda o, d, w: None)
    with pytest.raises(ValueError, match="already has a handler for __colabkit_torch__ 'tuple'"):
        registry.register(mine)
    with pytest.raises(ValueError, match="with and without kinds"):
        registry.register(codec.TypeHandler(VALUE, None, lambda v: False, lambda v, e, w: None,
                                            lambda o, d, w: None))
    with pytest.raises(ValueError, match="no handler is registered for the tags"):
        registry.encode({}, tags=["__colabkit_nothing__"])


# -- round trips of every kind (the torch kinds: below) ------------------------------------------------------------

def test_a_tuple_stays_a_tuple_at_any_depth(tmp_path):
    value = {"pair": (1, 2.5), "nested": [((1, (2,)), ()), "x"], "empty": (), "named": (None, "a", True)}
    back = through_files(value, tmp_path)
    assert back == value
    assert type(back["pair"]) is tuple and type(back["nested"]) is list and type(back["nested"][0]) is tuple
    assert type(back["nested"][0][0][1]) is tuple and back["empty"] == ()


def test_dicts_with_keys_json_objects_cannot_hold_round_trip(tmp_path):
    value = {"numbers": {0: "zero", 1.5: "x", -3: [1]}, "none": {None: 1, True: 2, "s": 3},
             "markers": {codec.ARRAY_TAG: "not an array", VALUE: "not a kind", codec.TRACKABLE_TAG: 1},
             "plain": {"a": {"b": 1}}}
    back = through_files(value, tmp_path)
    assert back == value
    assert list(back["numbers"]) == [0, 1.5, -3]


def test_arrays_and_numpy_scalars_round_trip(tmp_path):
    value = {"f32": np.arange(6, dtype=np.float32).reshape(2, 3), "text": np.array(["a", "bc"]),
             "zero_d": np.array(2), "scalar": np.float32(1.5), "int": np.int64(7), "flag": np.bool_(False)}
    back = through_files(value, tmp_path)
    for key in ("f32", "text", "zero_d"):
        assert back[key].dtype == value[key].dtype and np.array_equal(back[key], value[key])
    assert back["scalar"] == 1.5 and back["int"] == 7 and back["flag"] is False


def test_rng_objects_round_trip_and_draw_the_same_numbers(tmp_path):
    py = random.Random(3)
    py.random()
    legacy = np.random.RandomState(4)
    legacy.standard_normal()   # holds a cached gaussian
    generators = {name: np.random.Generator(getattr(np.random, name)(5))
                  for name in ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")}
    for g in generators.values():
        g.integers(0, 2 ** 32, size=3)
    back = through_files({"py": py, "legacy": legacy, **generators}, tmp_path)
    assert type(back["py"]) is random.Random and back["py"].random() == py.random()
    assert type(back["legacy"]) is np.random.RandomState
    assert back["legacy"].standard_normal() == legacy.standard_normal()
    for name, g in generators.items():
        assert type(back[name].bit_generator).__name__ == name
        assert back[name].integers(0, 2 ** 63, size=4).tolist() == g.integers(0, 2 ** 63, size=4).tolist()


def test_the_store_pass_writes_what_checkpoints_save_always_wrote():
    snap = state.snapshot({"w": np.arange(2.0), "n": np.int64(5), "l": [1, (2, 3), {"a": np.ones(1)}]})
    assert snap.tree == {"w": {codec.ARRAY_TAG: "a0"}, "n": 5, "l": [1, [2, 3], {"a": {codec.ARRAY_TAG: "a1"}}]}
    assert sorted(snap.arrays) == ["a0", "a1"]


@pytest.mark.parametrize("value, message", [
    ({1: "x"}, r"State key 1 at the state\['bad'\] must be a string"),
    ({codec.ARRAY_TAG: "a0"}, r"'__colabkit_array__' at the state\['bad'\] is a name colabkit uses"),
    ({"s": {1, 2}}, r"the state\['bad'\]\['s'\] has type set"),
    (np.array([{}], dtype=object), "object array"),
    (random.Random(1), "has type Random"),        # the adapters' kinds are not the store's
    (np.longdouble(1) if np.dtype(np.longdouble).itemsize > 8 else 1j, "has type"),
])
def test_the_store_pass_refuses_what_it_cannot_read_back(value, message):
    with pytest.raises(state.StateError, match=message):
        state.snapshot({"bad": value})


def test_a_key_an_adapter_cannot_store_is_refused_naming_it():
    with pytest.raises(codec.StateError, match=r"a key \(1, 2\) \(tuple\) at ar.state cannot be stored"):
        codec.encode({(1, 2): "x"}, tags=codec.VALUE_TAGS, where="ar.state")


# -- what a hostile state.json can make the decoders do: nothing new ---------------------------------------------

@pytest.mark.parametrize("tree, message", [
    ({VALUE: "tuple", "items": "abc"}, "items is 'abc', not a list"),
    ({VALUE: "dict", "items": [[[1], 2]]}, r"item 0 is \[\[1\], 2\], not a \[key, value\] pair"),
    ({VALUE: "dict", "items": [[1, 2, 3]]}, "not a \\[key, value\\] pair"),
    ({VALUE: "random.Random", "state": {"version": 3, "internal": [1] * 3, "gauss": None}}, "625 numbers"),
    ({VALUE: "numpy.RandomState", "state": {"keys": [1] * 624, "pos": 625, "has_gauss": 0, "cached_gaussian": 0.0}},
     "position is 625"),
    ({VALUE: "numpy.Generator", "state": {"bit_generator": "os"}}, "bit_generator is 'os', not one of MT19937"),
    ({VALUE: "numpy.Generator", "state": {"bit_generator": "__class__"}}, "not one of"),
    ({VALUE: "numpy.Generator", "state": {"bit_generator": "PCG64", "state": {"state": 2 ** 200, "inc": 1},
                                          "has_uint32": 0, "uinteger": 0}}, r"\['state'\] is \d+"),
    ({VALUE: "numpy.Generator", "state": {"bit_generator": "PCG64", "state": {"state": 1},
                                          "has_uint32": 0, "uinteger": 0}}, "fields"),
    ({VALUE: "numpy.Generator", "state": {"bit_generator": "MT19937", "state": {"key": [1, 2], "pos": 0}}},
     "not an array of numbers"),
])
def test_a_hostile_tree_is_refused(tree, message):
    with pytest.raises(InvalidCheckpoint, match=message):
        codec.decode({"x": tree}, tags=codec.VALUE_TAGS)


def test_a_tree_nested_deeper_than_python_can_walk_is_refused_as_invalid():
    tree = 0
    for _ in range(5000):
        tree = {VALUE: "tuple", "items": [tree]}
    with pytest.raises(InvalidCheckpoint, match="nested deeper than colabkit writes"):
        codec.decode(tree, tags=codec.VALUE_TAGS)
    with pytest.raises(InvalidCheckpoint, match="nested deeper"):
        codec.decode(tree, tags=codec.STORE_TAGS)


def test_a_value_that_holds_itself_is_refused_when_saved():
    loop = []
    loop.append(loop)
    with pytest.raises(state.StateError, match="nested too deep to store"):
        state.snapshot({"loop": loop})


def test_a_generator_state_of_the_wrong_array_shape_is_refused():
    key = np.zeros(10, dtype=np.uint32)
    with pytest.raises(InvalidCheckpoint, match="an array of shape \\(624,\\) and dtype uint32"):
        codec.decode({VALUE: "numpy.Generator", "state": {"bit_generator": "MT19937", "state": {"key": key, "pos": 0}}},
                     tags=codec.VALUE_TAGS)


# -- the torch kinds (registered when colabkit.torch is imported) ------------------------------------------------

def _torch():
    torch = pytest.importorskip("torch")
    import colabkit.torch  # noqa: F401 - registers the torch kinds
    return torch


TORCH_DTYPES = ["float64", "float32", "float16", "bfloat16", "complex128", "complex64", "int64", "int32", "int16",
                "int8", "uint8", "bool", "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2", "complex32"]


def _sample(torch, name):
    dtype = getattr(torch, name)
    if dtype == torch.bool:
        return torch.tensor([True, False, True])
    if dtype.is_complex:
        return torch.tensor([1 + 2j, -3.5j], dtype=torch.complex64).to(dtype)
    if dtype.is_floating_point:
        return torch.tensor([0.5, -2.0, 3.0]).to(dtype)
    return torch.tensor([0, 1, 7]).to(dtype)


def test_tensors_of_every_dtype_and_the_dtypes_themselves_round_trip(tmp_path):
    torch = _torch()
    names = [n for n in TORCH_DTYPES if isinstance(getattr(torch, n, None), torch.dtype)]
    tensors, dtypes = {}, {}
    for name in names:
        try:
            tensors[name] = _sample(torch, name)
        except (RuntimeError, TypeError):   # a dtype this torch cannot convert to on the CPU
            continue
        dtypes[name] = getattr(torch, name)
    back = through_files({"tensors": tensors, "dtypes": dtypes, "list": list(dtypes.values())}, tmp_path)
    for name, tensor in tensors.items():
        got = back["tensors"][name]
        assert isinstance(got, torch.Tensor) and got.dtype == tensor.dtype, name
        assert torch.equal(got.view(torch.uint8), tensor.view(torch.uint8)), name   # bit for bit
    assert back["dtypes"] == dtypes and back["list"] == list(dtypes.values())
    assert all(isinstance(d, torch.dtype) for d in back["list"])


def test_devices_and_tensors_inside_tuples_round_trip(tmp_path):
    torch = _torch()
    value = (torch.device("cpu"), torch.device("cuda", 1), torch.ones(2, 3), {0: torch.zeros(1, dtype=torch.int8)},
             torch.nn.Parameter(torch.full((2,), 0.25)))
    back = through_files(value, tmp_path)
    assert type(back) is tuple and back[:2] == value[:2]
    assert torch.equal(back[2], value[2]) and torch.equal(back[3][0], value[3][0])
    assert torch.equal(back[4], value[4].detach())


@pytest.mark.parametrize("tree, message", [
    ({VALUE: "dtype", "name": "seed"}, "dtype is 'seed', not a torch dtype"),
    ({VALUE: "dtype", "name": "torch.manual_seed"}, "not a torch dtype"),
    ({VALUE: "dtype", "name": ["float32"]}, "not a torch dtype"),
    ({VALUE: "device", "name": "toaster:9"}, "not a torch device"),
    ({VALUE: "device", "name": 0}, "not a torch device"),
    ({VALUE: "tensor", "dtype": "bfloat16", "data": np.zeros(2, np.float32)}, "whose data are float32, not int16"),
    ({VALUE: "tensor", "dtype": "float32", "data": [1.0, 2.0]}, "data is \\[1.0, 2.0\\], not an array of numbers"),
    ({VALUE: "tensor", "dtype": "float32", "data": np.array(["a"])}, "not an array of numbers"),
])
def test_a_hostile_torch_tree_is_refused(tree, message):
    _torch()
    with pytest.raises(InvalidCheckpoint, match=message):
        codec.decode({"x": tree}, tags=codec.VALUE_TAGS)
