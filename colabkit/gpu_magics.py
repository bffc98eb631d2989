"""`%gpus`: the GPU table, or a choice of GPUs (a thin skin over colabkit.gpus / colabkit.use_gpus)."""
from __future__ import annotations

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring


@magics_class
class GPUMagics(Magics):

    @magic_arguments()
    @argument("request", nargs="?", default=None,
              help="omit to list the GPUs; a count (2) picks the GPUs with most free memory, then least busy; "
                   "'auto' all that qualify; indices in nvidia-smi numbering (0,1 -- or 1, for GPU 1 alone) or "
                   "UUIDs (GPU-..., MIG-...) pick those. Same as colabkit.use_gpus(...)")
    @argument("--min-free", metavar="SIZE", help="only GPUs with this much free memory, e.g. 8GiB")
    @argument("--max-util", metavar="PCT", help="only GPUs at most this busy (%%)")
    @argument("--no-strict", action="store_true",
              help="take what is available (with a warning) instead of failing when the request cannot be met")
    @argument("--json", action="store_true", help="print machine-readable JSON")
    @line_magic
    def gpus(self, line=""):
        """List the GPUs, or choose GPUs for this kernel (before TensorFlow starts)."""
        args = parse_argstring(self.gpus, line)
        from . import devices
        try:
            if args.request is None and args.min_free is None and args.max_util is None:
                inventory = devices.gpus()
            else:
                request = "auto" if args.request is None else devices.parse_request(args.request)
                inventory = devices.use_gpus(request, min_free=args.min_free, max_util=args.max_util,
                                             strict=not args.no_strict)
        except (devices.GPUSelectionError, devices.DevicesAlreadyInitialized) as exc:
            raise UsageError(f"colabkit: {exc}") from None
        print(inventory.json() if args.json else inventory.table())


def load(shell) -> None:
    shell.register_magics(GPUMagics)


def unload(shell) -> None:
    """Remove exactly what `load` registered: the %gpus magic and the GPUMagics instance."""
    manager = shell.magics_manager
    table = manager.magics["line"]
    for name in GPUMagics.magics["line"]:
        owner = getattr(table.get(name), "__self__", None)
        if type(owner).__name__ == GPUMagics.__name__ and type(owner).__module__ == __name__:
            del table[name]
    owner = manager.registry.get(GPUMagics.__name__)
    if type(owner).__name__ == GPUMagics.__name__ and type(owner).__module__ == __name__:
        del manager.registry[GPUMagics.__name__]
