"""IPython magics: thin skins over colabkit's functions. Registered by `%load_ext colabkit`."""
from __future__ import annotations

from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring


@magics_class
class ColabkitMagics(Magics):

    @magic_arguments()
    @argument("what", nargs="?", default="status", choices=["status", "config", "version"],
              help="status (default): environment, VM age, time left, drive root, GPUs; "
                   "config: effective settings and their sources; version: the colabkit version")
    @argument("--json", action="store_true", help="status as JSON")
    @line_magic
    def colabkit(self, line=""):
        """Show colabkit's status summary, settings or version."""
        args = parse_argstring(self.colabkit, line)
        if args.what == "version":
            from ._version import __version__
            print(f"colabkit {__version__}")
        elif args.what == "config":
            from .status import config_report
            print(config_report())
        else:
            from .status import status
            s = status()
            print(s.json() if args.json else s.text())


def line_magic_names(magics_cls) -> list[str]:
    return list(magics_cls.magics["line"])


def load(shell) -> None:
    shell.register_magics(ColabkitMagics)


def unload(shell) -> None:
    """Remove exactly the magics `load` registered."""
    table = shell.magics_manager.magics["line"]
    for name in line_magic_names(ColabkitMagics):
        table.pop(name, None)
