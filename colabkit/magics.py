"""IPython magics: thin skins over colabkit's functions. Registered by `%load_ext colabkit`."""
from __future__ import annotations

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring


@magics_class
class ColabkitMagics(Magics):

    @magic_arguments()
    @argument("what", nargs="?", default="status", choices=["status", "config", "version"],
              help="status (default): environment, VM age, time left, drive root, GPUs, browser presence, "
                   "keep-alive, last checkpoint, next deadline save (a live panel where widgets render); "
                   "config: effective settings and their sources; version: the colabkit version")
    @argument("--json", action="store_true", help="status as JSON")
    @argument("--text", action="store_true", help="status as plain text, also where the live panel would show")
    @line_magic
    def colabkit(self, line=""):
        """Show colabkit's status summary, settings or version."""
        args = parse_argstring(self.colabkit, line)
        from .config import ConfigError
        try:
            if args.what == "version":
                from ._version import __version__
                print(f"colabkit {__version__}")
            elif args.what == "config":
                from .summary import config_report
                print(config_report())
            elif args.json:
                from .summary import status
                print(status().json())
            else:
                from .widgets import show_status  # live panel in a kernel with ipywidgets, text elsewhere
                show_status(text_only=args.text)
        except ConfigError as exc:
            # IPython shows a UsageError as one line, without a traceback.
            raise UsageError(f"colabkit: {exc}") from None

    @magic_arguments()
    @argument("interval", nargs="*", help='time between checks of the keep-alive script, e.g. 60s (default) or '
                                          '2min, at least 30s; "off" stops what %%keepalive started')
    @argument("--reconnect", action="store_true",
              help="let the script click Reconnect when the runtime is gone (a fresh VM: its disk and variables "
                   "are empty); by default it tells you and waits")
    @argument("--no-notify", action="store_true",
              help="no desktop notification or tone from the script (the tab title, banner and console remain)")
    @argument("--script", action="store_true", help="show the browser script panel also outside Colab")
    @argument("--poll", default=None, help="how often browser presence is checked (default 5s)")
    @line_magic
    def keepalive(self, line=""):
        """Keep a Colab runtime alive (best-effort browser script) and save before the idle cutoff.

        The script watches the toolbar (while the runtime is connected it clicks the connect button, as
        maintained keep-alive scripts do, and closes what that opens; Colab publishes no rule that this counts as
        activity) and, once the runtime is gone, tells you instead of reconnecting (unless --reconnect). Official
        routes without a script, for a runtime they connect or create themselves: Google's Colab extension for
        VS Code, Google's Colab CLI; and the paid plans' background execution.
        """
        from .keepalive import negative_argument
        bad = negative_argument(line)
        if bad:  # argparse would call "-5s" an unknown option
            raise UsageError(bad)
        args = parse_argstring(self.keepalive, line)
        from . import keepalive as _keepalive
        from .config import ConfigError
        try:
            _keepalive.keepalive(" ".join(args.interval) or _keepalive.DEFAULT_INTERVAL, reconnect=args.reconnect,
                                 notify=not args.no_notify, show_script=True if args.script else None, poll=args.poll)
        except (ConfigError, ValueError) as exc:
            raise UsageError(f"%keepalive: {exc}") from None


    @magic_arguments()
    @argument("--text", action="store_true", help="the compact text summary instead of the live plots")
    @argument("--refresh", default="5s", help="how often the plots are redrawn while training runs (default 5s)")
    @line_magic
    def monitor(self, line=""):
        """Live training-health plots (loss, step time and input share, GPU utilization/memory/temperature)
        of the most recently started colabkit monitor (colabkit.keras.Monitor, AutoResume(monitor=True),
        colabkit.monitor()); one started later is followed. Text in a terminal."""
        args = parse_argstring(self.monitor, line)
        from .health.plots import show
        try:
            show(text_only=args.text, refresh=args.refresh)
        except ValueError as exc:
            raise UsageError(f"%monitor: {exc}") from None

    @magic_arguments()
    @argument("src", help='dataset folder or .zip/.tar[.gz]: a path, "drive:data/x", "gdrive://data/x" or a share link')
    @argument("dst", nargs="?", default=None, help="local folder (default: under the cache dir)")
    @argument("--checksum", action="store_true", help="decide 'unchanged' by content, not size+mtime")
    @line_magic
    def stage(self, line=""):
        """Copy a dataset to fast local disk (cached, resumable) and return its local path."""
        args = parse_argstring(self.stage, line)
        from .config import ConfigError
        from .gdrive.staging import stage
        try:
            return str(stage(args.src, args.dst, checksum=args.checksum))
        except (ConfigError, ValueError, OSError, ImportError) as exc:
            raise UsageError(f"%stage: {exc}") from None

    @magic_arguments()
    @argument("--watch", required=True, help="the folder the command writes its checkpoints in")
    @argument("--to", required=True, help='where checkpoints are committed: "drive:runs/lora" or a folder')
    @argument("--resume-arg", default=None,
              help='appended when a checkpoint was restored, {latest} replaced by its path, e.g. '
                   '"--resume_from_checkpoint={latest}"; with nothing to restore it is left out')
    @argument("--fresh-arg", default=None, help="appended instead when there is nothing to restore")
    @argument("--pattern", action="append", default=None,
              help="a checkpoint file or folder name (repeatable; replaces the defaults: checkpoint-*, "
                   "checkpoint_*, step_*, epoch_*, *.ckpt, last.pt, last.pth, network-snapshot-*.pkl)")
    @argument("--marker", action="append", default=None,
              help="a file written last in each folder your --pattern matches")
    @argument("--keep", type=int, default=None, help="committed checkpoints kept (default: the keep setting)")
    @argument("--settle", default="5s", help="complete once unchanged this long (default 5s)")
    @argument("--every", default="2s", help="how often the folder is looked at (default 2s)")
    @argument("--deadline", default="auto", help='"auto", a budget such as "11h30m", or "off"')
    @argument("--margin", default=None, help="stop this long before the deadline (default 60s + --grace)")
    @argument("--stop-signal", default="SIGINT", help="sent before the deadline (default SIGINT)")
    @argument("--grace", default="2min", help="time to write the checkpoint and exit after the signal")
    @argument("--retries", type=int, default=0, help="relaunches after a crash, from the newest checkpoint")
    @cell_magic
    def guard(self, line="", cell=""):
        """Run the cell's shell command under colabkit's guard: the newest checkpoint in --to is restored into
        --watch and passed to the command (--resume-arg), each checkpoint the command writes is committed to
        --to, and before the runtime's deadline the command is stopped once its checkpoint is safe. Output
        streams into the cell. Returns nothing; the exit status is shown when it is not 0.

            %%guard --watch outputs/ --to drive:runs/lora --resume-arg "--resume_from_checkpoint={latest}"
            accelerate launch train.py --output_dir outputs
        """
        import shlex

        from .config import ConfigError
        from .guard import run
        from .guard.options import glue_values, run_kwargs
        try:
            args = self.guard.parser.parse_args(glue_values(shlex.split(line)))
        except ValueError as exc:
            raise UsageError(f"%%guard: {exc}") from None
        command = cell.strip()   # run by the shell: line continuations and `&&` work as in a terminal
        if not command:
            raise UsageError("%%guard: the cell is empty: write the training command in it, below the "
                             "%%guard line, e.g. python train.py --epochs 10")
        args.pattern, args.marker = args.pattern or None, args.marker or ()
        try:
            status = run(command, **run_kwargs(args))
        except (ConfigError, ValueError) as exc:
            raise UsageError(f"%%guard: {exc}") from None
        if status:
            print(f"colabkit guard: the command ended with exit status {status}")


def line_magic_names(magics_cls) -> list[str]:
    return list(magics_cls.magics["line"])


def load(shell) -> None:
    shell.register_magics(ColabkitMagics)


def unload(shell) -> None:
    """Remove exactly what `load` registered: the line magics and the Magics instance in the registry."""
    manager = shell.magics_manager
    for kind in ("line", "cell"):
        table = manager.magics[kind]
        for name in list(ColabkitMagics.magics[kind]):
            if _ours(getattr(table.get(name), "__self__", None)):
                del table[name]
    if _ours(manager.registry.get(ColabkitMagics.__name__)):
        del manager.registry[ColabkitMagics.__name__]


def _ours(obj) -> bool:
    # By name, not isinstance: after a module reload (%autoreload) the class object is a new one.
    return type(obj).__name__ == ColabkitMagics.__name__ and type(obj).__module__ == __name__
