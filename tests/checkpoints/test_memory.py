"""New host memory for checkpoint bytes (checkpoints/memory.py): what the read buffer and the snapshot buffers
are made of. Its speed is bench/peer_bench.py's business; here, that it is ordinary, writable, aligned memory
that goes back to the system, with and without the kernel's help."""
import gc
import mmap

import numpy as np
import pytest

from colabkit.checkpoints import memory


@pytest.mark.parametrize("populate", [True, False], ids=["MAP_POPULATE", "without"])
def test_new_memory_is_writable_aligned_and_shaped_as_asked(monkeypatch, populate):
    if not populate:
        monkeypatch.delattr(mmap, "MAP_POPULATE", raising=False)
    elif not hasattr(mmap, "MAP_POPULATE"):
        pytest.skip("no MAP_POPULATE on this system")
    raw = memory.new_bytes(9 << 20)
    assert raw.dtype == np.uint8 and raw.shape == (9 << 20,) and raw.flags.writeable
    assert raw.ctypes.data % (mmap.PAGESIZE if populate else 16) == 0
    raw[:] = 7
    assert int(raw[-1]) == 7
    array = memory.new_array((1024, 2048), "float32")
    assert array.shape == (1024, 2048) and array.dtype == np.float32 and array.flags.c_contiguous
    array[...] = np.arange(2048, dtype=np.float32)
    assert array[1023, 2047] == 2047
    assert memory.new_array((), "float64").shape == ()
    assert memory.new_array((3,), object).dtype == object


def test_a_populated_mapping_goes_back_to_the_system_with_its_last_view():
    if not hasattr(mmap, "MAP_POPULATE"):
        pytest.skip("no MAP_POPULATE on this system")

    def resident():   # populated pages are resident from the start: the process's RSS shows the mapping
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * mmap.PAGESIZE

    before = resident()
    array = memory.new_array((64 << 20,), np.uint8)
    view = array[10:20]
    del array
    gc.collect()
    assert resident() - before >= 60 << 20, "the mapping went away while a view of it was alive"
    del view
    gc.collect()
    assert resident() - before < 16 << 20, "the mapping outlived its last view"
