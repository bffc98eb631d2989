class Tensor:
    """A 1-d float tensor on a device: the slice the all-reduce probe uses."""

    def __init__(self, values, device="cpu"):
        self._values, self.device = [float(v) for v in values], str(device)

    def item(self):
        if len(self._values) != 1:
            raise RuntimeError("a Tensor with %d elements cannot be converted to Scalar" % len(self._values))
        return self._values[0]

    def tolist(self):
        return list(self._values)


def ones(*size, device=None, dtype=None):
    n = 1
    for s in size:
        n *= int(s)
    if device is not None and str(device).startswith("cuda"):
        from . import cuda
        cuda._lazy_check(str(device))
    return Tensor([1.0] * n, device or "cpu")
